"""The Dispatcher takes its wake-ups from any store that offers them (the
``WakeupSource`` protocol of ``pgstore.protocols``), not from PostgreSQL alone.

A memory store that offers wake-ups (``job_wakeups``, waking at each schedule)
gets a due-now job leased at once while the poll interval is long; the
Dispatcher passes the store its poll interval as the horizon, its holder as the
name and a ``listen=`` conninfo through, reports the wake-ups' connection news
as events (``ConnectionLost`` / ``Reconnected``, component ``listener``) and
stops them at stop; ``listen=False`` asks for none.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pgstore import AsyncPgJobStore, Job, MemoryJobStore, PgJobStore
from pgstore.runtime import events as ev
from pgstore.runtime.dispatcher import Dispatcher
from tests.support.waiting import until

POLL = 30.0  # seconds: far longer than the test may wait for a wake-up


class Wakeups:
    """What ``job_wakeups`` makes: wakes its runtime at each ``hint()`` once started."""

    def __init__(self, wake: Callable[[], None],
                 on_connection: Callable[[str | None], None] | None) -> None:
        self.wake = wake
        self.on_connection = on_connection
        self.listening = asyncio.Event()
        self.stopped = False

    def start(self) -> None:
        self.listening.set()
        if self.on_connection is not None:
            self.on_connection(None)

    async def stop(self) -> None:
        self.listening.clear()
        self.stopped = True

    def hint(self) -> None:
        if self.listening.is_set():
            self.wake()  # Runtime.wake: safe from any thread


class WakingMemoryJobStore(MemoryJobStore):
    """A memory job store that offers wake-ups: each ``schedule`` hints."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[Wakeups] = []
        self.asked: list[tuple[float, str, str | None]] = []

    def job_wakeups(
        self,
        wake: Callable[[], None],
        horizon: float,
        *,
        log: logging.Logger,
        name: str,
        conninfo: str | None = None,
        on_connection: Callable[[str | None], None] | None = None,
    ) -> Wakeups:
        self.asked.append((horizon, name, conninfo))
        wakeups = Wakeups(wake, on_connection)
        self.made.append(wakeups)
        return wakeups

    def schedule(
        self, run_id: str, dispatch_at: int, max_attempts: int | None = None,
        queue: str | None = None, priority: int | None = None, payload: Any = None,
    ) -> None:
        super().schedule(run_id, dispatch_at, max_attempts, queue, priority, payload)
        for wakeups in self.made:
            wakeups.hint()


def test_a_store_offering_wakeups_wakes_an_idle_dispatcher() -> None:
    store = WakingMemoryJobStore()
    got = threading.Event()
    seen: list[ev.Event] = []

    def dispatch(job: Job) -> str:
        got.set()
        return "bot"

    d = Dispatcher(store, dispatch, holder="d1", poll_interval=POLL, listen="host=elsewhere",
                   on_event=seen.append)

    async def main() -> float:
        runner = asyncio.ensure_future(d.run(handle_signals=False))
        await until("the wake-ups", lambda: bool(store.made))
        await asyncio.wait_for(store.made[0].listening.wait(), 5)
        await asyncio.sleep(0.3)  # idle in its poll wait
        started = time.monotonic()
        await asyncio.to_thread(store.schedule, "now", store.now_ms())
        await asyncio.to_thread(got.wait, 5)
        latency = time.monotonic() - started
        tell = store.made[0].on_connection
        assert tell is not None
        tell("OperationalError: gone")  # as the LISTEN connection reports a loss
        tell(None)  # and listening again
        d.stop()
        await runner
        return latency

    latency = asyncio.run(main())
    print(f"\nleased {latency * 1000:.0f} ms after the schedule (poll interval {POLL:g}s); "
          f"asked {store.asked}")
    assert got.is_set() and latency < 2.0, "woken, not left to the poll"
    job = store.get("now")
    assert job is not None and job.dispatched
    assert store.asked == [(POLL, "d1", "host=elsewhere")]
    assert store.made[0].stopped, "the wake-ups are stopped at stop"
    news = [(type(e).__name__, getattr(e, "component", None)) for e in seen
            if isinstance(e, (ev.ConnectionLost, ev.Reconnected))]
    assert news == [("ConnectionLost", "listener"), ("Reconnected", "listener")]


def test_listen_false_asks_the_store_for_no_wakeups() -> None:
    store = WakingMemoryJobStore()
    d = Dispatcher(store, lambda job: None, holder="d1", poll_interval=POLL, listen=False)

    async def main() -> None:
        await d.start()
        await d.tick()
        d.stop()

    asyncio.run(main())
    assert store.made == []


def test_which_stores_are_wakeup_sources() -> None:
    from pgstore.protocols import WakeupSource

    assert isinstance(WakingMemoryJobStore(), WakeupSource)
    assert not isinstance(MemoryJobStore(), WakeupSource)
    assert issubclass(PgJobStore, WakeupSource) and issubclass(AsyncPgJobStore, WakeupSource)
