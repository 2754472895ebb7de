"""schedule_claim_next with ids costs what its ids cost, not what the table holds.

The table holds 100,000 schedules (about 2,000 heap pages). A claim of ten
given ids must look those ids up in the primary key. It is measured as the
shared buffers the whole call touches (``EXPLAIN (ANALYZE, BUFFERS)`` counts
the statements the function runs too), under both plan modes a plpgsql
session can run its statements with: custom plans (the first calls) and the
generic plan it caches after that. Before revision pgstore_0004 the generic
plan read the whole table and searched the ids array for every row: about
2,000 buffers here, and 20 ms for 1,000 ids over only 1,000 rows.

Every test runs in a transaction it rolls back, so the table stays as filled.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgstore.testing import drop_schema, install_schema

ROWS = 100_000
NOW = 1_000_000
LEASE_MS = 30_000
MAX_BUFFERS = 200  # ten primary-key probes and updates; a scan of the table needs ~2,000


@pytest.fixture(scope="module")
def filled_schema(pgstore_database: str) -> Iterator[str]:
    """A schema whose schedules table holds ROWS due schedules, analysed."""
    schema = f"pgstore_plan_{uuid.uuid4().hex[:12]}"
    install_schema(pgstore_database, schema)
    try:
        with psycopg.connect(pgstore_database, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.schedules (id, kind, spec, next_run_at, updated_at)"
                    " SELECT 's-' || lpad(g::text, 6, '0'), 'interval', '60000', g, 0"
                    " FROM generate_series(1, %s) AS g"
                ).format(sql.Identifier(schema)),
                [ROWS],
            )
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}.schedules").format(sql.Identifier(schema)))
        yield schema
    finally:
        drop_schema(pgstore_database, schema)


@pytest.fixture
def conn(pgstore_database: str, filled_schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection in a transaction on the filled schema, rolled back after the test."""
    with psycopg.connect(pgstore_database) as connection:
        connection.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(filled_schema)))
        try:
            yield connection
        finally:
            connection.rollback()


def claim_buffers(conn: psycopg.Connection[Any], ids: list[str]) -> tuple[int, list[str]]:
    """Shared buffers touched by one schedule_claim_next of ``ids``, and the ids it claims;
    both calls are undone, so every call finds the same table."""
    call = "schedule_claim_next('plan-test', %s::bigint, %s::bigint, 100, %s::text[])"
    conn.execute("SAVEPOINT claim")
    row = conn.execute(
        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM {call}", (NOW, LEASE_MS, ids)
    ).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    touched = int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])
    conn.execute("ROLLBACK TO SAVEPOINT claim")
    claimed = [r[0] for r in conn.execute(f"SELECT id FROM {call}", (NOW, LEASE_MS, ids))]
    conn.execute("ROLLBACK TO SAVEPOINT claim")
    return touched, claimed


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
def test_claim_next_by_ids_probes_the_primary_key(
    conn: psycopg.Connection[Any], plan_mode: str
) -> None:
    ids = [f"s-{g:06d}" for g in (99_000, 5, 50_000, 12, 77_777, 3, 64_000, 8, 31_337, 1)]
    conn.execute("SET plan_cache_mode = " + plan_mode)
    for _ in range(6):  # past plpgsql's first custom plans, into whatever it caches
        claim_buffers(conn, ids)
    touched, claimed = claim_buffers(conn, ids)
    assert claimed == sorted(ids, key=lambda i: int(i[2:]))  # next_run_at order
    assert touched < MAX_BUFFERS, f"{touched} shared buffers for 10 ids under {plan_mode}"


def test_claim_next_without_ids_still_claims_the_earliest(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET plan_cache_mode = force_generic_plan")
    rows = conn.execute(
        "SELECT id, fencing_token FROM schedule_claim_next('plan-test', %s::bigint, %s::bigint, 3)",
        (NOW, LEASE_MS),
    ).fetchall()
    assert rows == [("s-000001", 1), ("s-000002", 1), ("s-000003", 1)]
