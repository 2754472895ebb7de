"""The runtimes' events (pgstore.runtime.events) on PostgreSQL: each thing that happened is
reported once, with what the store answered, and a subscriber cannot break a runtime."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from pgstore import InvalidArgument, Job, PgJobStore, PgScheduleStore
from pgstore.runtime import events as ev
from pgstore.runtime.dispatcher import Backoff, Dispatcher
from pgstore.runtime.scheduler import RunContext, Scheduler
from tests.support.proxy import TcpProxy, tcp_proxy
from tests.support.waiting import WAIT, until

E = TypeVar("E", bound=ev.Event)


class Recorder:
    """Every event, in order; thread-safe reads."""

    def __init__(self) -> None:
        self.events: list[ev.Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: ev.Event) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, kind: type[E]) -> list[E]:
        with self._lock:
            return [e for e in self.events if isinstance(e, kind)]



@pytest.fixture
def proxy(pgstore_database: str) -> Iterator[TcpProxy]:
    with tcp_proxy(pgstore_database) as p:
        yield p


def test_a_scheduler_reports_registers_claims_runs_and_completes(
    pgstore_database: str, pgstore_schema: str
) -> None:
    seen = Recorder()
    store = PgScheduleStore(pgstore_database, schema=pgstore_schema)
    s = Scheduler(store, owner="s1", lease_ms=5_000, poll_interval=0.02, on_event=seen)
    s.every("fine", 100, lambda: None)

    def boom() -> None:
        raise RuntimeError("boom")

    s.every("broken", 150, boom)

    async def main() -> None:
        task = asyncio.ensure_future(s.run(handle_signals=False))
        await until("runs", lambda: len(seen.of(ev.Complete)) >= 8)
        s.stop()
        await task

    asyncio.run(main())
    store.close()
    assert {(e.task_id, e.kind, e.spec) for e in seen.of(ev.Registered)} == {
        ("fine", "interval", "100"), ("broken", "interval", "150")}
    claims = [e for e in seen.of(ev.Claim) if e.outcome == "claimed"]
    runs, completes = seen.of(ev.HandlerRun), seen.of(ev.Complete)
    # One claim, one run and one complete per occurrence, with the claim's token.
    assert Counter((e.subject, e.token) for e in claims) == Counter(
        (e.subject, e.token) for e in runs) == Counter((e.subject, e.token) for e in completes)
    assert all(n == 1 for n in Counter((e.subject, e.token) for e in claims).values())
    for c in claims:
        assert c.runtime == "scheduler" and c.owner == "s1"
        assert c.due_at is not None and c.now is not None and c.now >= c.due_at
        assert c.lease_until is not None and c.lease_until > c.now
    assert {(e.subject, e.outcome) for e in runs} == {("fine", "ok"), ("broken", "error")}
    assert all(e.duration_s >= 0 for e in runs)
    assert {(e.subject, e.status, e.outcome, e.attempts) for e in completes} == {
        ("fine", "ok", "completed", 1), ("broken", "error", "completed", 1)}
    assert [e for e in seen.of(ev.Claim) if e.outcome == "error"] == []
    assert any(e.outcome == "empty" for e in seen.of(ev.Claim))
    assert seen.of(ev.Refused) == [] and seen.of(ev.LeaseLost) == []
    # Stopping comes once, when the stop begins: after it only the runs it counted as
    # running end (under load one may still be in flight at the stop).
    stops = [i for i, e in enumerate(seen.events) if isinstance(e, ev.Stopping)]
    assert len(stops) == 1
    stopping, after = seen.events[stops[0]], seen.events[stops[0] + 1:]
    assert isinstance(stopping, ev.Stopping)
    assert all(isinstance(e, (ev.HandlerRun, ev.Complete)) for e in after), after
    assert len([e for e in after if isinstance(e, ev.Complete)]) <= stopping.running


def _steal_schedule(dsn: str, schema: str, task: str, ahead_ms: int) -> int:
    """Claim ``task`` as another owner at a time past its lease; the new token."""
    with PgScheduleStore(dsn, schema=schema) as thief:
        claim = thief.claim_due(task, "thief", thief.now_ms() + ahead_ms, 60_000)
    assert claim is not None
    return claim.fencing_token


def test_a_stolen_schedule_lease_is_a_refused_renew_and_a_lost_lease(
    pgstore_database: str, pgstore_schema: str
) -> None:
    seen = Recorder()
    store = PgScheduleStore(pgstore_database, schema=pgstore_schema)
    s = Scheduler(store, owner="s1", lease_ms=600, poll_interval=0.02)
    s.subscribe(seen)
    stolen: list[int] = []

    def slow(ctx: RunContext) -> None:
        stolen.append(_steal_schedule(pgstore_database, pgstore_schema, "slow", 10_000))
        ctx.lease_lost.wait(WAIT)

    s.once("slow", 1, slow)

    async def main() -> None:
        task = asyncio.ensure_future(s.run(handle_signals=False))
        await until("the lease lost", lambda: bool(seen.of(ev.HandlerRun)))
        s.stop()
        await task

    asyncio.run(main())
    store.close()
    [claim] = [e for e in seen.of(ev.Claim) if e.outcome == "claimed"]
    assert claim.token is not None and stolen == [claim.token + 1]
    assert [(e.outcome, e.token) for e in seen.of(ev.Renew)] == [("refused", claim.token)]
    assert [(e.operation, e.token) for e in seen.of(ev.Refused)] == [("renew", claim.token)]
    assert [(e.reason, e.token) for e in seen.of(ev.LeaseLost)] == [("refused", claim.token)]
    assert [e.outcome for e in seen.of(ev.HandlerRun)] == ["lease_lost"]
    assert seen.of(ev.Complete) == []  # a lost lease is never completed


def test_a_complete_under_a_stolen_lease_is_rejected_and_refused(
    pgstore_database: str, pgstore_schema: str
) -> None:
    seen = Recorder()
    store = PgScheduleStore(pgstore_database, schema=pgstore_schema)
    s = Scheduler(store, owner="s1", lease_ms=30_000, poll_interval=0.02, on_event=seen)
    s.once("quick", 1, lambda: _steal_schedule(pgstore_database, pgstore_schema, "quick",
                                                60_000))

    async def main() -> None:
        task = asyncio.ensure_future(s.run(handle_signals=False))
        await until("the complete", lambda: bool(seen.of(ev.Complete)))
        s.stop()
        await task

    asyncio.run(main())
    store.close()
    [claim] = [e for e in seen.of(ev.Claim) if e.outcome == "claimed"]
    assert [(e.outcome, e.token) for e in seen.of(ev.HandlerRun)] == [("ok", claim.token)]
    assert [(e.outcome, e.token) for e in seen.of(ev.Complete)] == [("rejected", claim.token)]
    assert [(e.operation, e.token) for e in seen.of(ev.Refused)] == [("complete", claim.token)]
    assert seen.of(ev.Renew) == []


def test_a_dispatcher_reports_leases_lateness_marks_recalls_and_releases(
    pgstore_database: str, pgstore_schema: str
) -> None:
    seen = Recorder()
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    other = PgJobStore(pgstore_database, schema=pgstore_schema)
    now = store.now_ms()
    store.schedule("plain", now - 2_000)
    store.schedule("cancelled", now - 1_000)
    store.schedule("failing", now - 500)
    store.schedule("stolen", now - 250)
    recalled: list[tuple[str, str | None]] = []

    def dispatch(job: Job) -> str:
        if job.run_id == "cancelled":
            other.cancel("cancelled")
        if job.run_id == "failing" and job.lease_sequence == 1:
            raise RuntimeError("provider down")
        if job.run_id == "stolen" and job.lease_sequence == 1:
            # Once the others are answered, "stolen" is the only job a lease can take.
            deadline = time.monotonic() + WAIT
            while len(seen.of(ev.Complete)) < 3:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            taken = other.lease("thief", other.now_ms() + 120_000, 60_000)
            assert taken is not None and taken.run_id == "stolen"
        return f"bot-{job.run_id}"

    d = Dispatcher(store, dispatch, lambda job, worker: recalled.append((job.run_id, worker)),
                   holder="d1", ttl_ms=30_000, poll_interval=0.02, listen=False,
                   backoff=Backoff(base_ms=1, max_ms=1, jitter=0), on_event=seen)

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await until("four answers", lambda: len(seen.of(ev.Complete)) >= 4)
        d.stop()
        await task

    asyncio.run(main())
    store.close()
    other.close()
    claims = {(e.subject, e.token): e for e in seen.of(ev.Claim) if e.outcome == "claimed"}
    assert set(claims) == {("plain", 1), ("cancelled", 1), ("failing", 1), ("failing", 2),
                           ("stolen", 1)}
    dispatches = seen.of(ev.Dispatch)
    assert {(e.subject, e.token) for e in dispatches} == set(claims)
    for e in dispatches:
        claim = claims[e.subject, e.token]
        assert (claim.now, claim.due_at) == (e.now, e.dispatch_at)
        assert e.lateness_ms == e.now - e.dispatch_at
    late = {e.subject: e.lateness_ms for e in dispatches if e.token == 1}
    assert late["plain"] >= 2_000 and late["cancelled"] >= 1_000
    assert Counter((e.subject, e.outcome) for e in seen.of(ev.HandlerRun)) == Counter({
        ("plain", "ok"): 1, ("cancelled", "ok"): 1, ("failing", "error"): 1,
        ("failing", "ok"): 1, ("stolen", "ok"): 1})
    assert {(e.subject, e.token, e.outcome, e.worker_id)
            for e in seen.of(ev.Complete)} == {
        ("plain", 1, "completed", "bot-plain"), ("cancelled", 1, "cancelled", "bot-cancelled"),
        ("failing", 2, "completed", "bot-failing"), ("stolen", 1, "rejected", "bot-stolen")}
    assert [(e.subject, e.token, e.attempt, e.outcome) for e in seen.of(ev.Release)] == [
        ("failing", 1, 1, "released")]
    assert {(e.subject, e.reason, e.outcome, e.worker_id) for e in seen.of(ev.Recall)} == {
        ("cancelled", "cancelled", "ok", "bot-cancelled"), ("stolen", "taken", "ok",
                                                           "bot-stolen")}
    assert sorted(recalled) == [("cancelled", "bot-cancelled"), ("stolen", "bot-stolen")]
    assert [(e.operation, e.subject) for e in seen.of(ev.Refused)] == [
        ("mark_dispatched", "stolen")]


def test_a_dispatcher_renews_under_its_lease_sequence_and_reports_a_refusal(
    pgstore_database: str, pgstore_schema: str
) -> None:
    seen = Recorder()
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    store.schedule("long", store.now_ms() - 1)
    stolen = threading.Event()

    def dispatch(job: Job) -> str:
        deadline = time.monotonic() + WAIT
        while not any(e.outcome == "renewed" for e in seen.of(ev.Renew)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with PgJobStore(pgstore_database, schema=pgstore_schema) as thief:
            assert thief.lease("thief", thief.now_ms() + 60_000, 60_000) is not None
        stolen.set()
        while not seen.of(ev.LeaseLost):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return "bot"

    d = Dispatcher(store, dispatch, holder="d1", ttl_ms=450, poll_interval=0.02,
                   listen=False, on_event=seen)

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await until("the mark", lambda: bool(seen.of(ev.Complete)))
        d.stop()
        await task

    asyncio.run(main())
    store.close()
    renews = seen.of(ev.Renew)
    assert {e.token for e in renews} == {1}
    assert [e.outcome for e in renews][-1] == "refused"
    assert all(e.outcome == "renewed" for e in renews[:-1]) and len(renews) >= 2
    assert [(e.reason, e.token) for e in seen.of(ev.LeaseLost)] == [("refused", 1)]
    assert [e.operation for e in seen.of(ev.Refused)] == ["renew", "mark_dispatched"]
    assert [e.outcome for e in seen.of(ev.Complete)] == ["rejected"]
    assert [(e.reason, e.outcome) for e in seen.of(ev.Recall)] == [("taken", "none")]


def _terminate_listeners(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()"
            " AND datname = current_database()").fetchall()  # not other workers' listeners
    return len(rows)


def test_a_lost_listener_connection_and_its_reconnect_are_reported(
    pgstore_database: str, pgstore_schema: str
) -> None:
    seen = Recorder()
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    d = Dispatcher(store, lambda job: None, holder="d1", poll_interval=0.05, on_event=seen)

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await until("the listener", lambda: d._wakeups.wakeups is not None)
        assert d._wakeups.wakeups is not None
        await asyncio.wait_for(d._wakeups.wakeups.listening.wait(), WAIT)
        assert seen.of(ev.Reconnected) == []  # the first connection is not a reconnect
        for n in range(1, 3):
            assert await asyncio.to_thread(_terminate_listeners, pgstore_database) >= 1
            await until("the reconnect", lambda: len(seen.of(ev.Reconnected)) == n)  # noqa: B023
        d.stop()
        await task

    asyncio.run(main())
    store.close()
    lost = seen.of(ev.ConnectionLost)
    assert [e.component for e in lost] == ["listener", "listener"]
    assert all("terminat" in e.error for e in lost)
    assert [e.component for e in seen.of(ev.Reconnected)] == ["listener", "listener"]


def test_a_start_through_an_outage_reports_the_store_lost_then_back(
    pgstore_database: str, pgstore_schema: str, proxy: TcpProxy
) -> None:
    seen = Recorder()
    pool: ConnectionPool[Any] = ConnectionPool(
        proxy.dsn(pgstore_database), min_size=1, max_size=2, timeout=0.2,
        kwargs={"autocommit": True}, open=True)
    s = Scheduler(PgScheduleStore(pool, schema=pgstore_schema), owner="s1",
                  poll_interval=0.02, on_event=seen)
    s.every("t", 60_000, lambda: None)
    proxy.cut()

    async def main() -> None:
        try:
            start = asyncio.ensure_future(s.start())
            await until("failed starts", lambda: len(seen.of(ev.ConnectionLost)) >= 2)
        finally:
            proxy.restore()
        await asyncio.wait_for(start, WAIT)

    asyncio.run(main())
    pool.close()
    lost = seen.of(ev.ConnectionLost)
    assert {e.component for e in lost} == {"store"}
    assert all(e.error.startswith("PoolTimeout") for e in lost)
    assert [e.component for e in seen.of(ev.Reconnected)] == ["store"]
    assert [e.task_id for e in seen.of(ev.Registered)] == ["t"]


def test_a_subscriber_that_raises_changes_nothing_and_unsubscribing_stops_it(
    pgstore_database: str, pgstore_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen, later = Recorder(), Recorder()

    def broken(event: ev.Event) -> None:
        raise RuntimeError("subscriber bug")

    store = PgScheduleStore(pgstore_database, schema=pgstore_schema)
    s = Scheduler(store, owner="s1", poll_interval=0.02, on_event=broken)
    s.subscribe(seen)
    stop_later = s.subscribe(later)
    stop_later()
    s.every("t", 50, lambda: None)

    async def main() -> None:
        task = asyncio.ensure_future(s.run(handle_signals=False))
        await until("completes", lambda: len(seen.of(ev.Complete)) >= 3)
        s.stop()
        await task

    asyncio.run(main())
    store.close()
    assert {e.outcome for e in seen.of(ev.Complete)} == {"completed"}
    assert later.events == []
    assert "event subscriber" in caplog.text and "subscriber bug" in caplog.text


@pytest.mark.parametrize("bad", [1, "fn", object()])
def test_on_event_and_subscribe_take_only_callables(bad: Any) -> None:
    from pgstore import MemoryJobStore, MemoryScheduleStore

    with pytest.raises(InvalidArgument):
        Scheduler(MemoryScheduleStore(), on_event=bad)
    with pytest.raises(InvalidArgument):
        Dispatcher(MemoryJobStore(), lambda job: None, on_event=bad)
    with pytest.raises(InvalidArgument):
        Scheduler(MemoryScheduleStore()).subscribe(bad)
