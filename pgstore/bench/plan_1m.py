"""Show the job lease's plan on a jobs table with 1,000,000 dispatched jobs (not a test).

Usage: ``python -m pgstore.bench.plan_1m [DSN]`` (else ``$PGSTORE_DSN``). Installs a
throwaway schema with ``pgstore.testing.install_schema``, fills it with
1,000,000 dispatched jobs (due before every pending one, so a plain
``dispatch_at`` index would walk them first) and 1,000 due jobs, analyses it,
then prints ``EXPLAIN (ANALYZE, BUFFERS)`` of the lease statement, taken from
the installed ``job_lease`` body, with literal values (a custom plan) and
prepared with ``plan_cache_mode = force_generic_plan`` (the generic plan a
long-lived plpgsql session may switch to). Each runs in a transaction that is
rolled back. The schema is dropped at the end.
"""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from pgstore.testing import drop_schema, install_schema

DISPATCHED = 1_000_000
DUE = 1_000
NOW = 2_000_000
TTL = 30_000
VARIABLES: dict[str, Any] = {"v_now": NOW}
VARIABLE = re.compile(r"\b[pv]_\w+\b")


def lease_statement(conn: psycopg.Connection[Any]) -> str:
    """The walk that picks and locks the job to lease in the common case, every pending
    job in the default group (queue ``'default'`` at priority 0): the scalar ``(SELECT …
    FOR UPDATE SKIP LOCKED)`` in the installed ``job_lease``'s body (from pgstore_0019)."""
    row = conn.execute(
        "SELECT prosrc FROM pg_proc WHERE oid ="
        " 'job_lease(text, bigint, bigint, text[])'::regprocedure"
    ).fetchone()
    assert row is not None
    found = re.search(r"=\s*\(\s*(SELECT\s+c\.run_id\b.*?SKIP\s+LOCKED)\s*\)", row[0],
                      re.S | re.I)
    if not found:
        raise SystemExit(f"no `= (SELECT … SKIP LOCKED)` in job_lease:\n{row[0]}")
    return found.group(1)


def fill(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO jobs (run_id, dispatch_at, lease_holder, lease_until, worker_id,"
        " dispatched, cancelled)"
        " SELECT 'done-' || lpad(g::text, 8, '0'), g, 'holder-' || (g %% 7), g + 60000,"
        " 'bot-' || (g %% 50), true, false FROM generate_series(1, %s) AS g",
        [DISPATCHED],
    )
    conn.execute(
        "INSERT INTO jobs (run_id, dispatch_at)"
        " SELECT 'due-' || lpad(g::text, 5, '0'), %s + g FROM generate_series(1, %s) AS g",
        [NOW - DUE, DUE],
    )


def explain(conn: psycopg.Connection[Any], statement: str) -> str:
    rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {statement}").fetchall()
    conn.rollback()
    return "\n".join(row[0] for row in rows)


def main() -> None:
    dsn = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PGSTORE_DSN")
    if not dsn:
        raise SystemExit("usage: python -m pgstore.bench.plan_1m DSN  (or set PGSTORE_DSN)")
    schema = f"pgstore_plan1m_{uuid.uuid4().hex[:12]}"
    install_schema(dsn, schema)
    try:
        with psycopg.connect(dsn) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            started = time.perf_counter()
            fill(conn)
            conn.commit()
            conn.autocommit = True
            conn.execute("ANALYZE jobs")
            conn.autocommit = False
            print(
                f"server {conn.info.server_version}; filled {DISPATCHED:,} dispatched +"
                f" {DUE:,} due jobs and analysed in {time.perf_counter() - started:.1f} s"
            )
            sizes = conn.execute(
                "SELECT pg_size_pretty(pg_relation_size('jobs')),"
                " pg_size_pretty(pg_relation_size('jobs_pending_by_dispatch_at'))"
            ).fetchone()
            conn.rollback()
            assert sizes is not None
            print(f"jobs heap {sizes[0]}, jobs_pending_by_dispatch_at {sizes[1]}")

            statement = lease_statement(conn)
            conn.rollback()
            literal = VARIABLE.sub(
                lambda m: sql.Literal(VARIABLES[m.group(0)]).as_string(conn), statement
            )
            print("\n-- lease statement, custom plan (literal values):")
            print(literal)
            print(explain(conn, literal))

            order: list[str] = []

            def parameter(found: re.Match[str]) -> str:
                if found.group(0) not in order:
                    order.append(found.group(0))
                return f"${order.index(found.group(0)) + 1}"

            conn.execute(f"PREPARE lease AS {VARIABLE.sub(parameter, statement)}")
            conn.execute("SET plan_cache_mode = force_generic_plan")
            values = ", ".join(sql.Literal(VARIABLES[v]).as_string(conn) for v in order)
            print(f"\n-- lease statement, generic plan (EXECUTE lease({values})):")
            print(explain(conn, f"EXECUTE lease({values})"))
    finally:
        drop_schema(dsn, schema)


if __name__ == "__main__":
    main()
