"""Section ``limits``: what a queue limit costs the leasers, side by side in one process.

One Python process, one connection, drains ``limits_jobs`` jobs (all due) of one queue
at a time through ``job_lease_many(..., 100, ARRAY[queue])`` then
``job_mark_dispatched_many`` (the batch path), and ``limits_single_jobs`` through
``job_lease`` then ``job_mark_dispatched`` (the single path), each call its own
autocommit transaction, for four queues of one schema:

* ``unlimited``: no limit;
* ``concurrency``: ``queue_set_concurrency(queue, 1000)``;
* ``rate``: ``queue_set_rate(queue, 1000, 1)``: 1,000 leases a millisecond;
* ``both``: both of them.

The limits never bind (at most one batch of 100 lives at once, and every lease call
moves ``p_now`` on by a millisecond): what is measured is what keeping them costs a
leased job (the limited path of ``job_lease_take``, the row locks and writes of
``queue_slots``), not a throttle.

Per path, kind and repeat: the queue's jobs refilled and settled (VACUUM ANALYZE,
CHECKPOINT), then the drain, measuring the server backend's CPU (``utime + stime`` of
``/proc/<pg_backend_pid()>/stat`` and ``/proc/<pid>/schedstat``, as the queue-floor
section reads them) and the wall time (jobs/s). The kinds are interleaved within each
repeat; ratios are to ``unlimited`` of the same schema, path and repeat, medians over the
repeats. ``--limits-base-sql DIR`` also drains the same on a schema loaded from another
``sql/`` directory (main's, say), interleaved: the limits before and after a change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pgstore.bench._common import (
    Conn,
    Settings,
    connect,
    drop_schema,
    fresh_store_schema,
    ident,
    schema_name,
    settle,
)
from pgstore.bench._common import summary as summarize
from pgstore.bench._floor import backend_sched_ns, backend_stat_ns

#: Jobs a batch lease takes.
LIMITS_BATCH = 100
NOW = 10**13
TTL = 30_000
ME = "limits-worker"
#: The limits, each far above what one process's drain holds at once.
CONCURRENCY = 1000
RATE, RATE_PERIOD_MS = 1000, 1

KINDS = ("unlimited", "concurrency", "rate", "both")
PATHS = ("batch", "single")
MEASURES = ("server_sched_us", "server_cpu_us", "jobs_per_s")


class Limits:
    """The scratch schemas (head, and the base when given), their queues and drains."""

    def __init__(self, cfg: Settings) -> None:
        self.cfg = cfg
        self.schemas: dict[str, str] = {"head": schema_name("limits")}
        if cfg.limits_base_sql is not None:
            self.schemas["base"] = schema_name("limits_base")
        for name, schema in self.schemas.items():
            fresh_store_schema(cfg.dsn, schema,
                               cfg.limits_base_sql if name == "base" else None)
        self.conn: Conn = connect(cfg.dsn, prepare_threshold=0)
        self.pid = int(self.conn.info.backend_pid)
        for schema in self.schemas.values():
            s = ident(schema)
            for kind in ("concurrency", "both"):
                self.conn.execute(
                    f"SELECT {s}.queue_set_concurrency('{kind}', {CONCURRENCY})".encode())
            for kind in ("rate", "both"):
                self.conn.execute(f"SELECT {s}.queue_set_rate('{kind}', {RATE},"
                                  f" {RATE_PERIOD_MS})".encode())
        self.now = NOW

    def close(self) -> None:
        self.conn.close()
        with connect(self.cfg.dsn) as conn:
            for schema in self.schemas.values():
                drop_schema(conn, schema)

    def fill(self, s: str, kind: str, n: int) -> None:
        """``n`` due jobs of the queue ``kind``, and the clock moved on past every lease
        of the drain before (its jobs are gone: their places are busy until then)."""
        c = self.conn
        self.now += TTL + 1
        c.execute(f"TRUNCATE {s}.jobs".encode())
        c.execute(f"INSERT INTO {s}.jobs (run_id, dispatch_at, queue) SELECT 'job-' ||"
                  f" lpad(i::text, 8, '0'), {NOW - 1000}, '{kind}'"
                  f" FROM generate_series(1, {n}) i".encode())
        settle(c, f"{s}.jobs", f"{s}.queue_slots")

    def left(self, s: str) -> int:
        row = self.conn.execute(
            f"SELECT count(*) FROM {s}.jobs WHERE NOT dispatched OR worker_id IS NULL"
            .encode()).fetchone()
        assert row is not None
        return int(row[0])

    def loop(self, s: str, kind: str, path: str) -> Callable[[], int]:
        """A drain of the queue ``kind`` of schema ``s`` through ``path``; returns the
        jobs it marked. Every lease moves ``p_now`` on by a millisecond."""
        c = self.conn
        if path == "batch":
            lease = (f"SELECT * FROM {s}.job_lease_many(%s::text, %s::bigint, %s::bigint,"
                     f" %s::integer, %b::text[])")
            mark = (f"SELECT * FROM {s}.job_mark_dispatched_many(%b::text[], %s::text,"
                    f" %b::text[], %b::bigint[])")

            def batch() -> int:
                done = 0
                while True:
                    self.now += 1
                    cur = c.execute(lease, (ME, self.now, TTL, LIMITS_BATCH, [kind]))
                    names = [d.name for d in cur.description or ()]
                    at_id, at_seq = names.index("run_id"), names.index("lease_sequence")
                    rows = cur.fetchall()
                    if not rows:
                        return done
                    ids = [r[at_id] for r in rows]
                    seqs = [r[at_seq] for r in rows]
                    answer = c.execute(mark, (ids, ME, [ME] * len(ids), seqs)).fetchall()
                    assert len(answer) == len(ids) and all(a[2] for a in answer)
                    done += len(ids)

            return batch
        lease = (f"SELECT * FROM {s}.job_lease(%s::text, %s::bigint, %s::bigint,"
                 f" %b::text[])")
        mark = (f"SELECT * FROM {s}.job_mark_dispatched(%s::text, %s::text, %s::text,"
                f" %s::bigint)")

        def single() -> int:
            done = 0
            while True:
                self.now += 1
                cur = c.execute(lease, (ME, self.now, TTL, [kind]))
                names = [d.name for d in cur.description or ()]
                row = cur.fetchone()
                if row is None:
                    return done
                answer = c.execute(mark, (row[names.index("run_id")], ME, ME,
                                          row[names.index("lease_sequence")])).fetchone()
                assert answer is not None and answer[1]
                done += 1

        return single

    def drain(self, schema: str, kind: str, path: str, n: int) -> dict[str, Any]:
        """Fill ``n`` jobs of the queue ``kind``, drain them through ``path``; the costs a
        job."""
        s = ident(schema)
        self.fill(s, kind, n)
        loop = self.loop(s, kind, path)
        stat0, sched0 = backend_stat_ns(self.pid), backend_sched_ns(self.pid)
        wall0 = time.perf_counter_ns()
        done = loop()
        wall = time.perf_counter_ns() - wall0
        stat1, sched1 = backend_stat_ns(self.pid), backend_sched_ns(self.pid)
        left = self.left(s)
        per = max(done, 1)
        return {
            "jobs": done, "ok": done == n and left == 0,
            "jobs_per_s": done / (wall / 1e9),
            "server_cpu_us": None if stat0 is None or stat1 is None
            else (stat1 - stat0) / 1000 / per,
            "server_sched_us": None if sched0 is None or sched1 is None
            else (sched1 - sched0) / 1000 / per,
        }


def run_limits(cfg: Settings) -> dict[str, Any]:
    sizes = {"batch": cfg.limits_jobs, "single": min(cfg.limits_jobs, cfg.limits_single_jobs)}
    limits = Limits(cfg)
    runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {
        name: {path: {kind: [] for kind in KINDS} for path in PATHS}
        for name in limits.schemas}
    try:
        for schema in limits.schemas.values():  # untimed: plans cached, pages read
            for path in PATHS:
                for kind in KINDS:
                    limits.drain(schema, kind, path, min(LIMITS_BATCH * 3, sizes[path]))
        for _ in range(cfg.limits_repeats):
            for path in PATHS:
                for kind in KINDS:
                    for name, schema in limits.schemas.items():
                        runs[name][path][kind].append(
                            limits.drain(schema, kind, path, sizes[path]))
    finally:
        limits.close()
    out: dict[str, Any] = {}
    for name, paths in runs.items():
        out[name] = {}
        for path, kinds in paths.items():
            base = kinds["unlimited"]
            entry: dict[str, Any] = {}
            for kind, rs in kinds.items():
                v: dict[str, Any] = {"jobs": rs[0]["jobs"], "ok": all(r["ok"] for r in rs),
                                     "runs": rs}
                for m in MEASURES:
                    vals = [r[m] for r in rs if r[m] is not None]
                    v[m] = summarize(vals) if vals else None
                    pairs = [r[m] / b[m] for r, b in zip(rs, base, strict=True)
                             if r[m] and b[m]]
                    v[f"{m}_over_unlimited"] = summarize(pairs) if pairs else None
                entry[kind] = v
            out[name][path] = entry
    return {"batch": LIMITS_BATCH, "sizes": sizes, "repeats": cfg.limits_repeats,
            "concurrency": CONCURRENCY, "rate": RATE, "rate_period_ms": RATE_PERIOD_MS,
            "base_sql": None if cfg.limits_base_sql is None else str(cfg.limits_base_sql),
            "schemas": out,
            "all_checks_ok": all(v["ok"] for p in out.values() for k in p.values()
                                 for v in k.values())}


def limits_table(limits: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """The limits section: a job's server CPU and jobs/s for each queue kind and path, with
    their ratios to the unlimited queue (and, with a base, each schema's rows)."""

    def cell(v: dict[str, Any], m: str, fmt: str) -> str:
        if v.get(m) is None:
            return "-"
        text = format(v[m]["median"], fmt)
        ratio = v.get(f"{m}_over_unlimited")
        if ratio is not None:
            text += f" · {ratio['median']:.2f}x"
        return text

    rows = []
    for name, paths in limits["schemas"].items():
        for path, kinds in paths.items():
            label = f"{path} ({LIMITS_BATCH})" if path == "batch" else path
            for kind, v in kinds.items():
                rows.append([name, label, f"{kind} ({v['jobs']:,} jobs)"
                             + ("" if v["ok"] else " FAILED"),
                             cell(v, "server_sched_us", ".1f"), cell(v, "server_cpu_us", ".0f"),
                             cell(v, "jobs_per_s", ",.0f")])
    return (f"Queue limits: one process drains one queue at a time, median of "
            f"{limits['repeats']}; ratio to the unlimited queue of the same schema and path",
            ["schema", "path", "queue", "server µs/job (schedstat)",
             "server µs/job (stat ticks)", "jobs/s"], rows)
