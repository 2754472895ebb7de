"""The demo's trace: what every demo process did, in tables beside the store's schema.

``make demo`` runs a store in schema ``pgstore_demo`` and seven processes over
it. Each process writes what it does and sees to ``pgstore_demo_trace.events``
(one row per event, stamped with the database clock, so all processes share
one time line), and every schedule handler writes its run to
``pgstore_demo_trace.runs``. The orchestrator draws and checks the story from
these rows and from the store's own tables, which the trace never writes.

The Scheduler and the Dispatcher tell what they did (a claim, an accepted or
rejected complete, a lease, a recorded dispatch) only through their logs, so
``TraceLogHandler`` turns their log records into events.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from pgstore.runtime.scheduler import RunContext

__all__ = [
    "STORE_SCHEMA",
    "TRACE_SCHEMA",
    "Trace",
    "TraceLogHandler",
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


#: The runtimes' log messages that become events: the message's format string, then the
#: event kind and what each ``%`` argument is ("" for arguments the event does not keep;
#: the first is always the logging process's own name).
LOG_EVENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    # pgstore.scheduler
    "%s: registered %s (%s %s), next run at %s": (
        "register", ("", "subject", "", "detail", "scheduled_at")),
    "%s: claimed %s token %d (scheduled %s)": (
        "claim", ("", "subject", "token", "scheduled_at")),
    "%s: completed %s token %d %s, next run at %s": (
        "complete", ("", "subject", "token", "detail", "")),
    "%s: complete of %s token %d rejected: stale claim": (
        "rejected", ("", "subject", "token")),
    "%s: %s token %d lease lost (%s); %s": (  # the keeper: renew refused, or none in time
        "renew-refused", ("", "subject", "token", "detail", "")),
    "%s: %s token %d lost its lease; not completing": (
        "not-completed", ("", "subject", "token")),
    "%s: %s token %d raised": ("error", ("", "subject", "token")),
    # pgstore.dispatcher
    "%s: leased %s (due %s) until %s": (
        "lease", ("", "subject", "scheduled_at", "until_at")),
    "%s: dispatched %s to %s": ("dispatched", ("", "subject", "worker")),
    "%s: %s: %s; recalling %s": ("recalling", ("", "subject", "detail", "worker")),
    "%s: %s lease lost (%s); mark_dispatched will tell whether to recall": (
        "lease-lost", ("", "subject", "detail")),
    "%s: released %s for a retry at %s": ("released", ("", "subject", "scheduled_at")),
    # both
    "%s: stopping; %d running, grace %.1fs": ("stopping", ("", "detail", "")),
}


class TraceLogHandler(logging.Handler):
    """Writes the runtime's known log records (``LOG_EVENTS``) to the trace as events, and
    any other warning or error as a ``log`` event with its text."""

    def __init__(self, trace: Trace) -> None:
        super().__init__(logging.INFO)
        self.trace = trace

    def emit(self, record: logging.LogRecord) -> None:
        try:
            known = LOG_EVENTS.get(str(record.msg))
            if known is None or not isinstance(record.args, tuple):
                if record.levelno >= logging.WARNING:
                    self.trace.event("log", detail=record.getMessage())
                return
            kind, names = known
            fields: dict[str, Any] = {
                n: a for n, a in zip(names, record.args, strict=False) if n
            }
            if "detail" in fields:
                fields["detail"] = str(fields["detail"])
            self.trace.event(kind, **fields)
        except Exception:
            self.handleError(record)
