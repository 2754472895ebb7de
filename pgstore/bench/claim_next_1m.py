"""What ``claim_next`` without ids costs at 1,000,000 schedules, and what an index on
``next_run_at`` would cost the completes (not a test).

Usage: ``python -m pgstore.bench.claim_next_1m [DSN] [ROWS]`` (else ``$PGSTORE_DSN``;
1,000,000 rows). For the shipped storage and for the same with an index on
``(next_run_at, id)``, each in a throwaway schema: ``ROWS`` schedules, 1,000 of
them due, VACUUM ANALYZE and a CHECKPOINT; then ten rounds of
``schedule_claim_next(100)`` without ids (timed) and a ``schedule_complete`` of
each claimed row (moving its ``next_run_at`` two hours on, timed), in a session
with ``synchronous_commit = off`` (the flush is the same either way: the numbers
are the statements' own work). For each it prints the claim's time, the
complete's time, the WAL bytes per claim and per complete
(``pg_current_wal_insert_lsn()`` before and after), the HOT share of the
updates, and the plan of the claim's candidate scan.

The trade it shows: the index turns the claim's sequential scan of every row into
an index range scan of the due ones, and every complete into a non-HOT update
(its new ``next_run_at`` is an index key), which writes the row's new version on
another page plus an entry in each index.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import psycopg

from pgstore.bench._common import connect, fresh_store_schema, ident, stats_flush, table_updates

DUE = 1_000
ROUNDS = 10
LIMIT = 100
NOW = 10**12
VARIANTS: dict[str, list[str]] = {
    "shipped": [],
    "index_next_run_at": ["CREATE INDEX schedules_next_run_at ON schedules (next_run_at, id)"],
}
CANDIDATES = (
    "SELECT c.id FROM schedules c WHERE c.next_run_at IS NOT NULL AND c.next_run_at <= %s"
    " AND (c.lease_until IS NULL OR c.lease_until <= %s)"
    " ORDER BY c.next_run_at, c.id LIMIT 100 FOR UPDATE SKIP LOCKED"
)


def lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_bytes(conn: psycopg.Connection[Any], start: str, end: str) -> float:
    row = conn.execute("SELECT %s::pg_lsn - %s::pg_lsn", (end, start)).fetchone()
    assert row is not None
    return float(row[0])


def measure(dsn: str, rows: int, variant: str) -> dict[str, Any]:
    schema = f"pgstore_bench_cn1m_{variant}"
    fresh_store_schema(dsn, schema)
    conn = connect(dsn)
    try:
        conn.execute(f"SET search_path = {ident(schema)}".encode())
        conn.execute(
            "INSERT INTO schedules (id, kind, spec, next_run_at, updated_at)"
            " SELECT 's-' || lpad(i::text, 7, '0'), 'interval', '60000',"
            " CASE WHEN i < %s THEN %s - i ELSE %s + 3600000 + i END, 0"
            " FROM generate_series(0, %s - 1) i",
            (DUE, NOW, NOW, rows),
        )
        for statement in VARIANTS[variant]:
            conn.execute(statement.encode())
        conn.execute(b"VACUUM (ANALYZE) schedules")
        conn.execute(b"CHECKPOINT")
        conn.execute(b"SET synchronous_commit = off")
        stats_flush(conn)
        last = table_updates(conn, schema, "schedules")
        hot = {"claim": [0, 0], "complete": [0, 0]}

        def phase(name: str) -> None:
            nonlocal last
            stats_flush(conn)
            now = table_updates(conn, schema, "schedules")
            hot[name][0] += now[0] - last[0]
            hot[name][1] += now[1] - last[1]
            last = now

        claim_ms, complete_us, wal_claim, wal_complete = [], [], [], []
        t = NOW
        for _ in range(ROUNDS):
            t += 1
            l0 = lsn(conn)
            started = time.perf_counter_ns()
            claimed = conn.execute(
                "SELECT id, fencing_token FROM schedule_claim_next('bench', %s, 500, %s)",
                (t, LIMIT)).fetchall()
            claim_ms.append((time.perf_counter_ns() - started) / 1e6)
            l1 = lsn(conn)
            assert len(claimed) == LIMIT, len(claimed)
            phase("claim")
            started = time.perf_counter_ns()
            for sid, token in claimed:
                done = conn.execute("SELECT schedule_complete(%s, %s, %s, %s, 'ok', %s)",
                                    (sid, token, t + 7_200_000, t, t)).fetchone()
                assert done is not None and done[0]
            complete_us.append((time.perf_counter_ns() - started) / 1e3 / LIMIT)
            l2 = lsn(conn)
            phase("complete")
            wal_claim.append(wal_bytes(conn, l0, l1) / LIMIT)
            wal_complete.append(wal_bytes(conn, l1, l2) / LIMIT)
        plan = [str(r[0]) for r in conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {CANDIDATES}", (t + 1, t + 1)).fetchall()]
        return {
            "claim_next_ms": statistics.median(claim_ms), "claim_next_ms_min": min(claim_ms),
            "claim_next_ms_max": max(claim_ms),
            "complete_us": statistics.median(complete_us),
            "wal_per_claim": statistics.median(wal_claim),
            "wal_per_complete": statistics.median(wal_complete),
            "hot_share": {k: v[1] / max(v[0], 1) for k, v in hot.items()},
            "updates": {k: v[0] for k, v in hot.items()}, "plan": plan,
        }
    finally:
        conn.execute(f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE".encode())
        conn.close()


def main() -> None:
    dsn = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PGSTORE_DSN")
    if not dsn:
        raise SystemExit("usage: python -m pgstore.bench.claim_next_1m DSN [ROWS]")
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    for variant in VARIANTS:
        r = measure(dsn, rows, variant)
        print(f"== {variant}: {rows:,} schedules, {DUE:,} due; {ROUNDS} rounds of"
              f" claim_next({LIMIT}) without ids, then a complete of each claimed row")
        print(f"  claim_next: {r['claim_next_ms']:.2f} ms (min {r['claim_next_ms_min']:.2f},"
              f" max {r['claim_next_ms_max']:.2f}); {r['wal_per_claim']:.0f} WAL bytes per row")
        print(f"  complete: {r['complete_us']:.0f} us; {r['wal_per_complete']:.0f} WAL bytes")
        print("  HOT share: " + ", ".join(
            f"{k} {v:.0%} of {r['updates'][k]}" for k, v in r["hot_share"].items()))
        print("  " + "\n  ".join(r["plan"]))


if __name__ == "__main__":
    main()
