"""Many first calls at once on a fresh store: each answers as it would alone.

A store asks each connection once, at its first call, whether it may prepare
(``pgstore.postgres.preparing``), and an asyncio store on its own direct connection
asks whether it may pipeline (``pgstore.postgres.pipelined``). Twenty different calls
(of a job store and a schedule store sharing one source) made at once on a store
that has sent nothing yet: behind PgBouncer's transaction pooling (where the probe
sends a pipeline of its own) and on a direct connection, from asyncio tasks and from
threads, on a connection in autocommit, in the caller's transaction, and on a pool
the store owns. Every call succeeds and gets what the same calls made one after the
other answer; many trials, each on a fresh store and connection.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from pgstore import AsyncPgJobStore, AsyncPgScheduleStore, PgJobStore, PgScheduleStore
from pgstore.testing import PgBouncer

TRIALS = 25
FAR = 10**13  # due far in the future: nothing in the batch leases or lists them

#: How the stores are given their source: ``conn``, one connection in autocommit shared
#: by both stores; ``tx``, one connection with autocommit off (the calls join the
#: caller's transaction, committed after); ``owned``, a conninfo (each store its pool).
SOURCES = ["conn", "tx", "owned"]


def _seed(dsn: str, schema: str) -> None:
    """What the batch reads, written before it (the batch never reads what it writes)."""
    with PgJobStore(dsn, schema=schema) as jobs, PgScheduleStore(dsn, schema=schema) as sch:
        for i in range(3):
            jobs.schedule(f"seed{i}", FAR + i, queue="seeded", payload={"i": i})
        sch.register("sched0", "interval", "60000", FAR)


def _calls(jobs: Any, schedules: Any, trial: int, tag: str) -> list[Callable[[], Any]]:
    """Twenty different calls, the same for a sync store (answers) and an asyncio one
    (awaitables); the writes (schedule, delete) touch nothing the reads read."""
    return [
        lambda: jobs.get("seed0"),
        lambda: jobs.get("seed1"),
        lambda: jobs.get("missing"),
        lambda: jobs.list_jobs("all", queues=["seeded"]),
        lambda: jobs.list_failed(),
        lambda: jobs.list_dispatched(),
        lambda: jobs.cancel("missing"),
        lambda: jobs.retry("missing"),
        lambda: jobs.renew("missing", "h", None, 1000),
        lambda: jobs.release("missing", "h", 5),
        lambda: jobs.reschedule("missing", 5),
        lambda: jobs.lease("h", None, 1000, queues=["nothing-here"]),
        lambda: jobs.schedule(f"{tag}{trial}a", FAR, queue="fresh"),
        lambda: jobs.schedule(f"{tag}{trial}b", FAR, queue="fresh"),
        lambda: jobs.get("seed2"),
        lambda: schedules.get("sched0"),
        lambda: schedules.get("missing"),
        lambda: schedules.list(),
        lambda: schedules.renew("missing", 1, 5),
        lambda: schedules.delete("missing"),
    ]


def _sequential(dsn: str, schema: str) -> list[Any]:
    """The batch's answers, one call after the other, on a store of its own."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs, schedules = PgJobStore(conn, schema=schema), PgScheduleStore(conn, schema=schema)
        return [call() for call in _calls(jobs, schedules, 0, "seq")]


async def _async_batch(dsn: str, schema: str, source: str, trial: int) -> list[Any]:
    conn = None
    if source == "owned":
        jobs = AsyncPgJobStore(dsn, schema=schema)
        schedules = AsyncPgScheduleStore(dsn, schema=schema)
    else:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=source == "conn")
        jobs = AsyncPgJobStore(conn, schema=schema)
        schedules = AsyncPgScheduleStore(conn, schema=schema)
    try:
        calls: list[Callable[[], Awaitable[Any]]] = _calls(jobs, schedules, trial, "a")
        answers = await asyncio.gather(*(call() for call in calls), return_exceptions=True)
        if conn is not None:  # the caller's transaction commits; the connection still works
            try:
                if source == "tx":
                    await conn.commit()
                answers.append(await (await conn.execute("SELECT 1")).fetchone())
            except psycopg.Error as exc:
                answers.append(exc)
        return answers
    finally:
        await jobs.close()
        await schedules.close()
        if conn is not None:
            await conn.close()


def _sync_batch(dsn: str, schema: str, source: str, trial: int) -> list[Any]:
    conn = None
    if source == "owned":
        jobs, schedules = PgJobStore(dsn, schema=schema), PgScheduleStore(dsn, schema=schema)
    else:
        conn = psycopg.connect(dsn, autocommit=source == "conn")
        jobs, schedules = PgJobStore(conn, schema=schema), PgScheduleStore(conn, schema=schema)
    calls = _calls(jobs, schedules, trial, "s")
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        start.wait()  # all at once, as far as threads go
        try:
            return call()
        except Exception as exc:
            return exc

    try:
        with ThreadPoolExecutor(len(calls)) as pool:
            answers = list(pool.map(run, calls))
        if conn is not None:
            try:
                if source == "tx":
                    conn.commit()
                answers.append(conn.execute("SELECT 1").fetchone())
            except psycopg.Error as exc:
                answers.append(exc)
        return answers
    finally:
        jobs.close()
        schedules.close()
        if conn is not None:
            conn.close()


def _dsn(route: str, request: pytest.FixtureRequest, database: str) -> str:
    if route == "direct":
        return database
    bouncer: PgBouncer = request.getfixturevalue("pgstore_pgbouncer")
    return bouncer.dsn_for(database)


def _check(answers: list[Any], expected: list[Any], source: str, trial: int) -> None:
    if source != "owned":
        expected = [*expected, (1,)]  # and the connection answers after
    errors = [f"call {i}: {type(a).__name__}: {str(a).splitlines()[0] if str(a) else ''}"
              for i, a in enumerate(answers) if isinstance(a, BaseException)]
    assert errors == [], f"trial {trial}"
    assert answers == expected, f"trial {trial}"


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("route", ["bouncer", "direct"])
@pytest.mark.parametrize("callers", ["tasks", "threads"])
def test_concurrent_first_calls_on_a_fresh_store(
    request: pytest.FixtureRequest, pgstore_database: str, pgstore_schema: str,
    callers: str, route: str, source: str,
) -> None:
    """The batch at once from asyncio tasks (an asyncio store) or threads (a sync one),
    ``TRIALS`` times, each on a fresh store; then every write of every trial is there."""
    dsn = _dsn(route, request, pgstore_database)
    _seed(pgstore_database, pgstore_schema)
    expected = _sequential(pgstore_database, pgstore_schema)
    tag = "a" if callers == "tasks" else "s"
    for trial in range(TRIALS):
        if callers == "tasks":
            answers = asyncio.run(_async_batch(dsn, pgstore_schema, source, trial))
        else:
            answers = _sync_batch(dsn, pgstore_schema, source, trial)
        _check(answers, expected, source, trial)
    with PgJobStore(pgstore_database, schema=pgstore_schema) as jobs:  # every write landed
        assert all(jobs.get(f"{tag}{t}{x}") is not None for t in range(TRIALS) for x in "ab")
