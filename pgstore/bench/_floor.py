"""Section ``queue-floor``: what a job costs the server on pgstore's SQL paths against a
minimal hand-written queue, one process, one connection, no Python runtime around it.

One Python process drains ``floor_jobs`` jobs (all due) in batches of ``FLOOR_BATCH``
through each variant, each lease and each mark its own autocommit transaction (the
server's ``synchronous_commit``, as pgstore runs):

* ``bare_text``: a minimal queue with a text key: ``id text COLLATE "C"`` primary key,
  ``run_at``, ``status`` (0 waiting, 1 leased, 2 done), holder, lease end, worker, and
  one partial index of the waiting jobs (``run_at, id WHERE status = 0``). Lease: one
  ``UPDATE ... WHERE id = ANY (ARRAY(SELECT ... ORDER BY run_at, id LIMIT 500 FOR UPDATE
  SKIP LOCKED)) RETURNING id``; mark: one ``UPDATE ... WHERE id = ANY ($1) AND holder =
  $2``. Both prepared.
* ``bare_bigint``: the same with a ``bigint`` identity key.
* ``pgstore_batch``: ``job_lease_many`` then ``job_mark_dispatched_many`` (with the
  lease sequences, as the Dispatcher sends them), ``SELECT *`` as the wrappers send.
* ``pgstore_single``: ``job_lease`` then ``job_mark_dispatched``, a job at a time, over
  ``floor_single_jobs`` jobs (a commit a call: a drain of 50,000 would take minutes).
* ``pgstore_updates``: the two UPDATEs inside ``job_lease_many`` and
  ``job_mark_dispatched_many`` sent bare (prepared), on pgstore's table: what the
  functions around them (checks, plpgsql, the answer's assembly) add.
* ``mark_lease_batch``: ``job_lease_many`` once, then ``proto_mark_lease_many``, a
  prototype defined here in the bench's own schema only (no revision ships it;
  docs/performance.md, "Where the batch path's cost goes"): one call, one commit, that
  marks a batch (``job_mark_dispatched_many``) and leases the next (``job_lease_many``),
  answering both; the whole call is counted as the mark.
* ``base_batch`` (only with ``--floor-base-sql DIR``): ``pgstore_batch`` on a second
  schema loaded from another ``sql/`` directory (main's, say), in the same process and
  interleaved: a change to the batch functions measured before and after.
* ``dispatcher``: pgstore's ``Dispatcher`` (``AsyncPgJobStore`` on one connection,
  ``batch_size`` 500, ``concurrency`` 1000, an ``async def`` dispatch that returns a
  worker id, no event subscriber) draining the same table in this process: its client
  CPU a job is the Python runtime's cost over the SQL path's (``pgstore_batch``).

Array parameters go in binary (``%b``), as pgstore's wrappers send them.

Per variant and repeat: the table refilled and settled (VACUUM ANALYZE, CHECKPOINT),
then the drain, measuring the server backend's CPU (``utime + stime`` of
``/proc/<pg_backend_pid()>/stat``, in clock ticks, and ``/proc/<pid>/schedstat``, in ns,
when the server runs on this machine), the client process's CPU
(``time.process_time``) and the wall time. The variants are interleaved within each
repeat; ratios are to ``bare_text`` of the same repeat, medians over the repeats.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

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

#: Jobs a lease takes (and a mark marks).
FLOOR_BATCH = 500
NOW = 10**13
TTL = 30_000
ME = "floor-worker"

VARIANTS = ("bare_text", "bare_bigint", "pgstore_batch", "pgstore_single",
            "pgstore_updates", "mark_lease_batch", "dispatcher")
#: The variant ``--floor-base-sql`` adds: the batch path on the other sql/ directory.
BASE_VARIANT = "base_batch"
#: The Dispatcher variant's ``concurrency``: two batches in flight.
DISPATCHER_CONCURRENCY = 1000


def _bare_ddl(s: str) -> str:
    return f"""
CREATE TABLE {s}.q_text (
    id          text COLLATE "C" PRIMARY KEY,
    run_at      bigint   NOT NULL,
    status      smallint NOT NULL DEFAULT 0,
    holder      text,
    lease_until bigint,
    worker_id   text);
CREATE INDEX q_text_waiting ON {s}.q_text (run_at, id) WHERE status = 0;
CREATE TABLE {s}.q_bigint (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_at      bigint   NOT NULL,
    status      smallint NOT NULL DEFAULT 0,
    holder      text,
    lease_until bigint,
    worker_id   text);
CREATE INDEX q_bigint_waiting ON {s}.q_bigint (run_at, id) WHERE status = 0;
"""


def _bare_lease(s: str, table: str) -> str:
    return (f"UPDATE {s}.{table} q SET status = 1, holder = %s, lease_until = %s"
            f" WHERE q.id = ANY (ARRAY(SELECT c.id FROM {s}.{table} c"
            f" WHERE c.status = 0 AND c.run_at <= %s ORDER BY c.run_at, c.id"
            f" LIMIT %s FOR UPDATE SKIP LOCKED)) RETURNING q.id")


def _bare_mark(s: str, table: str, key: str) -> str:
    return (f"UPDATE {s}.{table} SET status = 2, worker_id = %s"
            f" WHERE id = ANY (%b::{key}[]) AND holder = %s AND status = 1")


#: The UPDATE of job_lease_many (job_lease_default, sql/22_job_batches.sql), its variables
#: as parameters: holder, until, limit bound where it binds p_holder, p_until, p_limit and
#: p_now.
def _pg_lease_update(s: str) -> str:
    return f"""
UPDATE {s}.jobs j
   SET lease_holder = CASE WHEN j.attempts < j.max_attempts THEN %(holder)s END,
       lease_until = CASE WHEN j.attempts < j.max_attempts THEN %(until)s::bigint END,
       lease_sequence = CASE WHEN j.attempts < j.max_attempts
                             THEN greatest(j.lease_sequence + 1,
                                           (SELECT {s}.token_floor_at(
                                                       (SELECT e.epoch FROM {s}.store_epoch e))),
                                           (SELECT f.lease_sequence + 1 FROM {s}.job_fences f))
                             ELSE j.lease_sequence END,
       attempts = CASE WHEN j.attempts < j.max_attempts THEN j.attempts + 1 ELSE j.attempts END,
       failed = j.attempts >= j.max_attempts,
       finished_at = CASE WHEN j.attempts < j.max_attempts
                          THEN j.finished_at ELSE {s}.now_ms() END,
       last_error = CASE WHEN j.attempts < j.max_attempts THEN j.last_error
                         ELSE format('out of attempts: leased %%s times (max_attempts '
                                     '%%s), the last lease expired without a release',
                                     j.attempts, j.max_attempts) END
 WHERE j.run_id = ANY (ARRAY(
           SELECT c.run_id FROM {s}.jobs c
            WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
              AND c.queue = 'default' AND c.priority = 0
              AND c.dispatch_at <= %(now)s::bigint
              AND (c.lease_until IS NULL OR c.lease_until <= %(now)s::bigint)
            ORDER BY c.dispatch_at, c.run_id
            LIMIT %(limit)s::integer
              FOR UPDATE SKIP LOCKED))
RETURNING j.*"""


def _pg_mark_update(s: str) -> str:
    return f"""
UPDATE {s}.jobs j
   SET dispatched = true,
       worker_id = (SELECT jsonb_object(%(ids)b::text[], %(workers)b::text[])) ->> j.run_id,
       finished_at = coalesce(j.finished_at, (SELECT {s}.now_ms()))
 WHERE j.run_id = ANY (%(ids)b::text[])
   AND j.lease_holder = %(holder)s
   AND j.lease_sequence = coalesce(
           ((SELECT jsonb_object(%(ids)b::text[], %(seqs)b::text[])) ->> j.run_id)::bigint,
           j.lease_sequence)
RETURNING j.run_id, j.cancelled"""


#: The prototype of one call that marks a batch and leases the next (docs/performance.md,
#: "Where the batch path's cost goes"), in the bench's schema only: the mark's answer
#: (run_id, cancelled, recorded), then the leased jobs (run_id, lease_sequence and the
#: row), through the shipped functions, unchanged.
def _proto_ddl(s: str) -> str:
    return f"""
CREATE FUNCTION {s}.proto_mark_lease_many(
    p_run_ids text[], p_holder text, p_worker_ids text[], p_lease_sequences bigint[],
    p_now bigint, p_ttl_ms bigint, p_limit integer
) RETURNS TABLE (run_id text, cancelled boolean, recorded boolean, lease_sequence bigint,
                 job {s}.jobs)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY
    SELECT m.run_id, m.cancelled, m.recorded, NULL::bigint, NULL::jobs
      FROM job_mark_dispatched_many(p_run_ids, p_holder, p_worker_ids,
                                    p_lease_sequences) AS m;
    RETURN QUERY
    SELECT l.run_id, NULL::boolean, NULL::boolean, l.lease_sequence, l
      FROM job_lease_many(p_holder, p_now, p_ttl_ms, p_limit) AS l;
END
$$;
"""


# --- measuring ------------------------------------------------------------------------

_TICK_NS = 10**9 // (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def backend_stat_ns(pid: int) -> int | None:
    """utime + stime of process ``pid`` (``/proc/<pid>/stat``), in ns; None when /proc
    does not show it (a server on another machine)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after the command name
    return (int(fields[11]) + int(fields[12])) * _TICK_NS  # fields 14 and 15 of stat(5)


def backend_sched_ns(pid: int) -> int | None:
    """The CPU time process ``pid`` has run (``/proc/<pid>/schedstat``), in ns."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Split:
    """The backend's CPU (schedstat) split between the lease and the mark calls: read
    after each call, the delta since the last read goes to that call's phase."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ns = {"lease": 0, "mark": 0}
        self.last = backend_sched_ns(pid)

    def __call__(self, phase: str) -> None:
        if self.last is None:
            return
        now = backend_sched_ns(self.pid)
        assert now is not None
        self.ns[phase] += now - self.last
        self.last = now


class Floor:
    """The scratch schema, its tables and the drains."""

    def __init__(self, cfg: Settings) -> None:
        self.cfg = cfg
        self.schema = schema_name("queue_floor")
        self.s = ident(self.schema)
        fresh_store_schema(cfg.dsn, self.schema)
        self.conn: Conn = connect(cfg.dsn, prepare_threshold=0)
        self.conn.execute(_bare_ddl(self.s).encode(), prepare=False)
        self.conn.execute(f"SET search_path TO {self.s}".encode(), prepare=False)
        self.conn.execute(_proto_ddl(self.s).encode(), prepare=False)
        self.pid = int(self.conn.info.backend_pid)
        self.base: str | None = None  # the base_batch variant's schema, quoted
        if cfg.floor_base_sql is not None:
            self.base_schema = schema_name("queue_floor_base")
            fresh_store_schema(cfg.dsn, self.base_schema, cfg.floor_base_sql)
            self.base = ident(self.base_schema)

    def close(self) -> None:
        self.conn.close()
        with connect(self.cfg.dsn) as conn:
            drop_schema(conn, self.schema)
            if self.base is not None:
                drop_schema(conn, self.base_schema)

    def _schema(self, variant: str) -> str:
        """The quoted schema whose jobs table ``variant`` drains."""
        if variant == BASE_VARIANT:
            assert self.base is not None
            return self.base
        return self.s

    # -- filling ------------------------------------------------------------------------

    def fill(self, variant: str, n: int) -> None:
        s, c = self._schema(variant), self.conn
        if variant == "bare_text":
            c.execute(f"TRUNCATE {s}.q_text".encode())
            c.execute(f"INSERT INTO {s}.q_text (id, run_at) SELECT 'job-' || lpad(i::text, 8,"
                      f" '0'), {NOW - 1000} FROM generate_series(1, {n}) i".encode())
            settle(c, f"{s}.q_text")
        elif variant == "bare_bigint":
            c.execute(f"TRUNCATE {s}.q_bigint".encode())
            c.execute(f"INSERT INTO {s}.q_bigint (run_at) SELECT {NOW - 1000}"
                      f" FROM generate_series(1, {n}) i".encode())
            settle(c, f"{s}.q_bigint")
        else:  # the Dispatcher reads the database's clock: due long before it
            due = 1000 if variant == "dispatcher" else NOW - 1000
            c.execute(f"TRUNCATE {s}.jobs".encode())
            c.execute(f"INSERT INTO {s}.jobs (run_id, dispatch_at) SELECT 'job-' ||"
                      f" lpad(i::text, 8, '0'), {due}"
                      f" FROM generate_series(1, {n}) i".encode())
            settle(c, f"{s}.jobs")

    def left(self, variant: str) -> int:
        """Jobs not yet marked done after a drain."""
        s = self._schema(variant)
        if variant.startswith("bare_"):
            table = "q_text" if variant == "bare_text" else "q_bigint"
            q = f"SELECT count(*) FROM {s}.{table} WHERE status <> 2 OR worker_id IS NULL"
        else:
            q = f"SELECT count(*) FROM {s}.jobs WHERE NOT dispatched OR worker_id IS NULL"
        row = self.conn.execute(q.encode()).fetchone()
        assert row is not None
        return int(row[0])

    # -- the loops ----------------------------------------------------------------------

    def loop(self, variant: str, split: Split) -> Callable[[], int]:
        """A drain of every due job through ``variant``; returns the jobs it marked."""
        c, s = self.conn, self.s
        if variant in ("bare_text", "bare_bigint"):
            table, key = ("q_text", "text") if variant == "bare_text" else ("q_bigint", "bigint")
            lease, mark = _bare_lease(s, table), _bare_mark(s, table, key)

            def bare() -> int:
                done = 0
                while True:
                    ids = [r[0] for r in c.execute(lease, (ME, NOW + TTL, NOW, FLOOR_BATCH))]
                    split("lease")
                    if not ids:
                        return done
                    cur = c.execute(mark, (ME, ids, ME))
                    split("mark")
                    assert cur.rowcount == len(ids)
                    done += len(ids)

            return bare
        if variant in ("pgstore_batch", BASE_VARIANT):
            fs = self._schema(variant)
            lease = (f"SELECT * FROM {fs}.job_lease_many(%s::text, %s::bigint, %s::bigint,"
                     f" %s::integer)")
            mark = (f"SELECT * FROM {fs}.job_mark_dispatched_many(%b::text[], %s::text,"
                    f" %b::text[], %b::bigint[])")

            def batch() -> int:
                done = 0
                while True:
                    cur = c.execute(lease, (ME, NOW, TTL, FLOOR_BATCH))
                    split("lease")
                    names = [d.name for d in cur.description or ()]
                    at_id, at_seq = names.index("run_id"), names.index("lease_sequence")
                    rows = cur.fetchall()
                    if not rows:
                        return done
                    ids = [r[at_id] for r in rows]
                    seqs = [r[at_seq] for r in rows]
                    answer = c.execute(mark, (ids, ME, [ME] * len(ids), seqs)).fetchall()
                    split("mark")
                    assert len(answer) == len(ids) and all(a[2] for a in answer)
                    done += len(ids)

            return batch
        if variant == "mark_lease_batch":
            lease = (f"SELECT run_id, lease_sequence FROM {s}.job_lease_many(%s::text,"
                     f" %s::bigint, %s::bigint, %s::integer)")
            both = (f"SELECT run_id, cancelled, recorded, lease_sequence, job"
                    f" FROM {s}.proto_mark_lease_many(%b::text[], %s::text, %b::text[],"
                    f" %b::bigint[], %s::bigint, %s::bigint, %s::integer)")

            def mark_lease() -> int:
                done = 0
                leased = c.execute(lease, (ME, NOW, TTL, FLOOR_BATCH)).fetchall()
                split("lease")
                while leased:
                    ids = [r[0] for r in leased]
                    seqs = [r[1] for r in leased]
                    rows = c.execute(both, (ids, ME, [ME] * len(ids), seqs, NOW, TTL,
                                            FLOOR_BATCH)).fetchall()
                    split("mark")
                    answer, leased = rows[:len(ids)], [(r[0], r[3]) for r in rows[len(ids):]]
                    assert [a[0] for a in answer] == ids and all(a[2] for a in answer)
                    done += len(ids)
                return done

            return mark_lease
        if variant == "pgstore_single":
            lease = f"SELECT * FROM {s}.job_lease(%s::text, %s::bigint, %s::bigint)"
            mark = (f"SELECT * FROM {s}.job_mark_dispatched(%s::text, %s::text, %s::text,"
                    f" %s::bigint)")

            def single() -> int:
                done = 0
                while True:
                    cur = c.execute(lease, (ME, NOW, TTL))
                    split("lease")
                    names = [d.name for d in cur.description or ()]
                    row = cur.fetchone()
                    if row is None:
                        return done
                    run_id = row[names.index("run_id")]
                    seq = row[names.index("lease_sequence")]
                    answer = c.execute(mark, (run_id, ME, ME, seq)).fetchone()
                    split("mark")
                    assert answer is not None and answer[1]
                    done += 1

            return single
        assert variant == "pgstore_updates"
        lease_u, mark_u = _pg_lease_update(s), _pg_mark_update(s)

        def updates() -> int:
            done = 0
            while True:
                cur = c.execute(lease_u, {"holder": ME, "until": NOW + TTL, "now": NOW,
                                          "limit": FLOOR_BATCH})
                split("lease")
                names = [d.name for d in cur.description or ()]
                at_id, at_seq = names.index("run_id"), names.index("lease_sequence")
                rows = [r for r in cur.fetchall() if not r[names.index("failed")]]
                if not rows:
                    return done
                ids = [r[at_id] for r in rows]
                seqs = [str(r[at_seq]) for r in rows]
                marked = c.execute(mark_u, {"ids": ids, "workers": [ME] * len(ids),
                                            "holder": ME, "seqs": seqs}).fetchall()
                split("mark")
                assert len(marked) == len(ids)
                done += len(ids)

        return updates

    def drain(self, variant: str, n: int) -> dict[str, Any]:
        """Fill ``n`` jobs, drain them through ``variant``; the costs a job."""
        self.fill(variant, n)
        if variant == "dispatcher":
            return asyncio.run(self._dispatcher_drain(n))
        split = Split(self.pid)
        loop = self.loop(variant, split)
        stat0, sched0 = backend_stat_ns(self.pid), backend_sched_ns(self.pid)
        cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
        done = loop()
        wall = time.perf_counter_ns() - wall0
        cpu = time.process_time_ns() - cpu0
        stat1, sched1 = backend_stat_ns(self.pid), backend_sched_ns(self.pid)
        out = self._costs(variant, n, done, wall, cpu, (stat0, stat1), (sched0, sched1))
        if out["server_sched_us"] is not None:
            out["server_lease_us"] = split.ns["lease"] / 1000 / done
            out["server_mark_us"] = split.ns["mark"] / 1000 / done
        return out

    def _costs(self, variant: str, n: int, done: int, wall: int, cpu: int,
               stat: tuple[int | None, int | None],
               sched: tuple[int | None, int | None]) -> dict[str, Any]:
        left = self.left(variant)
        done_or_1 = max(done, 1)
        out: dict[str, Any] = {
            "jobs": done, "left": left, "ok": done == n and left == 0,
            "jobs_per_s": done / (wall / 1e9),
            "client_cpu_us": cpu / 1000 / done_or_1,
            "server_cpu_us": None, "server_sched_us": None,
            "server_lease_us": None, "server_mark_us": None,
        }
        if stat[0] is not None and stat[1] is not None:
            out["server_cpu_us"] = (stat[1] - stat[0]) / 1000 / done_or_1
        if sched[0] is not None and sched[1] is not None:
            out["server_sched_us"] = (sched[1] - sched[0]) / 1000 / done_or_1
        return out

    async def _dispatcher_drain(self, n: int) -> dict[str, Any]:
        """``n`` jobs through one Dispatcher (``batch_size`` 500, ``concurrency`` 1000, an
        ``async def`` dispatch, no event subscriber) on one connection of its own: this
        process's CPU from its start to its last mark, over ``n``."""
        from pgstore.models import Job
        from pgstore.postgres.jobs import AsyncPgJobStore
        from pgstore.runtime.dispatcher import Dispatcher

        got = 0

        async def dispatch(job: Job) -> str:
            nonlocal got
            got += 1
            return ME

        conn = await psycopg.AsyncConnection.connect(self.cfg.dsn, autocommit=True)
        try:
            store = AsyncPgJobStore(conn, schema=self.schema)
            d = Dispatcher(store, dispatch, holder=ME, concurrency=DISPATCHER_CONCURRENCY,
                           batch_size=FLOOR_BATCH, poll_interval=0.002, listen=False)
            await d.start()
            await (await conn.execute(b"SELECT 1")).fetchall()
            pid = int(conn.info.backend_pid)
            stat0, sched0 = backend_stat_ns(pid), backend_sched_ns(pid)
            cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
            runner = asyncio.ensure_future(d.run(handle_signals=False))
            while got < n or d.running:
                await asyncio.sleep(0.005)
                if runner.done():
                    break
            wall = time.perf_counter_ns() - wall0
            cpu = time.process_time_ns() - cpu0
            stat1, sched1 = backend_stat_ns(pid), backend_sched_ns(pid)
            d.stop()
            await runner
            await store.close()
        finally:
            await conn.close()
        return self._costs("dispatcher", n, got, wall, cpu, (stat0, stat1), (sched0, sched1))


def run_floor(cfg: Settings) -> dict[str, Any]:
    n = cfg.floor_jobs
    single = min(n, cfg.floor_single_jobs)
    floor = Floor(cfg)
    variants_run: tuple[str, ...] = VARIANTS
    if cfg.floor_base_sql is not None:  # beside pgstore_batch, for the interleaving
        at = VARIANTS.index("pgstore_batch") + 1
        variants_run = (*VARIANTS[:at], BASE_VARIANT, *VARIANTS[at:])
    if cfg.floor_variants is not None:  # --floor-variants: these only (base_batch stays)
        variants_run = tuple(v for v in variants_run
                             if v in cfg.floor_variants or v == BASE_VARIANT)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants_run}
    try:
        for variant in variants_run:  # one untimed warm-up of each: plans cached, pages read
            floor.drain(variant, min(FLOOR_BATCH * 2, n))
        for _ in range(cfg.floor_repeats):
            for variant in variants_run:
                runs[variant].append(floor.drain(variant,
                                                 single if variant == "pgstore_single" else n))
    finally:
        floor.close()
    measures = ("server_cpu_us", "server_sched_us", "server_lease_us", "server_mark_us",
                "client_cpu_us", "jobs_per_s")
    variants: dict[str, Any] = {}
    for variant, rs in runs.items():
        v: dict[str, Any] = {"jobs": rs[0]["jobs"], "ok": all(r["ok"] for r in rs),
                             "runs": rs}
        for m in measures:
            vals = [r[m] for r in rs if r[m] is not None]
            v[m] = summarize(vals) if vals else None
        variants[variant] = v
    over: dict[str, Any] = {}
    for variant, rs in runs.items():
        if variant == "bare_text" or "bare_text" not in runs:  # no ratios without it
            continue
        o: dict[str, Any] = {}
        for m in measures:
            pairs = [(r[m], b[m]) for r, b in zip(rs, runs["bare_text"], strict=True)
                     if r[m] and b[m]]
            if pairs:
                vals = [r / b for r, b in pairs]
                o[m] = {"ratio": summarize(vals)}
        over[variant] = o
    return {"jobs": n, "single_jobs": single, "batch": FLOOR_BATCH,
            "repeats": cfg.floor_repeats, "variants": variants, "over_bare_text": over,
            "all_checks_ok": all(v["ok"] for v in variants.values())}
