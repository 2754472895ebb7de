"""store_stats() at 1,000 and 1,000,000 finished jobs, like for like (not a test).

Usage: ``python -m pgstore.bench.stats_1m [--dsn DSN] [--base-sql DIR]`` (else
``$PGSTORE_DSN``, else the embedded server ``make bench`` uses). The bench's stats
section (``--only stats``) times its 1,000-job table with the jobs its write rounds
lease, mark and cancel (8,000 waiting, and those finished in the last seconds), so
its ratio mostly says what those cost. Here both tables hold the same live jobs (10
due, 10 in the future) and differ only in their history (1% recalled, 5% cancelled,
0.1% failed, as the bench's). Each is loaded from the current ``sql/`` (and, with
``--base-sql``, from another ``sql/`` directory too, "base"), filled with one
``INSERT ... SELECT generate_series``, vacuumed, and ``store_stats()`` is called
until ``job_history`` has passed the history. Then, each table in a session of its
own opened after that: 8 rounds interleaving the tables (the first untimed), 100
calls of ``store_stats(NULL)`` a table a round. Prints the median µs of the rounds'
medians with their range, and the ratio 1,000,000 / 1,000 a round. The schemas are
dropped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from pgstore.bench._common import Conn, Settings, connect, embedded_server
from pgstore.bench._stats import Table

SIZES = (1_000, 1_000_000)
ROUNDS = 8  # the first untimed
CALLS = 100


def _median_us(conn: Conn, schema: str, calls: int) -> float:
    call = f"SELECT * FROM {schema}.store_stats(NULL)".encode()
    took: list[float] = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        conn.execute(call).fetchall()
        took.append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(took)


def run(dsn: str, base_sql: Path | None) -> None:
    cfg = Settings(dsn=dsn, out=Path("."))
    kinds = ["head"] if base_sql is None else ["base", "head"]
    tables: dict[tuple[str, int], Table] = {}
    sessions: list[Conn] = []
    try:
        for kind in kinds:
            for rows in SIZES:
                table = Table(cfg, f"stats_1m_{kind}_{rows}", kind, base_sql)
                table.fill(rows, 10)
                table.caught_up()
                tables[kind, rows] = table
        fresh = {key: connect(dsn) for key in tables}
        sessions.extend(fresh.values())
        medians: dict[tuple[str, int], list[float]] = {key: [] for key in tables}
        for round_ in range(ROUNDS):
            for key, table in tables.items():
                took = _median_us(fresh[key], table.s, CALLS)
                if round_:
                    medians[key].append(took)
        for (kind, rows), values in medians.items():
            print(f"{kind} at {rows:>9,} finished jobs: {statistics.median(values):7.0f} µs"
                  f" ({min(values):.0f}-{max(values):.0f})")
        for kind in kinds:
            ratios = [b / a for a, b in zip(medians[kind, SIZES[0]], medians[kind, SIZES[1]],
                                            strict=True)]
            print(f"{kind}: {SIZES[1]:,} / {SIZES[0]:,}: {statistics.median(ratios):.2f}x"
                  f" ({min(ratios):.2f}-{max(ratios):.2f})")
    finally:
        for conn in sessions:
            conn.close()
        for table in tables.values():
            table.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgstore.bench.stats_1m",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", default=os.environ.get("PGSTORE_DSN"),
                        help="server (default: $PGSTORE_DSN, else embedded)")
    parser.add_argument("--base-sql", type=Path, metavar="DIR",
                        help="also time schemas loaded from this sql/ directory (base)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        dsn = args.dsn or stack.enter_context(embedded_server())
        run(dsn, args.base_sql)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
