"""Section 4: the lease -> mark-dispatched loop against four peers.

Every system runs the same loop shape: W worker processes, one autocommit
connection each, taking one job and finishing it, over the due jobs, until the
queue is empty. Every worker imports, connects and builds (and warms up) all it
needs before it reports ready; the drain is timed from the go signal, which
comes once every worker is ready. Each drain takes enough jobs to last at least
``peer_seconds`` (10 s by default): the count is scaled per system and W from a
first, untimed drain of ``peer_jobs`` jobs, or of a larger one where that was
too short to tell (``calibrate``, ``scaled_jobs``), and recorded in the results
(with any drain that still came out shorter); with ``peer_seconds`` 0
(``--quick``) every drain takes ``peer_jobs``. All run on the same server in
the same run, in their own schemas, installed by their own code:

* pgstore: ``PgJobStore.lease`` then ``PgJobStore.mark_dispatched`` (the sync
  wrapper over the worker's connection) as built by default (``prepare=None``:
  prepared, on this direct connection); ``pgstore_unprepared``, the same with
  ``prepare=False``; and, optionally, the same two functions straight from SQL
  (psycopg's default, which prepares a statement from its fifth run). One job
  per lease; ``pgstore_batch``, the batched path: one ``Dispatcher`` per worker process
  on an ``AsyncPgJobStore`` over the worker's one connection (its default
  ``batch_size``, 500, ``concurrency`` 1000, as in the burst), whose leases, marks and
  renews carry up to ``batch_size`` jobs a call; a job is recorded by its provider
  call (no event subscriber) and the worker is done when its Dispatcher is idle after
  ``EMPTY_RETRIES`` lease calls in a row found nothing, as pgqueuer's loop stops after
  as many empty dequeues (``empty_leases_store``);
* procrastinate: its own ``fetch_job`` and ``finish_job`` queries
  (``procrastinate_fetch_job_v2`` / ``procrastinate_finish_job_v1``), from
  its ``queries.sql``, on its ``schema.sql``;
* pgqueuer: its own dequeue and log (ack) statements, rendered by its
  ``QueryQueueBuilder`` (``batch_size=PGQUEUER_BATCH``, no concurrency limits;
  a batch acknowledged in one log statement) and sent as its psycopg driver
  sends them (a raw cursor with ``$n`` parameters), on the schema
  ``Queries.install()`` (``pgq install``) creates;
* graphile-worker and pg-boss (``_node.py``): node processes, with their own
  batching on (graphile-worker's local queue and batched completions, pg-boss's
  ``fetch`` with ``batchSize`` and one ``complete`` of the batch's ids).

Each run checks that no job was taken twice (the ids every worker saw), that
every job was seen, and that every job ended finished in the database (and,
for the peers that delete finished jobs, that none is left). While a run goes, a sampler
reads the wait events of the workers' backends from ``pg_stat_activity``.

Last, each system drains once more at the largest W (as many jobs as its first unflushed
drain says last ``peer_seconds``; half of ``peer_jobs`` when that is 0) with its
sessions' ``synchronous_commit = off``: commits no longer wait for the WAL flush, so the
loop is bound by CPU alone (the workers' and the server's), and the ratio
between systems is what their per-job work costs, without the flushes that
every system pays alike.

With ``--peer-counts`` each timed drain also says what it cost, per 1,000 jobs: commits,
WAL flushes and bytes, statements (``pg_stat_statements``, where the server preloads it),
and the server's, the system's backends' and its workers' CPU a job (``_counts``), with
the unit costs of a round trip and a WAL flush measured before and after the drains:
counts that the machine's load moves little, where the rates move with it.

The peers are benchmark-only extras (``pip install pgstore[bench]``).
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import math
import multiprocessing as mp
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import RawCursor

from pgstore.bench._common import (
    Conn,
    Settings,
    connect,
    fresh_store_schema,
    ident,
    schema_name,
)
from pgstore.bench._common import summary as summarize
from pgstore.bench._counts import (
    COUNTS_NOTE,
    Counted,
    counts_line,
    median_counts,
    sched_ns,
    snapshot,
    statements_ready,
    unit_costs,
)
from pgstore.bench._node import NODE_SYSTEMS, PACKAGES, NodeSystem, ensure_packages, versions
from pgstore.bench._node import SETTINGS as NODE_SETTINGS

SYSTEMS = ("pgstore", "pgstore_batch", "pgstore_unprepared", "pgstore_sql", "procrastinate",
           "pgqueuer", *NODE_SYSTEMS)
#: The systems that run pgstore's own schema.
OURS = ("pgstore", "pgstore_batch", "pgstore_unprepared", "pgstore_sql")
#: ``pgstore_batch``'s Dispatcher: as many dispatches at once as the burst's.
BATCH_CONCURRENCY = 1000
PEERS = ("procrastinate", "pgqueuer", *NODE_SYSTEMS)
#: ``--peer-counts``: how long (s) after a drain its counts are read, for the workers'
#: backends to exit and report theirs.
COUNT_SETTLE_S = 1.0
EMPTY_RETRIES = 3
#: pgqueuer's dequeue batch (its ``batch_size``): 100 beat 10 and 1 at W = 4, and 500 beat
#: 100 at W = 8 (9,465 against 7,077 jobs/s over 20,000 jobs; docs/performance.md);
#: ``PGSTORE_BENCH_PGQUEUER_BATCH`` overrides it, to try others.
PGQUEUER_BATCH = 500


def pgqueuer_batch() -> int:
    return int(os.environ.get("PGSTORE_BENCH_PGQUEUER_BATCH") or PGQUEUER_BATCH)


def _module(name: str) -> Any:
    """A peer's module, untyped: the peers are optional (``pgstore[bench]``)."""
    return importlib.import_module(name)


def peers_available() -> dict[str, str | None]:
    """For each peer, None if importable, else why not."""
    out: dict[str, str | None] = {}
    for name in ("procrastinate", "pgqueuer"):
        try:
            __import__(name)
            out[name] = None
        except ImportError as exc:
            out[name] = f"not installed ({exc}); pip install 'pgstore[bench]'"
    return out


# --- the worker processes ------------------------------------------------------------


def _loop_pgstore(
    conn: Conn, schema: str, me: str, prepare: bool | None = None
) -> Callable[[], tuple[list[Any], int]]:
    from pgstore.postgres.jobs import PgJobStore

    store = PgJobStore(conn, schema=schema, prepare=prepare)

    def drain() -> tuple[list[Any], int]:
        got: list[Any] = []
        last = time.monotonic_ns()
        empty = 0
        while empty < EMPTY_RETRIES:
            job = store.lease(me, None, 30_000)
            if job is None:
                empty += 1
                time.sleep(0.002)
                continue
            empty = 0
            mark = store.mark_dispatched(job.run_id, me, me)
            assert mark.recorded and not mark.cancelled
            got.append(job.run_id)
            last = time.monotonic_ns()
        return got, last

    return drain


def _loop_pgstore_sql(conn: Conn, schema: str, me: str) -> Callable[[], tuple[list[Any], int]]:
    s = ident(schema)
    lease = f"SELECT run_id FROM {s}.job_lease(%s, NULL, 30000)"
    mark = f"SELECT recorded FROM {s}.job_mark_dispatched(%s, %s, %s)"

    def drain() -> tuple[list[Any], int]:
        got: list[Any] = []
        last = time.monotonic_ns()
        empty = 0
        while empty < EMPTY_RETRIES:
            row = conn.execute(lease, (me,)).fetchone()
            if row is None:
                empty += 1
                time.sleep(0.002)
                continue
            empty = 0
            done = conn.execute(mark, (row[0], me, me)).fetchone()
            assert done is not None and done[0]
            got.append(row[0])
            last = time.monotonic_ns()
        return got, last

    return drain


def _loop_pgstore_batch(dsn: str, schema: str, me: str, kwargs: dict[str, Any],
                        wait_for_go: Callable[[], None]) -> tuple[list[Any], int]:
    """One Dispatcher (the default ``batch_size``) on one connection, until it is idle
    after ``EMPTY_RETRIES`` lease calls in a row found nothing; the run ids it
    dispatched, and when it was done (its first idle moment after its last run). Before
    ``wait_for_go`` (which reports the worker ready and waits for the go signal) it
    imports, connects (``kwargs``: the session's options), builds its store and
    Dispatcher and makes a first round trip, as every other worker does before it
    reports ready; its Dispatcher starts at the signal. The jobs are recorded by the
    provider call, as every peer's loop records its own, with no event subscriber (which
    would have the Dispatcher build four events a job): that each job was dispatched
    once is checked in the database after the drain. It stops as pgqueuer's loop does
    (``empty_leases_store``), with no query of its own.
    """
    from pgstore.models import Job
    from pgstore.runtime.dispatcher import Dispatcher

    got: list[Any] = []

    async def dispatch(job: Job) -> str:
        got.append(job.run_id)
        return me

    async def main() -> int:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, **kwargs)
        try:
            store = empty_leases_store()(conn, schema=schema)
            d = Dispatcher(store, dispatch, holder=me, concurrency=BATCH_CONCURRENCY,
                           poll_interval=0.002, listen=False)
            await (await conn.execute(b"SELECT 1")).fetchall()
            await asyncio.to_thread(wait_for_go)
            runner = asyncio.ensure_future(d.run(handle_signals=False))
            idle_since = 0
            try:
                while True:
                    await asyncio.sleep(0.002)
                    if d.running or not store.empty:
                        idle_since = 0
                        continue
                    if not idle_since:
                        idle_since = time.monotonic_ns()
                    if store.empty >= EMPTY_RETRIES:
                        return idle_since
            finally:
                d.stop()
                await runner
                await store.close()
        finally:
            await conn.close()

    last = asyncio.run(main())
    return got, last


def empty_leases_store() -> Any:
    """``AsyncPgJobStore`` counting the lease calls in a row that found nothing
    (``empty``; a call that leased a job sets it back to 0). pgstore_batch's loop stops
    once its Dispatcher is idle after ``EMPTY_RETRIES`` of them (its poll interval, 2 ms,
    apart), as pgqueuer's loop stops after as many empty dequeues 2 ms apart and
    graphile-worker's ``runOnce`` after its first. It asked the database whether any job
    was left instead, after each empty lease: a statement that no index of the table
    could answer (its predicate is not the pending indexes'), so a sequential scan of
    20 ms or more a call over 300,000 jobs, 51 calls in a drain at W = 8
    (docs/performance.md, the check for jobs left)."""
    from pgstore.models import Job
    from pgstore.postgres.jobs import AsyncPgJobStore

    class EmptyLeases(AsyncPgJobStore):
        empty = 0

        async def lease(self, holder: str, now: int | None, ttl_ms: int,
                        queues: Sequence[str] | None = None) -> Job | None:
            job = await super().lease(holder, now, ttl_ms, queues)
            self.empty = self.empty + 1 if job is None else 0
            return job

        async def lease_many(self, holder: str, now: int | None, ttl_ms: int, limit: int,
                             queues: Sequence[str] | None = None) -> list[Job]:
            jobs = await super().lease_many(holder, now, ttl_ms, limit, queues)
            self.empty = 0 if jobs else self.empty + 1
            return jobs

    return EmptyLeases


def _loop_procrastinate(conn: Conn, schema: str, me: str
                        ) -> Callable[[], tuple[list[Any], int]]:
    queries = _module("procrastinate.sql").queries
    row = conn.execute("SELECT worker_id FROM procrastinate_register_worker_v1()").fetchone()
    assert row is not None
    worker_id = row[0]
    fetch, finish = queries["fetch_job"], queries["finish_job"]

    def drain() -> tuple[list[Any], int]:
        got: list[Any] = []
        last = time.monotonic_ns()
        empty = 0
        while empty < EMPTY_RETRIES:
            job = conn.execute(fetch, {"queues": None, "worker_id": worker_id}).fetchone()
            if job is None or job[0] is None:  # the function returns an all-NULL row
                empty += 1
                time.sleep(0.002)
                continue
            empty = 0
            conn.execute(finish, {"job_id": job[0], "status": "succeeded",
                                  "delete_job": False})
            got.append(job[0])
            last = time.monotonic_ns()
        return got, last

    return drain


class PgqueuerLoop:
    """pgqueuer's own dequeue and log (ack) statements on ``schema``, sent as its psycopg
    driver sends them (a raw cursor with ``$n`` parameters)."""

    def __init__(self, schema: str) -> None:
        qb = _module("pgqueuer.adapters.persistence.qb")
        settings = _module("pgqueuer.domain.settings")
        self.qbq = qb.QueryQueueBuilder(settings=settings.DBSettings(db_schema=schema))
        self.manager, self.batch = uuid.uuid4(), pgqueuer_batch()
        self.log_sql = self.qbq.build_log_job_query()

    def warm_up(self) -> None:
        """Render the dequeue statement once (pgqueuer caches its text), before the drain."""
        self._query()

    def _query(self) -> Any:
        return self.qbq.build_dequeue_query(
            batch_size=self.batch, entrypoints=["bench"], concurrency_limits=[0],
            queue_manager_id=self.manager, global_concurrency_limit=None,
            heartbeat_timeout=timedelta(seconds=30),
        )

    def dequeue(self, conn: Conn) -> list[int]:
        """Up to ``batch`` job ids, taken."""
        # pgqueuer rebuilds its dequeue statement every iteration too (the text is cached).
        query = self._query()
        cur = RawCursor(conn)
        cur.execute(query.sql, query.args)
        return [int(row[0]) for row in cur.fetchall()]

    def ack(self, conn: Conn, ids: list[int]) -> None:
        """The batch logged successful, in one statement."""
        RawCursor(conn).execute(self.log_sql,
                                (ids, ["successful"] * len(ids), [None] * len(ids)))


def _loop_pgqueuer(conn: Conn, schema: str, me: str) -> Callable[[], tuple[list[Any], int]]:
    loop = PgqueuerLoop(schema)
    loop.warm_up()

    def drain() -> tuple[list[Any], int]:
        got: list[Any] = []
        last = time.monotonic_ns()
        empty = 0
        while empty < EMPTY_RETRIES:
            ids = loop.dequeue(conn)
            if not ids:
                empty += 1
                time.sleep(0.002)
                continue
            empty = 0
            loop.ack(conn, ids)
            got.extend(ids)
            last = time.monotonic_ns()
        return got, last

    return drain


#: Each Python system's loop: given the worker's connection, its schema and its name, it
#: imports, builds and warms up all it needs, then returns the drain itself, which the
#: worker calls at the go signal (the drain returns the job ids it took and when it took
#: its last). Nothing a system needs is imported or built after the signal.
LOOPS: dict[str, Callable[[Conn, str, str], Callable[[], tuple[list[Any], int]]]] = {
    "pgstore": _loop_pgstore,
    "pgstore_unprepared": lambda conn, schema, me: _loop_pgstore(conn, schema, me, prepare=False),
    "pgstore_sql": _loop_pgstore_sql,
    "procrastinate": _loop_procrastinate,
    "pgqueuer": _loop_pgqueuer,
}


def _worker(system: str, dsn: str, schema: str, index: int, ready: Any, go: Any,
            results: Any, unflushed: bool) -> None:
    """One worker process: it connects, imports and builds all its system needs (its loop
    from ``LOOPS``, or its Dispatcher), then reports ready and waits for the go signal,
    so that the timed drain holds the draining alone."""
    me = f"bench-{system}-{index}"
    said_ready = False
    cpu_at_go, runq_at_go = 0.0, 0

    def wait_for_go() -> None:
        nonlocal said_ready, cpu_at_go, runq_at_go
        ready.put(index)
        said_ready = True
        go.wait()
        cpu_at_go, runq_at_go = time.process_time(), sched_ns()[1]

    try:
        options = [f"-c search_path={schema}"] if system == "procrastinate" else []
        if unflushed:
            options.append("-c synchronous_commit=off")
        kwargs: dict[str, Any] = {"application_name": f"bench-{system}"}
        if options:
            kwargs["options"] = " ".join(options)
        if system == "pgstore_batch":  # asyncio: its one connection, through its store
            got, last = _loop_pgstore_batch(dsn, schema, me, kwargs, wait_for_go)
        else:
            with connect(dsn, **kwargs) as conn:
                conn.execute("SELECT 1").fetchall()
                drain = LOOPS[system](conn, schema, me)
                wait_for_go()
                got, last = drain()
        results.put((index, got, last, None,
                     (time.process_time() - cpu_at_go, (sched_ns()[1] - runq_at_go) / 1e9)))
    except BaseException as exc:  # reported to the parent, which fails the run
        if not said_ready:
            ready.put(index)
        results.put((index, [], 0, f"{type(exc).__name__}: {exc}", (0.0, 0.0)))


# --- setting up each system -------------------------------------------------------------


class System:
    """One system's schema: installed once, refilled before each run."""

    def __init__(self, name: str, dsn: str) -> None:
        self.name = name
        self.dsn = dsn
        self.schema = schema_name("peer_" + name)

    def install(self) -> None:
        with connect(self.dsn) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident(self.schema)} CASCADE".encode())
        if self.name in OURS:
            fresh_store_schema(self.dsn, self.schema)
        elif self.name == "procrastinate":
            manager = _module("procrastinate.schema").SchemaManager
            with psycopg.connect(self.dsn) as tx:
                tx.execute(f"CREATE SCHEMA {ident(self.schema)}".encode())
                tx.execute(f"SET LOCAL search_path = {ident(self.schema)}".encode())
                tx.execute(manager.get_schema().encode())
        else:
            asyncio.run(self._pgqueuer_install())

    def _pgqueuer_queries(self, aconn: Any) -> Any:
        driver = _module("pgqueuer.adapters.drivers.psycopg").PsycopgDriver
        qb = _module("pgqueuer.adapters.persistence.qb")
        queries = _module("pgqueuer.queries").Queries
        settings = _module("pgqueuer.domain.settings").DBSettings(db_schema=self.schema)
        return queries(driver(aconn), qbe=qb.QueryBuilderEnvironment(settings=settings),
                       qbq=qb.QueryQueueBuilder(settings=settings))

    async def _pgqueuer_install(self) -> None:
        aconn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        async with aconn:
            await self._pgqueuer_queries(aconn).install()

    async def _pgqueuer_fill(self, n: int) -> None:
        aconn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        async with aconn:
            q = self._pgqueuer_queries(aconn)
            await q.clear_queue()
            await q.clear_queue_log()
            await q.enqueue(["bench"] * n, [None] * n, [0] * n)

    def fill(self, n: int) -> None:
        """Empty the queue and add ``n`` due jobs (each system's own enqueue where it has
        one; pgstore's bulk INSERT is the benchmark's shortcut for n job_schedule calls)."""
        s = ident(self.schema)
        with connect(self.dsn) as conn:
            if self.name in OURS:
                conn.execute(f"TRUNCATE {s}.jobs".encode())
                conn.execute(
                    f"INSERT INTO {s}.jobs (run_id, dispatch_at) SELECT 'p-' || i, i"
                    f" FROM generate_series(1, {n}) i".encode())
                tables = [f"{s}.jobs"]
            elif self.name == "procrastinate":
                conn.execute(f"TRUNCATE {s}.procrastinate_jobs, {s}.procrastinate_workers"
                             f" CASCADE".encode())
                conn.execute(f"SET search_path = {s}".encode())
                conn.execute(
                    "SELECT procrastinate_defer_jobs_v1(ARRAY(SELECT ROW('default', 'bench', 0,"
                    " NULL, NULL, '{}'::jsonb, NULL)::procrastinate_job_to_defer_v1"
                    f" FROM generate_series(1, {n})))".encode())
                conn.execute(b"RESET search_path")
                tables = [f"{s}.procrastinate_jobs", f"{s}.procrastinate_events"]
            else:
                asyncio.run(self._pgqueuer_fill(n))
                tables = [f"{s}.pgqueuer", f"{s}.pgqueuer_log"]
            for table in tables:
                conn.execute(f"VACUUM (ANALYZE) {table}".encode())
            conn.execute(b"CHECKPOINT")

    def finished(self) -> int:
        """How many jobs the database says were finished."""
        s = ident(self.schema)
        with connect(self.dsn) as conn:
            if self.name in OURS:
                sql = f"SELECT count(*) FROM {s}.jobs WHERE dispatched"
            elif self.name == "procrastinate":
                sql = f"SELECT count(*) FROM {s}.procrastinate_jobs WHERE status = 'succeeded'"
            else:
                sql = (f"SELECT count(*) FROM {s}.pgqueuer_log WHERE status = 'successful'"
                       f" AND NOT EXISTS (SELECT FROM {s}.pgqueuer)")
            row = conn.execute(sql.encode()).fetchone()
            assert row is not None
            return int(row[0])

    def drop(self) -> None:
        with connect(self.dsn) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident(self.schema)} CASCADE".encode())


class WaitSampler(threading.Thread):
    """Counts the wait events of one system's backends every few milliseconds; and what
    it costs the server (``polls``: its transactions; ``cpu_s``: its backend's CPU), for
    ``--peer-counts`` to take off. ``started`` is set once it has polled. ``backends``:
    each of the system's backends' (CPU ns, ns waiting for a CPU) when first and last
    seen (``/proc/<pid>/schedstat``; none when the server runs elsewhere)."""

    def __init__(self, dsn: str, system: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.app = dsn, f"bench-{system}"
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.polls = 0
        self.cpu_s = 0.0
        self.stop = threading.Event()
        self.started = threading.Event()
        self.backends: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.started.set()

    def _run(self) -> None:
        with connect(self.dsn) as conn:
            first = sched_ns(conn.info.backend_pid)[0]
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), state, pid"
                    " FROM pg_stat_activity WHERE application_name = %s", (self.app,)
                ).fetchall()
                self.polls += 1
                for event, state, pid in rows:
                    self.counts["ClientRead (idle)" if state == "idle" else event] += 1
                    now = sched_ns(pid)
                    if now[0]:
                        self.backends[pid] = (self.backends.get(pid, (now, now))[0], now)
                self.started.set()
                self.samples += len(rows)
                time.sleep(0.005)
            self.cpu_s = (sched_ns(conn.info.backend_pid)[0] - first) / 1e9 if first else 0.0

    def backend_s(self) -> tuple[float, float]:
        """The system's backends' CPU seconds, and seconds waiting for a CPU, between the
        sampler's first and last sight of each."""
        return (sum(b[0] - a[0] for a, b in self.backends.values()) / 1e9,
                sum(b[1] - a[1] for a, b in self.backends.values()) / 1e9)

    def shares(self) -> dict[str, float]:
        total = max(self.samples, 1)
        return {k: round(v / total, 3) for k, v in self.counts.most_common(8)}


#: A worker's answer: its index, the job ids it took, when it took its last, its error or
#: None, and from the go signal to its last job, its CPU seconds and its (main thread's)
#: seconds waiting for a CPU.
Answer = tuple[int, list[Any], int, str | None, tuple[float, float]]


def _drain_python(system: System, workers: int, unflushed: bool,
                  counted: Counted | None = None) -> tuple[int, list[Answer], WaitSampler]:
    """Start ``workers`` Python worker processes, let them go; their answers. With
    ``counted``, its first snapshot is read just before the go signal."""
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_worker,
                    args=(system.name, system.dsn, system.schema, i, ready, go, results,
                          unflushed))
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    sampler = WaitSampler(system.dsn, system.name)
    sampler.start()
    if counted is not None:
        sampler.started.wait(timeout=60)
        counted.start()
    start = time.monotonic_ns()
    go.set()
    out = [results.get(timeout=1800) for _ in procs]
    sampler.stop.set()
    for p in procs:
        p.join(timeout=60)
    sampler.join(timeout=5)
    return start, out, sampler


def _drain_node(system: NodeSystem, workers: int, unflushed: bool,
                counted: Counted | None = None) -> tuple[int, list[Answer], WaitSampler]:
    """The same with ``workers`` node processes."""
    procs = system.start_workers(workers, unflushed)
    sampler = WaitSampler(system.dsn, system.name)
    sampler.start()
    if counted is not None:
        sampler.started.wait(timeout=60)
        counted.start()
    start = NodeSystem.go(procs)
    answers = NodeSystem.answers(procs)
    sampler.stop.set()
    sampler.join(timeout=5)
    return start, [(i, [str(x) for x in a.get("got", [])], int(a.get("last", 0)), err,
                    (float(a.get("cpu_us", 0)) / 1e6, float(a.get("runq_us", 0)) / 1e6))
                   for i, (a, err) in enumerate(answers)], sampler


def run_once(system: System | NodeSystem, workers: int, jobs: int,
             unflushed: bool = False, counts: bool | None = None) -> dict[str, Any]:
    """One timed drain of ``jobs`` jobs by ``workers`` processes (with
    ``synchronous_commit = off`` in their sessions when ``unflushed``). With ``counts``
    (None: no counts; False: without ``pg_stat_statements``) the result's ``counts``
    says what the drain cost the server, per 1,000 jobs (``_counts``)."""
    system.fill(jobs)
    counted = None if counts is None else Counted(system.dsn, counts)
    if isinstance(system, NodeSystem):
        start, out, sampler = _drain_node(system, workers, unflushed, counted)
    else:
        start, out, sampler = _drain_python(system, workers, unflushed, counted)
    extra: dict[str, Any] = {}
    if counted is not None:
        time.sleep(COUNT_SETTLE_S)  # the workers' backends exit, and report their counts
        extra["counts"] = counted.per_job(
            jobs, snapshot(system.dsn, counted.statements), own_commits=sampler.polls,
            own_cpu_s=sampler.cpu_s, backend_s=sampler.backend_s(),
            client_s=(sum(c for *_, (c, _) in out), sum(q for *_, (_, q) in out)))
    errors = [e for _, _, _, e, _ in out if e]
    seen = [job for _, got, _, _, _ in out for job in got]
    end = max((last for _, got, last, _, _ in out if got), default=start)
    elapsed = (end - start) / 1e9
    duplicates = len(seen) - len(set(seen))
    finished = system.finished()
    ok = not errors and duplicates == 0 and len(seen) == jobs and finished == jobs
    return {
        "workers": workers,
        "jobs": jobs,
        "seconds": round(elapsed, 4),
        "jobs_per_s": jobs / elapsed if elapsed > 0 else 0.0,
        "leased": len(seen),
        "duplicates": duplicates,
        "finished_in_db": finished,
        "per_worker": sorted(len(got) for _, got, _, _, _ in out),
        "errors": errors,
        "ok": ok,
        "wait_events": sampler.shares(),
        **extra,
    }


def peer_info(modules: Path | None) -> dict[str, dict[str, Any]]:
    """Each system's version and the settings the bench runs it with."""
    from importlib.metadata import PackageNotFoundError, version

    from pgstore.runtime.dispatcher import BATCH_SIZE

    def of(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    info: dict[str, dict[str, Any]] = {
        "pgstore": {"version": of("pgstore"), "settings": {"prepare": None, "batch": 1}},
        "pgstore_batch": {"version": of("pgstore"),
                          "settings": {"dispatcher": True, "batch_size": BATCH_SIZE,
                                       "concurrency": BATCH_CONCURRENCY}},
        "pgstore_unprepared": {"version": of("pgstore"),
                               "settings": {"prepare": False, "batch": 1}},
        "pgstore_sql": {"version": of("pgstore"), "settings": {"psycopg_prepare_threshold": 5}},
        "procrastinate": {"version": of("procrastinate"),
                          "settings": {"batch": 1, "note": "fetch_job takes one job"}},
        "pgqueuer": {"version": of("pgqueuer"),
                     "settings": {"batch_size": pgqueuer_batch(), "tried": [1, 10, 100, 500]}},
    }
    node = versions(modules) if modules is not None else {}
    for name in NODE_SYSTEMS:
        info[name] = {"version": node.get(name, PACKAGES[name]), "node": node.get("node"),
                      "settings": dict(NODE_SETTINGS[name])}
    return info


#: The margin over ``peer_seconds`` a scaled drain is sized for (a rate measured over a
#: short drain is not the rate over a long one), and the round number of jobs it is sized in.
SCALE_MARGIN = 1.25
SCALE_STEP = 1_000


def scaled_jobs(jobs_per_s: float, cfg: Settings) -> int:
    """The jobs a drain at ``jobs_per_s`` takes to last ``cfg.peer_seconds`` with
    SCALE_MARGIN, in SCALE_STEPs, never fewer than ``cfg.peer_jobs``."""
    want = math.ceil(jobs_per_s * cfg.peer_seconds * SCALE_MARGIN / SCALE_STEP) * SCALE_STEP
    return max(cfg.peer_jobs, want)


#: Untimed calibration drains per system and W at most (``calibrate``).
CALIBRATION_DRAINS = 3


def calibrate(system: System | NodeSystem, workers: int, cfg: Settings,
              unflushed: bool = False) -> float:
    """The rate (jobs/s) to size ``system``'s drains at ``workers`` by: that of an untimed
    drain of ``cfg.peer_jobs``, or, while such a drain lasts less than half of
    ``cfg.peer_seconds`` (where a worker's start and the last stragglers still weigh
    much, and the rate comes out low: graphile-worker drained 5,000 jobs at W = 2 at
    less than half its rate over 133,000), of one more drain sized from it, up to
    CALIBRATION_DRAINS."""
    jobs = cfg.peer_jobs
    rate = 0.0
    for _ in range(CALIBRATION_DRAINS):
        r = run_once(system, workers, jobs, unflushed=unflushed)
        rate = r["jobs_per_s"]
        if r["seconds"] >= cfg.peer_seconds / 2:
            break
        jobs = max(scaled_jobs(rate, cfg), 2 * jobs)
    return rate


def run_peers(cfg: Settings) -> dict[str, Any]:
    missing = peers_available()
    modules: Path | None = None
    if any(n in cfg.peer_systems for n in NODE_SYSTEMS):
        modules, why = ensure_packages(cfg.cache)
        if why:
            cfg.log(f"  peers: {why}")
            missing.update({n: why for n in NODE_SYSTEMS})
    names = [n for n in SYSTEMS if n in cfg.peer_systems and missing.get(n) is None]
    systems: list[System | NodeSystem] = [
        NodeSystem(n, cfg.dsn, modules) if n in NODE_SYSTEMS and modules is not None
        else System(n, cfg.dsn)
        for n in names
    ]
    for sy in systems:
        sy.install()
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        sy.name: {w: [] for w in cfg.workers} for sy in systems
    }
    top = max(cfg.workers)
    # How many jobs each drain takes: ``peer_jobs``, or, with ``peer_seconds`` set, as
    # many as the system drains in that long at its rate in a first, untimed drain of
    # ``peer_jobs`` at that W (and the same for the unflushed drain), with a margin, so
    # that what a worker does once, after the go signal, weighs little in any drain.
    counts = {sy.name: {w: cfg.peer_jobs for w in cfg.workers} for sy in systems}
    unflushed_counts = {sy.name: max(cfg.peer_jobs // 2, 1) for sy in systems}
    calibration: dict[str, dict[str, float]] = {sy.name: {} for sy in systems}
    # --peer-counts: each timed drain's counts, with pg_stat_statements where preloaded.
    counting = statements_ready(cfg.dsn) if cfg.peer_counts else None
    costs: dict[str, dict[str, float]] = {}
    if counting is not None:
        costs["before"] = unit_costs(cfg.dsn)
        cfg.log(f"  peers: unit costs before the drains (µs): {costs['before']}")
    try:
        if cfg.peer_seconds > 0:
            for sy in systems:
                for w in cfg.workers:
                    rate = calibrate(sy, w, cfg)
                    calibration[sy.name][str(w)] = round(rate, 1)
                    counts[sy.name][w] = scaled_jobs(rate, cfg)
                    cfg.log(f"  peers: calibration W={w} {sy.name}: {rate:.0f}"
                            f" jobs/s -> {counts[sy.name][w]:,} jobs a drain")
                rate = calibrate(sy, top, cfg, unflushed=True)
                calibration[sy.name]["unflushed"] = round(rate, 1)
                unflushed_counts[sy.name] = scaled_jobs(rate, cfg)
        for rep in range(cfg.peer_repeats):
            for w in cfg.workers:
                for sy in systems:
                    r = run_once(sy, w, counts[sy.name][w], counts=counting)
                    runs[sy.name][w].append(r)
                    cfg.log(f"  peers: repeat {rep + 1} W={w} {sy.name}: "
                            f"{r['jobs_per_s']:.0f} jobs/s over {r['jobs']:,} jobs in"
                            f" {r['seconds']:.1f} s{'' if r['ok'] else '  CHECK FAILED'}")
                    if "counts" in r:
                        cfg.log(f"    counts a 1,000 jobs: {counts_line(r['counts'])}")
        # Without peer_seconds, a ratio of rates: half the jobs will do.
        unflushed = {sy.name: run_once(sy, top, unflushed_counts[sy.name], unflushed=True,
                                       counts=counting)
                     for sy in systems}
        for name, r in unflushed.items():
            cfg.log(f"  peers: W={top} {name}, synchronous_commit off: "
                    f"{r['jobs_per_s']:.0f} jobs/s over {r['jobs']:,} jobs in"
                    f" {r['seconds']:.1f} s{'' if r['ok'] else '  CHECK FAILED'}")
            if "counts" in r:
                cfg.log(f"    counts a 1,000 jobs: {counts_line(r['counts'])}")
        if counting is not None:
            costs["after"] = unit_costs(cfg.dsn)
            cfg.log(f"  peers: unit costs after the drains (µs): {costs['after']}")
    finally:
        for sy in systems:
            sy.drop()
    result: dict[str, Any] = {
        "unit": "jobs/s",
        "jobs": cfg.peer_jobs,
        "min_seconds": cfg.peer_seconds,
        "counted": None if counting is None else
        {"pg_stat_statements": counting, "note": COUNTS_NOTE, "unit_costs_us": costs},
        "jobs_per_drain": {name: {str(w): n for w, n in per.items()}
                           for name, per in counts.items()},
        "calibration_jobs_per_s": calibration,
        # Timed drains that still lasted less than min_seconds: "system W=w": seconds.
        "short_drains": {f"{name} W={w}": r["seconds"] for name, per in runs.items()
                         for w, rs in per.items() for r in rs
                         if cfg.peer_seconds > 0 and r["seconds"] < cfg.peer_seconds},
        "workers": list(cfg.workers),
        "skipped": {k: v for k, v in missing.items() if v and k in cfg.peer_systems},
        "peers": {k: v for k, v in peer_info(modules).items() if k in names},
        "systems": {},
        "all_checks_ok": all(r["ok"] for per in runs.values() for rs in per.values() for r in rs)
        and all(r["ok"] for r in unflushed.values()),
        "unflushed": {
            "workers": top,
            "jobs": max(unflushed_counts.values(), default=0),
            "jobs_per_drain": unflushed_counts,
            "note": "one drain per system with synchronous_commit = off: CPU-bound",
            "systems": {name: r for name, r in unflushed.items()},
            "over": {
                mine: {peer: unflushed[mine]["jobs_per_s"] / unflushed[peer]["jobs_per_s"]
                       for peer in PEERS if peer in unflushed}
                for mine in OURS if mine in unflushed
            },
        },
    }
    for name, per in runs.items():
        entry: dict[str, Any] = {}
        for w, rs in per.items():
            waits: collections.Counter[str] = collections.Counter()
            for r in rs:
                waits.update(r["wait_events"])
            entry[str(w)] = {
                "jobs_per_s": summarize([r["jobs_per_s"] for r in rs]),
                **({"counts": median_counts([r["counts"] for r in rs])}
                   if rs and all("counts" in r for r in rs) else {}),
                "checks_ok": all(r["ok"] for r in rs),
                "duplicates": sum(r["duplicates"] for r in rs),
                "errors": [e for r in rs for e in r["errors"]],
                "wait_events": {k: round(v / len(rs), 3) for k, v in waits.most_common(6)},
                "runs": rs,
            }
        result["systems"][name] = entry
    # Ratios of our lease -> dispatch throughput to each peer, and to our own W=1, per
    # worker count, for each way of running ours.
    result["over"], result["scaling"] = {}, {}
    for mine in (m for m in OURS if m in runs):
        ratios: dict[str, Any] = {}
        for peer in (p for p in PEERS if p in runs):
            ratios[peer] = {}
            for w in cfg.workers:
                a = [r["jobs_per_s"] for r in runs[mine][w]]
                b = [r["jobs_per_s"] for r in runs[peer][w]]
                ratios[peer][str(w)] = {
                    "ratio": summarize([x / y for x, y in zip(a, b, strict=True)])}
        result["over"][mine] = ratios
        base = statistics.median([r["jobs_per_s"] for r in runs[mine][cfg.workers[0]]])
        result["scaling"][mine] = {
            str(w): {"ratio": summarize([r["jobs_per_s"] / base for r in runs[mine][w]])}
            for w in cfg.workers
        }
    return result
