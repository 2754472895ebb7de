"""Sections 1-3: the floors, every store operation, and the naive transaction.

Floors: ``SELECT 1`` (a round trip) and a durable one-row ``UPDATE`` (a round
trip plus a commit's WAL flush), on the connection the operations use.

Operations: each through the sync wrapper (``PgScheduleStore`` /
``PgJobStore`` over that same autocommit connection), the asyncio wrapper (over
an ``AsyncConnection`` of its own), both as built by default (``prepare=None``:
on a direct connection the statements are prepared) and with ``prepare=False``,
and straight from SQL (``SELECT * FROM
schema.fn(...)`` through psycopg, which prepares it from its fifth run).
Every call is checked to have really written (a claim that claims nothing
commits no WAL and would flatter us).
Each repeat times ``calls`` calls of one operation in one mode right after
``calls // 2`` floor UPDATEs, and its ratio is taken against that adjacent
floor, so drifts of the machine's speed cancel out; the figures are medians
of the repeats, with their min and max.

Rows: how pgstore's models are built out of a result's rows, the shipped way (each
field stored into its slot, ``rows.SLOT_BUILT``) against calling the dataclass
(its generated ``__init__``, the way every other class is built). Measured twice,
interleaved in one process on the same database: the operations that return
models run again through the default wrappers with the models built by their
constructor (``sync_init``, ``async_init``), so each mode's per-call overhead over
the SQL of the same repeat is paired; and the decoding alone (no server) of real
rows of ``schedules`` and ``jobs``, one row and a hundred, each way in turn.

Naive: the same claim as ``BEGIN; SELECT ... FOR UPDATE; UPDATE; COMMIT``
from the client, against ``schedule_claim_due`` from SQL, interleaved; and
the UPDATE that ``schedule_claim_due`` runs, sent bare as a prepared
statement: what the function's own work (checks, plpgsql) costs on top.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

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
from pgstore.models import CompletePatch, Job, MarkResult, ScheduleRecord
from pgstore.postgres import rows as _rows
from pgstore.postgres.jobs import AsyncPgJobStore, PgJobStore
from pgstore.postgres.schedules import AsyncPgScheduleStore, PgScheduleStore

#: The virtual clock of the ops schema: every claim moves it past the last lease.
LEASE_MS = 500
STEP_MS = 1_000
JOB_NOW = 10**13
JOB_TTL = 10**9
SCHED_IDS = 1_000


class Clock:
    """Epoch ms that move forward by more than a lease at every tick."""

    def __init__(self) -> None:
        self.t = 10**12

    def tick(self) -> int:
        self.t += STEP_MS
        return self.t


def floor_batch(conn: Conn, table: str, n: int) -> tuple[float, float]:
    """(SELECT 1, durable UPDATE) mean µs over ``n`` calls each."""
    sel, upd = Timer(), Timer()
    update = f"UPDATE {table} SET n = n + 1 WHERE id = 1".encode()
    for _ in range(n):
        with sel.timing():
            conn.execute(b"SELECT 1").fetchall()
    for _ in range(n):
        with upd.timing():
            cur = conn.execute(update)
        assert cur.rowcount == 1
    return sel.mean_us, upd.mean_us


def make_floor_table(conn: Conn, schema: str) -> str:
    table = f"{ident(schema)}.floor"
    conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n bigint NOT NULL)".encode())
    conn.execute(f"INSERT INTO {table} VALUES (1, 0)".encode())
    return table


def run_floors(cfg: Settings) -> dict[str, Any]:
    schema = schema_name("floors")
    with connect(cfg.dsn) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE".encode())
        conn.execute(f"CREATE SCHEMA {ident(schema)}".encode())
        table = make_floor_table(conn, schema)
        floor_batch(conn, table, 20)  # warm up: prepared statements, caches
        sel, upd = [], []
        for _ in range(cfg.repeats):
            s, u = floor_batch(conn, table, cfg.calls)
            sel.append(s)
            upd.append(u)
        conn.execute(f"DROP SCHEMA {ident(schema)} CASCADE".encode())
    ratios = [u / s for s, u in zip(sel, upd, strict=True)]
    return {
        "unit": "us per call",
        "select1": summarize(sel),
        "durable_update": summarize(upd),
        "update_over_select1": {"ratio": summarize(ratios)},
    }


# --- the operations --------------------------------------------------------------


@dataclass
class Op:
    """One store operation, callable three ways with the same effect.

    ``setup(i)`` runs untimed before call ``i`` and returns its context;
    ``sync`` / ``aio`` / ``sql`` make the timed call and return True when it
    really wrote; ``after(ctx)`` runs untimed after it."""

    name: str
    sync: Callable[[Any], bool]
    aio: Callable[[Any], Awaitable[bool]]
    sql: Callable[[Any], bool]
    setup: Callable[[int], Any]
    after: Callable[[Any], None] | None = None
    records: int = 1  # records per call (claim_next)
    share: int = 1  # times 1/share of the calls per repeat (claim_next costs a hundred)
    builds: bool = False  # answers with pgstore's models (measured in INIT_MODES too)


#: How each operation is called: the wrappers as built by default (``prepare=None``: on
#: this direct connection they prepare), the wrappers with ``prepare=False``, and the SQL
#: function straight from psycopg.
MODES = ("sync", "sync_unprepared", "async", "async_unprepared", "sql")
#: The default wrappers again, with the models built by calling them (``built_by_init``),
#: for the operations that answer with models (``Op.builds``).
INIT_MODES = ("sync_init", "async_init")

#: The makers of ``built_by_init``: kept from one batch to the next, as the shipped ones.
_INIT_MAKERS: dict[Any, Callable[[Any], Any]] = {}


@contextmanager
def built_by_init() -> Iterator[None]:
    """Within: pgstore's models built by their constructor, as any other class is (no
    ``SLOT_BUILT``), with makers of their own so that neither way evicts the other's."""
    slot_built, makers = _rows.SLOT_BUILT, _rows._MAKERS
    _rows.SLOT_BUILT, _rows._MAKERS = frozenset(), _INIT_MAKERS
    try:
        yield
    finally:
        _rows.SLOT_BUILT, _rows._MAKERS = slot_built, makers


class Fixture:
    """The ops schema and the ways of calling it (``MODES``)."""

    def __init__(self, cfg: Settings, schema: str, conn: Conn, aconn: Any) -> None:
        self.cfg, self.schema, self.conn = cfg, schema, conn
        self.s = ident(schema)
        self.clock = Clock()
        self.stores = {
            prepare: (PgScheduleStore(conn, schema=schema, prepare=prepare),
                      PgJobStore(conn, schema=schema, prepare=prepare),
                      AsyncPgScheduleStore(aconn, schema=schema, prepare=prepare),
                      AsyncPgJobStore(aconn, schema=schema, prepare=prepare))
            for prepare in (None, False)
        }
        self.sched, self.jobs = self.stores[False][0], self.stores[False][1]  # for fill()

    def q(self, text: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self.conn.execute(text.replace("S.", self.s + "."), args).fetchall()

    def fill(self, calls_per_mode: int) -> None:
        n = calls_per_mode
        leases, cancels = n * 2 * (len(MODES) + len(INIT_MODES)), n * len(MODES)
        s = self.s
        self.conn.execute(
            f"""INSERT INTO {s}.schedules (id, kind, spec, next_run_at, updated_at)
                SELECT p || '-' || lpad(i::text, 4, '0'), 'interval', '60000', 0, 0
                  FROM unnest(ARRAY['cd', 'cp', 'cn']) AS p,
                       generate_series(0, {SCHED_IDS - 1}) AS i""".encode()
        )
        # Jobs: leased in due order (dispatch_at = i), cancelled ones far in the future;
        # per call and mode, job_lease and job_mark_dispatched lease one each, job_cancel
        # cancels one.
        self.conn.execute(
            f"""INSERT INTO {s}.jobs (run_id, dispatch_at)
                SELECT 'jl-' || lpad(i::text, 7, '0'), i FROM generate_series(1, {leases}) i
                UNION ALL
                SELECT 'jc-' || lpad(i::text, 7, '0'), 9000000000000000 + i
                  FROM generate_series(1, {cancels}) i""".encode()
        )
        self.sched.register("rg-0", "interval", "60000", 0, 0)
        self.sched.register("rn-0", "interval", "60000", 0, 0)
        claim = self.sched.claim_due("rn-0", "bench", self.clock.tick(), LEASE_MS)
        assert claim is not None
        self.renew_token = claim.fencing_token
        self.jobs.schedule("jr-0", 0)  # due before every jl-* job: the next lease takes it
        lease = self.jobs.lease("bench", JOB_NOW, JOB_TTL)
        assert lease is not None and lease.run_id == "jr-0", lease
        self.conn.execute(f"VACUUM (ANALYZE) {s}.schedules, {s}.jobs".encode())
        self.conn.execute(b"CHECKPOINT")
        self.cancel_next = 0

    def ops(self, prepare: bool | None) -> list[Op]:
        """The operations, their wrapper calls on stores built with ``prepare``."""
        cl = self.clock
        sched, jobs, asched, ajobs = self.stores[prepare]
        ids = {p: [f"{p}-{i:04d}" for i in range(SCHED_IDS)] for p in ("cd", "cp", "cn")}
        # claim_next(100) is handed the hundred ids it is to claim, as claim_due is
        # handed its one: a window moving over the cn-* schedules, all due at every tick.
        windows = [ids["cn"][k:k + 100] for k in range(0, SCHED_IDS, 100)]

        def window_ctx(i: int) -> tuple[int, list[str]]:
            return cl.tick(), windows[i % len(windows)]

        def claim_ctx(i: int) -> tuple[str, int]:
            return ids["cd"][i % SCHED_IDS], cl.tick()

        def complete_ctx(i: int) -> tuple[str, int, int]:
            sid, now = ids["cp"][i % SCHED_IDS], cl.tick()
            rows = self.q("SELECT fencing_token FROM S.schedule_claim_due(%s, 'bench', %s, %s)",
                          (sid, now, LEASE_MS))
            assert rows, sid
            return sid, int(rows[0][0]), now

        def lease_after(ctx: Any) -> None:
            run_id = self.leased.pop()
            rows = self.q("SELECT recorded FROM S.job_mark_dispatched(%s, 'bench', 'w')",
                          (run_id,))
            assert rows[0][0]

        def mark_ctx(i: int) -> str:
            rows = self.q("SELECT run_id FROM S.job_lease('bench', %s, %s)", (JOB_NOW, JOB_TTL))
            assert rows
            return str(rows[0][0])

        def cancel_ctx(i: int) -> str:
            self.cancel_next += 1
            return f"jc-{self.cancel_next:07d}"

        self.leased: list[str] = []

        def leased(run_id: object) -> bool:
            if run_id is None:
                return False
            self.leased.append(str(run_id))
            return True

        patch = CompletePatch
        return [
            Op("claim_due",
               sync=lambda c: sched.claim_due(c[0], "bench", c[1], LEASE_MS) is not None,
               aio=lambda c: _some(asched.claim_due(c[0], "bench", c[1], LEASE_MS)),
               sql=lambda c: bool(self.q(
                   "SELECT * FROM S.schedule_claim_due(%s, 'bench', %s, %s)",
                   (c[0], c[1], LEASE_MS))),
               setup=claim_ctx, builds=True),
            Op("renew",
               sync=lambda c: sched.renew("rn-0", self.renew_token, c),
               aio=lambda c: _true(asched.renew("rn-0", self.renew_token, c)),
               sql=lambda c: bool(self.q("SELECT S.schedule_renew('rn-0', %s, %s)",
                                         (self.renew_token, c))[0][0]),
               setup=lambda i: cl.tick()),
            Op("complete",
               sync=lambda c: sched.complete(c[0], c[1], patch(0, c[2], "ok"), c[2]),
               aio=lambda c: _true(asched.complete(c[0], c[1], patch(0, c[2], "ok"), c[2])),
               sql=lambda c: bool(self.q(
                   "SELECT S.schedule_complete(%s, %s, 0, %s, 'ok', %s)",
                   (c[0], c[1], c[2], c[2]))[0][0]),
               setup=complete_ctx),
            Op("register_unchanged",
               sync=lambda c: sched.register("rg-0", "interval", "60000", 0, c).id == "rg-0",
               aio=lambda c: _reg(asched.register("rg-0", "interval", "60000", 0, c)),
               sql=lambda c: bool(self.q(
                   "SELECT id FROM S.schedule_register('rg-0', 'interval', '60000', 0, %s)",
                   (c,))),
               setup=lambda i: cl.tick(), builds=True),
            Op("claim_next_100",
               sync=lambda c: len(sched.claim_next("bench", c[0], LEASE_MS, 100, c[1])) == 100,
               aio=lambda c: _len100(asched.claim_next("bench", c[0], LEASE_MS, 100, c[1])),
               sql=lambda c: len(self.q(
                   "SELECT * FROM S.schedule_claim_next('bench', %s, %s, 100, %s)",
                   (c[0], LEASE_MS, c[1]))) == 100,
               setup=window_ctx, records=100, share=10, builds=True),
            Op("job_lease",
               sync=lambda c: leased(_run_id(jobs.lease("bench", JOB_NOW, JOB_TTL))),
               aio=lambda c: _leased(ajobs.lease("bench", JOB_NOW, JOB_TTL), leased),
               sql=lambda c: leased(_first(self.q(
                   "SELECT run_id FROM S.job_lease('bench', %s, %s)", (JOB_NOW, JOB_TTL)))),
               setup=lambda i: None, after=lease_after, builds=True),
            Op("job_renew",
               sync=lambda c: jobs.renew("jr-0", "bench", JOB_NOW, JOB_TTL),
               aio=lambda c: _true(ajobs.renew("jr-0", "bench", JOB_NOW, JOB_TTL)),
               sql=lambda c: bool(self.q("SELECT S.job_renew('jr-0', 'bench', %s, %s)",
                                         (JOB_NOW, JOB_TTL))[0][0]),
               setup=lambda i: None),
            Op("job_mark_dispatched",
               sync=lambda c: jobs.mark_dispatched(c, "bench", "w").recorded,
               aio=lambda c: _recorded(ajobs.mark_dispatched(c, "bench", "w")),
               sql=lambda c: bool(self.q(
                   "SELECT recorded FROM S.job_mark_dispatched(%s, 'bench', 'w')", (c,))[0][0]),
               setup=mark_ctx, builds=True),
            Op("job_cancel",
               sync=lambda c: jobs.cancel(c) == "cancelled",
               aio=lambda c: _cancelled(ajobs.cancel(c)),
               sql=lambda c: self.q("SELECT S.job_cancel(%s)", (c,))[0][0] == "cancelled",
               setup=cancel_ctx),
        ]


async def _some(aw: Awaitable[Any]) -> bool:
    return (await aw) is not None


async def _true(aw: Awaitable[Any]) -> bool:
    return bool(await aw)


async def _reg(aw: Awaitable[Any]) -> bool:
    return bool((await aw).id == "rg-0")


async def _len100(aw: Awaitable[Any]) -> bool:
    return len(await aw) == 100


async def _recorded(aw: Awaitable[Any]) -> bool:
    return bool((await aw).recorded)


async def _cancelled(aw: Awaitable[Any]) -> bool:
    return bool((await aw) == "cancelled")


async def _leased(aw: Awaitable[Any], note: Callable[[object], bool]) -> bool:
    return note(_run_id(await aw))


def _run_id(job: Any) -> object:
    return None if job is None else job.run_id


def _first(rows: list[tuple[Any, ...]]) -> object:
    return rows[0][0] if rows else None


def _batch(op: Op, mode: str, n: int, loop: asyncio.AbstractEventLoop) -> float:
    """Mean µs of ``n`` timed calls of ``op`` in ``mode`` (``sync``, ``async`` or ``sql``)."""
    return _batch_timer(op, mode, n, loop).mean_us


def _batch_timer(op: Op, mode: str, n: int, loop: asyncio.AbstractEventLoop) -> Timer:
    """The timer of ``n`` timed calls of ``op`` in ``mode``: wall and client CPU a call."""
    timer = Timer()
    if mode == "async":

        async def go() -> None:
            for i in range(n):
                ctx = op.setup(i)
                with timer.timing():
                    ok = await op.aio(ctx)
                assert ok, (op.name, mode, ctx)
                if op.after is not None:
                    op.after(ctx)

        loop.run_until_complete(go())
        return timer
    call = op.sync if mode == "sync" else op.sql
    for i in range(n):
        ctx = op.setup(i)
        with timer.timing():
            ok = call(ctx)
        assert ok, (op.name, mode, ctx)
        if op.after is not None:
            op.after(ctx)
    return timer


def run_ops(cfg: Settings) -> dict[str, Any]:
    schema = schema_name("ops")
    fresh_store_schema(cfg.dsn, schema)
    loop = asyncio.new_event_loop()
    conn = connect(cfg.dsn)
    aconn = loop.run_until_complete(psycopg.AsyncConnection.connect(cfg.dsn, autocommit=True))
    try:
        fx = Fixture(cfg, schema, conn, aconn)
        n = cfg.calls
        fx.fill((n + 10) * (cfg.repeats + 1))
        floor_table = make_floor_table(conn, schema)
        ops = fx.ops(prepare=None)
        unprepared = {op.name: op for op in fx.ops(prepare=False)}

        def timed(op: Op, mode: str, n: int) -> float:
            if mode.endswith("_unprepared"):
                return _batch(unprepared[op.name], mode.removesuffix("_unprepared"), n, loop)
            if mode.endswith("_init"):
                with built_by_init():
                    timer = _batch_timer(op, mode.removesuffix("_init"), n, loop)
            else:
                timer = _batch_timer(op, mode, n, loop)
            cpu[op.name].setdefault(mode, []).append(timer.cpu_mean_us)
            return timer.mean_us

        cpu: dict[str, dict[str, list[float]]] = {op.name: {} for op in ops}

        def modes(op: Op) -> tuple[str, ...]:
            return MODES + INIT_MODES if op.builds else MODES

        for op in ops:  # warm-up round: prepared statements, plan caches, pools
            for mode in modes(op):
                timed(op, mode, 10)
        cpu = {op.name: {} for op in ops}
        floor_batch(conn, floor_table, 20)
        raw: dict[str, dict[str, list[float]]] = {
            op.name: {m: [] for m in modes(op)} for op in ops
        }
        ratios: dict[str, dict[str, list[float]]] = {
            op.name: {m: [] for m in modes(op)} for op in ops
        }
        floors: list[float] = []
        selects: list[float] = []
        for rep in range(cfg.repeats):
            for op in ops:
                for mode in modes(op):
                    sel, floor = floor_batch(conn, floor_table, max(n // 2, 10))
                    mean = timed(op, mode, max(n // op.share, 3))
                    floors.append(floor)
                    selects.append(sel)
                    raw[op.name][mode].append(mean)
                    ratios[op.name][mode].append(mean / floor)
            cfg.log(f"  ops: repeat {rep + 1}/{cfg.repeats} done")
        result: dict[str, Any] = {
            "unit": "us per call",
            "calls_per_repeat": n,
            "floor_durable_update": summarize(floors),
            "floor_select1": summarize(selects),
            "ops": {},
        }
        for op in ops:
            entry: dict[str, Any] = {"records_per_call": op.records}
            for mode in MODES:
                entry[mode] = {"us": summarize(raw[op.name][mode]),
                               "ratio": summarize(ratios[op.name][mode])}
            result["ops"][op.name] = entry
        result["rows_built"] = {
            "note": "models built by their slots (shipped) or by calling them (_init): "
                    "per-call overhead over the SQL of the same repeat, us; the client "
                    "thread's CPU a call, us, and its ratio to the slots' in the same repeat",
            "ops": {
                op.name: {
                    mode: {"us": summarize(raw[op.name][mode]),
                           "overhead_us": summarize(
                               [w - q for w, q in zip(raw[op.name][mode], raw[op.name]["sql"],
                                                      strict=True)]),
                           "client_cpu_us": summarize(cpu[op.name][mode]),
                           "client_cpu_over_slots": {"ratio": summarize(
                               [c / s for c, s in zip(cpu[op.name][mode],
                                                      cpu[op.name][mode.removesuffix("_init")],
                                                      strict=True)])}}
                    for mode in ("sync", "sync_init", "async", "async_init")
                }
                for op in ops if op.builds
            },
            "decode": decode_rows(conn, schema, max(cfg.repeats, 3)),
        }
        # claim_next(100) against claim_due one by one, in records/s, per repeat.
        per_rep = [
            100 * one / batch
            for one, batch in zip(
                raw["claim_due"]["sync"], raw["claim_next_100"]["sync"], strict=True)
        ]
        result["claim_next_vs_claim_due"] = {
            "ratio": summarize(per_rep),
            "note": "records/s of claim_next(100) over records/s of claim_due, sync wrapper",
        }
        return result
    finally:
        loop.run_until_complete(aconn.close())
        loop.close()
        conn.execute(f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE".encode())
        conn.close()


def decode_rows(conn: Conn, schema: str, repeats: int) -> dict[str, Any]:
    """µs to decode real rows of ``schema`` into pgstore's models, the shipped way (their
    slots) and by calling them, in turn within each repeat (which goes first alternates):
    one row and a hundred of ``schedules`` and ``jobs``, one ``MarkResult``."""
    s = ident(schema)
    cases: list[tuple[str, type[Any], list[tuple[Any, ...]], tuple[str, ...]]] = []
    for cls, query in ((ScheduleRecord, f"SELECT * FROM {s}.schedules ORDER BY id LIMIT 100"),
                       (Job, f"SELECT * FROM {s}.jobs ORDER BY run_id LIMIT 100"),
                       (MarkResult, "SELECT true AS cancelled, false AS recorded")):
        cur = conn.execute(query.encode())
        rows = cur.fetchall()
        columns = tuple(c.name for c in cur.description or ())
        name = cls.__name__
        cases.append((f"{name} x1", cls, rows[:1], columns))
        if len(rows) > 1:
            assert len(rows) == 100, (name, len(rows))
            cases.append((f"{name} x100", cls, rows, columns))
    out: dict[str, Any] = {}
    for label, cls, rows, columns in cases:
        indices = _rows._indices(cls, columns)
        slots = _rows._slot_maker(cls, indices)
        init = _rows._constructor_maker(cls, indices)
        assert [slots(r) for r in rows] == [init(r) for r in rows], label
        loops = max(20_000 // len(rows), 100)

        def timed(make: Callable[[Any], Any], rows: list[Any] = rows, loops: int = loops
                  ) -> float:
            start = time.perf_counter()
            for _ in range(loops):
                [make(r) for r in rows]
            return (time.perf_counter() - start) / loops * 1e6

        timed(slots)
        timed(init)
        by_slots: list[float] = []
        by_init: list[float] = []
        for rep in range(repeats):
            if rep % 2:
                by_init.append(timed(init))
                by_slots.append(timed(slots))
            else:
                by_slots.append(timed(slots))
                by_init.append(timed(init))
        out[label] = {
            "rows": len(rows),
            "slots_us": summarize(by_slots),
            "init_us": summarize(by_init),
            "init_over_slots": {"ratio": summarize(
                [i / t for i, t in zip(by_init, by_slots, strict=True)])},
        }
    return out


# --- the naive transaction -------------------------------------------------------------


def run_naive(cfg: Settings) -> dict[str, Any]:
    schema = schema_name("naive")
    fresh_store_schema(cfg.dsn, schema)
    conn = connect(cfg.dsn)
    s = ident(schema)
    try:
        conn.execute(
            f"""INSERT INTO {s}.schedules (id, kind, spec, next_run_at, updated_at)
                SELECT p || '-' || lpad(i::text, 4, '0'), 'interval', '60000', 0, 0
                  FROM unnest(ARRAY['ours', 'naive', 'bare']) AS p,
                       generate_series(0, {SCHED_IDS - 1}) AS i""".encode()
        )
        conn.execute(f"VACUUM (ANALYZE) {s}.schedules".encode())
        floor_table = make_floor_table(conn, schema)
        clock = Clock()
        ours_sql = f"SELECT * FROM {s}.schedule_claim_due(%s, 'bench', %s, %s)"
        select = (
            f"SELECT id FROM {s}.schedules WHERE id = %s AND next_run_at IS NOT NULL"
            f" AND next_run_at <= %s AND (lease_until IS NULL OR lease_until <= %s) FOR UPDATE"
        )
        update = (
            f"UPDATE {s}.schedules SET lease_owner = %s, lease_until = %s,"
            f" fencing_token = fencing_token + 1 WHERE id = %s RETURNING *"
        )

        bare_update = (
            f"UPDATE {s}.schedules s SET lease_owner = %s, lease_until = %s,"
            f" fencing_token = s.fencing_token + 1 WHERE s.id = %s AND s.next_run_at IS NOT NULL"
            f" AND s.next_run_at <= %s AND (s.lease_until IS NULL OR s.lease_until <= %s)"
            f" RETURNING s.*"
        )

        def claims(prefix: str, statement: str,
                   args: Callable[[str, int], tuple[object, ...]]) -> Callable[[int], float]:
            """Mean µs of ``n`` claims, each one ``statement`` with ``args(id, now)``."""

            def timed(n: int) -> float:
                t = Timer()
                for i in range(n):
                    sid, now = f"{prefix}-{i % SCHED_IDS:04d}", clock.tick()
                    with t.timing():
                        rows = conn.execute(statement, args(sid, now)).fetchall()
                    assert rows
                return t.mean_us

            return timed

        ours = claims("ours", ours_sql, lambda sid, now: (sid, now, LEASE_MS))
        bare = claims("bare", bare_update,
                      lambda sid, now: ("bench", now + LEASE_MS, sid, now, now))

        def naive(n: int) -> float:
            t = Timer()
            for i in range(n):
                sid, now = f"naive-{i % SCHED_IDS:04d}", clock.tick()
                with t.timing():
                    conn.execute(b"BEGIN")
                    got = conn.execute(select, (sid, now, now)).fetchall()
                    if got:
                        rows = conn.execute(update, ("bench", now + LEASE_MS, sid)).fetchall()
                    conn.execute(b"COMMIT")
                assert got and rows
            return t.mean_us

        ours(20)
        naive(20)
        bare(20)
        o_us, n_us, b_us, f_us, ratio, ratio_floor = [], [], [], [], [], []
        bare_over_ours, bare_over_floor = [], []
        for _ in range(cfg.repeats):
            _, f = floor_batch(conn, floor_table, max(cfg.calls // 2, 10))
            o = ours(cfg.calls)
            nv = naive(cfg.calls)
            b = bare(cfg.calls)
            o_us.append(o)
            n_us.append(nv)
            b_us.append(b)
            f_us.append(f)
            ratio.append(nv / o)
            ratio_floor.append(nv / f)
            bare_over_ours.append(b / o)
            bare_over_floor.append(b / f)
        return {
            "unit": "us per call",
            "statements": "BEGIN; SELECT ... FOR UPDATE; UPDATE ... RETURNING *; COMMIT",
            "ours_claim_due_sql": {"us": summarize(o_us)},
            "naive_transaction": {"us": summarize(n_us), "ratio": summarize(ratio_floor)},
            "floor_durable_update": summarize(f_us),
            "naive_over_ours": {"ratio": summarize(ratio)},
            "bare_update": {"us": summarize(b_us), "ratio": summarize(bare_over_floor),
                            "note": "schedule_claim_due's UPDATE sent bare (prepared)"},
            "bare_over_ours": {"ratio": summarize(bare_over_ours)},
        }
    finally:
        conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE".encode())
        conn.close()
