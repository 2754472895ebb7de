"""The runner's own paths (pgstore.postgres.runner): what a call reads of its result,
and how it is sent on each kind of source."""

from __future__ import annotations

import asyncio

import psycopg
from psycopg.rows import tuple_row

from pgstore.postgres.runner import column_names


def test_column_names_are_read_from_the_result(pgstore_database: str) -> None:
    """The names, in order, whatever the alphabet; the same names give the same tuple
    back (what the row pickers' cache is keyed on); no result, or no column: none."""
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        cur = conn.cursor(row_factory=tuple_row)
        assert column_names(cur) == ()
        cur.execute('SELECT 1 AS b, 2 AS a, 3 AS "été", 4 AS "x y"')
        first = column_names(cur)
        assert first == ("b", "a", "été", "x y")
        assert first == tuple(c.name for c in cur.description or ())
        cur.execute('SELECT 5 AS b, 6 AS a, 7 AS "été", 8 AS "x y"')
        assert column_names(cur) is first
        cur.execute("SELECT")
        assert column_names(cur) == ()
        cur.execute("SET application_name = 'x'")
        assert column_names(cur) == ()


def test_column_names_of_an_async_cursor(pgstore_database: str) -> None:
    async def main() -> tuple[str, ...]:
        async with await psycopg.AsyncConnection.connect(pgstore_database) as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute("SELECT 1 AS run_id, 2 AS recorded")
            return column_names(cur)

    assert asyncio.run(main()) == ("run_id", "recorded")
