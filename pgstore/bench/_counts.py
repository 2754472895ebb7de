"""What a peer drain costs the server, counted (``--peer-counts``).

Wall-clock rates move with the machine's load; these counts move little. Around each
timed drain of the peer loop (``_peers.run_once``), from just before the go signal to
just after the last worker's connection closed, the bench reads the server's
cumulative statistics and reports, per 1,000 jobs:

* ``commits``: transactions committed (``pg_stat_database.xact_commit`` of the bench's
  database), less the bench's own: the wait sampler's polls and this reading's one (a
  few a drain remain: autovacuum's, and what the workers' backends reported late);
* ``wal_flushes`` and ``wal_writes``: WAL fsyncs and writes of the whole server
  (``pg_stat_io``'s ``wal`` rows on PostgreSQL 18, ``pg_stat_wal`` before it);
* ``wal_records`` and ``wal_kb`` (``pg_stat_wal``, the whole server: autovacuum too);
* ``statements``: top-level statements the system sent, from ``pg_stat_statements``
  where the server preloads it (else absent), with the most called ones
  (``top_statements``: the start of their text, calls and WAL kB per 1,000 jobs, and
  the time executing them a job, µs: the commit's flush, after the executor, is not in
  it);

and per job ``server_cpu_us`` (every process of the server, when it runs on this
machine, less the wait sampler's backend: ``server_cpu_s``), ``backend_cpu_us``
and ``backend_runq_us`` (the system's own backends: CPU, and time runnable but waiting
for a CPU, from ``/proc/<pid>/schedstat`` as the wait sampler last saw them, up to 5 ms
before each closed), ``client_cpu_us`` (the workers' own CPU from the go signal to
their last job) and ``client_runq_us`` (their main threads' time waiting for a CPU). A
server that preloads ``pg_stat_statements`` gets the extension created in the bench's
database when it lacks it. ``unit_costs`` times what these counts cost one at a time
here: a round trip and a WAL flush (docs/performance.md, what bounds W = 1).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from pgstore.bench._common import connect

COUNTS_NOTE = ("per 1,000 jobs of each timed drain (CPU: µs a job): commits, WAL flushes,"
               " writes, records and kB of the whole server, statements the system sent"
               " (pg_stat_statements); docs/performance.md, what bounds W = 1")
#: ``pg_stat_statements`` rows read per snapshot (the most called).
TOP = 40
#: The bench's own statements, left out of ``statements``.
_OWN = "%pg_stat%"


@dataclass
class Snapshot:
    """The server's cumulative counters at one moment."""

    values: dict[str, float]
    #: query text (its start) -> (calls, WAL bytes, ms executing); empty without
    #: pg_stat_statements
    statements: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    server_cpu_s: float | None = None


def statements_ready(dsn: str) -> bool:
    """Whether ``pg_stat_statements`` can be read at ``dsn``: preloaded, and its
    extension there (created now when it was not)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('shared_preload_libraries')").fetchone()
        if row is None or "pg_stat_statements" not in str(row[0]):
            return False
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return True


def snapshot(dsn: str, statements: bool, reset: bool = False) -> Snapshot:
    """The counters now, read in one transaction (the one commit ``Counted`` takes off);
    with ``reset``, ``pg_stat_statements`` emptied first."""
    with psycopg.connect(dsn) as conn:
        if statements and reset:
            conn.execute("SELECT pg_stat_statements_reset()")
        cpu = server_cpu_s(dsn, pid=conn.info.backend_pid)  # no statement to count
        row = conn.execute(
            "SELECT current_setting('server_version_num')::int,"
            " (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),"
            " wal_records, wal_bytes FROM pg_stat_wal").fetchone()
        assert row is not None
        version, commits, records, wal_bytes = row
        if version >= 180000:
            io = conn.execute("SELECT coalesce(sum(fsyncs), 0), coalesce(sum(writes), 0)"
                              " FROM pg_stat_io WHERE object = 'wal'").fetchone()
        else:
            io = conn.execute("SELECT wal_sync, wal_write FROM pg_stat_wal").fetchone()
        assert io is not None
        values = {"commits": float(commits), "wal_records": float(records),
                  "wal_bytes": float(wal_bytes), "wal_flushes": float(io[0]),
                  "wal_writes": float(io[1])}
        found: dict[str, tuple[int, int, float]] = {}
        if statements:
            for query, calls, wal, ms in conn.execute(
                    "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 90), sum(calls),"
                    " sum(wal_bytes), sum(total_exec_time) FROM pg_stat_statements"
                    " WHERE dbid = (SELECT oid FROM pg_database"
                    " WHERE datname = current_database()) AND query NOT"
                    " ILIKE %s AND query NOT IN ('BEGIN', 'COMMIT')"  # the snapshots'
                    " GROUP BY 1 ORDER BY 2 DESC LIMIT %s", (_OWN, TOP)):
                found[str(query)] = (int(calls), int(wal), float(ms))
    return Snapshot(values, found, cpu)


@dataclass
class Counted:
    """The counts of one drain: a snapshot before the go signal, one after the end."""

    dsn: str
    statements: bool
    before: Snapshot | None = None

    def start(self) -> None:
        self.before = snapshot(self.dsn, self.statements, reset=True)

    def per_job(self, jobs: int, after: Snapshot, own_commits: int, own_cpu_s: float,
                backend_s: tuple[float, float], client_s: tuple[float, float]
                ) -> dict[str, Any]:
        """The counts per 1,000 jobs (CPU per job, µs), given the bench's own commits and
        server CPU in between (the wait sampler's), and the system's backends' and its
        workers' (CPU seconds, seconds waiting for a CPU)."""
        assert self.before is not None
        before = self.before
        k = 1000 / jobs
        d = {name: after.values[name] - before.values[name] for name in after.values}
        d["commits"] -= own_commits + 1  # the sampler's polls, the first snapshot's
        out: dict[str, Any] = {
            "commits": round(d["commits"] * k, 2),
            "wal_flushes": round(d["wal_flushes"] * k, 2),
            "wal_writes": round(d["wal_writes"] * k, 2),
            "wal_records": round(d["wal_records"] * k, 1),
            "wal_kb": round(d["wal_bytes"] * k / 1024, 1),
            "client_cpu_us": round(client_s[0] / jobs * 1e6, 2),
            "client_runq_us": round(client_s[1] / jobs * 1e6, 2),
        }
        if backend_s[0] > 0:
            out["backend_cpu_us"] = round(backend_s[0] / jobs * 1e6, 2)
            out["backend_runq_us"] = round(backend_s[1] / jobs * 1e6, 2)
        if before.server_cpu_s is not None and after.server_cpu_s is not None:
            server = after.server_cpu_s - before.server_cpu_s - own_cpu_s
            out["server_cpu_us"] = round(server / jobs * 1e6, 2)
        if self.statements:
            zero = (0, 0, 0.0)
            calls = {q: (c - before.statements.get(q, zero)[0],
                         w - before.statements.get(q, zero)[1],
                         ms - before.statements.get(q, zero)[2])
                     for q, (c, w, ms) in after.statements.items()}
            out["statements"] = round(sum(c for c, _, _ in calls.values()) * k, 2)
            out["top_statements"] = [
                {"query": q, "calls": round(c * k, 2), "wal_kb": round(w * k / 1024, 1),
                 "exec_us_a_job": round(ms * 1000 / jobs, 2)}
                for q, (c, w, ms) in sorted(calls.items(), key=lambda x: -x[1][0])[:6] if c > 0
            ]
        return out


#: The counts ``counts_line`` logs, in its order.
_LOGGED = ("commits", "statements", "wal_flushes", "wal_kb", "server_cpu_us", "backend_cpu_us",
           "backend_runq_us", "client_cpu_us", "client_runq_us")


def counts_line(counts: dict[str, Any]) -> str:
    """One drain's counts, for the log."""
    return ", ".join(f"{name} {counts[name]}" for name in _LOGGED if name in counts)


def median_counts(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each numeric count over the repeats of one system and W."""
    names = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {k: round(statistics.median(r[k] for r in runs), 2) for k in names
            if all(k in r for r in runs)}


#: Calls each unit cost is the median of.
UNIT_CALLS = 400


def unit_costs(dsn: str, calls: int = UNIT_CALLS) -> dict[str, float]:
    """What the counted things cost one at a time here, in µs (medians of ``calls``): a
    round trip (a prepared ``SELECT 1``), a durable one-row UPDATE's commit, the same with
    ``synchronous_commit = off`` (no flush to wait for), and their difference: the WAL
    flush a durable commit waits for."""
    table = "pgstore_bench_unit_cost"

    def median_us(conn: psycopg.Connection[Any], query: str) -> float:
        times = []
        for _ in range(calls):
            t = time.perf_counter_ns()
            conn.execute(query, prepare=True)
            times.append(time.perf_counter_ns() - t)
        return statistics.median(times) / 1000

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n bigint)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 0)")
        try:
            update = f"UPDATE {table} SET n = n + 1 WHERE id = 1"
            out = {"round_trip_us": median_us(conn, "SELECT 1"),
                   "durable_update_us": median_us(conn, update)}
            conn.execute("SET synchronous_commit = off")
            out["unflushed_update_us"] = median_us(conn, update)
        finally:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    out["flush_us"] = out["durable_update_us"] - out["unflushed_update_us"]
    return {k: round(v, 1) for k, v in out.items()}


def sched_ns(pid: int | str = "self") -> tuple[int, int]:
    """(CPU ns, ns runnable but waiting for a CPU) of process ``pid``'s main thread, from
    ``/proc/<pid>/schedstat``; (0, 0) when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return 0, 0


def _ticks(pid: int) -> tuple[int, int]:
    """(CPU ticks of ``pid`` and its reaped children, its parent's pid), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]), int(fields[1])


def server_cpu_s(dsn: str, pid: int | None = None) -> float | None:
    """CPU seconds the server at ``dsn`` has used so far, when it runs on this machine:
    its postmaster's, with every backend it reaped, plus the live backends'. None when
    /proc does not show it (another machine). ``pid``: one of its backends' (else asked
    on a connection of its own)."""
    try:
        if pid is None:
            with connect(dsn) as conn:
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                pid = int(row[0])
        _, postmaster = _ticks(pid)
        total, _ = _ticks(postmaster)
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    ticks, parent = _ticks(int(entry))
                except (OSError, ValueError, IndexError):
                    continue
                if parent == postmaster:
                    total += ticks
        return total / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, psycopg.Error):
        return None
