"""Section 6: write amplification. Do claims, completes and leases stay HOT?

``hot_cycles`` claim/complete cycles over ``hot_schedules`` schedules, in
rounds (every schedule claimed, then every one completed); the HOT share of
the claims and of the completes is read separately from the deltas of
``n_tup_upd`` / ``n_tup_hot_upd`` in ``pg_stat_user_tables`` between phases
(after ``pg_stat_force_next_flush()``). Table and index sizes before and
after. The same for ``hot_cycles`` jobs leased and marked dispatched.

Storage variants, each in its own schema: the shipped one (sql/), and, with a
fifth of the cycles, fillfactor 100 and, for schedules, an extra index on
``next_run_at`` (what ``claim_next`` without ``p_ids`` would want at scale).

The loop runs with ``synchronous_commit = off`` in its own session: what it
measures is where row versions go, not how long a flush takes, and it makes
100,000 cycles take seconds instead of a minute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pgstore.bench._common import (
    Conn,
    Settings,
    connect,
    fresh_store_schema,
    ident,
    relation_sizes,
    schema_name,
    stats_flush,
    table_updates,
)

LEASE_MS = 500
JOB_NOW = 10**13
JOB_ROUND = 100

SCHEDULE_VARIANTS: dict[str, list[str]] = {
    "shipped": [],
    "fillfactor_100": ["ALTER TABLE {s}.schedules SET (fillfactor = 100)"],
    "index_next_run_at": ["CREATE INDEX schedules_next_run_at ON {s}.schedules (next_run_at)"],
}
JOB_VARIANTS: dict[str, list[str]] = {
    "shipped": [],
    "fillfactor_100": ["ALTER TABLE {s}.jobs SET (fillfactor = 100)"],
}


class Phases:
    """HOT deltas per named phase of one table, read between phases."""

    def __init__(self, conn: Conn, schema: str, table: str) -> None:
        self.conn, self.schema, self.table = conn, schema, table
        self.totals: dict[str, list[int]] = {}
        stats_flush(conn)
        self.last = table_updates(conn, schema, table)

    def close(self, phase: str) -> None:
        stats_flush(self.conn)
        now = table_updates(self.conn, self.schema, self.table)
        upd, hot = now[0] - self.last[0], now[1] - self.last[1]
        total = self.totals.setdefault(phase, [0, 0])
        total[0] += upd
        total[1] += hot
        self.last = now

    def report(self, calls: dict[str, int]) -> dict[str, Any]:
        return {
            phase: {"updates": upd, "hot_updates": hot, "calls": calls.get(phase, 0),
                    "hot_share": round(hot / upd, 4) if upd else None}
            for phase, (upd, hot) in self.totals.items()
        }


def _reloptions(conn: Conn, schema: str, table: str) -> list[str]:
    row = conn.execute(
        "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = %s::regclass",
        (f"{ident(schema)}.{ident(table)}",),
    ).fetchone()
    return list(row[0]) if row else []


def _cycles(cfg: Settings, variant: str) -> int:
    """The shipped storage gets every cycle; the alternatives a fifth, to keep the run short."""
    return cfg.hot_cycles if variant == "shipped" else max(cfg.hot_cycles // 5, 1)


def _schedules(cfg: Settings, variant: str, ddl: list[str]) -> dict[str, Any]:
    schema = schema_name("hot_sched_" + variant)
    fresh_store_schema(cfg.dsn, schema)
    s = ident(schema)
    conn = connect(cfg.dsn)
    try:
        conn.execute(b"SET synchronous_commit = off")
        for stmt in ddl:
            conn.execute(stmt.format(s=s).encode())
        n = cfg.hot_schedules
        conn.execute(
            f"INSERT INTO {s}.schedules (id, kind, spec, next_run_at, updated_at)"
            f" SELECT 'h-' || lpad(i::text, 5, '0'), 'interval', '60000', 0, 0"
            f" FROM generate_series(0, {n - 1}) i".encode())
        conn.execute(f"VACUUM (ANALYZE) {s}.schedules".encode())
        before = relation_sizes(conn, schema, "schedules")
        ids = [f"h-{i:05d}" for i in range(n)]
        claim = f"SELECT fencing_token FROM {s}.schedule_claim_due(%s, 'bench', %s, {LEASE_MS})"
        complete = f"SELECT {s}.schedule_complete(%s, %s, %s, %s, 'ok', %s)"
        phases = Phases(conn, schema, "schedules")
        t = 10**12
        rounds = max(_cycles(cfg, variant) // n, 1)
        tokens: dict[str, int] = {}
        for _ in range(rounds):
            t += 1000
            for sid in ids:
                row = conn.execute(claim, (sid, t)).fetchone()
                assert row is not None, sid
                tokens[sid] = int(row[0])
            phases.close("claim")
            for sid in ids:
                row = conn.execute(complete, (sid, tokens[sid], t, t, t)).fetchone()
                assert row is not None and row[0], sid
            phases.close("complete")
        after = relation_sizes(conn, schema, "schedules")
        dead = conn.execute(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count FROM pg_stat_user_tables"
            " WHERE schemaname = %s AND relname = 'schedules'", (schema,)).fetchone()
        return {
            "reloptions": _reloptions(conn, schema, "schedules"),
            "ddl": ddl,
            "schedules": n,
            "cycles": rounds * n,
            "phases": phases.report({"claim": rounds * n, "complete": rounds * n}),
            "sizes_before": before,
            "sizes_after": after,
            "growth": round(after["total"] / before["total"], 3) if before["total"] else None,
            "live_dead_autovacuums": list(dead) if dead else None,
        }
    finally:
        conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE".encode())
        conn.close()


def _jobs(cfg: Settings, variant: str, ddl: list[str]) -> dict[str, Any]:
    schema = schema_name("hot_jobs_" + variant)
    fresh_store_schema(cfg.dsn, schema)
    s = ident(schema)
    conn = connect(cfg.dsn)
    try:
        conn.execute(b"SET synchronous_commit = off")
        for stmt in ddl:
            conn.execute(stmt.format(s=s).encode())
        n = _cycles(cfg, variant)
        conn.execute(
            f"INSERT INTO {s}.jobs (run_id, dispatch_at) SELECT 'j-' || lpad(i::text, 7, '0'), i"
            f" FROM generate_series(1, {n}) i".encode())
        conn.execute(f"VACUUM (ANALYZE) {s}.jobs".encode())
        before = relation_sizes(conn, schema, "jobs")
        lease = f"SELECT run_id FROM {s}.job_lease('bench', {JOB_NOW}, 60000)"
        renew = f"SELECT {s}.job_renew(%s, 'bench', {JOB_NOW}, 90000)"
        mark = f"SELECT recorded FROM {s}.job_mark_dispatched(%s, 'bench', 'w')"
        phases = Phases(conn, schema, "jobs")
        done = 0
        while done < n:
            batch: list[str] = []
            for _ in range(min(JOB_ROUND, n - done)):
                row = conn.execute(lease.encode()).fetchone()
                assert row is not None
                batch.append(str(row[0]))
            phases.close("lease")
            for run_id in batch:
                row = conn.execute(renew, (run_id,)).fetchone()
                assert row is not None and row[0]
            phases.close("renew")
            for run_id in batch:
                row = conn.execute(mark, (run_id,)).fetchone()
                assert row is not None and row[0]
            phases.close("mark_dispatched")
            done += len(batch)
        after = relation_sizes(conn, schema, "jobs")
        conn.execute(f"VACUUM {s}.jobs".encode())
        vacuumed = relation_sizes(conn, schema, "jobs")
        return {
            "reloptions": _reloptions(conn, schema, "jobs"),
            "ddl": ddl,
            "jobs": n,
            "phases": phases.report({"lease": n, "renew": n, "mark_dispatched": n}),
            "sizes_before": before,
            "sizes_after": after,
            "sizes_after_vacuum": vacuumed,
            "growth": round(after["total"] / before["total"], 3) if before["total"] else None,
        }
    finally:
        conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE".encode())
        conn.close()


def run_hot(cfg: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {"schedules": {}, "jobs": {}}
    runs: list[tuple[str, str, list[str], Callable[[Settings, str, list[str]], dict[str, Any]]]]
    runs = [("schedules", v, d, _schedules) for v, d in SCHEDULE_VARIANTS.items()]
    runs += [("jobs", v, d, _jobs) for v, d in JOB_VARIANTS.items()]
    for table, variant, ddl, fn in runs:
        out[table][variant] = fn(cfg, variant, ddl)
        cfg.log(f"  hot: {table} {variant} done")
    shipped = out["schedules"]["shipped"]["phases"]
    out["claims_hot_share"] = {"ratio": shipped["claim"]["hot_share"]}
    out["completes_hot_share"] = {"ratio": shipped["complete"]["hot_share"]}
    out["leases_hot_share"] = {"ratio": out["jobs"]["shipped"]["phases"]["lease"]["hot_share"]}
    return out
