"""Section 5: does the cost stay flat as the tables grow?

* ``job_lease`` (then ``job_mark_dispatched``, untimed) with ``scale_due`` due
  jobs beside ``scale_rows`` dispatched ones, against the due jobs alone;
* the same with, besides, ``scale_rows // 10`` jobs not due yet at a higher
  priority (issue 25: the lease must not walk them on the way to the due ones);
* the batched path, ``job_lease_many(100)`` then ``job_mark_dispatched_many``
  (timed together, per job), on a schema at ``pgstore_0018`` (before queues)
  and on one at the head, side by side (``lease_mark_batch``);
  and, to show why the jobs table wants a prompt autovacuum, the same after
  the history was dispatched by UPDATE with no VACUUM since (its dead entries
  still in the pending index);
* ``schedule_claim_due`` by a random id among ``scale_due`` schedules and
  among ``scale_rows``;
* ``schedule_claim_next(100)`` at both sizes, with ``p_ids`` (what a
  scheduler passes: ``scale_due`` ids of its own) and without;
* ``lease_cpu`` (issue 25, "Fast and flat"): the server CPU of a lease call
  (``/proc/<backend pid>/schedstat`` read around it; the client's wall time
  beside it), ``job_lease`` and ``job_lease_many(10)``, each with ``p_queues``
  NULL (every queue) and with a list (``LEASE_QUEUES``), on three tables:
  ``plain`` (``scale_due`` due jobs and nothing else), ``shape`` (the same
  with ``scale_due`` finished jobs and ``scale_due // 10`` future-dated jobs at
  priority 10: the big table's shape at the small size) and ``big``
  (``scale_rows`` finished jobs and ``scale_rows // 10`` future-dated priority
  jobs beside the due ones). Each call's jobs are given back, untimed, by an
  UPDATE that clears their lease (a HOT update: no index changes), so every
  table keeps its shape call after call (a mark and new jobs would grow the
  plain table's history, repeat after repeat); the tables are vacuumed between
  repeats (their autovacuum off, so no table is vacuumed in the middle of a
  repeat). The calls go round the tables one by one, the order turned each
  time. A
  repeat's figure is the median of its calls (on a shared server a call that
  rebuilds its caches after another session's DDL costs ten times the
  others). The ratios are big (and shape) over plain, per repeat; ``--scale-base-sql DIR``
  measures the same on tables loaded from another ``sql/`` directory beside
  them (before and after a change, in one process).

The big tables are filled with ``INSERT ... SELECT generate_series`` straight
into the store's tables (a benchmark shortcut for a million ``register`` /
``job_schedule`` calls), then VACUUM ANALYZE and a CHECKPOINT, as a real table
would have seen from autovacuum. Each repeat measures the small and the big
variant back to back; the ratio is big over small, per repeat.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
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
from pgstore.bench._floor import backend_sched_ns

NOW = 10**13
LEASE_MS = 500


def _fill_jobs(conn: Conn, s: str, due: int, history: int, dead: bool) -> None:
    """``history`` dispatched jobs due before ``due`` pending ones."""
    if history:
        conn.execute(
            f"INSERT INTO {s}.jobs (run_id, dispatch_at, lease_holder, lease_until, worker_id,"
            f" dispatched) SELECT 'h-' || i, i, 'old', i + 30000, 'w', {not dead}"
            f" FROM generate_series(1, {history}) i".encode())
        if dead:
            conn.execute(f"VACUUM (ANALYZE) {s}.jobs".encode())
            # No autovacuum from here on: the history's pending-index entries stay dead.
            conn.execute(f"ALTER TABLE {s}.jobs SET (autovacuum_enabled = false)".encode())
            conn.execute(f"UPDATE {s}.jobs SET dispatched = true WHERE run_id LIKE 'h-%'".encode())
    conn.execute(
        f"INSERT INTO {s}.jobs (run_id, dispatch_at) SELECT 'd-' || lpad(i::text, 7, '0'),"
        f" {history} + i FROM generate_series(1, {due}) i".encode())
    if dead:
        conn.execute(f"ANALYZE {s}.jobs".encode())
    else:
        conn.execute(f"VACUUM (ANALYZE) {s}.jobs".encode())


def _fill_future_priority(conn: Conn, s: str, rows: int) -> None:
    """``rows`` jobs at priority 10, due after NOW: ahead of every due job in lease order
    by priority, but not leasable."""
    conn.execute(
        f"INSERT INTO {s}.jobs (run_id, dispatch_at, priority) SELECT 'f-' || i,"
        f" {NOW} + i, 10 FROM generate_series(1, {rows}) i".encode())
    conn.execute(f"VACUUM (ANALYZE) {s}.jobs".encode())


def _fill_schedules(conn: Conn, s: str, rows: int) -> None:
    conn.execute(
        f"INSERT INTO {s}.schedules (id, kind, spec, next_run_at, updated_at)"
        f" SELECT 's-' || lpad(i::text, 7, '0'), 'interval', '60000', i % 1000, 0"
        f" FROM generate_series(0, {rows - 1}) i".encode())
    conn.execute(f"VACUUM (ANALYZE) {s}.schedules".encode())


#: The revision before queues (pgstore_0019): the batched path's "before".
BEFORE_QUEUES = "pgstore_0018"
#: Jobs per batched lease (then one batched mark).
BATCH = 100


class Variant:
    def __init__(self, cfg: Settings, part: str, revision: str | None = None,
                 sql_dir: Path | None = None) -> None:
        self.schema = schema_name(part)
        self.s = ident(self.schema)
        if revision is None:
            fresh_store_schema(cfg.dsn, self.schema, sql_dir)
        else:
            from pgstore.schema.migrations import migrate

            with connect(cfg.dsn) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {self.s} CASCADE".encode())
            migrate(cfg.dsn, self.schema, revision, client_role=False)
        self.conn = connect(cfg.dsn)

    def close(self) -> None:
        self.conn.execute(f"DROP SCHEMA IF EXISTS {self.s} CASCADE".encode())
        self.conn.close()


def run_scale(cfg: Settings) -> dict[str, Any]:
    small, big, due = cfg.scale_due, cfg.scale_rows, cfg.scale_due
    rng = random.Random(42)
    variants: dict[str, Variant] = {}
    try:
        for part in ("scale_jobs_small", "scale_jobs_big", "scale_jobs_dead", "scale_jobs_prio",
                     "scale_sched_small", "scale_sched_big", "scale_batch_head"):
            variants[part] = Variant(cfg, part)
        variants["scale_batch_before"] = Variant(cfg, "scale_batch_before", BEFORE_QUEUES)
        cfg.log(f"  scale: filling {big:,} rows (generate_series)...")
        _fill_jobs(variants["scale_jobs_small"].conn, variants["scale_jobs_small"].s, due, 0,
                   False)
        _fill_jobs(variants["scale_jobs_big"].conn, variants["scale_jobs_big"].s, due, big, False)
        _fill_jobs(variants["scale_jobs_prio"].conn, variants["scale_jobs_prio"].s, due, big, False)
        _fill_future_priority(variants["scale_jobs_prio"].conn, variants["scale_jobs_prio"].s,
                              max(big // 10, 1))
        n_batches = max(cfg.calls // 20, 3)
        batch_jobs = BATCH * n_batches * (cfg.repeats + 1)
        for part in ("scale_batch_before", "scale_batch_head"):
            _fill_jobs(variants[part].conn, variants[part].s, batch_jobs, 0, False)
        _fill_jobs(variants["scale_jobs_dead"].conn, variants["scale_jobs_dead"].s, due, big, True)
        _fill_schedules(variants["scale_sched_small"].conn, variants["scale_sched_small"].s, small)
        _fill_schedules(variants["scale_sched_big"].conn, variants["scale_sched_big"].s, big)
        variants["scale_sched_small"].conn.execute(b"CHECKPOINT")

        clock = [10**12]

        def tick() -> int:
            clock[0] += 1000
            return clock[0]

        def lease_batch(v: Variant, n: int) -> float:
            t = Timer()
            lease = f"SELECT run_id FROM {v.s}.job_lease('bench', %s, 60000)"
            mark = f"SELECT recorded FROM {v.s}.job_mark_dispatched(%s, 'bench', 'w')"
            for _ in range(n):
                with t.timing():
                    row = v.conn.execute(lease, (NOW,)).fetchone()
                assert row is not None and str(row[0]).startswith("d-"), row
                v.conn.execute(mark, (row[0],))
            return t.mean_us

        def claim_batch(v: Variant, rows: int, n: int) -> float:
            t = Timer()
            claim = f"SELECT id FROM {v.s}.schedule_claim_due(%s, 'bench', %s, {LEASE_MS})"
            for _ in range(n):
                sid = f"s-{rng.randrange(rows):07d}"
                now = tick()
                with t.timing():
                    got = v.conn.execute(claim, (sid, now)).fetchall()
                assert got, sid
            return t.mean_us

        def lease_mark_many(v: Variant, n: int) -> float:
            """µs per job of ``job_lease_many(BATCH)`` then ``job_mark_dispatched_many``."""
            t = Timer()
            lease = f"SELECT run_id FROM {v.s}.job_lease_many('bench', %s, 60000, {BATCH})"
            mark = (f"SELECT recorded FROM {v.s}.job_mark_dispatched_many(%s, 'bench',"
                    f" array_fill('w'::text, ARRAY[{BATCH}]), NULL)")
            for _ in range(n):
                with t.timing():
                    got = [r[0] for r in v.conn.execute(lease, (NOW,)).fetchall()]
                    marked = v.conn.execute(mark, (got,)).fetchall()
                assert len(got) == BATCH and all(r[0] for r in marked), len(got)
            return t.mean_us / BATCH

        ids = [f"s-{i:07d}" for i in range(due)]

        def next_batch(v: Variant, with_ids: bool, n: int) -> float:
            t = Timer()
            q = (f"SELECT id FROM {v.s}.schedule_claim_next('bench', %s, {LEASE_MS}, 100, %s)")
            for _ in range(n):
                now = tick()
                with t.timing():
                    got = v.conn.execute(q, (now, ids if with_ids else None)).fetchall()
                assert len(got) == 100
            return t.mean_us

        n = max(cfg.calls // 2, 5)
        # The small jobs table serves the three job cases: its due jobs must last every round.
        n_jobs = max(min(n, due // (3 * (cfg.repeats + 1))), 2)
        n_scan = max(3, n // 10)
        cases: dict[str, tuple[Callable[[], float], Callable[[], float]]] = {
            "job_lease": (lambda: lease_batch(variants["scale_jobs_small"], n_jobs),
                          lambda: lease_batch(variants["scale_jobs_big"], n_jobs)),
            "job_lease_unvacuumed": (lambda: lease_batch(variants["scale_jobs_small"], n_jobs),
                                     lambda: lease_batch(variants["scale_jobs_dead"], n_jobs)),
            "job_lease_future_priority": (
                lambda: lease_batch(variants["scale_jobs_small"], n_jobs),
                lambda: lease_batch(variants["scale_jobs_prio"], n_jobs)),
            "claim_due": (lambda: claim_batch(variants["scale_sched_small"], small, n),
                          lambda: claim_batch(variants["scale_sched_big"], big, n)),
            "claim_next_100_with_ids": (
                lambda: next_batch(variants["scale_sched_small"], True, n),
                lambda: next_batch(variants["scale_sched_big"], True, n)),
            "claim_next_100_no_ids": (
                lambda: next_batch(variants["scale_sched_small"], False, n_scan),
                lambda: next_batch(variants["scale_sched_big"], False, n_scan)),
        }
        # One untimed round first: caches, plans, and the dead variant's first scan
        # (which marks the dead index entries it meets, as the first lease after a
        # mass dispatch would).
        for a, b in cases.values():
            a()
            b()
        before, after = variants["scale_batch_before"], variants["scale_batch_head"]
        lease_mark_many(before, n_batches)
        lease_mark_many(after, n_batches)
        raw: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in cases}
        batch_raw: tuple[list[float], list[float]] = ([], [])
        for rep in range(cfg.repeats):
            for name, (a, b) in cases.items():
                raw[name][0].append(a())
                raw[name][1].append(b())
            # Alternated, so drift on a shared machine falls on both alike.
            pair = (before, after) if rep % 2 == 0 else (after, before)
            for v in pair:
                batch_raw[0 if v is before else 1].append(lease_mark_many(v, n_batches))
            cfg.log(f"  scale: repeat {rep + 1}/{cfg.repeats} done")
        plans = {
            "job_lease_big": _plan(variants["scale_jobs_big"], "job_lease"),
            "job_lease_future_priority": _call_plan(variants["scale_jobs_prio"]),
            "job_lease_unvacuumed": _plan(variants["scale_jobs_dead"], "job_lease"),
            "claim_next_no_ids_big": _plan(variants["scale_sched_big"], "claim_next"),
        }
        sizes = {
            name: {"rows": r, "total_bytes": _size(variants[name])}
            for name, r in (("scale_jobs_small", due), ("scale_jobs_big", due + big),
                            ("scale_jobs_dead", due + big),
                            ("scale_jobs_prio", due + big + max(big // 10, 1)),
                            ("scale_sched_small", small),
                            ("scale_sched_big", big))
        }
        return {
            "unit": "us per call",
            "small_rows": small,
            "big_rows": big,
            "due_jobs": due,
            "calls_per_repeat": {"jobs": n_jobs, "claim": n, "claim_next_no_ids": n_scan},
            "cases": {
                name: {"small_us": summarize(a), "big_us": summarize(b),
                       "ratio": summarize([y / x for x, y in zip(a, b, strict=True)])}
                for name, (a, b) in raw.items()
            },
            "lease_mark_batch": {
                "unit": f"us per job, job_lease_many({BATCH}) + job_mark_dispatched_many",
                "before_revision": BEFORE_QUEUES,
                "batches_per_repeat": n_batches,
                "before_us": summarize(batch_raw[0]),
                "after_us": summarize(batch_raw[1]),
                "ratio": summarize([y / x for x, y in zip(*batch_raw, strict=True)]),
            },
            "future_priority_jobs": max(big // 10, 1),
            "plans": plans,
            "sizes": sizes,
            "lease_cpu": run_lease_cpu(cfg),
        }
    finally:
        for v in variants.values():
            v.close()


# --- lease_cpu: the server CPU of a lease call beside future priority jobs (issue 25) ---

#: What the list cases pass as p_queues: the default queue and one with no job.
LEASE_QUEUES = ["default", "other"]
#: Jobs a job_lease_many call of the lease_cpu cases takes.
LEASE_MANY = 10
#: The lease_cpu cases: (name, p_queues, jobs a call: None for job_lease).
LEASE_CASES: tuple[tuple[str, list[str] | None, int | None], ...] = (
    ("job_lease", None, None),
    ("job_lease_queues", LEASE_QUEUES, None),
    ("job_lease_many_10", None, LEASE_MANY),
    ("job_lease_many_10_queues", LEASE_QUEUES, LEASE_MANY),
)
#: The lease_cpu tables: plain (due jobs only), shape (the big table's shape at the
#: small size), big.
LEASE_TABLES = ("plain", "shape", "big")


class LeaseTable:
    """A jobs table of the lease_cpu cases: ``due`` due jobs, ``finished`` dispatched
    ones (due before them, finished_at set) and ``future`` jobs at priority 10 due after
    NOW; each lease call's jobs are given back (lease cleared, attempts 0) by an
    untimed UPDATE."""

    def __init__(self, cfg: Settings, part: str, sql_dir: Path | None) -> None:
        self.v = Variant(cfg, part, sql_dir=sql_dir)
        self.pid = int(self.v.conn.info.backend_pid)

    def fill(self, due: int, finished: int, future: int) -> None:
        conn, s = self.v.conn, self.v.s
        conn.execute(f"ALTER TABLE {s}.jobs SET (autovacuum_enabled = false)".encode())
        if finished:
            conn.execute(
                f"INSERT INTO {s}.jobs (run_id, dispatch_at, lease_holder, lease_until,"
                f" worker_id, dispatched, lease_sequence, attempts, finished_at)"
                f" SELECT 'h-' || lpad(i::text, 8, '0'), i, 'old', i + 30000, 'w', true, 1, 1,"
                f" i + 1000 FROM generate_series(1, {finished}) i".encode())
        conn.execute(
            f"INSERT INTO {s}.jobs (run_id, dispatch_at) SELECT 'd-' || lpad(i::text, 8, '0'),"
            f" {finished} + i FROM generate_series(1, {due}) i".encode())
        if future:
            conn.execute(
                f"INSERT INTO {s}.jobs (run_id, dispatch_at, priority)"
                f" SELECT 'f-' || lpad(i::text, 8, '0'), {NOW} + i, 10"
                f" FROM generate_series(1, {future}) i".encode())
        conn.execute(f"VACUUM (ANALYZE) {s}.jobs".encode())

    def call(self, queues: list[str] | None, many: int | None) -> tuple[int | None, int]:
        """One lease call: (server CPU ns, None when /proc does not show the server's CPU:
        another machine; client wall ns); then, untimed, the jobs it leased given back."""
        conn, s = self.v.conn, self.v.s
        if many is None:
            lease = f"SELECT run_id FROM {s}.job_lease('bench', %s, 60000, %s)"
            args: tuple[Any, ...] = (NOW, queues)
        else:
            lease = f"SELECT run_id FROM {s}.job_lease_many('bench', %s, 60000, %s, %s)"
            args = (NOW, many, queues)
        c0 = backend_sched_ns(self.pid)
        w0 = time.perf_counter_ns()
        got = [str(r[0]) for r in conn.execute(lease, args).fetchall()]
        wall = time.perf_counter_ns() - w0
        c1 = backend_sched_ns(self.pid)
        assert len(got) == (many or 1) and all(r.startswith("d-") for r in got), got
        # Given back in one UPDATE (HOT: no indexed column changes): the table keeps its
        # shape, call after call.
        conn.execute(f"UPDATE {s}.jobs SET lease_holder = NULL, lease_until = NULL,"
                     f" attempts = 0 WHERE run_id = ANY (%s)", (got,))
        return (None if c0 is None or c1 is None else c1 - c0), wall

    def vacuum(self) -> None:
        self.v.conn.execute(f"VACUUM {self.v.s}.jobs".encode())

    def close(self) -> None:
        self.v.close()


def run_lease_cpu(cfg: Settings) -> dict[str, Any]:
    """The lease_cpu cases (the module's docstring): per case and table, the server CPU
    µs per call; the ratios big / plain and shape / plain, per repeat."""
    due, big = cfg.scale_due, cfg.scale_rows
    shapes = {"plain": (due, 0, 0), "shape": (due, due, max(due // 10, 1)),
              "big": (due, big, max(big // 10, 1))}
    kinds: dict[str, Path | None] = {"head": None}
    if cfg.scale_base_sql is not None:
        kinds["base"] = cfg.scale_base_sql
    tables: dict[tuple[str, str], LeaseTable] = {}
    try:
        for kind, sql_dir in kinds.items():
            for name in LEASE_TABLES:
                tables[kind, name] = LeaseTable(cfg, f"lease_{kind}_{name}", sql_dir)
        cfg.log(f"  scale: lease_cpu, filling {len(tables)} tables (generate_series)...")
        for (_, name), table in tables.items():
            table.fill(*shapes[name])
        tables["head", "plain"].v.conn.execute(b"CHECKPOINT")
        measured = backend_sched_ns(tables["head", "plain"].pid) is not None
        n = max(cfg.calls // 2, 5)
        order = list(tables)
        # One untimed round first: plans, caches.
        for key in order:
            for _, queues, many in LEASE_CASES:
                for _ in range(3):
                    tables[key].call(queues, many)
        raw: dict[tuple[str, str, str], list[float]] = {}
        wall: dict[tuple[str, str, str], list[float]] = {}
        for rep in range(cfg.repeats):
            for table in tables.values():
                # A VACUUM invalidates the plans cached on the table: one untimed call of
                # each case plans them again, so that no case pays it for the others.
                table.vacuum()
                for _, queues, many in LEASE_CASES:
                    table.call(queues, many)
            for case, queues, many in LEASE_CASES:
                cpu: dict[tuple[str, str], list[int]] = {key: [] for key in order}
                took: dict[tuple[str, str], list[int]] = {key: [] for key in order}
                # Call by call across the tables (the order turned every call), so that
                # drift on a shared machine falls on every table alike.
                for i in range(n):
                    for key in (order if (rep + i) % 2 == 0 else order[::-1]):
                        c, w = tables[key].call(queues, many)
                        if c is not None:
                            cpu[key].append(c)
                        took[key].append(w)
                for kind, name in order:
                    w_us = statistics.median(took[kind, name]) / 1000
                    c_us = statistics.median(cpu[kind, name]) / 1000 if measured else w_us
                    raw.setdefault((kind, case, name), []).append(c_us)
                    wall.setdefault((kind, case, name), []).append(w_us)
            cfg.log(f"  scale: lease_cpu repeat {rep + 1}/{cfg.repeats} done")

        def ratios(kind: str, case: str, name: str) -> dict[str, Any]:
            return summarize([y / x for x, y in zip(raw[kind, case, "plain"],
                                                    raw[kind, case, name], strict=True)])

        out: dict[str, Any] = {
            "unit": ("server CPU us per call (schedstat, median of the calls)" if measured
                     else "wall us per call (median of the calls; no /proc view of the server)"),
            "server_cpu": measured,
            "calls_per_repeat": n,
            "queues": LEASE_QUEUES,
            "many": LEASE_MANY,
            "tables": {name: {"due": d, "finished": f, "future_priority": p}
                       for name, (d, f, p) in shapes.items()},
        }
        for kind in kinds:
            out[kind] = {
                case: {
                    **{f"{name}_us": summarize(raw[kind, case, name]) for name in LEASE_TABLES},
                    **{f"{name}_wall_us": summarize(wall[kind, case, name])
                       for name in LEASE_TABLES},
                    "ratio": ratios(kind, case, "big"),
                    "ratio_shape": ratios(kind, case, "shape"),
                }
                for case, _, _ in LEASE_CASES
            }
        if "base" in kinds:
            out["base_sql"] = str(cfg.scale_base_sql)
            out["head_over_base"] = {
                case: {name: summarize([y / x for x, y in zip(raw["base", case, name],
                                                              raw["head", case, name],
                                                              strict=True)])
                       for name in LEASE_TABLES}
                for case, _, _ in LEASE_CASES
            }
        return out
    finally:
        for table in tables.values():
            table.close()


def _call_plan(v: Variant) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of one whole job_lease call (its buffers are the
    function's), rolled back."""
    v.conn.execute(b"BEGIN")
    try:
        rows = v.conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM {v.s}.job_lease('explain', {NOW}, 60000)"
            .encode()).fetchall()
        return [str(r[0]) for r in rows]
    finally:
        v.conn.execute(b"ROLLBACK")


def _size(v: Variant) -> int:
    row = v.conn.execute(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
        " WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r'", (v.schema,)
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def lease_statement(conn: Conn, s: str, now: int = NOW) -> str:
    """The lease walk of the job_lease installed in schema ``s`` (quoted), at ``now``, with
    literal values; run it with ``search_path`` at ``s`` (inside a transaction:
    ``SET LOCAL search_path`` first). Read from the function, so it never drifts."""
    from pgstore.bench.plan_1m import VARIABLE
    from pgstore.bench.plan_1m import lease_statement as installed

    conn.execute(f"SET LOCAL search_path = {s}".encode())
    values = {"v_now": str(now)}
    return VARIABLE.sub(lambda m: values[m.group(0)], installed(conn))


def _plan(v: Variant, what: str) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the statement inside the function, rolled back."""
    s = v.s
    v.conn.execute(b"BEGIN")
    try:
        return _explain(v, what, s)
    finally:
        v.conn.execute(b"ROLLBACK")


def _explain(v: Variant, what: str, s: str) -> list[str]:
    if what == "job_lease":
        stmt = lease_statement(v.conn, s)
    else:
        stmt = (f"SELECT c.id FROM {s}.schedules c WHERE c.next_run_at IS NOT NULL AND"
                f" c.next_run_at <= {NOW} AND (c.lease_until IS NULL OR c.lease_until <= {NOW})"
                f" ORDER BY c.next_run_at, c.id LIMIT 100 FOR UPDATE SKIP LOCKED")
    rows = v.conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {stmt}".encode()).fetchall()
    return [str(r[0]) for r in rows]
