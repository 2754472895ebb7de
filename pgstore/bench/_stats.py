"""Section 11: what ``store_stats()`` costs as the history grows, before and after
``pgstore_0014``, and what that revision costs the job's write path.

Four job tables, each in its own schema, with ``stats_small`` (1,000) or
``stats_rows`` (1,000,000) finished jobs of history (1% of them recalled, 5%
cancelled, 0.1% failed: the states a history holds) and due jobs waiting:

* ``before_*``: schemas migrated to ``pgstore_0013``, whose ``store_stats()``
  scans the history;
* ``after_*``: schemas at head, whose ``store_stats()`` reads ``job_history``
  and the jobs finished since its ``upto``. Before timing, ``store_stats()`` is
  called until ``job_history`` has moved past the history, as it does within
  seconds in a running store;
* ``base_*`` (with ``--stats-base-sql DIR``): schemas loaded from another
  ``sql/`` directory (say main's, before a change), treated as head is, so a
  change is timed side by side with the code it replaces.

Timed, in rounds interleaving the tables (one untimed round first):

* ``store_stats(NULL)``, ``calls // 10`` calls a round per table;
* the write path at the small history, ``pgstore_0013`` (and base) against head: a lease and
  its mark (``job_lease`` then ``job_mark_dispatched``, timed together), and a
  ``job_cancel`` of a waiting job, ``calls`` of each a round: the client's wall
  time, and the server backend's CPU time (``/proc/<pid>/schedstat``, when the
  server runs on this machine), which the machine's load moves far less.

The history is loaded with one ``INSERT ... SELECT generate_series`` per table.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pgstore.bench._common import (
    Conn,
    Settings,
    Timer,
    connect,
    drop_schema,
    fresh_store_schema,
    ident,
    schema_name,
    settle,
)
from pgstore.bench._common import summary as summarize
from pgstore.schema.migrations import migrate

NOW = 10**13
#: The revision whose store_stats() scans the history.
BEFORE = "pgstore_0013"


def backend_cpu_ns(conn: Conn) -> int | None:
    """CPU time the server process behind ``conn`` has run, in ns; None when /proc does
    not show it (a server on another machine)."""
    try:
        return int(Path(f"/proc/{conn.info.backend_pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Table:
    """One job table in its own schema (``revision``: head, ``BEFORE``, or "base":
    loaded from ``sql_dir``)."""

    def __init__(self, cfg: Settings, part: str, revision: str,
                 sql_dir: Path | None = None) -> None:
        self.schema = schema_name(part)
        self.s = ident(self.schema)
        self.revision = revision
        if revision in ("head", "base"):
            fresh_store_schema(cfg.dsn, self.schema, sql_dir if revision == "base" else None)
        else:
            with connect(cfg.dsn) as conn:
                drop_schema(conn, self.schema)
            migrate(cfg.dsn, self.schema, revision, client_role=False)
        self.conn: Conn = connect(cfg.dsn)
        self.leased = 0
        self.cancelled = 0
        #: The server CPU µs per call of the last lease_mark_us / cancel_us (None: unseen).
        self.cpu_us: float | None = None

    def fill(self, history: int, due: int) -> None:
        s = self.s
        self.conn.execute(
            f"INSERT INTO {s}.jobs (run_id, dispatch_at, lease_holder, lease_until, worker_id,"
            f" dispatched, cancelled, failed, finished_at)"
            f" SELECT 'h-' || lpad(i::text, 8, '0'), i, 'old', i + 30000, 'w',"
            f" i % 1000 <> 7 AND i % 20 <> 3, i % 100 = 1 OR i % 20 = 3, i % 1000 = 7, i"
            f" FROM generate_series(1, {history}) i".encode())
        self.conn.execute(
            f"INSERT INTO {s}.jobs (run_id, dispatch_at) SELECT 'd-' || lpad(i::text, 8, '0'),"
            f" {history} + i FROM generate_series(1, {due}) i".encode())
        self.conn.execute(
            f"INSERT INTO {s}.jobs (run_id, dispatch_at) SELECT 'c-' || lpad(i::text, 8, '0'),"
            f" {NOW} * 2 + i FROM generate_series(1, {due}) i".encode())
        settle(self.conn, f"{s}.jobs")

    def caught_up(self, timeout: float = 60.0) -> None:
        """Call store_stats() until job_history has moved past the history (head and base)."""
        if self.revision not in ("head", "base"):
            return
        deadline = time.monotonic() + timeout
        stats = f"SELECT FROM {self.s}.store_stats()".encode()
        upto = f"SELECT upto > 0 FROM {self.s}.job_history".encode()
        while True:
            self.conn.execute(stats)
            row = self.conn.execute(upto).fetchone()
            if row is not None and row[0]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.schema}: job_history did not move in {timeout} s")
            time.sleep(0.2)

    def stats_us(self, n: int) -> float:
        """Median µs of ``n`` store_stats(NULL) calls."""
        t = Timer()
        call = f"SELECT * FROM {self.s}.store_stats(NULL)".encode()
        for _ in range(n):
            with t.timing():
                self.conn.execute(call).fetchone()
        return t.median_us

    def lease_mark_us(self, n: int) -> float:
        """Median µs of ``n`` leases, each with its mark."""
        t = Timer()
        lease = f"SELECT run_id FROM {self.s}.job_lease('bench', %s, 60000)".encode()
        mark = f"SELECT recorded FROM {self.s}.job_mark_dispatched(%s, 'bench', 'w')".encode()
        cpu = backend_cpu_ns(self.conn)
        for _ in range(n):
            with t.timing():
                row = self.conn.execute(lease, (NOW,)).fetchone()
                assert row is not None and str(row[0]).startswith("d-"), row
                done = self.conn.execute(mark, (row[0],)).fetchone()
            assert done == (True,), done
        self._cpu(cpu, n)
        return t.median_us

    def _cpu(self, before: int | None, n: int) -> None:
        after = backend_cpu_ns(self.conn)
        self.cpu_us = None if before is None or after is None else (after - before) / 1000 / n

    def cancel_us(self, n: int) -> float:
        """Median µs of ``n`` job_cancel calls, each of a waiting job."""
        t = Timer()
        cancel = f"SELECT {self.s}.job_cancel(%s)".encode()
        cpu = backend_cpu_ns(self.conn)
        for _ in range(n):
            self.cancelled += 1
            run_id = f"c-{self.cancelled:08d}"
            with t.timing():
                row = self.conn.execute(cancel, (run_id,)).fetchone()
            assert row == ("cancelled",), row
        self._cpu(cpu, n)
        return t.median_us

    def close(self) -> None:
        drop_schema(self.conn, self.schema)
        self.conn.close()


def run_stats(cfg: Settings) -> dict[str, Any]:
    history, small = cfg.stats_rows, cfg.stats_small
    n_stats = max(cfg.calls // 10, 5)
    n = cfg.calls
    rounds = cfg.repeats + 1  # one untimed round first
    tables: dict[str, Table] = {}
    sides = ("before", "after") if cfg.stats_base_sql is None else ("before", "base", "after")
    revisions = {"before": BEFORE, "base": "base", "after": "head"}
    try:
        for side in sides:
            for size in ("small", "big"):
                name = f"{side}_{size}"
                tables[name] = Table(cfg, f"stats_{name}", revisions[side],
                                     cfg.stats_base_sql if side == "base" else None)
        cfg.log(f"  stats: filling {small:,} and {history:,} finished jobs, at {BEFORE} "
                "and at head (generate_series)...")
        for name, table in tables.items():
            rows = history if name.endswith("big") else small
            table.fill(rows, rounds * n + 10 if name.endswith("small") else 10)
        for table in tables.values():
            table.caught_up()

        stats: dict[str, list[float]] = {name: [] for name in tables}
        writes: dict[str, list[float]] = {f"{op}_{side}": [] for op in ("lease_mark", "cancel")
                                          for side in sides}
        cpu: dict[str, list[float]] = {name: [] for name in writes}
        for rep in range(rounds):
            for name, table in tables.items():
                took = table.stats_us(n_stats)
                if rep:
                    stats[name].append(took)
            for side in sides:
                table = tables[f"{side}_small"]
                lease_mark = table.lease_mark_us(n)
                lease_mark_cpu = table.cpu_us
                cancel = table.cancel_us(n)
                if rep:
                    writes[f"lease_mark_{side}"].append(lease_mark)
                    writes[f"cancel_{side}"].append(cancel)
                    for name, value in ((f"lease_mark_{side}", lease_mark_cpu),
                                        (f"cancel_{side}", table.cpu_us)):
                        if value is not None:
                            cpu[name].append(value)
        result: dict[str, Any] = {
            "unit": "us per call (median of the calls of a repeat; median of the repeats)",
            "small_rows": small,
            "big_rows": history,
            "stats_calls_per_repeat": n_stats,
            "write_calls_per_repeat": n,
            "store_stats_us": {name: summarize(v) for name, v in stats.items()},
            "growth": {side: summarize([b / a for a, b in zip(
                stats[f"{side}_small"], stats[f"{side}_big"], strict=True)])
                for side in sides},
            "writes_us": {name: summarize(v) for name, v in writes.items()},
            "write_ratio": {op: summarize([a / b for b, a in zip(
                writes[f"{op}_before"], writes[f"{op}_after"], strict=True)])
                for op in ("lease_mark", "cancel")},
            "writes_cpu_us": {name: summarize(v) for name, v in cpu.items()} if all(
                cpu.values()) else None,
            "write_cpu_ratio": {op: summarize([a / b for b, a in zip(
                cpu[f"{op}_before"], cpu[f"{op}_after"], strict=True)])
                for op in ("lease_mark", "cancel")} if all(cpu.values()) else None,
        }
        if cfg.stats_base_sql is not None:
            result["base_sql"] = str(cfg.stats_base_sql)
            result["base_ratio"] = {
                "store_stats_big": summarize([a / b for b, a in zip(
                    stats["base_big"], stats["after_big"], strict=True)]),
                **{op: summarize([a / b for b, a in zip(
                    writes[f"{op}_base"], writes[f"{op}_after"], strict=True)])
                   for op in ("lease_mark", "cancel")}}
            result["base_cpu_ratio"] = {op: summarize([a / b for b, a in zip(
                cpu[f"{op}_base"], cpu[f"{op}_after"], strict=True)])
                for op in ("lease_mark", "cancel")} if all(cpu.values()) else None
        s = result["store_stats_us"]
        cfg.log(f"  stats: store_stats at {small:,} / {history:,} finished jobs: "
                f"{BEFORE} {s['before_small']['median']:.0f} / {s['before_big']['median']:.0f} µs,"
                f" head {s['after_small']['median']:.0f} / {s['after_big']['median']:.0f} µs")
        w = result["write_ratio"]
        cfg.log(f"  stats: head / {BEFORE}: lease+mark {w['lease_mark']['median']:.3f}x, "
                f"cancel {w['cancel']['median']:.3f}x")
        c = result["write_cpu_ratio"]
        if c is not None:
            cfg.log(f"  stats: head / {BEFORE}, server CPU: lease+mark "
                    f"{c['lease_mark']['median']:.3f}x, cancel {c['cancel']['median']:.3f}x")
        if cfg.stats_base_sql is not None:
            cfg.log(f"  stats: store_stats at base {s['base_small']['median']:.0f} / "
                    f"{s['base_big']['median']:.0f} µs")
            c = result["base_cpu_ratio"]
            if c is not None:
                cfg.log(f"  stats: head / base, server CPU: lease+mark "
                        f"{c['lease_mark']['median']:.3f}x, cancel {c['cancel']['median']:.3f}x")
        return result
    finally:
        for table in tables.values():
            table.close()
