"""The Dispatcher over the memory job store, with a clock moved by hand."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from pgstore import CancelResult, InvalidArgument, Job, MemoryJobStore
from pgstore.runtime import events as ev
from pgstore.runtime import tracing
from pgstore.runtime.dispatcher import Backoff, Dispatcher
from tests.support.clock import FakeClock
from tests.support.waiting import until


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class Provider:
    """A fake bot provider: records what was sent and recalled."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.recalled: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()

    def dispatch(self, job: Job) -> str:
        with self.lock:
            worker = f"bot-{len(self.sent) + 1}"
            self.sent.append((job.run_id, job.lease_holder or "?"))
            return worker

    def recall(self, job: Job, worker_id: str | None) -> None:
        with self.lock:
            self.recalled.append((job.run_id, worker_id))


def _dispatcher(store: MemoryJobStore, clock: FakeClock, provider: Provider, **kw: Any) -> Dispatcher:
    kw.setdefault("holder", "d1")
    kw.setdefault("ttl_ms", 30_000)
    kw.setdefault("dispatch", provider.dispatch)
    kw.setdefault("recall", provider.recall)
    return Dispatcher(store, clock=clock, **kw)


async def _round(d: Dispatcher) -> int:
    leased = await d.tick()
    await d.wait_idle()
    return leased


def test_due_jobs_are_dispatched_once_in_due_order() -> None:
    store, clock, provider = MemoryJobStore(), FakeClock(1_000), Provider()
    for run_id, at in [("late", 900), ("early", 100), ("future", 5_000)]:
        store.schedule(run_id, at)
    d = _dispatcher(store, clock, provider, concurrency=1)

    async def main() -> list[int]:
        await d.start()
        return [await _round(d) for _ in range(3)]

    assert run(main()) == [1, 1, 0]
    assert provider.sent == [("early", "d1"), ("late", "d1")]
    assert provider.recalled == []
    assert [(j.run_id, j.worker_id) for j in store.list_dispatched()] == [
        ("early", "bot-1"), ("late", "bot-2")
    ]
    future = store.get("future")
    assert future is not None and not future.dispatched and future.lease_holder is None


def test_a_cancel_during_dispatch_recalls_the_bot() -> None:
    store, clock, provider = MemoryJobStore(), FakeClock(1_000), Provider()
    store.schedule("meeting", 500)

    def dispatch(job: Job) -> str:
        assert store.cancel(job.run_id) == CancelResult.CANCELLED  # the user cancels meanwhile
        return "bot-7"

    d = _dispatcher(store, clock, provider, dispatch=dispatch)

    async def main() -> None:
        await d.start()
        await _round(d)

    run(main())
    assert provider.recalled == [("meeting", "bot-7")]
    job = store.get("meeting")
    assert job is not None and job.dispatched and job.cancelled and job.worker_id == "bot-7"


def test_a_cancelled_job_is_never_dispatched() -> None:
    store, clock, provider = MemoryJobStore(), FakeClock(1_000), Provider()
    store.schedule("meeting", 500)
    assert store.cancel("meeting") == CancelResult.CANCELLED
    d = _dispatcher(store, clock, provider)

    async def main() -> int:
        await d.start()
        return await _round(d)

    assert run(main()) == 0
    assert provider.sent == []


def test_lost_lease_means_not_recorded_and_the_bot_is_recalled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock, provider = MemoryJobStore(), FakeClock(1_000), Provider()
    store.schedule("meeting", 500)
    ttl = 900
    gate = threading.Event()

    def slow_dispatch(job: Job) -> str:
        gate.wait(10)
        return "bot-slow"

    slow = _dispatcher(store, clock, provider, holder="slow", ttl_ms=ttl, dispatch=slow_dispatch)
    fast = _dispatcher(store, clock, provider, holder="fast", ttl_ms=ttl)

    async def main() -> None:
        await slow.start()
        await fast.start()
        assert await slow.tick() == 1
        clock.advance(ttl)  # the slow holder's lease expires while its provider works
        assert await _round(fast) == 1  # another holder takes it and dispatches
        gate.set()
        await slow.wait_idle()

    with caplog.at_level(logging.INFO, logger="pgstore.dispatcher"):
        run(main())
    assert provider.recalled == [("meeting", "bot-slow")]
    job = store.get("meeting")
    assert job is not None and job.lease_holder == "fast" and job.worker_id == "bot-1"
    assert "lease taken by another holder; recalling bot-slow" in caplog.text


def test_a_failed_dispatch_is_released_with_backoff() -> None:
    store, clock, provider = MemoryJobStore(), FakeClock(10_000), Provider()
    store.schedule("meeting", 0)
    failures = [RuntimeError("provider 503"), RuntimeError("provider 503")]

    def dispatch(job: Job) -> str:
        if failures:
            raise failures.pop()
        return "bot-1"

    backoff = Backoff(base_ms=1_000, factor=3, max_ms=60_000, jitter=0.5, random=lambda: 0.5)
    d = _dispatcher(store, clock, provider, dispatch=dispatch, backoff=backoff)

    async def main() -> list[Any]:
        await d.start()
        seen: list[Any] = []
        await _round(d)
        seen.append(store.get("meeting"))
        clock.set(10_999)
        seen.append(await _round(d))
        clock.set(11_000)
        await _round(d)
        seen.append(store.get("meeting"))
        clock.set(14_000)
        await _round(d)
        seen.append(store.get("meeting"))
        return seen

    first, early, second, done = run(main())
    assert (first.dispatch_at, first.lease_holder, first.dispatched) == (11_000, None, False)
    assert early == 0
    assert (second.dispatch_at, second.lease_holder) == (14_000, None)  # 1_000 * 3
    assert done.dispatched and done.worker_id == "bot-1"


def test_backoff_reads_the_stored_attempts_so_a_new_dispatcher_continues_and_the_last_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Attempt numbers come from the leased row, not from the dispatcher: a second
    Dispatcher instance (a restart) backs off from attempt 3, and the release of the
    job's last attempt (max_attempts=4) fails it, keeping the error's text."""
    store, clock = MemoryJobStore(), FakeClock(10_000)
    store.schedule("meeting", 0, 4)
    seen: list[tuple[str, int]] = []

    def dispatch(job: Job) -> str:
        seen.append((job.lease_holder or "?", job.attempts))
        raise ConnectionError(f"provider down at attempt {job.attempts}")

    backoff = Backoff(base_ms=1_000, factor=2, max_ms=60_000, jitter=0)

    async def rounds(d: Dispatcher, count: int) -> list[int]:
        await d.start()
        due = []
        for _ in range(count):
            await _round(d)
            job = store.get("meeting")
            assert job is not None
            due.append(job.dispatch_at)
            clock.set(max(clock(), job.dispatch_at))
        return due

    first = _dispatcher(store, clock, Provider(), holder="d1", dispatch=dispatch, backoff=backoff)
    assert run(rounds(first, 2)) == [11_000, 13_000]  # 10_000 + 1_000, 11_000 + 2_000
    second = _dispatcher(store, clock, Provider(), holder="d2", dispatch=dispatch, backoff=backoff)
    with caplog.at_level(logging.INFO, logger="pgstore.dispatcher"):
        # Attempt 3 backs off 4_000 (not 1_000, as a count kept in the dispatcher would).
        assert run(rounds(second, 3)) == [17_000, 17_000, 17_000]
    assert seen == [("d1", 1), ("d1", 2), ("d2", 3), ("d2", 4)]
    job = store.get("meeting")
    assert job is not None and job.state == "failed" and job.attempts == 4
    assert job.last_error == "ConnectionError: provider down at attempt 4"
    assert "dispatch of meeting failed (attempt 3 of 4)" in caplog.text
    assert "d2: meeting failed for good after 4 attempt(s)" in caplog.text
    assert store.retry("meeting", 17_000).value == "retried"
    run(rounds(second, 1))
    assert seen[-1] == ("d2", 1)


def test_backoff_grows_caps_and_jitters() -> None:
    low = Backoff(base_ms=100, factor=2, max_ms=1_000, jitter=0.2, random=lambda: 0.0)
    high = Backoff(base_ms=100, factor=2, max_ms=1_000, jitter=0.2, random=lambda: 1.0)
    assert [low.delay_ms(n) for n in range(1, 6)] == [80, 160, 320, 640, 800]
    assert [high.delay_ms(n) for n in range(1, 6)] == [120, 240, 480, 960, 1_200]
    assert Backoff(jitter=0).delay_ms(10_000) == 300_000
    with pytest.raises(InvalidArgument):
        Backoff(jitter=1.5)
    with pytest.raises(InvalidArgument):
        Backoff(base_ms=0)


def test_renews_while_dispatch_runs() -> None:
    store, clock, provider = MemoryJobStore(), FakeClock(1_000), Provider()
    store.schedule("meeting", 0)
    ttl = 600  # renewed every 0.2 s of real time
    seen: list[int | None] = []

    def dispatch(job: Job) -> str:
        clock.advance(400)
        threading.Event().wait(0.5)  # two renews happen meanwhile
        current = store.get(job.run_id)
        seen.append(None if current is None else current.lease_until)
        return "bot"

    d = _dispatcher(store, clock, provider, ttl_ms=ttl, dispatch=dispatch)

    async def main() -> None:
        await d.start()
        await _round(d)

    run(main())
    assert seen == [1_400 + ttl]  # renewed from the advanced clock, not the lease time
    assert provider.recalled == []


@pytest.mark.parametrize("path", ["runs", "traced"])
def test_a_renew_overtaken_by_its_own_mark_is_no_lost_lease(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a queue with a concurrency limit of 1, the mark commits and frees the queue's
    place, another dispatcher leases the next job into it, and the mark's answer is
    slow to come back: the keeper's renews meanwhile are refused (the lease holds no
    place and the queue is full). That is the lease ending by its own mark, not a stale
    holder: no ``Refused``, no ``LeaseLost`` (whose alert says the work may run twice),
    no recall; the mark's answer is the report. Without spans and with them (a tracer
    that records: each run in its span's context, the span closed with the outcome)."""
    exporter = None
    if path == "traced":
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        exporter, sdk = InMemorySpanExporter(), TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(exporter))
        monkeypatch.setattr(tracing, "recording", lambda: True)
        monkeypatch.setattr(tracing, "_tracer", sdk.get_tracer("test"))

    class SlowAnswers(MemoryJobStore):
        def _taken_elsewhere(self, marked: Any) -> Any:
            assert self.lease("d2", 1_000, 60_000, ["q"]) is not None
            time.sleep(1.0)  # renews every 0.2 s of real time meanwhile
            return marked

        def mark_dispatched(self, *args: Any, **kwargs: Any) -> Any:
            return self._taken_elsewhere(super().mark_dispatched(*args, **kwargs))

        def mark_dispatched_many(self, *args: Any, **kwargs: Any) -> Any:
            return self._taken_elsewhere(super().mark_dispatched_many(*args, **kwargs))

    store, clock, provider = SlowAnswers(), FakeClock(1_000), Provider()
    store.set_queue_concurrency("q", 1)
    store.schedule("meeting", 0, queue="q")
    store.schedule("next", 1, queue="q")
    seen: list[ev.Event] = []

    def dispatch(job: Job) -> str:
        threading.Event().wait(0.3)  # past the first renew: the job has a keeper
        return "bot"

    d = _dispatcher(store, clock, provider, ttl_ms=600, dispatch=dispatch,
                    on_event=seen.append)

    async def main() -> None:
        await d.start()
        await _round(d)

    run(main())
    renews = [e for e in seen if isinstance(e, ev.Renew)]
    assert renews, "the job's keeper renewed while it was dispatched"
    assert [e.outcome for e in renews] == ["renewed"] * len(renews)
    assert [e for e in seen if isinstance(e, (ev.LeaseLost, ev.Refused, ev.Recall))] == []
    assert [(e.subject, e.outcome) for e in seen if isinstance(e, ev.Complete)] == [
        ("meeting", "completed")]
    assert provider.recalled == []
    taken = store.get("next")
    assert taken is not None and taken.lease_holder == "d2"
    if exporter is not None:
        assert [(s.attributes or {}).get("pgstore.outcome")
                for s in exporter.get_finished_spans()] == ["completed"]


def test_async_dispatch_and_recall() -> None:
    store, clock = MemoryJobStore(), FakeClock(1_000)
    store.schedule("m1", 0)
    recalled: list[str | None] = []

    async def dispatch(job: Job) -> str:
        await asyncio.sleep(0)
        store.cancel(job.run_id)
        return "bot-async"

    async def recall(job: Job, worker_id: str | None) -> None:
        recalled.append(worker_id)

    d = Dispatcher(store, dispatch, recall, holder="d", clock=clock)

    async def main() -> None:
        await d.start()
        await _round(d)

    run(main())
    assert recalled == ["bot-async"]


def test_stop_abandons_a_dispatch_past_the_grace_period() -> None:
    store, clock, provider = MemoryJobStore(), FakeClock(1_000), Provider()
    store.schedule("stuck", 0)

    async def dispatch(job: Job) -> str:
        await asyncio.sleep(10)
        return "never"

    d = _dispatcher(store, clock, provider, dispatch=dispatch, grace_period=0.1,
                    poll_interval=0.05)

    async def main() -> None:
        runner = asyncio.ensure_future(d.run())
        while d.running < 1:
            await asyncio.sleep(0.01)
        d.stop()
        await asyncio.wait_for(runner, 5)

    run(main())
    job = store.get("stuck")
    assert job is not None and not job.dispatched and job.lease_holder == "d1"  # left to expire
    assert d.abandoned


class HangingMarks(MemoryJobStore):
    """A memory store whose marks wait (in their worker thread) until ``go`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.marks_out = 0
        self.renews = 0

    def renew(self, *args: Any, **kw: Any) -> Any:
        self.renews += 1
        return super().renew(*args, **kw)

    def renew_many(self, *args: Any, **kw: Any) -> Any:
        self.renews += 1
        return super().renew_many(*args, **kw)

    def mark_dispatched(self, *args: Any, **kw: Any) -> Any:
        self.marks_out += 1
        self.go.wait(30)
        return super().mark_dispatched(*args, **kw)

    def mark_dispatched_many(self, *args: Any, **kw: Any) -> Any:
        self.marks_out += 1
        self.go.wait(30)
        return super().mark_dispatched_many(*args, **kw)


def test_stop_abandons_runs_whose_mark_has_no_answer_by_the_end_of_the_grace_period() -> None:
    """A run waits for its mark's answer with no task of its own: a stop whose grace
    period ends first abandons it all the same (no recall, no longer running, its
    lease no longer renewed), and the mark already sent may still commit, as a
    single call would."""
    store, clock, provider = HangingMarks(), FakeClock(1_000), Provider()
    for n in range(3):
        store.schedule(f"h{n}", 0)
    # A lease of 0.6 s: its keepers renew every 0.2 s while the marks hang.
    d = _dispatcher(store, clock, provider, ttl_ms=600, grace_period=0.5,
                    poll_interval=0.05)

    async def main() -> None:
        runner = asyncio.ensure_future(d.run(handle_signals=False))
        try:
            await until("the marks sent", lambda: store.marks_out > 0, timeout=20)
            assert d.running == 3
            await until("their leases renewed", lambda: store.renews > 0, timeout=20)
            d.stop()
            await asyncio.wait_for(runner, 5)
            await asyncio.sleep(0.3)  # a renew out at the stop may still come back
            renewed = store.renews
            await asyncio.sleep(0.7)  # more than three renew periods
            assert store.renews == renewed  # no keeper left behind
        finally:
            store.go.set()

    run(main())
    assert d.abandoned and d.running == 0
    assert len(provider.sent) == 3 and provider.recalled == []


def test_a_full_dispatcher_leases_again_as_its_runs_end_not_at_its_next_poll() -> None:
    """Concurrency 2, six due jobs, a poll interval of a minute: the end of the first
    runs wakes it, so all six go long before the first poll would have come."""
    store, clock, provider = MemoryJobStore(), FakeClock(1_000), Provider()
    for n in range(6):
        store.schedule(f"m{n}", 0)
    sent: list[str] = []

    async def dispatch(job: Job) -> str:
        await asyncio.sleep(0.05)
        sent.append(job.run_id)
        return "bot"

    d = _dispatcher(store, clock, provider, dispatch=dispatch, concurrency=2,
                    poll_interval=60.0)

    async def main() -> None:
        runner = asyncio.ensure_future(d.run(handle_signals=False))
        try:
            await until("all six dispatched", lambda: len(sent) == 6, timeout=20)
            await until("all six marked", lambda: d.running == 0, timeout=20)
        finally:
            d.stop()
            await asyncio.wait_for(runner, 5)

    run(main())
    assert sorted(sent) == [f"m{n}" for n in range(6)]
    assert all(job.dispatched for job in store.list_dispatched()) and len(
        store.list_dispatched()) == 6


def test_short_dispatches_cost_no_keeper_and_late_starting_runs_are_kept_at_once() -> None:
    """Jobs whose dispatch ends before their first renew is due are never renewed (no
    keeper starts for them, even once that time has passed); a run that starts after
    it (the loop held up past a third of the lease) is renewed at once, as its lease
    needs."""
    store, clock, provider = MemoryJobStore(), FakeClock(1_000), Provider()
    for n in range(5):
        store.schedule(f"quick{n}", 0)
    renews: list[ev.Renew] = []
    ttl = 600  # first renew due 0.2 s after the lease

    d = _dispatcher(store, clock, provider, ttl_ms=ttl, concurrency=10,
                    on_event=lambda e: renews.append(e) if isinstance(e, ev.Renew) else None)

    async def quick_round() -> None:
        await d.start()
        assert await _round(d) == 5
        await asyncio.sleep(0.5)  # well past the batch's first renew

    run(quick_round())
    assert renews == []
    assert len(store.list_dispatched()) == 5

    store.schedule("late", 0)
    renewed_until: list[int | None] = []

    def hold_up(e: ev.Event) -> None:
        if isinstance(e, ev.Claim) and e.outcome == "claimed":
            time.sleep(0.3)  # holds the loop: the run starts after its renew was due
        if isinstance(e, ev.Renew):
            renews.append(e)

    async def dispatch(job: Job) -> str:
        clock.advance(100)
        await until("a renew", lambda: bool(renews), timeout=5)
        current = store.get(job.run_id)
        renewed_until.append(None if current is None else current.lease_until)
        return "bot"

    late = _dispatcher(store, clock, provider, holder="d2", ttl_ms=ttl, dispatch=dispatch,
                       on_event=hold_up)

    async def late_round() -> None:
        await late.start()
        assert await _round(late) == 1

    run(late_round())
    assert [e.outcome for e in renews][:1] == ["renewed"]
    assert renewed_until == [1_100 + ttl]  # renewed, from the advanced clock


def test_a_dispatcher_with_queues_leases_only_their_jobs_by_priority() -> None:
    store, clock, provider = MemoryJobStore(), FakeClock(1_000), Provider()
    store.schedule("node-job", 10, queue="node", priority=99)
    store.schedule("py-low", 20, queue="python")
    store.schedule("py-high", 30, queue="python", priority=5, payload={"seat": 3})
    d = _dispatcher(store, clock, provider, concurrency=1, queues=["python"])

    async def main() -> list[int]:
        await d.start()
        return [await _round(d) for _ in range(3)]

    assert run(main()) == [1, 1, 0]
    assert provider.sent == [("py-high", "d1"), ("py-low", "d1")]
    node = store.get("node-job")
    assert node is not None and not node.dispatched and node.lease_holder is None
    with pytest.raises(InvalidArgument, match="queues"):
        _dispatcher(store, clock, provider, queues=[])
