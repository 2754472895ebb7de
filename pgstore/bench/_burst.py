"""Section ``burst``: N jobs due at one instant T, drained by W worker processes.

At 10:00 every bot of the 10:00 meetings is due in the same second. Each
system gets ``burst_jobs`` jobs (100,000 by default) due at T, a few seconds
ahead; its W worker processes start before T and wait, as a deployment's
dispatchers would; each job's provider call is a no-op that records when it
was made. Reported per system: the time from T until the last job was
dispatched (recorded as dispatched in the database), jobs/s over that time,
how late after T the provider calls came (p50, p99, max), and the number of
jobs dispatched over time (``burst.png``). Every run is checked in the
database: every job dispatched exactly once (and no provider call made twice).

A system is one function ``(BurstSpec) -> BurstResult``: it stores the jobs
(not yet due), starts its workers through ``_run_workers``, which sets T a
moment after every worker is up and waiting and makes the jobs due then (one
UPDATE, then ``VACUUM (ANALYZE)`` of the system's tables, all before T: ``make_due``
says why), and
returns what they recorded through ``burst_result``, which computes the
figures the same way for everyone. ``BURST_SYSTEMS`` names them; a peer added to the
benchmark adds its function there.

* ``pgstore_batch``: W processes, each one ``Dispatcher`` on an
  ``AsyncPgJobStore`` over one connection (``concurrency`` 1000, the default
  ``batch_size``, 500): leases, marks and renews in batches.
* ``pgstore_single``: Dispatchers as they were before the batch calls: one
  lease and one mark per job (``batch_size=1``), the default ``concurrency``
  (4), on one connection each too.
* ``procrastinate``: W processes running its own fetch-job / finish-job loop
  (``procrastinate_fetch_job_v2`` / ``procrastinate_finish_job_v1``), the jobs
  deferred with ``scheduled_at`` = T (the peers extra);
* ``pgqueuer``: W processes running its own dequeue / log loop as in the peer loop
  (``batch_size`` 500), the jobs enqueued by its ``enqueue`` and given
  ``execute_after`` = T; a job's finish is its ``successful`` log row's ``created``;
* ``graphile-worker`` and ``pg-boss``: their node processes as in the peer loop
  (``node_peers.cjs``), connected before T, given their go line at T, the jobs' due
  times (``run_at``, ``start_after``) set to T (``_node_burst``).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg

from pgstore.bench._common import Settings, connect, fresh_store_schema, ident, schema_name
from pgstore.bench._common import summary as summarize
from pgstore.bench._counts import server_cpu_s

#: T is this long (ms) after every worker said it is up and waiting (a loaded machine
#: can take many seconds to start eight Python processes: T never falls before that).
LEAD_MS = 1_500
#: The due time the jobs are stored with until T is known: 2100-01-01 (epoch ms).
NOT_YET = 4_102_444_800_000
#: The width of one step of the dispatched-over-time line (ms).
STEP_MS = 100


@dataclass(frozen=True)
class BurstSpec:
    """What every system is asked to do: ``jobs`` jobs due at ``at_ms`` (epoch ms, the
    database clock; 0 until ``_run_workers`` sets it), drained by ``workers`` processes
    started before then."""

    dsn: str
    jobs: int
    workers: int
    at_ms: int
    #: Where npm installs the Node peers (``--cache``).
    cache: Path = Path(".bench-cache")


@dataclass
class BurstResult:
    """One system's burst: the shape every burst function returns (``burst_result``)."""

    system: str
    jobs: int
    workers: int
    #: T until the last job was recorded as dispatched (s), and jobs / that.
    drain_s: float
    jobs_per_s: float
    #: How late after T the provider calls were made (ms): p50, p99, max.
    lateness_ms: dict[str, float]
    #: Dispatched so far at each STEP_MS after T: (seconds after T, jobs).
    timeline: list[tuple[float, int]]
    #: Checked in the database: every job dispatched once, no provider call twice.
    exactly_once: bool
    detail: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def burst_result(
    system: str, spec: BurstSpec, called_ms: list[int], run_ids: list[str],
    finished_ms: list[int], dispatched_in_db: int, errors: list[str],
    detail: dict[str, Any] | None = None,
) -> BurstResult:
    """The figures of one burst from what was recorded: ``called_ms`` when each provider
    call was made, ``run_ids`` the jobs they were for, ``finished_ms`` when the database
    recorded each job dispatched (epoch ms), ``dispatched_in_db`` how many it holds."""
    late = sorted(float(c - spec.at_ms) for c in called_ms)
    last = max(finished_ms, default=spec.at_ms)
    drain = max(last - spec.at_ms, 1) / 1000
    steps = int(drain * 1000 // STEP_MS) + 2
    counts = [0] * steps
    for f in finished_ms:
        counts[min(steps - 1, max(0, (f - spec.at_ms) // STEP_MS + 1))] += 1
    timeline, total = [], 0
    for i, c in enumerate(counts):
        total += c
        timeline.append((i * STEP_MS / 1000, total))
    once = (not errors and len(run_ids) == spec.jobs == len(set(run_ids))
            and dispatched_in_db == spec.jobs and len(finished_ms) == spec.jobs)
    return BurstResult(
        system=system, jobs=spec.jobs, workers=spec.workers, drain_s=round(drain, 3),
        jobs_per_s=round(spec.jobs / drain, 1),
        lateness_ms={"p50": _percentile(late, 0.5), "p99": _percentile(late, 0.99),
                     "max": late[-1] if late else 0.0},
        timeline=timeline, exactly_once=once, detail=detail or {}, errors=errors,
    )


@dataclass
class Gate:
    """What a worker process gets to wait for T: it says it is ready, waits for ``go``,
    then reads T (epoch ms) from ``at``."""

    ready: Any
    go: Any
    at: Any

    def wait_for_t(self, index: int) -> int:
        self.ready.put(index)
        self.go.wait()
        return int(self.at.value)

    def wait_until_t(self, index: int) -> None:
        """``wait_for_t``, then sleep until T itself."""
        at_ms = self.wait_for_t(index)
        while time.time() * 1000 < at_ms:
            time.sleep(0.005)


def make_due(dsn: str, update: bytes, at_ms: int, tables: list[str],
             options: str | None = None) -> None:
    """Make a system's jobs due at ``at_ms`` (``update``, given it), then
    ``VACUUM (ANALYZE)`` ``tables``, all before T.

    Why the VACUUM: the jobs are stored with a due time far ahead and moved to T by one
    mass UPDATE once T is known (every worker up and waiting). That UPDATE leaves a dead
    row version, and a dead index entry, behind each job. A system whose pending index is
    keyed on the due time (pgstore's) finds them sorted out of its way; one whose index is
    not (pgqueuer's) steps over a dead version per job. A real top of the hour has no such
    dead versions: its jobs were scheduled ahead of time with that due time, and
    autovacuum had hours to tidy up behind any earlier changes. A VACUUM after the UPDATE
    leaves each table in that state: every job live, with its final due time, and no dead
    versions for any system to step over. (Inserting the jobs with their final due time
    would model it as well, but T would have to be fixed before the fill, whose length
    differs by system and machine, and before the workers start.)"""
    kwargs: dict[str, Any] = {"options": options} if options else {}
    with connect(dsn, **kwargs) as conn:
        conn.execute(update, (at_ms,))
        for table in tables:
            conn.execute(f"VACUUM (ANALYZE) {table}".encode())


def setup_ms(dsn: str, update: bytes, tables: list[str], options: str | None = None) -> int:
    """Put the jobs off to NOT_YET (``make_due``, the UPDATE and VACUUM the burst makes
    before T) and return how long it took (ms): T is set far enough ahead for the same
    work to end before it."""
    started = time.monotonic()
    make_due(dsn, update, NOT_YET, tables, options)
    return int((time.monotonic() - started) * 1000)


def _run_workers(
    target: Callable[..., None], spec: BurstSpec, due: Callable[[int], None], lead_ms: int,
    *args: Any
) -> tuple[list[Any], float | None, BurstSpec, int]:
    """Start ``spec.workers`` processes of ``target(index, results, gate, *args)``; once
    all are ready, set T ``lead_ms`` ahead, make the jobs due then (``due(T)``) and let
    them go; collect one result each. Returns them, the server's CPU seconds from T until
    the last result, the spec with T, and how long before T the jobs were due (ms: below
    0, ``due`` ended after T)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    gate = Gate(ctx.Queue(), ctx.Event(), ctx.Value("q", 0))
    procs = [ctx.Process(target=target, args=(i, results, gate, *args))
             for i in range(spec.workers)]
    for p in procs:
        p.start()
    for _ in procs:
        gate.ready.get(timeout=600)
    at_ms = _db_now_ms(spec.dsn) + lead_ms
    due(at_ms)
    margin = at_ms - _db_now_ms(spec.dsn)
    gate.at.value = at_ms
    gate.go.set()
    time.sleep(max(0.0, at_ms / 1000 - time.time()))
    before = server_cpu_s(spec.dsn)
    out = [results.get(timeout=900) for _ in procs]
    after = server_cpu_s(spec.dsn)
    for p in procs:
        p.join(timeout=60)
    cpu = None if before is None or after is None else after - before
    return out, cpu, replace(spec, at_ms=at_ms), margin


def lead(setup: int) -> int:
    """How far ahead of now T is set, given the setup's UPDATE and VACUUM took ``setup``
    ms: LEAD_MS, plus twice that, so that the same work before T ends before it."""
    return LEAD_MS + 2 * setup


# --- pgstore -----------------------------------------------------------------------------


def _pgstore_worker(index: int, results: Any, gate: Gate, dsn: str, schema: str,
                    batch_size: int, concurrency: int) -> None:
    from pgstore.models import Job, MarkResult
    from pgstore.postgres.jobs import AsyncPgJobStore
    from pgstore.runtime.dispatcher import Dispatcher

    called: list[tuple[str, int]] = []

    async def dispatch(job: Job) -> str:
        called.append((job.run_id, time.time_ns() // 1_000_000))
        return f"bot-{index}"

    class CountedStore(AsyncPgJobStore):
        """The store with its lease and mark calls counted (the Dispatcher keeps no
        counters of its own)."""

        lease_calls = mark_calls = marks = 0

        async def lease(self, *args: Any) -> Job | None:
            self.lease_calls += 1
            return await super().lease(*args)

        async def lease_many(self, *args: Any) -> list[Job]:
            self.lease_calls += 1
            return await super().lease_many(*args)

        async def mark_dispatched(self, *args: Any) -> MarkResult:
            self.mark_calls += 1
            self.marks += 1
            return await super().mark_dispatched(*args)

        async def mark_dispatched_many(self, *args: Any) -> list[MarkResult]:
            self.mark_calls += 1
            self.marks += len(args[0])
            return await super().mark_dispatched_many(*args)

    async def main() -> dict[str, Any]:
        # One connection, as every other system's worker has: the store's calls take
        # turns on it, and so does the check for jobs left.
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        store = CountedStore(conn, schema=schema)
        d = Dispatcher(store, dispatch, holder=f"burst-{index}", concurrency=concurrency,
                       batch_size=batch_size, poll_interval=0.05, listen=False)
        runner = asyncio.ensure_future(d.run(handle_signals=False))
        await asyncio.sleep(0.2)  # polling: up and waiting
        at_ms = await asyncio.to_thread(gate.wait_for_t, index)
        # Until T plus a while with nothing left: every worker stops once the database
        # says the burst is drained.
        left = (f"SELECT EXISTS (SELECT FROM {ident(schema)}.jobs"
                f" WHERE NOT dispatched AND NOT cancelled AND NOT failed)").encode()
        # The lease calls and the CPU before T, as of the last look before it: counted
        # from the first look after T instead, the calls of the burst's first tens of
        # ms (a late look under load) went uncounted.
        idle_calls, cpu_at_t = store.lease_calls, time.process_time()
        after_t = False
        try:
            while True:
                await asyncio.sleep(0.05)
                if not after_t:
                    if time.time() * 1000 < at_ms:
                        idle_calls, cpu_at_t = store.lease_calls, time.process_time()
                        continue
                    after_t = True
                if d.running:
                    continue
                # Idle: is any job left? Through the pending index, as a lease looks (a
                # count(*) of the table every 50 ms in 8 workers was a third of the
                # server's CPU in the burst).
                row = await (await conn.execute(left)).fetchone()
                if row is not None and not row[0]:
                    break
        finally:
            d.stop()
            await runner
            await store.close()
            await conn.close()
        return {"lease_calls": store.lease_calls - idle_calls,
                "mark_calls": store.mark_calls, "marks": store.marks,
                "worker_cpu_s": time.process_time() - cpu_at_t}

    try:
        stats = asyncio.run(main())
        results.put((called, stats, None))
    except BaseException as exc:  # reported to the parent, which fails the run
        results.put((called, {}, f"{type(exc).__name__}: {exc}"))


def _pgstore_burst(spec: BurstSpec, name: str, batch_size: int, concurrency: int
                   ) -> BurstResult:
    schema = schema_name("burst_" + name)
    fresh_store_schema(spec.dsn, schema)
    s = ident(schema)
    try:
        with connect(spec.dsn) as conn:
            conn.execute(  # the bulk of job_schedule_many calls, straight: the fill is not timed
                f"INSERT INTO {s}.jobs (run_id, dispatch_at) SELECT 'b-' || i, %s"
                f" FROM generate_series(1, %s) i".encode(), (NOT_YET, spec.jobs))
        update = f"UPDATE {s}.jobs SET dispatch_at = %s".encode()
        took = setup_ms(spec.dsn, update, [f"{s}.jobs"])
        with connect(spec.dsn) as conn:
            conn.execute(b"CHECKPOINT")

        def due(at_ms: int) -> None:
            make_due(spec.dsn, update, at_ms, [f"{s}.jobs"])

        out, server_cpu, spec, margin = _run_workers(_pgstore_worker, spec, due, lead(took),
                                                     spec.dsn, schema, batch_size, concurrency)
        with connect(spec.dsn) as conn:
            finished = [int(r[0]) for r in conn.execute(
                f"SELECT finished_at FROM {s}.jobs WHERE dispatched".encode()).fetchall()]
    finally:
        with connect(spec.dsn) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE".encode())
    called = [c for calls, _, _ in out for c in calls]
    detail = {k: sum(st.get(k, 0) for _, st, _ in out) for k in ("lease_calls", "mark_calls",
                                                                   "marks", "worker_cpu_s")}
    detail["server_cpu_s"] = server_cpu
    detail["due_before_t_ms"] = margin
    return burst_result(name, spec, [t for _, t in called], [r for r, _ in called], finished,
                        len(finished), [e for _, _, e in out if e], detail)


def burst_pgstore_batch(spec: BurstSpec) -> BurstResult:
    """Dispatchers built for bursts: the default batches (up to ``BATCH_SIZE``), as many
    dispatches at once as the peer loop's (``BATCH_CONCURRENCY``)."""
    from pgstore.bench._peers import BATCH_CONCURRENCY
    from pgstore.runtime.dispatcher import BATCH_SIZE

    return _pgstore_burst(spec, "pgstore_batch", BATCH_SIZE, BATCH_CONCURRENCY)


def burst_pgstore_single(spec: BurstSpec) -> BurstResult:
    """The path before the batch calls: one job a call, the default concurrency (4)."""
    return _pgstore_burst(spec, "pgstore_single", 1, 4)


# --- procrastinate ------------------------------------------------------------------------


def _procrastinate_worker(index: int, results: Any, gate: Gate, dsn: str, schema: str
                          ) -> None:
    from pgstore.bench._peers import _module

    called: list[tuple[int, int]] = []
    try:
        queries = _module("procrastinate.sql").queries
        with connect(dsn, options=f"-c search_path={schema}") as conn:
            row = conn.execute(
                "SELECT worker_id FROM procrastinate_register_worker_v1()").fetchone()
            assert row is not None
            worker_id, fetch, finish = row[0], queries["fetch_job"], queries["finish_job"]
            gate.wait_until_t(index)
            cpu_at_t = time.process_time()
            empty = 0
            while empty < 20:
                job = conn.execute(fetch, {"queues": None, "worker_id": worker_id}).fetchone()
                if job is None or job[0] is None:
                    empty += 1
                    time.sleep(0.005)
                    continue
                empty = 0
                called.append((int(job[0]), time.time_ns() // 1_000_000))
                conn.execute(finish, {"job_id": job[0], "status": "succeeded",
                                      "delete_job": False})
        results.put((called, {"worker_cpu_s": time.process_time() - cpu_at_t}, None))
    except BaseException as exc:
        results.put((called, {}, f"{type(exc).__name__}: {exc}"))


def burst_procrastinate(spec: BurstSpec) -> BurstResult:
    from pgstore.bench._peers import _module

    schema = schema_name("burst_procrastinate")
    s = ident(schema)
    manager = _module("procrastinate.schema").SchemaManager
    with connect(spec.dsn) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE".encode())
    try:
        with psycopg.connect(spec.dsn) as tx:
            tx.execute(f"CREATE SCHEMA {s}".encode())
            tx.execute(f"SET LOCAL search_path = {s}".encode())
            tx.execute(manager.get_schema().encode())
            tx.execute(
                "SELECT procrastinate_defer_jobs_v1(ARRAY(SELECT ROW('default', 'bench', 0,"
                " NULL, NULL, '{}'::jsonb, to_timestamp(%s / 1000.0))"
                "::procrastinate_job_to_defer_v1 FROM generate_series(1, %s)))",
                (NOT_YET, spec.jobs))
        # Its triggers find their tables on the search_path.
        update = (f"UPDATE {s}.procrastinate_jobs"
                  f" SET scheduled_at = to_timestamp(%s / 1000.0)").encode()
        tables, path = [f"{s}.procrastinate_jobs"], f"-c search_path={schema}"
        took = setup_ms(spec.dsn, update, tables, path)
        with connect(spec.dsn) as conn:
            conn.execute(b"CHECKPOINT")

        def due(at_ms: int) -> None:
            make_due(spec.dsn, update, at_ms, tables, path)

        out, server_cpu, spec, margin = _run_workers(_procrastinate_worker, spec, due,
                                                     lead(took), spec.dsn, schema)
        with connect(spec.dsn) as conn:
            # When each job's succeeded event was written: its finish.
            finished = [int(r[0]) for r in conn.execute(
                f"SELECT (extract(epoch FROM e.at) * 1000)::bigint"
                f" FROM {s}.procrastinate_events e WHERE e.type = 'succeeded'".encode()
            ).fetchall()]
            row = conn.execute(f"SELECT count(*) FROM {s}.procrastinate_jobs"
                               f" WHERE status = 'succeeded'".encode()).fetchone()
            succeeded = int(row[0]) if row else 0
    finally:
        with connect(spec.dsn) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE".encode())
    called = [c for calls, _, _ in out for c in calls]
    return burst_result("procrastinate", spec, [t for _, t in called],
                        [str(j) for j, _ in called], finished, succeeded,
                        [e for _, _, e in out if e],
                        {"worker_cpu_s": sum(st.get("worker_cpu_s", 0) for _, st, _ in out),
                         "server_cpu_s": server_cpu, "due_before_t_ms": margin})


# --- pgqueuer ------------------------------------------------------------------------------


def _pgqueuer_worker(index: int, results: Any, gate: Gate, dsn: str, schema: str) -> None:
    from pgstore.bench._peers import PgqueuerLoop

    called: list[tuple[int, int]] = []
    try:
        loop = PgqueuerLoop(schema)
        loop.warm_up()
        with connect(dsn) as conn:
            conn.execute("SELECT 1").fetchall()
            gate.wait_until_t(index)
            cpu_at_t = time.process_time()
            empty = 0
            while empty < 20:
                ids = loop.dequeue(conn)
                if not ids:
                    empty += 1
                    time.sleep(0.005)
                    continue
                empty = 0
                now = time.time_ns() // 1_000_000
                called.extend((i, now) for i in ids)
                loop.ack(conn, ids)
        results.put((called, {"worker_cpu_s": time.process_time() - cpu_at_t}, None))
    except BaseException as exc:
        results.put((called, {}, f"{type(exc).__name__}: {exc}"))


def burst_pgqueuer(spec: BurstSpec) -> BurstResult:
    """pgqueuer's own dequeue (``batch_size`` as in the peer loop) and log statements; the
    jobs enqueued by its ``enqueue``, then given ``execute_after`` = T."""
    from pgstore.bench._peers import System

    system = System("pgqueuer", spec.dsn)
    system.schema = schema_name("burst_pgqueuer")
    s = ident(system.schema)
    system.install()
    try:
        system.fill(spec.jobs)  # due now: put off until T before any worker starts
        update = (f"UPDATE {s}.pgqueuer SET execute_after = to_timestamp(%s / 1000.0)"
                  .encode())
        took = setup_ms(spec.dsn, update, [f"{s}.pgqueuer"])
        with connect(spec.dsn) as conn:
            conn.execute(b"CHECKPOINT")

        def due(at_ms: int) -> None:
            make_due(spec.dsn, update, at_ms, [f"{s}.pgqueuer"])

        out, server_cpu, spec, margin = _run_workers(_pgqueuer_worker, spec, due, lead(took),
                                                     spec.dsn, system.schema)
        with connect(spec.dsn) as conn:
            # When each job's ack (its 'successful' log row) was written.
            finished = [int(r[0]) for r in conn.execute(
                f"SELECT (extract(epoch FROM created) * 1000)::bigint FROM {s}.pgqueuer_log"
                f" WHERE status = 'successful'".encode()).fetchall()]
        succeeded = system.finished()
    finally:
        system.drop()
    called = [c for calls, _, _ in out for c in calls]
    return burst_result("pgqueuer", spec, [t for _, t in called], [str(j) for j, _ in called],
                        finished, succeeded, [e for _, _, e in out if e],
                        {"worker_cpu_s": sum(st.get("worker_cpu_s", 0) for _, st, _ in out),
                         "server_cpu_s": server_cpu, "due_before_t_ms": margin})


# --- graphile-worker and pg-boss (node) ----------------------------------------------------

#: Where each Node peer keeps a job's due time.
NODE_DUE = {"graphile-worker": ("_private_jobs", "run_at"), "pg-boss": ("job", "start_after")}


def _node_burst(spec: BurstSpec, name: str) -> BurstResult:
    """A Node peer's own enqueue, its jobs then put off until T; its W node processes
    (node_peers.cjs ``work``, the peer loop's settings) connect before T and get their go
    line at T. Finished: pg-boss's ``completed_on``; graphile-worker deletes a finished
    job, so each job counts from its handler's call, and the last from the moment its
    ``runOnce`` returned (every completion written)."""
    from pgstore.bench._node import NodeSystem, ensure_packages

    modules, why = ensure_packages(spec.cache)
    if modules is None:
        raise RuntimeError(f"{name}: {why}")
    system = NodeSystem(name, spec.dsn, modules)
    system.schema = schema_name("burst_" + name.replace("-", "_"))
    s = ident(system.schema)
    table, column = NODE_DUE[name]
    system.install()
    try:
        system.fill(spec.jobs)
        put_off = f"UPDATE {s}.{table} SET {column} = to_timestamp(%s / 1000.0)".encode()
        took = setup_ms(spec.dsn, put_off, [f"{s}.{table}"])
        with connect(spec.dsn) as conn:
            conn.execute(b"CHECKPOINT")
        procs = system.start_workers(spec.workers, False)
        at_ms = _db_now_ms(spec.dsn) + lead(took)
        make_due(spec.dsn, put_off, at_ms, [f"{s}.{table}"])
        margin = at_ms - _db_now_ms(spec.dsn)
        spec = replace(spec, at_ms=at_ms)
        time.sleep(max(0.0, at_ms / 1000 - time.time()))
        before = server_cpu_s(spec.dsn)
        NodeSystem.go(procs)
        answers = NodeSystem.answers(procs)
        after = server_cpu_s(spec.dsn)
        called = [(str(j), int(c)) for a, _ in answers
                  for j, c in zip(a.get("got", []), a.get("calls", []), strict=True)]
        done = system.finished()
        if name == "pg-boss":
            with connect(spec.dsn) as conn:
                finished = [int(r[0]) for r in conn.execute(
                    f"SELECT (extract(epoch FROM completed_on) * 1000)::bigint FROM {s}.job"
                    f" WHERE name = 'bench' AND state = 'completed'".encode()).fetchall()]
        else:
            finished = sorted(c for _, c in called)
            if finished:
                finished[-1] = max([finished[-1]] + [int(a["end"]) for a, _ in answers if a])
    finally:
        system.drop()
    cpu = None if before is None or after is None else after - before
    return burst_result(name, spec, [c for _, c in called], [j for j, _ in called], finished,
                        done, [e for _, e in answers if e],
                        {"server_cpu_s": cpu, "due_before_t_ms": margin})


def burst_graphile_worker(spec: BurstSpec) -> BurstResult:
    return _node_burst(spec, "graphile-worker")


def burst_pg_boss(spec: BurstSpec) -> BurstResult:
    return _node_burst(spec, "pg-boss")


#: Every system of the burst section, by name: one function each.
BURST_SYSTEMS: dict[str, Callable[[BurstSpec], BurstResult]] = {
    "pgstore_batch": burst_pgstore_batch,
    "pgstore_single": burst_pgstore_single,
    "procrastinate": burst_procrastinate,
    "pgqueuer": burst_pgqueuer,
    "graphile-worker": burst_graphile_worker,
    "pg-boss": burst_pg_boss,
}


def _db_now_ms(dsn: str) -> int:
    with connect(dsn) as conn:
        row = conn.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
                           ).fetchone()
        assert row is not None
        return int(row[0])


def run_burst(cfg: Settings) -> dict[str, Any]:
    from pgstore.bench._peers import peers_available

    missing = {k: v for k, v in peers_available().items() if v and k in cfg.burst_systems}
    names = [n for n in cfg.burst_systems if n not in missing]
    runs: dict[str, list[BurstResult]] = {n: [] for n in names}
    for rep in range(cfg.burst_repeats):
        for name in names:
            spec = BurstSpec(cfg.dsn, cfg.burst_jobs, cfg.burst_workers, 0,  # T: once ready
                             cfg.cache)
            try:
                r = BURST_SYSTEMS[name](spec)
            except Exception as exc:  # one peer that cannot run must not lose the others
                missing[name] = f"{type(exc).__name__}: {exc}"
                cfg.log(f"  burst: {name}: not measured: {missing[name]}")
                continue
            if r.detail.get("server_cpu_s") is not None:
                # From T to the end: what the drain cost both sides, per job.
                r.detail["cpu_us_per_job"] = round(
                    (r.detail["server_cpu_s"] + r.detail.get("worker_cpu_s", 0)) / r.jobs * 1e6)
            runs[name].append(r)
            cfg.log(f"  burst: repeat {rep + 1} {name} W={spec.workers}: {r.jobs} jobs drained"
                    f" in {r.drain_s:.2f} s ({r.jobs_per_s:.0f} jobs/s), lateness p50"
                    f" {r.lateness_ms['p50']:.0f} p99 {r.lateness_ms['p99']:.0f} max"
                    f" {r.lateness_ms['max']:.0f} ms; CPU {r.detail.get('worker_cpu_s', 0):.1f} s"
                    f" workers + {r.detail.get('server_cpu_s') or float('nan'):.1f} s server"
                    f" (load {os.getloadavg()[0]:.1f})"
                    f"{'' if r.exactly_once else '  CHECK FAILED'}")
    runs = {name: rs for name, rs in runs.items() if rs}
    systems = {}
    for name, rs in runs.items():
        systems[name] = {
            "drain_s": summarize([r.drain_s for r in rs]),
            "jobs_per_s": summarize([r.jobs_per_s for r in rs]),
            "lateness_p50_ms": summarize([r.lateness_ms["p50"] for r in rs]),
            "lateness_p99_ms": summarize([r.lateness_ms["p99"] for r in rs]),
            "lateness_max_ms": summarize([r.lateness_ms["max"] for r in rs]),
            "exactly_once": all(r.exactly_once for r in rs),
            "cpu_us_per_job": summarize([r.detail["cpu_us_per_job"] for r in rs
                                         if "cpu_us_per_job" in r.detail]),
            "runs": [asdict(r) for r in rs],
        }
    over = {}
    if "pgstore_batch" in runs:
        for other in (n for n in runs if n != "pgstore_batch"):
            a = [r.jobs_per_s for r in runs["pgstore_batch"]]
            b = [r.jobs_per_s for r in runs[other]]
            over[other] = summarize([x / y for x, y in zip(a, b, strict=True)])
    return {
        "unit": "s",
        "jobs": cfg.burst_jobs,
        "workers": cfg.burst_workers,
        "skipped": missing,
        "systems": systems,
        "batch_over": over,
        "all_checks_ok": all(s["exactly_once"] for s in systems.values()),
    }
