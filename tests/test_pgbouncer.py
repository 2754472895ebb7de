"""The stores and the runtimes behind PgBouncer in transaction pooling mode.

The conformance suites run through it too (the ``*_bouncer`` store kinds in
``conftest.py``); these tests cover what they cannot: the fixture really pools
by transaction, statements are never prepared by psycopg's ``prepare_threshold``,
a user's explicit transaction holds, the runtimes work,
and backends terminated behind the bouncer.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from pgstore import (
    AsyncPgJobStore,
    CompletePatch,
    Dispatcher,
    Job,
    PgJobStore,
    PgScheduleStore,
    RunContext,
    Scheduler,
)
from pgstore.testing import PgBouncer, drop_schema
from tests.support.wakeup import wake_up_latency

TIMEOUT = 10.0


@pytest.fixture
def bounced(pgstore_pgbouncer: PgBouncer, pgstore_database: str) -> str:
    """The session database's conninfo through pgbouncer."""
    return pgstore_pgbouncer.dsn_for(pgstore_database)


def test_the_fixture_pools_by_transaction(bounced: str) -> None:
    with psycopg.connect(bounced, autocommit=True) as a, psycopg.connect(bounced) as b:
        row = a.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        # a's server connection went back to the pool after its statement: b's
        # transaction gets it (pgbouncer reuses the last one freed).
        assert b.execute("SELECT pg_backend_pid()").fetchone() == row
        assert a.execute("SELECT pg_backend_pid()").fetchone() != row  # b holds it now
        b.rollback()


def test_calls_are_never_prepared_whatever_the_connection(
    bounced: str, pgstore_schema: str
) -> None:
    """psycopg prepares a statement on its 5th run (``prepare_threshold``) by default;
    through transaction pooling that breaks (26000 / 42P05) unless the pooler keeps
    prepared statements. The stores' calls never follow that threshold: by default they
    are sent unprepared through a pgbouncer that forwards statements as they are (1.18,
    or 1.21+ with max_prepared_statements = 0) and prepared through one that keeps them
    (test_prepare.py tells which), over their own pools and the user's connections."""
    errors: list[BaseException] = []
    conns = [psycopg.connect(bounced, autocommit=True) for _ in range(3)]
    pool = ConnectionPool(bounced, min_size=2, max_size=4, open=True)
    stores = [PgScheduleStore(c, schema=pgstore_schema) for c in conns]
    stores += [PgScheduleStore(pool, schema=pgstore_schema),
               PgScheduleStore(bounced, schema=pgstore_schema)]

    def work(n: int, store: PgScheduleStore) -> None:
        try:
            for i in range(40):
                store.register(f"t{n}-{i % 3}", "interval", "1000", 100, 10)
                store.get(f"t{n}-0")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n, s)) for n, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in conns:
        c.close()
    pool.close()
    stores[-1].close()
    assert errors == []

    async def one_async_connection() -> None:
        aconn = await psycopg.AsyncConnection.connect(bounced, autocommit=True)
        async with aconn:
            store = AsyncPgJobStore(aconn, schema=pgstore_schema)
            for i in range(20):
                await store.schedule(f"m{i % 2}", 100 + i)
                await store.get("m0")

    async def main() -> None:
        await asyncio.gather(*(one_async_connection() for _ in range(3)))

    asyncio.run(main())


def test_an_explicit_transaction_through_pgbouncer(
    bounced: str, pgstore_database: str, pgstore_schema: str
) -> None:
    """Autocommit off: pgbouncer keeps one server connection for the whole transaction;
    the calls join it, and the user commits or rolls back."""
    direct = PgJobStore(pgstore_database, schema=pgstore_schema)
    with psycopg.connect(bounced) as conn:
        store = PgJobStore(conn, schema=pgstore_schema)
        store.schedule("m", 100)
        job = store.lease("d1", 100, 10_000)
        assert job is not None and job.run_id == "m"
        assert store.renew("m", "d1", 200, 10_000) is True
        assert direct.get("m") is None  # not committed yet
        conn.commit()
        leased = direct.get("m")
        assert leased is not None and leased.lease_holder == "d1"
        assert store.mark_dispatched("m", "d1", "bot-1").recorded
        store.schedule("n", 100)
        conn.rollback()
    after = direct.get("m")
    assert after is not None and not after.dispatched and direct.get("n") is None
    direct.close()


def test_auto_migrate_through_pgbouncer(bounced: str, pgstore_database: str) -> None:
    schema = f"pgstore_{uuid.uuid4().hex[:12]}"
    store = PgScheduleStore(bounced, schema=schema, auto_migrate=True)
    try:
        store.start()
        assert store.register("t", "once", "1", 100, 10).fencing_token == 0
    finally:
        store.close()
        drop_schema(pgstore_database, schema)


def test_a_backend_terminated_behind_pgbouncer(
    bounced: str, pgstore_database: str, pgstore_schema: str
) -> None:
    """pgbouncer closes the client connection whose server connection died in a
    transaction: the call raises, the store's pool replaces it, the next call works."""
    store = PgScheduleStore(bounced, schema=pgstore_schema)
    store.register("t", "interval", "1000", 100, 10)
    raised: list[BaseException] = []

    def claim() -> None:
        try:
            store.claim_due("t", "w", 200, 1_000)
        except BaseException as exc:
            raised.append(exc)

    with psycopg.connect(pgstore_database) as locker, \
            psycopg.connect(pgstore_database, autocommit=True) as admin:
        locker.execute(
            psycopg.sql.SQL("SELECT 1 FROM {}.schedules WHERE id = 't' FOR UPDATE").format(
                psycopg.sql.Identifier(pgstore_schema)
            )
        )
        thread = threading.Thread(target=claim)
        thread.start()
        deadline = time.monotonic() + TIMEOUT
        while True:
            row = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"  # not another session's (xdist worker's)
                " AND query LIKE '%schedule_claim_due%'"
            ).fetchone()
            if row is not None or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert row is not None
        admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        thread.join(TIMEOUT)
        locker.rollback()
        assert len(raised) == 1 and isinstance(raised[0], psycopg.OperationalError)
        record = store.get("t")
        assert record is not None and record.fencing_token == 0
        claim_after = store.claim_due("t", "w", 200, 1_000)
        assert claim_after is not None and claim_after.fencing_token == 1
        # Server connections dying idle in pgbouncer's pool: pgbouncer replaces them.
        idle = [
            pid for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND state = 'idle' AND pid <> pg_backend_pid()"
            )
        ]
        assert idle
        for pid in idle:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        while admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (idle,)
        ).fetchone() != (0,):
            time.sleep(0.01)
        time.sleep(0.2)
        assert store.complete("t", 1, CompletePatch(1_100, 200, "ok"), 300) is True
    store.close()


def test_the_runtimes_through_pgbouncer(bounced: str, pgstore_schema: str) -> None:
    """Scheduler and Dispatcher over stores behind pgbouncer. LISTEN does not survive
    transaction pooling: the dispatcher falls back on its polling (README)."""
    runs: list[int] = []
    sent: list[str] = []
    lock = threading.Lock()

    def tick(ctx: RunContext) -> None:
        with lock:
            runs.append(ctx.scheduled_at)

    def dispatch(job: Job) -> str:
        with lock:
            sent.append(job.run_id)
        return f"bot-{job.run_id}"

    schedules = PgScheduleStore(bounced, schema=pgstore_schema)
    jobs = PgJobStore(bounced, schema=pgstore_schema)
    scheduler = Scheduler(schedules, owner="s", lease_ms=5_000, poll_interval=0.02)
    scheduler.every("tick", 100, tick)
    dispatcher = Dispatcher(jobs, dispatch, holder="d", poll_interval=0.05)
    producer = PgJobStore(bounced, schema=pgstore_schema)
    now = producer.now_ms()
    run_ids = [f"m{n}" for n in range(10)]
    for n, run_id in enumerate(run_ids):
        producer.schedule(run_id, now + 50 * n)

    async def main() -> None:
        tasks = [asyncio.ensure_future(r.run()) for r in (scheduler, dispatcher)]
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            with lock:
                if len(runs) >= 8 and len(sent) == len(run_ids):
                    break
            await asyncio.sleep(0.05)
        scheduler.stop()
        dispatcher.stop()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    dispatched = [producer.get(r) for r in run_ids]
    for store in (schedules, jobs, producer):
        store.close()
    assert len(runs) >= 8 and [at for at, n in Counter(runs).items() if n > 1] == []
    assert Counter(sent) == Counter(run_ids)
    assert all(job is not None and job.dispatched for job in dispatched)


def test_a_dispatcher_behind_pgbouncer_wakes_through_a_direct_listen_conninfo(
    bounced: str, pgstore_database: str, pgstore_schema: str
) -> None:
    got = threading.Event()
    store = PgJobStore(bounced, schema=pgstore_schema)
    dispatcher = Dispatcher(store, lambda job: got.set(), holder="idle", poll_interval=30.0,
                            listen=pgstore_database)
    producer = PgJobStore(bounced, schema=pgstore_schema)
    producer.start()

    latency = wake_up_latency(dispatcher, producer, got)
    producer.close()
    store.close()
    assert got.is_set() and latency < 5.0  # far below the 30 s poll
