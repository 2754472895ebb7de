"""Backends terminated (``pg_terminate_backend``) under the stores and the runtimes.

A call in flight is made to wait on a lock held by another connection, so it is
certainly in flight when its backend is terminated; then:

* the call raises psycopg's ``OperationalError`` (``AdminShutdown``, 57P01);
* its transaction was rolled back: the row is as before the call, and the same
  call, sent again, takes effect;
* the next call on the same store works: a pool drops the dead connection; a
  pooled connection whose backend died while it sat idle is replaced before a
  call uses it (no error at all); a store over a single ``Connection`` keeps
  failing with "the connection is closed" until the user reconnects;
* the Scheduler and the Dispatcher carry on, and nothing runs twice.

The retry tests at the end pin down what a blind retry of each call does when
its first attempt committed but the answer was lost (emulated by sending the
call twice): which calls are idempotent, and what the others cost.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from pgstore import (
    AsyncPgScheduleStore,
    CancelResult,
    CompletePatch,
    Dispatcher,
    Job,
    PgJobStore,
    PgScheduleStore,
    RunContext,
    Scheduler,
)
from tests.conftest import JobStoreUnderTest, StoreUnderTest

TIMEOUT = 10.0
#: The bound of a wait for a state that a loaded machine (a load average of 10 on two
#: cores) may take far longer than ``TIMEOUT`` to reach; reached in well under a second
#: on a quiet one, and the wait ends as soon as it is.
SETTLE = 60.0


def _app_name() -> str:
    return f"drop-{uuid.uuid4().hex[:10]}"


def _with_app(dsn: str, app: str) -> str:
    return make_conninfo(dsn, application_name=app)


def _backends(dsn: str, app: str, *, state: str | None = None) -> list[int]:
    """Pids of the backends of ``app`` (optionally only those in ``state``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
            " AND (%s::text IS NULL OR state = %s)",
            (app, state, state),
        ).fetchall()
    return [int(pid) for (pid,) in rows]


def _blocked_backend(dsn: str, app: str, function: str, timeout: float = TIMEOUT) -> int:
    """The pid of ``app``'s backend running ``function`` while it waits on a lock."""
    pid = _find_blocked(dsn, app, function, timeout)
    if pid is None:
        raise AssertionError(
            f"no backend of {app} blocked in {function}; its backends: {_activity(dsn, app)}"
        )
    return pid


def _find_blocked(dsn: str, app: str, function: str, timeout: float) -> int | None:
    """``_blocked_backend``, or None when there is none within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                " AND wait_event_type = 'Lock' AND query LIKE %s",
                (app, f"%{function}%"),
            ).fetchone()
            if row is not None:
                return int(row[0])
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)


def _activity(dsn: str, app: str) -> list[tuple[Any, ...]]:
    """What ``app``'s backends do: pid, state, wait event and the start of the query."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT pid, state, wait_event_type, wait_event, left(query, 60)"
            " FROM pg_stat_activity WHERE application_name = %s ORDER BY pid",
            (app,),
        ).fetchall()


def _terminate(dsn: str, pids: list[int]) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return len(pids)


def _kill_idle(dsn: str, app: str) -> int:
    """Terminate every idle backend of ``app``; how many (waits until they are gone)."""
    pids = _backends(dsn, app, state="idle")
    _terminate(dsn, pids)
    deadline = time.monotonic() + TIMEOUT
    while set(pids) & set(_backends(dsn, app)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(pids)


@contextmanager
def _row_locked(dsn: str, schema: str, table: str, key: str, value: str) -> Iterator[None]:
    """Hold ``SELECT ... FOR UPDATE`` on one row until the block ends."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            sql.SQL("SELECT 1 FROM {}.{} WHERE {} = %s FOR UPDATE").format(
                sql.Identifier(schema), sql.Identifier(table), sql.Identifier(key)
            ),
            (value,),
        )
        try:
            yield
        finally:
            conn.rollback()


def _in_flight_then_killed(
    dsn: str, schema: str, app: str, lock: tuple[str, str, str], function: str,
    call: Callable[[], Any],
) -> BaseException | None:
    """Run ``call`` in a thread while the row ``lock`` (table, key column, value) is held,
    terminate its backend once it waits on the lock, release; what the call raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    table, key, value = lock
    with _row_locked(dsn, schema, table, key, value):
        thread = threading.Thread(target=run)
        thread.start()
        _terminate(dsn, [_blocked_backend(dsn, app, function)])
        thread.join(TIMEOUT)
    assert not thread.is_alive()
    return raised[0] if raised else None


def _assert_terminated(exc: BaseException | None) -> None:
    assert isinstance(exc, psycopg.OperationalError), repr(exc)
    assert "terminating connection due to administrator command" in str(exc)


# --- the stores ------------------------------------------------------------------


def test_sync_store_own_pool(pgstore_database: str, pgstore_schema: str) -> None:
    dsn, app = pgstore_database, _app_name()
    store = PgScheduleStore(_with_app(dsn, app), schema=pgstore_schema)
    store.start()
    try:
        store.register("t", "interval", "1000", 100, 10)
        exc = _in_flight_then_killed(
            dsn, pgstore_schema, app, ("schedules", "id", "t"), "schedule_claim_due",
            lambda: store.claim_due("t", "w", 200, 1_000),
        )
        _assert_terminated(exc)
        record = store.get("t")  # the next call works, on another connection
        assert record is not None
        assert (record.fencing_token, record.lease_owner) == (0, None)  # rolled back
        claim = store.claim_due("t", "w", 200, 1_000)
        assert claim is not None and claim.fencing_token == 1

        # Backends that die while their connections sit idle in the pool: no call fails.
        assert _kill_idle(dsn, app) >= 1
        assert store.renew("t", 1, 5_000) is True
        assert _kill_idle(dsn, app) >= 1
        assert store.complete("t", 1, CompletePatch(1_100, 200, "ok"), 300) is True
    finally:
        store.close()


def test_sync_store_own_pool_survives_every_idle_connection_dying(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """A server restart kills every idle connection at once: the next call still works,
    at once (psycopg_pool's ``check=`` would sleep 1 s, 2 s, 4 s... between them)."""
    dsn, app = pgstore_database, _app_name()
    store = PgScheduleStore(_with_app(dsn, app), schema=pgstore_schema)
    store.start()
    try:
        barrier = threading.Barrier(8)

        def busy() -> None:  # eight borrowers at once: the pool grows to eight connections
            with store._runner._pool.connection():  # type: ignore[union-attr]
                barrier.wait(TIMEOUT)

        threads = [threading.Thread(target=busy) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert _kill_idle(dsn, app) == 8
        started = time.monotonic()
        assert store.get("nope") is None
        assert time.monotonic() - started < 1.0
        assert len(_backends(dsn, app)) >= 1
    finally:
        store.close()


def test_async_store_own_pool(pgstore_database: str, pgstore_schema: str) -> None:
    dsn, app = pgstore_database, _app_name()

    async def main() -> None:
        store = AsyncPgScheduleStore(_with_app(dsn, app), schema=pgstore_schema)
        await store.start()
        try:
            await store.register("t", "interval", "1000", 100, 10)
            claim = await store.claim_due("t", "w", 200, 1_000)
            assert claim is not None
            patch = CompletePatch(1_100, 200, "ok")
            raised: list[BaseException] = []

            async def complete() -> None:
                try:
                    await store.complete("t", claim.fencing_token, patch, 300)
                except BaseException as exc:
                    raised.append(exc)

            with _row_locked(dsn, pgstore_schema, "schedules", "id", "t"):
                task = asyncio.ensure_future(complete())
                pid = await asyncio.to_thread(_blocked_backend, dsn, app, "schedule_complete")
                await asyncio.to_thread(_terminate, dsn, [pid])
                await asyncio.wait_for(task, TIMEOUT)
            _assert_terminated(raised[0] if raised else None)
            record = await store.get("t")
            assert record is not None and record.lease_owner == "w"  # not completed
            assert await store.complete("t", claim.fencing_token, patch, 300) is True

            assert await asyncio.to_thread(_kill_idle, dsn, app) >= 1
            assert (await store.get("t")) is not None
        finally:
            await store.close()

    asyncio.run(main())


def test_job_store_over_a_user_pool(pgstore_database: str, pgstore_schema: str) -> None:
    dsn, app = pgstore_database, _app_name()
    # The user's pool, left at psycopg's defaults (no autocommit, no check): the
    # pool commits each call.
    with ConnectionPool(dsn, min_size=2, max_size=4, kwargs={"application_name": app}) as pool:
        store = PgJobStore(pool, schema=pgstore_schema)
        store.start()
        store.schedule("m", 100)
        job = store.lease("d1", 100, 10_000)
        assert job is not None
        exc = _in_flight_then_killed(
            dsn, pgstore_schema, app, ("jobs", "run_id", "m"), "job_mark_dispatched",
            lambda: store.mark_dispatched("m", "d1", "bot-1"),
        )
        _assert_terminated(exc)
        after = store.get("m")
        assert after is not None and not after.dispatched and after.worker_id is None
        mark = store.mark_dispatched("m", "d1", "bot-1")
        assert (mark.recorded, mark.cancelled) == (True, False)

        assert _kill_idle(dsn, app) >= 1
        assert store.cancel("m") is CancelResult.ALREADY_DISPATCHED
        dispatched = store.get("m")
        assert dispatched is not None and dispatched.worker_id == "bot-1"


def test_store_over_one_user_connection(pgstore_database: str, pgstore_schema: str) -> None:
    """A dead connection cannot be replaced by the store: every later call says the
    connection is closed, until the user makes a new store over a new connection."""
    dsn, app = pgstore_database, _app_name()
    conn = psycopg.connect(_with_app(dsn, app), autocommit=True)
    try:
        store = PgScheduleStore(conn, schema=pgstore_schema)
        store.start()
        store.register("t", "interval", "1000", 100, 10)
        exc = _in_flight_then_killed(
            dsn, pgstore_schema, app, ("schedules", "id", "t"), "schedule_claim_due",
            lambda: store.claim_due("t", "w", 200, 1_000),
        )
        _assert_terminated(exc)
        assert conn.closed
        with pytest.raises(psycopg.OperationalError, match="the connection is closed"):
            store.get("t")
    finally:
        conn.close()
    with psycopg.connect(dsn, autocommit=True) as fresh:
        again = PgScheduleStore(fresh, schema=pgstore_schema)
        record = again.get("t")
        assert record is not None and record.fencing_token == 0  # the claim rolled back
        assert again.claim_due("t", "w", 200, 1_000) is not None


def test_explicit_transaction_lost_with_its_connection(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """Autocommit off: the calls of the user's transaction are lost together."""
    dsn, app = pgstore_database, _app_name()
    with psycopg.connect(_with_app(dsn, app)) as conn:
        store = PgScheduleStore(conn, schema=pgstore_schema)
        store.register("a", "interval", "1000", 100, 10)
        store.register("b", "interval", "1000", 100, 10)
        _terminate(dsn, _backends(dsn, app))
        with pytest.raises(psycopg.OperationalError):
            conn.commit()
    with PgScheduleStore(dsn, schema=pgstore_schema) as check:
        assert check.list() == []


# --- the runtimes ----------------------------------------------------------------


def test_scheduler_carries_on_when_its_connections_die(
    pgstore_database: str, pgstore_schema: str
) -> None:
    dsn, app = pgstore_database, _app_name()
    runs: list[tuple[int, int]] = []
    lock = threading.Lock()

    def record(ctx: RunContext) -> None:
        with lock:
            runs.append((ctx.scheduled_at, ctx.fencing_token))

    store = PgScheduleStore(_with_app(dsn, app), schema=pgstore_schema)
    scheduler = Scheduler(store, owner="s1", lease_ms=3_000, poll_interval=0.02,
                          grace_period=2.0)
    scheduler.every("tick", 100, record)
    killed: list[str] = []

    def count() -> int:
        with lock:
            return len(runs)

    def wait_for_runs(n: int) -> None:
        deadline = time.monotonic() + TIMEOUT
        while count() < n:
            assert time.monotonic() < deadline, f"only {count()} runs"
            time.sleep(0.02)

    def attack() -> None:
        wait_for_runs(3)
        for _ in range(3):  # connections dying while idle in the pool
            assert _kill_idle(dsn, app) >= 1
            killed.append("idle")
            wait_for_runs(count() + 2)
        for _ in range(2):  # a claim_next in flight (waiting on the table lock)
            with psycopg.connect(dsn) as locker:
                locker.execute(
                    sql.SQL("LOCK TABLE {}.schedules IN EXCLUSIVE MODE").format(
                        sql.Identifier(pgstore_schema)
                    )
                )
                _terminate(dsn, [_blocked_backend(dsn, app, "schedule_claim_next")])
                killed.append("claim_next")
            wait_for_runs(count() + 2)

    async def main() -> None:
        runner = asyncio.ensure_future(scheduler.run())
        await asyncio.to_thread(attack)
        at_last_kill = count()
        await asyncio.to_thread(wait_for_runs, at_last_kill + 3)  # it carries on
        scheduler.stop()
        await runner

    asyncio.run(main())
    store.close()
    assert killed == ["idle"] * 3 + ["claim_next"] * 2
    occurrences = Counter(at for at, _ in runs)
    assert [at for at, n in occurrences.items() if n > 1] == []  # nothing ran twice
    tokens = [token for _, token in sorted(runs)]
    assert tokens == list(range(1, len(tokens) + 1))  # no claim lost or repeated
    with PgScheduleStore(dsn, schema=pgstore_schema) as check:
        final = check.get("tick")
    assert final is not None and final.fencing_token in (len(runs), len(runs) + 1)


def test_scheduler_complete_killed_in_flight_does_not_run_twice(
    pgstore_database: str, pgstore_schema: str
) -> None:
    dsn, app = pgstore_database, _app_name()
    runs: list[tuple[int, int]] = []
    lock = threading.Lock()
    held: list[psycopg.Connection[Any]] = []

    def record(ctx: RunContext) -> None:
        with lock:
            runs.append((ctx.scheduled_at, ctx.fencing_token))
            n = len(runs)
        if n == 3:  # hold the record's row: this run's complete will wait on it
            locker = psycopg.connect(dsn)
            locker.execute(
                sql.SQL("SELECT 1 FROM {}.schedules WHERE id = 'tick' FOR UPDATE").format(
                    sql.Identifier(pgstore_schema)
                )
            )
            held.append(locker)

    store = PgScheduleStore(_with_app(dsn, app), schema=pgstore_schema)
    scheduler = Scheduler(store, owner="s1", lease_ms=600, poll_interval=0.02,
                          grace_period=2.0)
    scheduler.every("tick", 100, record)

    def attack() -> None:
        _terminate(dsn, [_blocked_backend(dsn, app, "schedule_complete")])
        held[0].rollback()
        held[0].close()
        time.sleep(1.5)  # past the lease: a lost complete would be claimed and run again

    async def main() -> None:
        runner = asyncio.ensure_future(scheduler.run())
        await asyncio.to_thread(attack)
        scheduler.stop()
        await runner

    asyncio.run(main())
    store.close()
    occurrences = Counter(at for at, _ in runs)
    assert len(runs) >= 6
    assert [at for at, n in occurrences.items() if n > 1] == []


def test_dispatcher_carries_on_when_its_connections_die(
    pgstore_database: str, pgstore_schema: str
) -> None:
    dsn, app = pgstore_database, _app_name()
    sent: list[str] = []
    lock = threading.Lock()
    held: list[psycopg.Connection[Any]] = []
    n_jobs = 30

    def dispatch(job: Job) -> str:
        with lock:
            sent.append(job.run_id)
            n = len(sent)
        if n == 5:  # hold the job's row: its mark_dispatched will wait on it
            locker = psycopg.connect(dsn)
            locker.execute(
                sql.SQL("SELECT 1 FROM {}.jobs WHERE run_id = %s FOR UPDATE").format(
                    sql.Identifier(pgstore_schema)
                ),
                (job.run_id,),
            )
            held.append(locker)
        return f"bot-{job.run_id}"

    producer = PgJobStore(dsn, schema=pgstore_schema)
    producer.start()
    now = producer.now_ms()
    run_ids = [f"meeting-{n:02d}" for n in range(n_jobs)]
    for n, run_id in enumerate(run_ids):
        producer.schedule(run_id, now + 60 * n)  # due over about 2 s
    later = [f"meeting-{n:02d}" for n in range(n_jobs, n_jobs + 5)]  # after the last kill
    store = PgJobStore(_with_app(dsn, app), schema=pgstore_schema)
    dispatcher = Dispatcher(store, dispatch, holder="d1", ttl_ms=5_000, poll_interval=0.02,
                            concurrency=2)
    killed: list[str] = []

    def count() -> int:
        with lock:
            return len(sent)

    def attack() -> None:
        # A mark_dispatched in flight: the dispatcher retries it.
        _terminate(dsn, [_blocked_backend(dsn, app, "job_mark_dispatched", SETTLE)])
        killed.append("mark_dispatched")
        held[0].rollback()
        held[0].close()
        # Connections dying while idle in the pool (the listener's too).
        for _ in range(3):
            time.sleep(0.15)
            _kill_idle(dsn, app)
            killed.append("idle")
        # A lease in flight (waiting on the table lock). The lock holds up the runs'
        # marks and renews too, and the dispatcher leases only with a slot free: taken
        # while each slot holds a run (jobs backed up, as on a loaded machine), it
        # holds those runs, and no lease call comes. So it is let go for them to end
        # and taken again, each time for at most 2 s (well under ttl_ms), until a
        # lease waits on it.
        deadline = time.monotonic() + SETTLE
        while killed[-1] != "lease":
            with psycopg.connect(dsn) as locker:
                locker.execute(
                    sql.SQL("LOCK TABLE {}.jobs IN EXCLUSIVE MODE").format(
                        sql.Identifier(pgstore_schema)
                    )
                )
                pid = _find_blocked(dsn, app, "job_lease", 2.0)
                if pid is not None:
                    _terminate(dsn, [pid])
                    killed.append("lease")
                else:
                    assert time.monotonic() < deadline, (
                        f"no backend of {app} blocked in job_lease; its backends:"
                        f" {_activity(dsn, app)}"
                    )
        # It carries on: jobs scheduled after the lease died are dispatched too.
        now = producer.now_ms()
        for n, run_id in enumerate(later):
            producer.schedule(run_id, now + 60 * n)
        deadline = time.monotonic() + SETTLE
        while _pending(producer, run_ids + later) and time.monotonic() < deadline:
            time.sleep(0.05)

    async def main() -> None:
        runner = asyncio.ensure_future(dispatcher.run())
        await asyncio.to_thread(attack)
        dispatcher.stop()
        await runner

    asyncio.run(main())
    store.close()
    final = {run_id: producer.get(run_id) for run_id in run_ids + later}
    producer.close()
    assert killed == ["mark_dispatched", "idle", "idle", "idle", "lease"]
    counts = Counter(sent)
    assert [r for r, n in counts.items() if n > 1] == []  # no bot sent twice
    for run_id in run_ids + later:
        job = final[run_id]
        assert job is not None and job.dispatched, run_id  # every job was sent
        assert job.worker_id == f"bot-{run_id}" and counts[run_id] == 1, run_id
    assert count() == n_jobs + len(later)


def _pending(store: PgJobStore, run_ids: list[str]) -> list[str]:
    return [r for r in run_ids if not (job := store.get(r)) or not job.dispatched]


# --- what a blind retry does ----------------------------------------------------------
# Each test sends a call twice: the first attempt stands for one that committed but
# whose answer was lost with its connection; the second is the caller's blind retry.


def test_retry_register_is_idempotent(schedules: StoreUnderTest) -> None:
    s = schedules.store
    first = s.register("t", "interval", "1000", 100, 10)
    assert s.register("t", "interval", "1000", 100, 10) == first
    assert schedules.state() == ([first], {})


def test_retry_claim_leaves_a_lease_nobody_holds_until_it_expires(
    schedules: StoreUnderTest,
) -> None:
    s = schedules.store
    s.register("t", "interval", "1000", 100, 10)
    lost = s.claim_due("t", "w", 200, 1_000)  # committed; the answer never arrived
    assert lost is not None
    assert s.claim_due("t", "w", 200, 1_000) is None  # the retry: "not claimable"
    assert s.claim_next("w", 1_199, 1_000, 5, ["t"]) == []  # ... until the lease expires
    # The owner can find its claim (and token) again: it is the record's lease.
    record = s.get("t")
    assert record is not None
    assert (record.lease_owner, record.fencing_token) == ("w", lost.fencing_token)
    again = s.claim_due("t", "w", 1_200, 1_000)  # delayed by lease_ms, then claimable
    assert again is not None and again.fencing_token == lost.fencing_token + 1


def test_retry_renew_is_idempotent(schedules: StoreUnderTest) -> None:
    s = schedules.store
    s.register("t", "interval", "1000", 100, 10)
    claim = s.claim_due("t", "w", 200, 1_000)
    assert claim is not None
    assert s.renew("t", claim.fencing_token, 5_000) is True
    before = schedules.state()
    assert s.renew("t", claim.fencing_token, 5_000) is True
    assert schedules.state() == before


def test_retry_complete_after_success_answers_false(schedules: StoreUnderTest) -> None:
    s = schedules.store
    s.register("t", "interval", "1000", 100, 10)
    claim = s.claim_due("t", "w", 200, 1_000)
    assert claim is not None
    patch = CompletePatch(1_100, 200, "ok")
    assert s.complete("t", claim.fencing_token, patch, 300) is True
    before = schedules.state()
    assert s.complete("t", claim.fencing_token, patch, 300) is False  # spent: ambiguous
    assert schedules.state() == before
    # What tells "mine committed" from "stale": the token is still mine, the lease is
    # cleared and last_run_at is my patch's.
    record = s.get("t")
    assert record is not None
    assert (record.fencing_token, record.lease_owner, record.last_run_at) == (
        claim.fencing_token, None, 200
    )


def test_retry_delete_is_idempotent(schedules: StoreUnderTest) -> None:
    s = schedules.store
    s.register("t", "interval", "1000", 100, 10)
    s.claim_due("t", "w", 200, 1_000)
    s.delete("t")
    before = schedules.state()
    s.delete("t")
    assert schedules.state() == before == ([], {"t": 1})


def test_retry_schedule_is_idempotent(jobs: JobStoreUnderTest) -> None:
    j = jobs.store
    j.schedule("m", 100)
    before = jobs.state()
    j.schedule("m", 100)
    assert jobs.state() == before


def test_retry_lease_leaves_the_job_leased_until_ttl(jobs: JobStoreUnderTest) -> None:
    j = jobs.store
    j.schedule("m", 100)
    lost = j.lease("d1", 100, 1_000)  # committed; the answer never arrived
    assert lost is not None and lost.run_id == "m"
    assert j.lease("d1", 100, 1_000) is None  # the retry: nothing leasable
    assert j.lease("d1", 1_099, 1_000) is None
    again = j.lease("d1", 1_100, 1_000)  # delayed by ttl_ms
    assert again is not None and again.run_id == "m"


def test_retry_renew_job_is_idempotent(jobs: JobStoreUnderTest) -> None:
    j = jobs.store
    j.schedule("m", 100)
    j.lease("d1", 100, 1_000)
    assert j.renew("m", "d1", 500, 1_000) is True
    before = jobs.state()
    assert j.renew("m", "d1", 500, 1_000) is True
    assert jobs.state() == before


@pytest.mark.parametrize("cancel_first", [False, True])
def test_retry_mark_dispatched_is_idempotent(
    jobs: JobStoreUnderTest, cancel_first: bool
) -> None:
    j = jobs.store
    j.schedule("m", 100)
    j.lease("d1", 100, 1_000)
    if cancel_first:
        j.cancel("m")
    first = j.mark_dispatched("m", "d1", "bot-1")
    before = jobs.state()
    assert j.mark_dispatched("m", "d1", "bot-1") == first
    assert (first.recorded, first.cancelled) == (True, cancel_first)
    assert jobs.state() == before


def test_retry_release_after_success_answers_false(jobs: JobStoreUnderTest) -> None:
    j = jobs.store
    j.schedule("m", 100)
    j.lease("d1", 100, 1_000)
    assert j.release("m", "d1", 5_000) is True
    before = jobs.state()
    assert j.release("m", "d1", 5_000) is False  # ambiguous after a lost answer
    assert jobs.state() == before
    job = j.get("m")  # what tells "mine committed": no holder, dispatch_at = retry_at
    assert job is not None
    assert (job.lease_holder, job.dispatch_at) == (None, 5_000)


def test_retry_cancel_is_idempotent(jobs: JobStoreUnderTest) -> None:
    j = jobs.store
    j.schedule("m", 100)
    assert j.cancel("m") is CancelResult.CANCELLED
    before = jobs.state()
    assert j.cancel("m") is CancelResult.CANCELLED
    assert jobs.state() == before


def test_retry_remove_is_idempotent(jobs: JobStoreUnderTest) -> None:
    j = jobs.store
    j.schedule("m", 100)
    j.remove("m")
    j.remove("m")
    assert jobs.state() == []
