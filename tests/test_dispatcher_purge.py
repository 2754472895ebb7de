"""The Dispatcher's retention (purge_after) on PostgreSQL: rounds at start and every
interval, in batches, only jobs finished long enough ago; off by default; a store
connected as the client role is refused at start."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgstore import Job, MemoryJobStore, NotPermitted, PgJobStore
from pgstore.runtime import events as ev
from pgstore.runtime.dispatcher import Dispatcher
from pgstore.testing import drop_schema, install_schema
from tests.support.waiting import WAIT, until

DAY = 86_400_000



def _never(job: Job) -> None:
    raise AssertionError(f"nothing is due, yet {job.run_id} was dispatched")


def _finished(dsn: str, schema: str, run_ids: list[str], age_ms: int) -> None:
    """Dispatch ``run_ids`` and date their finish ``age_ms`` back.

    They are due a day ahead and leased with a clock a day ahead, so a Dispatcher
    running beside this (on the server's clock) never leases them itself.
    """
    with PgJobStore(dsn, schema=schema) as jobs:
        for run_id in run_ids:
            ahead = jobs.now_ms() + DAY
            jobs.schedule(run_id, ahead)
            leased = jobs.lease("earlier", ahead, 60_000)
            assert leased is not None and leased.run_id == run_id
            assert jobs.mark_dispatched(run_id, "earlier", "bot").recorded
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(
            "UPDATE {}.jobs SET finished_at = {}.now_ms() - %s, lease_until = 0"
            " WHERE run_id = ANY(%s)").format(sql.Identifier(schema), sql.Identifier(schema)),
            (age_ms, run_ids))


def _run_ids(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT run_id FROM {}.jobs ORDER BY run_id").format(
            sql.Identifier(schema))).fetchall()
    return [r[0] for r in rows]


def test_purge_after_deletes_only_jobs_finished_long_enough_ago_in_batches(
    pgstore_database: str, pgstore_schema: str
) -> None:
    dsn, schema = pgstore_database, pgstore_schema
    old = [f"old-{n:02d}" for n in range(12)]
    _finished(dsn, schema, old, 8 * DAY)
    _finished(dsn, schema, ["recent-1", "recent-2"], 1 * DAY)
    with PgJobStore(dsn, schema=schema) as jobs:
        jobs.schedule("waiting", jobs.now_ms() + DAY)
        jobs.schedule("cancelled-old", jobs.now_ms() + DAY)
        jobs.cancel("cancelled-old")
        jobs.schedule("held-old", jobs.now_ms() - 1)
        assert jobs.lease("h", None, 600_000) is not None
        jobs.cancel("held-old")  # finished, but its lease is live: kept
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {}.jobs SET finished_at = finished_at - %s WHERE run_id"
                             " IN ('cancelled-old', 'held-old')").format(sql.Identifier(schema)),
                     (8 * DAY,))
    rounds: list[ev.Purge] = []
    store = PgJobStore(dsn, schema=schema)
    d = Dispatcher(store, _never, holder="d1", poll_interval=0.05, listen=False,
                   purge_after=timedelta(days=7), purge_batch=5,
                   on_event=lambda e: rounds.append(e) if isinstance(e, ev.Purge) else None)

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await until("a round", lambda: bool(rounds))
        d.stop()
        await task

    started = store.now_ms()
    asyncio.run(main())
    store.close()
    [done] = rounds
    assert (done.outcome, done.deleted, done.batches) == ("ok", 13, 3)  # 5 + 5 + 3
    assert done.before is not None and started - 7 * DAY <= done.before <= started - 7 * DAY + WAIT * 1000
    assert _run_ids(dsn, schema) == ["held-old", "recent-1", "recent-2", "waiting"]


def test_rounds_repeat_every_purge_interval(pgstore_database: str, pgstore_schema: str) -> None:
    dsn, schema = pgstore_database, pgstore_schema
    rounds: list[ev.Purge] = []
    store = PgJobStore(dsn, schema=schema)
    d = Dispatcher(store, _never, holder="d1", poll_interval=0.05, listen=False,
                   purge_after=1_000, purge_interval=0.2,
                   on_event=lambda e: rounds.append(e) if isinstance(e, ev.Purge) else None)

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await until("the first round", lambda: bool(rounds))
        assert rounds[0].deleted == 0
        await asyncio.to_thread(_finished, dsn, schema, ["a", "b", "c"], 5_000)
        await until("a round that deletes them", lambda: sum(r.deleted for r in rounds) == 3)
        d.stop()
        await task

    asyncio.run(main())
    store.close()
    assert len(rounds) >= 2 and all(r.outcome == "ok" for r in rounds)
    assert _run_ids(dsn, schema) == []


def test_retention_is_off_by_default(pgstore_database: str, pgstore_schema: str) -> None:
    dsn, schema = pgstore_database, pgstore_schema
    _finished(dsn, schema, ["ancient"], 365 * DAY)
    seen: list[ev.Event] = []
    store = PgJobStore(dsn, schema=schema)
    d = Dispatcher(store, _never, holder="d1", poll_interval=0.05, listen=False,
                   on_event=seen.append)
    assert d.purge_after_ms is None

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await asyncio.sleep(0.5)
        d.stop()
        await task

    asyncio.run(main())
    store.close()
    assert not any(isinstance(e, ev.Purge) for e in seen)
    assert _run_ids(dsn, schema) == ["ancient"]


def test_a_client_role_store_is_refused_at_start_and_nothing_is_purged(
    pgstore_database: str, pgstore_schema: str
) -> None:
    dsn = pgstore_database
    schema = f"{pgstore_schema}_c"
    role = f"{schema}_client"
    install_schema(dsn, schema, client_role=role)
    try:
        _finished(dsn, schema, ["ancient"], 365 * DAY)
        client_dsn = make_conninfo(dsn, options=f"-c role={role}")
        store = PgJobStore(client_dsn, schema=schema)
        d = Dispatcher(store, _never, holder="d1", listen=False, purge_after=timedelta(days=7))
        with pytest.raises(NotPermitted) as refused:
            asyncio.run(d.start())
        assert "job_purge" in str(refused.value) and "owner" in str(refused.value)
        assert refused.value.sqlstate == "42501"
        # The same store without retention starts: the refusal is about the purge alone.
        plain = Dispatcher(store, _never, holder="d2", listen=False)
        asyncio.run(plain.start())
        store.close()
        assert _run_ids(dsn, schema) == ["ancient"]
    finally:
        drop_schema(dsn, schema)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(
                sql.Identifier(role)))


def test_a_failed_round_is_reported_and_the_next_one_retries(
    pgstore_database: str, pgstore_schema: str
) -> None:
    dsn, schema = pgstore_database, pgstore_schema
    rounds: list[ev.Purge] = []
    # The purge's DELETE waits on a lock past this store's statement timeout: it fails.
    store = PgJobStore(make_conninfo(dsn, options="-c statement_timeout=300"), schema=schema)
    d = Dispatcher(store, _never, holder="d1", poll_interval=0.05, listen=False,
                   purge_after=1_000, purge_interval=0.2,
                   on_event=lambda e: rounds.append(e) if isinstance(e, ev.Purge) else None)
    locker: psycopg.Connection[Any] = psycopg.connect(dsn)

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await until("the first round", lambda: bool(rounds))
        await asyncio.to_thread(locker.execute, sql.SQL(
            "LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema)))
        await until("a failed round", lambda: any(r.outcome == "error" for r in rounds))
        await asyncio.to_thread(locker.rollback)
        await asyncio.to_thread(_finished, dsn, schema, ["old"], 10_000)
        await until("a round that deletes", lambda: sum(r.deleted for r in rounds) == 1)
        d.stop()
        await task

    try:
        asyncio.run(main())
    finally:
        locker.close()
        store.close()
    failed = [r for r in rounds if r.outcome == "error"]
    assert failed and all(r.error and "QueryCanceled" in r.error for r in failed)
    assert rounds[-1].outcome == "ok"
    assert _run_ids(dsn, schema) == []


def test_the_memory_store_purges_through_the_same_option() -> None:
    store = MemoryJobStore()
    store.schedule("sent", store.now_ms() - 1)
    leased = store.lease("h", None, 100)
    assert leased is not None
    assert store.mark_dispatched("sent", "h", "bot").recorded
    store.schedule("waiting", store.now_ms() + DAY)
    time.sleep(0.2)  # the lease (100 ms) is over, the job finished 200 ms ago
    d = Dispatcher(store, _never, holder="d1", listen=False, purge_after=100)

    async def main() -> int:
        await d.start()
        try:
            return await d.purge_round()
        finally:
            d.stop()
            await d._shutdown()

    assert asyncio.run(main()) in (0, 1)  # the start's round may have taken it already
    assert store.get("sent") is None and store.get("waiting") is not None
