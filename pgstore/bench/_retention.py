"""Section 8: what a million finished jobs cost the lease, and what a purge gives back.

Three job tables, each with due jobs waiting after its history (the history's
``dispatch_at`` and ``finished_at`` are older than every due job):

* ``small``: ``retention_small`` (1,000) finished jobs of history;
* ``big``: ``retention_rows`` (1,000,000) finished jobs, as autovacuum leaves a
  table (inserted finished, then VACUUM ANALYZE), autovacuum on;
* ``dead``: the same history dispatched by one mass UPDATE after a VACUUM, with
  autovacuum off for the table: the pending index still holds an entry of
  every job dispatched since (the never-vacuumed case).

The lease (``job_lease``, then an untimed ``job_mark_dispatched``) is timed
against ``small``, side by side, one ratio per repeat, in these states:

* ``big`` before the purge; right after ``job_purge`` deleted all but the
  newest ``retention_small`` finished jobs (batches of ``PURGE_BATCH``); after
  autovacuum processed the table (waited for up to ``AUTOVACUUM_WAIT`` s; a
  manual VACUUM otherwise, recorded as such);
* ``dead`` before the purge, after it (still never vacuumed), and after one
  VACUUM (the fix).

The history is loaded with one ``INSERT ... SELECT generate_series`` per table.
"""

from __future__ import annotations

import time
from typing import Any

from pgstore.bench._common import (
    Conn,
    Settings,
    Timer,
    connect,
    fresh_store_schema,
    ident,
    schema_name,
)
from pgstore.bench._common import summary as summarize
from pgstore.bench._scale import lease_statement

NOW = 10**13
#: Jobs deleted per ``job_purge`` call in this section.
PURGE_BATCH = 10_000
#: How long to wait for autovacuum to process the purged table (seconds).
AUTOVACUUM_WAIT = 150.0


class Table:
    """One job table in its own store schema, over its own connection."""

    def __init__(self, cfg: Settings, part: str) -> None:
        self.schema = schema_name(part)
        self.s = ident(self.schema)
        fresh_store_schema(cfg.dsn, self.schema)
        self.conn: Conn = connect(cfg.dsn)

    def fill(self, history: int, due: int, *, dead: bool) -> None:
        s = self.s
        if dead:  # waiting first, vacuumed, then dispatched in one UPDATE, never vacuumed
            self.conn.execute(f"ALTER TABLE {s}.jobs SET (autovacuum_enabled = false)".encode())
            self.conn.execute(
                f"INSERT INTO {s}.jobs (run_id, dispatch_at) SELECT 'h-' || lpad(i::text, 8,"
                f" '0'), i FROM generate_series(1, {history}) i".encode())
            self.conn.execute(f"VACUUM (ANALYZE) {s}.jobs".encode())
            self.conn.execute(
                f"UPDATE {s}.jobs SET dispatched = true, worker_id = 'w', lease_holder = 'old',"
                f" lease_until = dispatch_at + 30000, finished_at = dispatch_at"
                f" WHERE run_id LIKE 'h-%'".encode())
        else:
            self.conn.execute(
                f"INSERT INTO {s}.jobs (run_id, dispatch_at, lease_holder, lease_until,"
                f" worker_id, dispatched, finished_at) SELECT 'h-' || lpad(i::text, 8, '0'),"
                f" i, 'old', i + 30000, 'w', true, i FROM generate_series(1, {history}) i"
                .encode())
        self.conn.execute(
            f"INSERT INTO {s}.jobs (run_id, dispatch_at) SELECT 'd-' || lpad(i::text, 8, '0'),"
            f" {history} + i FROM generate_series(1, {due}) i".encode())
        self.conn.execute(f"{'ANALYZE' if dead else 'VACUUM (ANALYZE)'} {s}.jobs".encode())

    def lease_us(self, n: int) -> float:
        """Mean µs of ``n`` leases (each followed by an untimed mark)."""
        t = Timer()
        lease = f"SELECT run_id FROM {self.s}.job_lease('bench', %s, 60000)".encode()
        mark = f"SELECT recorded FROM {self.s}.job_mark_dispatched(%s, 'bench', 'w')".encode()
        for _ in range(n):
            with t.timing():
                row = self.conn.execute(lease, (NOW,)).fetchone()
            assert row is not None and str(row[0]).startswith("d-"), row
            self.conn.execute(mark, (row[0],))
        return t.mean_us

    def lease_buffers(self) -> int:
        """Shared buffers (hit + read) one lease touches: EXPLAIN (ANALYZE, BUFFERS) of
        job_lease's statement, rolled back. The machine's load does not move it."""
        self.conn.execute(b"BEGIN")
        try:
            statement = lease_statement(self.conn, self.s, NOW)
            row = self.conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}".encode()).fetchone()
        finally:
            self.conn.execute(b"ROLLBACK")
        assert row is not None
        plan = row[0][0]["Plan"]
        return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])

    def purge(self, before: int) -> dict[str, Any]:
        """``job_purge(before, PURGE_BATCH)`` until a call deletes fewer; totals and time."""
        call = f"SELECT {self.s}.job_purge(%s, {PURGE_BATCH})".encode()
        deleted = calls = 0
        started = time.perf_counter()
        while True:
            row = self.conn.execute(call, (before,)).fetchone()
            assert row is not None
            deleted += int(row[0])
            calls += 1
            if int(row[0]) < PURGE_BATCH:
                break
        seconds = time.perf_counter() - started
        return {"deleted": deleted, "calls": calls, "seconds": round(seconds, 2),
                "jobs_per_s": round(deleted / seconds) if seconds else None}

    def vacuum_state(self) -> dict[str, Any]:
        row = self.conn.execute(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count, vacuum_count"
            " FROM pg_stat_user_tables WHERE relid = %s::regclass",
            (f"{self.s}.jobs",)).fetchone()
        assert row is not None
        return {"live": row[0], "dead": row[1], "autovacuums": row[2], "vacuums": row[3],
                "bytes": self.size()}

    def size(self) -> int:
        row = self.conn.execute("SELECT pg_total_relation_size(%s::regclass)",
                                (f"{self.s}.jobs",)).fetchone()
        return int(row[0]) if row else 0

    def wait_for_autovacuum(self, timeout: float) -> str:
        """``autovacuum`` once it processed the table after now, else ``manual`` (a VACUUM
        run here, after ``timeout`` seconds)."""
        before = self.vacuum_state()["autovacuums"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.conn.execute("SELECT pg_stat_clear_snapshot()")
            if self.vacuum_state()["autovacuums"] > before:
                return "autovacuum"
            time.sleep(1.0)
        self.conn.execute(f"VACUUM (ANALYZE) {self.s}.jobs".encode())
        return "manual"

    def close(self) -> None:
        self.conn.execute(f"DROP SCHEMA IF EXISTS {self.s} CASCADE".encode())
        self.conn.close()


def run_retention(cfg: Settings) -> dict[str, Any]:
    history, kept = cfg.retention_rows, cfg.retention_small
    n = max(cfg.calls // 2, 5)
    rounds = cfg.repeats + 1  # one untimed round first
    tables: dict[str, Table] = {}
    try:
        for part in ("small", "big", "dead"):
            tables[part] = Table(cfg, f"retention_{part}")
        small, big, dead = tables["small"], tables["big"], tables["dead"]
        cfg.log(f"  retention: filling {history:,} finished jobs twice (generate_series)...")
        small.fill(kept, 6 * rounds * n + 10, dead=False)
        big.fill(history, 3 * rounds * n + 10, dead=False)
        dead.fill(history, 3 * rounds * n + 10, dead=True)
        small.conn.execute(b"CHECKPOINT")

        def compare(other: Table, label: str) -> dict[str, Any]:
            a: list[float] = []
            b: list[float] = []
            for rep in range(rounds):
                x, y = small.lease_us(n), other.lease_us(n)
                if rep:
                    a.append(x)
                    b.append(y)
            buffers = {"small": small.lease_buffers(), "other": other.lease_buffers()}
            cfg.log(f"  retention: {label}: {summarize(b)['median']:.0f} µs against "
                    f"{summarize(a)['median']:.0f} µs; {buffers['other']} buffers per lease"
                    f" against {buffers['small']}")
            return {"small_us": summarize(a), "other_us": summarize(b),
                    "ratio": summarize([y / x for x, y in zip(a, b, strict=True)]),
                    "buffers": buffers}

        cases: dict[str, Any] = {}
        states: dict[str, Any] = {}
        before = history - kept + 1  # finished_at is 1..history: keeps the newest `kept`
        cases["big_before_purge"] = compare(big, "the big history, vacuumed")
        states["big_before_purge"] = big.vacuum_state()
        purges = {"big": big.purge(before)}
        cases["big_after_purge"] = compare(big, "after the purge, not yet vacuumed")
        states["big_after_purge"] = big.vacuum_state()
        waited = 0.0 if cfg.quick else AUTOVACUUM_WAIT
        started = time.monotonic()
        vacuum = big.wait_for_autovacuum(waited)
        cfg.log(f"  retention: the purged table vacuumed by {vacuum} after "
                f"{time.monotonic() - started:.0f} s")
        cases["big_after_autovacuum"] = compare(big, f"after the purge and {vacuum}")
        states["big_after_autovacuum"] = big.vacuum_state()

        cases["dead_before_purge"] = compare(dead, "dispatched since the last VACUUM")
        states["dead_before_purge"] = dead.vacuum_state()
        purges["dead"] = dead.purge(before)
        cases["dead_after_purge"] = compare(dead, "after the purge, never vacuumed")
        states["dead_after_purge"] = dead.vacuum_state()
        dead.conn.execute(f"VACUUM (ANALYZE) {dead.s}.jobs".encode())
        cases["dead_after_vacuum"] = compare(dead, "after one VACUUM")
        states["dead_after_vacuum"] = dead.vacuum_state()
        return {
            "unit": "us per call",
            "history_rows": history,
            "kept_rows": kept,
            "calls_per_repeat": n,
            "purge_batch": PURGE_BATCH,
            "purges": purges,
            "vacuum_after_purge": vacuum,
            "cases": cases,
            "states": states,
        }
    finally:
        for table in tables.values():
            table.close()


#: For the report: the cases in the order they are told, with what each one is.
CASE_LABELS: dict[str, str] = {
    "big_before_purge": "the big history (vacuumed), before the purge",
    "big_after_purge": "after job_purge, autovacuum on, not yet run",
    "big_after_autovacuum": "after job_purge and the vacuum",
    "dead_before_purge": "the history dispatched since the last VACUUM",
    "dead_after_purge": "never vacuumed, after job_purge",
    "dead_after_vacuum": "never vacuumed, purged, then one VACUUM",
}
