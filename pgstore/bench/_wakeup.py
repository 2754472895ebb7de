"""Section 7: wake-up latency, and what the notification costs.

Latency: a ``Dispatcher`` over ``AsyncPgJobStore`` sits idle (LISTEN on
``job_channel()``, poll interval 60 s); the bench schedules a due-now job
with ``job_schedule`` and times from just before that call to the moment the
dispatcher's ``dispatch`` callback runs: the schedule's commit, the
notification, the dispatcher's clock read and its ``job_lease``.

Cost: ``job_schedule`` (which notifies) against, in the same run and on the
same connection, the identical upsert as plain SQL without ``pg_notify``, and
a copy of ``job_schedule`` itself minus its ``pg_notify`` line (created in
the bench schema from ``pg_get_functiondef``), while the dispatcher listens.
"""

from __future__ import annotations

import asyncio
import threading
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
from pgstore.bench._ops import floor_batch, make_floor_table
from pgstore.models import Job
from pgstore.postgres.jobs import AsyncPgJobStore, PgJobStore
from pgstore.runtime.dispatcher import Dispatcher

FAR = 9 * 10**15


def _silent_copy(conn: Conn, schema: str) -> bool:
    """Create ``job_schedule_silent``: ``job_schedule`` without its notification."""
    row = conn.execute(  # by name: the signature grows (pgstore_0010 added p_max_attempts)
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s AND p.proname = 'job_schedule'",
        (schema,),
    ).fetchone()
    assert row is not None
    body = str(row[0])
    if "pg_notify" not in body:
        return False
    lines = [ln for ln in body.splitlines() if "pg_notify" not in ln]
    text = "\n".join(lines).replace(".job_schedule(", ".job_schedule_silent(", 1)
    conn.execute(text.encode())
    return True


class IdleDispatcher:
    """A Dispatcher running in a thread of its own, idle between jobs."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.store = AsyncPgJobStore(dsn, schema=schema)
        self.seen: dict[str, int] = {}
        self.event = threading.Event()
        self.dispatcher = Dispatcher(self.store, self._dispatch, holder="bench-idle",
                                     poll_interval=60.0, concurrency=1)
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.ready = threading.Event()

    async def _dispatch(self, job: Job) -> str:
        self.seen[job.run_id] = time.perf_counter_ns()
        self.event.set()
        return "bot"

    def _main(self) -> None:
        async def go() -> None:
            task = asyncio.ensure_future(self.dispatcher.run())
            while self.dispatcher._wakeups.wakeups is None:
                await asyncio.sleep(0.01)
            await asyncio.wait_for(self.dispatcher._wakeups.wakeups.listening.wait(), 30)
            self.ready.set()
            await task
            await self.store.close()

        asyncio.run(go())

    def start(self) -> None:
        self.thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the dispatcher did not start listening")
        time.sleep(0.3)

    def stop(self) -> None:
        self.dispatcher.stop()
        self.thread.join(timeout=30)


def run_wakeup(cfg: Settings) -> dict[str, Any]:
    schema = schema_name("wakeup")
    fresh_store_schema(cfg.dsn, schema)
    s = ident(schema)
    conn = connect(cfg.dsn)
    idle = IdleDispatcher(cfg.dsn, schema)
    try:
        producer = PgJobStore(conn, schema=schema)
        idle.start()
        latencies = []
        for i in range(cfg.wakeup_samples):
            run_id = f"now-{i}"
            at = producer.now_ms()
            idle.event.clear()
            start = time.perf_counter_ns()
            producer.schedule(run_id, at)
            if not idle.event.wait(10):
                raise RuntimeError(f"{run_id} was not dispatched within 10 s")
            latencies.append((idle.seen[run_id] - start) / 1e6)
            time.sleep(0.15)  # mark_dispatched, then idle again in the 60 s poll wait

        silent = _silent_copy(conn, schema)
        floor_table = make_floor_table(conn, schema)
        counter = [0]

        def batch(sql: str, n: int) -> float:
            t = Timer()
            for _ in range(n):
                counter[0] += 1
                args = (f"far-{counter[0]}", FAR + counter[0])
                with t.timing():
                    conn.execute(sql, args)
            return t.mean_us

        variants = {
            "job_schedule": f"SELECT {s}.job_schedule(%s, %s)",
            "upsert_plain_sql": (f"INSERT INTO {s}.jobs AS j (run_id, dispatch_at) VALUES (%s, %s)"
                                 f" ON CONFLICT (run_id) DO UPDATE SET dispatch_at ="
                                 f" excluded.dispatch_at"),
        }
        if silent:
            variants["job_schedule_without_notify"] = f"SELECT {s}.job_schedule_silent(%s, %s)"
        for sql in variants.values():
            batch(sql, 20)
        raw: dict[str, list[float]] = {k: [] for k in variants}
        floors: list[float] = []
        for _ in range(cfg.repeats):
            floors.append(floor_batch(conn, floor_table, max(cfg.calls // 2, 10))[1])
            for name, sql in variants.items():
                raw[name].append(batch(sql, cfg.calls))
        base = "job_schedule_without_notify" if silent else "upsert_plain_sql"
        pairs = list(zip(raw["job_schedule"], raw[base], strict=True))
        cost = [a - b for a, b in pairs]
        return {
            "latency_ms": summarize(latencies),
            "latency_samples_ms": [round(x, 3) for x in latencies],
            "poll_interval_s": 60.0,
            "cost_us": {k: summarize(v) for k, v in raw.items()},
            "floor_durable_update_us": summarize(floors),
            "notify_cost_us": summarize(cost),
            "notify_cost_against": base,
            "job_schedule_over_silent": {
                "ratio": summarize([a / b for a, b in pairs])},
            "job_schedule_over_floor": {
                "ratio": summarize(
                    [a / f for a, f in zip(raw["job_schedule"], floors, strict=True)])},
        }
    finally:
        idle.stop()
        conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE".encode())
        conn.close()
