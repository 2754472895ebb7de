"""Calls pipelined on an asyncio store's own connection (pgstore.postgres.pipelined).

A store on a direct autocommit connection sends each call at once, behind the calls
still out, each in its own transaction: every call gets its own answer, one refused
call costs the others nothing, a caller cancelled after sending leaves the connection
usable, psycopg's own calls on the connection wait their turn, a statement deallocated
behind the store's back is prepared again; and nothing is pipelined behind PgBouncer,
in the caller's transaction, or on a pool.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pgstore import AsyncPgJobStore, InvalidArgument, PgJobStore
from pgstore.postgres.pipelined import Pipeline, direct
from pgstore.testing import PgBouncer

CALLS = 200


def _pipeline(store: AsyncPgJobStore) -> Pipeline | None:
    return store._runner._pipeline


async def _connect(dsn: str, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, **kwargs)


def test_many_calls_at_once_each_get_their_own_answer(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """200 schedules and 200 gets made at once on one connection: sent together (more
    than one out at a time), each answered with its own job, every write committed."""

    async def main() -> tuple[int, list[Any]]:
        conn = await _connect(pgstore_database)
        async with conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            await store.schedule("warm", 1)  # the prepare verdict, asked once
            most = 0
            pipeline = _pipeline(store)
            assert pipeline is not None

            async def schedule(i: int) -> None:
                nonlocal most
                call = store.schedule(f"p{i}", 1000 + i)
                task = asyncio.ensure_future(call)
                await asyncio.sleep(0)
                most = max(most, pipeline.out)
                await task

            await asyncio.gather(*(schedule(i) for i in range(CALLS)))
            got = await asyncio.gather(*(store.get(f"p{i}") for i in range(CALLS)))
            assert pipeline.out == 0 and not pipeline.busy
            return most, got

    most, got = asyncio.run(main())
    assert most > 1
    assert [None if j is None else (j.run_id, j.dispatch_at) for j in got] == [
        (f"p{i}", 1000 + i) for i in range(CALLS)]
    with PgJobStore(pgstore_database, schema=pgstore_schema) as other:
        assert all(other.get(f"p{i}") is not None for i in range(CALLS))


def test_a_refused_call_costs_the_calls_around_it_nothing(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """A bad argument between good calls out at once: it alone raises InvalidArgument
    (22023, changing nothing); the calls before and after it are answered and
    committed, each in its own transaction."""

    async def main() -> list[Any]:
        conn = await _connect(pgstore_database)
        async with conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            await store.schedule("warm", 1)
            return await asyncio.gather(  # type: ignore[return-value]
                store.schedule("before", 10), store.schedule("bad", 10, max_attempts=0),
                store.schedule("after", 10), store.get("before"),
                return_exceptions=True)

    answers = asyncio.run(main())
    assert answers[0] is None and answers[2] is None
    assert isinstance(answers[1], InvalidArgument) and answers[1].sqlstate == "22023"
    assert answers[3] is not None and answers[3].run_id == "before"
    with PgJobStore(pgstore_database, schema=pgstore_schema) as other:
        assert other.get("before") is not None and other.get("after") is not None
        assert other.get("bad") is None


def test_a_cancelled_caller_leaves_the_connection_usable(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """Callers cancelled once their calls were sent: the calls still run (and commit,
    as a single call in flight would), their answers go unread, and the calls after
    them are answered."""

    async def main() -> Any:
        conn = await _connect(pgstore_database)
        async with conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            await store.schedule("warm", 1)
            tasks = [asyncio.ensure_future(store.schedule(f"c{i}", 5)) for i in range(20)]
            await asyncio.sleep(0)  # sent
            for task in tasks[::2]:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            job = await store.get("c1")
            pipeline = _pipeline(store)
            assert pipeline is not None and pipeline.out == 0
            await (await conn.execute("SELECT 1")).fetchall()  # psycopg's own, after
            return job

    assert asyncio.run(main()) is not None
    with PgJobStore(pgstore_database, schema=pgstore_schema) as other:
        assert all(other.get(f"c{i}") is not None for i in range(1, 20, 2))


def test_psycopg_calls_on_the_connection_wait_their_turn(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """The user's own execute on the store's connection, made while store calls are out,
    runs once they are answered (the pipeline holds the connection's lock), and the
    store's calls after it are pipelined again."""

    async def main() -> list[Any]:
        conn = await _connect(pgstore_database)
        async with conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            await store.schedule("warm", 1)

            async def own() -> Any:
                cur = await conn.execute("SELECT count(*) FROM pg_stat_activity")
                return (await cur.fetchone() or (None,))[0]

            return await asyncio.gather(
                *(store.schedule(f"u{i}", 7) for i in range(10)), own(),
                *(store.get(f"u{i}") for i in range(10)))

    answers = asyncio.run(main())
    assert isinstance(answers[10], int)
    assert all(a is not None for a in answers[11:])


def test_a_statement_deallocated_behind_the_store_is_prepared_again(
    pgstore_database: str, pgstore_schema: str
) -> None:
    async def main() -> Any:
        conn = await _connect(pgstore_database)
        async with conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            await store.schedule("d", 1)
            await conn.execute("DEALLOCATE ALL")
            await store.schedule("d2", 1)
            return await store.get("d2")

    job = asyncio.run(main())
    assert job is not None and job.run_id == "d2"


def test_a_terminated_backend_fails_every_call_out(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """The backend terminated while calls are out: each raises (none hangs)."""

    async def main() -> list[Any]:
        conn = await _connect(pgstore_database)
        async with conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            await store.schedule("t", 1)
            pid = conn.info.backend_pid
            with psycopg.connect(pgstore_database, autocommit=True) as killer:
                killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await asyncio.sleep(0.2)
            return await asyncio.wait_for(asyncio.gather(
                *(store.get("t") for _ in range(5)), return_exceptions=True), 10)

    answers = asyncio.run(main())
    assert all(isinstance(a, Exception) for a in answers), answers


def test_nothing_is_pipelined_in_the_callers_transaction(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """Autocommit off: the calls join the caller's transaction, one at a time, and a
    rollback takes them back."""

    async def main() -> Any:
        conn = await psycopg.AsyncConnection.connect(pgstore_database)
        async with conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            await asyncio.gather(*(store.schedule(f"x{i}", 1) for i in range(5)))
            assert _pipeline(store) is None
            await conn.rollback()
            return await store.get("x0")

    assert asyncio.run(main()) is None


def test_nothing_is_pipelined_behind_pgbouncer(
    pgstore_pgbouncer: PgBouncer, pgstore_database: str, pgstore_schema: str
) -> None:
    """Behind transaction pooling (the prepare verdict says so) calls go one at a time,
    as before, and are answered, the first ones too, made at once on a fresh store
    (they wait for one probe: tests/test_first_calls.py)."""
    bounced = pgstore_pgbouncer.dsn_for(pgstore_database)

    async def main() -> tuple[list[Any], Pipeline | None]:
        conn = await _connect(bounced)
        async with conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            await asyncio.gather(*(store.schedule(f"b{i}", 1) for i in range(10)))
            got = await asyncio.gather(*(store.get(f"b{i}") for i in range(10)))
            return got, _pipeline(store)

    got, pipeline = asyncio.run(main())
    assert pipeline is None
    assert [j.run_id if j else None for j in got] == [f"b{i}" for i in range(10)]


def test_a_pooler_is_never_direct(
    pgstore_pgbouncer: PgBouncer, pgstore_database: str
) -> None:
    """Behind PgBouncer, even one that keeps prepared statements (its verdict: prepare),
    calls are not pipelined: ``direct`` tells the pooler from the server."""

    async def main() -> tuple[bool, bool]:
        bounced = await _connect(pgstore_pgbouncer.dsn_for(pgstore_database))
        straight = await _connect(pgstore_database)
        async with bounced, straight:
            return await direct(bounced), await direct(straight)

    assert asyncio.run(main()) == (False, True)


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_store_can_turn_it_off(
    pgstore_database: str, pgstore_schema: str, pipeline: bool
) -> None:
    async def main() -> Pipeline | None:
        conn = await _connect(pgstore_database)
        async with conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            store._runner.pipeline = pipeline
            await asyncio.gather(*(store.schedule(f"o{i}", 1) for i in range(3)))
            return _pipeline(store)

    assert (asyncio.run(main()) is not None) is pipeline
