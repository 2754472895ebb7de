"""The demo's trace: what every demo process did, in tables beside the store's schema.

``make demo`` runs a store in schema ``pgstore_demo`` and seven processes over
it. Each process writes what it does and sees to ``pgstore_demo_trace.events``
(one row per event, stamped with the database clock, so all processes share
one time line), and every schedule handler writes its run to
``pgstore_demo_trace.runs``. The orchestrator draws and checks the story from
these rows and from the store's own tables, which the trace never writes.

The Scheduler and the Dispatcher report what they did (a claim, an accepted or
rejected complete, a lease, a recorded dispatch) as events
(``pgstore.runtime.events``); ``TraceEvents`` subscribes to them and writes
them as trace rows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from pgstore.runtime import events as ev
from pgstore.runtime.scheduler import RunContext

__all__ = [
    "STORE_SCHEMA",
    "TRACE_SCHEMA",
    "Trace",
    "TraceEvents",
    "create_trace_tables",
]

#: The store's schema (migrated afresh by every demo run).
STORE_SCHEMA = "pgstore_demo"
#: The demo's own tables: not the store's, dropped and made again by every run.
TRACE_SCHEMA = "pgstore_demo_trace"

_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

_DDL = f"""
CREATE SCHEMA {{trace}};

-- One row per thing that happened. process: who it happened to (scheduler-2,
-- dispatcher-1, or demo for the orchestrator); subject: a task id, a meeting
-- (job run_id) or nothing; the other columns are filled where they apply.
CREATE TABLE {{trace}}.events (
    seq          bigserial PRIMARY KEY,
    at           bigint NOT NULL DEFAULT {_NOW_MS},
    process      text NOT NULL,
    kind         text NOT NULL,
    subject      text,
    token        bigint,
    scheduled_at bigint,
    until_at     bigint,
    worker       text,
    detail       text
);

-- One row per schedule handler run, written by the handler itself.
CREATE TABLE {{trace}}.runs (
    id           bigserial PRIMARY KEY,
    task         text NOT NULL,
    token        bigint NOT NULL,
    scheduled_at bigint NOT NULL,
    owner        text NOT NULL,
    claimed_at   bigint NOT NULL,
    started_at   bigint NOT NULL DEFAULT {_NOW_MS},
    ended_at     bigint
);
"""


def create_trace_tables(conn: psycopg.Connection[Any]) -> None:
    """Drop the trace schema if a previous run left it, and create it empty."""
    trace = sql.Identifier(TRACE_SCHEMA)
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(trace))
    conn.execute(sql.SQL(_DDL).format(trace=trace))


class Trace:
    """One process's writer of trace rows, over one autocommit connection shared by threads.

    Rows are committed before ``event`` returns (with ``synchronous_commit``
    off: visible to the other processes at once, only not waiting on the disk).
    """

    def __init__(self, dsn: str, process: str) -> None:
        self.process = process
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)
        self._conn.execute("SET synchronous_commit = off")
        self._insert_event = sql.SQL(
            "INSERT INTO {}.events (process, kind, subject, token, scheduled_at, until_at,"
            " worker, detail) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
        ).format(sql.Identifier(TRACE_SCHEMA))
        self._insert_run = sql.SQL(
            "INSERT INTO {}.runs (task, token, scheduled_at, owner, claimed_at)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING id"
        ).format(sql.Identifier(TRACE_SCHEMA))
        self._end_run = sql.SQL(f"UPDATE {{}}.runs SET ended_at = {_NOW_MS} WHERE id = %s").format(
            sql.Identifier(TRACE_SCHEMA)
        )

    def event(
        self,
        kind: str,
        subject: str | None = None,
        *,
        process: str | None = None,
        token: int | None = None,
        scheduled_at: int | None = None,
        until_at: int | None = None,
        worker: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Record one event, by default as this trace's process."""
        row = (process or self.process, kind, subject, token, scheduled_at, until_at, worker,
               detail)
        with self._lock:
            self._conn.execute(self._insert_event, row)

    @contextmanager
    def run(self, ctx: RunContext) -> Iterator[None]:
        """Record a schedule handler's run: a row when it starts, its end when it ends."""
        with self._lock:
            cur = self._conn.execute(
                self._insert_run,
                (ctx.task_id, ctx.fencing_token, ctx.scheduled_at, ctx.owner, ctx.started_at),
            )
            row = cur.fetchone()
        assert row is not None
        try:
            yield
        finally:
            with self._lock:
                self._conn.execute(self._end_run, (row[0],))

    def close(self) -> None:
        self._conn.close()


_WHY = {"cancelled": "cancelled meanwhile", "rejected": "lease taken by another holder",
        "failed": "not recorded within mark_timeout"}


class TraceEvents:
    """A runtime's subscriber (``runtime.subscribe``) that writes what the runtime reports
    (``pgstore.runtime.events``) to the trace, as the kinds the report reads: register,
    claim, complete, rejected, renew-refused, not-completed, error (schedulers); lease,
    dispatched, recalling, lease-lost, released (dispatchers); stopping (both)."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace

    def __call__(self, event: ev.Event) -> None:
        t = self.trace
        if isinstance(event, ev.Registered):
            t.event("register", event.task_id, scheduled_at=event.next_run_at,
                    detail=event.spec)
        elif isinstance(event, ev.Claim) and event.outcome == "claimed":
            if event.runtime == "scheduler":
                t.event("claim", event.subject, token=event.token, scheduled_at=event.due_at)
            else:
                t.event("lease", event.subject, scheduled_at=event.due_at,
                        until_at=event.lease_until)
        elif isinstance(event, ev.Complete):
            if event.runtime == "dispatcher":
                if event.outcome == "completed":
                    t.event("dispatched", event.subject, worker=event.worker_id)
                else:
                    t.event("recalling", event.subject, worker=event.worker_id,
                            detail=_WHY[event.outcome])
            elif event.outcome in ("completed", "rejected"):
                t.event("complete" if event.outcome == "completed" else "rejected",
                        event.subject, token=event.token, detail=event.status)
        elif isinstance(event, ev.LeaseLost):
            t.event("renew-refused" if event.runtime == "scheduler" else "lease-lost",
                    event.subject, token=event.token, detail=event.reason)
        elif isinstance(event, ev.HandlerRun) and event.runtime == "scheduler":
            if event.outcome in ("lease_lost", "error"):
                t.event("not-completed" if event.outcome == "lease_lost" else "error",
                        event.subject, token=event.token)
        elif isinstance(event, ev.Release) and event.outcome == "released":
            t.event("released", event.subject, scheduled_at=event.retry_at)
        elif isinstance(event, ev.Stopping):
            t.event("stopping", detail=str(event.running))
