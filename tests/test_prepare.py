"""``prepare=True``: the stores prepare their statements server-side, and only then.

The conformance suites run a ``pg_prepared`` store too (``conftest.py``); these
tests show what the option changes on the server: the session's
``pg_prepared_statements`` hold the store's calls with it, and nothing without
it even past psycopg's default ``prepare_threshold`` (5); a connection opened
with ``prepare_threshold=None`` (psycopg's switch for PgBouncer) prepares
nothing either way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pgstore import AsyncPgJobStore, InvalidArgument, PgJobStore, PgScheduleStore


def _prepared(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute("SELECT statement FROM pg_prepared_statements ORDER BY 1").fetchall()
    return [str(r[0]) for r in rows]


@pytest.mark.parametrize(
    ("prepare", "threshold", "expected"), [(False, 5, False), (True, 5, True), (True, None, False)]
)
def test_sync_stores_prepare_only_when_asked(
    pgstore_database: str, pgstore_schema: str, prepare: bool, threshold: int | None,
    expected: bool,
) -> None:
    with psycopg.connect(
        pgstore_database, autocommit=True, prepare_threshold=threshold
    ) as conn:
        schedules = PgScheduleStore(conn, schema=pgstore_schema, prepare=prepare)
        jobs = PgJobStore(conn, schema=pgstore_schema, prepare=prepare)
        for i in range(8):  # past psycopg's default threshold, in case it were followed
            schedules.register("p", "interval", "1000", 100 + i, 10)
            jobs.schedule(f"p{i}", 100 + i)
        assert [j.run_id for j in jobs.list_dispatched()] == []
        statements = _prepared(conn)
    if not expected:
        assert statements == []
        return
    assert len(statements) == 3, statements  # register, schedule, list_dispatched: once each
    for name in ("schedule_register", "job_schedule", "job_list_dispatched"):
        assert any(f'"{pgstore_schema}"."{name}"(' in s for s in statements), (name, statements)


def test_async_stores_prepare_when_asked(pgstore_database: str, pgstore_schema: str) -> None:
    async def main() -> list[str]:
        aconn = await psycopg.AsyncConnection.connect(pgstore_database, autocommit=True)
        async with aconn:
            store = AsyncPgJobStore(aconn, schema=pgstore_schema, prepare=True)
            for i in range(3):
                await store.schedule(f"a{i}", 100)
                assert await store.get(f"a{i}") is not None
            cur = await aconn.execute("SELECT statement FROM pg_prepared_statements")
            return [str(r[0]) for r in await cur.fetchall()]

    statements = asyncio.run(main())
    assert len(statements) == 2, statements
    assert {s.split(".", 1)[1].split("(", 1)[0] for s in statements} == {'"job_schedule"', '"job_get"'}


@pytest.mark.parametrize("value", [None, 1, "yes"])
def test_prepare_must_be_a_bool(pgstore_database: str, value: object) -> None:
    with pytest.raises(InvalidArgument, match="prepare must be True or False"):
        PgJobStore(pgstore_database, prepare=value)  # type: ignore[arg-type]
