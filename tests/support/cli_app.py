"""An app for the ``pgstore run`` tests (tests/test_cli.py), over PostgreSQL stores.

The store comes from ``CLI_APP_DSN`` and ``CLI_APP_SCHEMA``, set by the test. Each
run writes a marker row into ``<schema>.cli_app_marks`` (the test creates that
table), so the test can see from the database what ran, with which token and owner.

* ``scheduler``: a module-level Scheduler with an interval task ``tick`` (every
  200 ms) and ``boom`` (every 300 ms, raises: completed with status ``error``).
* ``make_dispatcher()``: a factory returning a Dispatcher whose ``dispatch`` sends
  bot ``bot-<run_id>``; a run id starting ``flaky-`` fails its first attempt
  (released for a retry), one starting ``cancel-`` is cancelled while it is being
  dispatched (the bot is recalled).
* ``make_doomed_dispatcher()``: a Dispatcher whose every dispatch raises, marking
  each attempt (the stored count it was leased with) and each backoff delay.
* ``make_timed_dispatcher()``: a Dispatcher (ttl 1.5 s, so its keeper renews every
  0.5 s) whose dispatch marks how late it started (key the run id, token the ms
  since ``dispatch_at`` by this host's clock) and then takes ``CLI_APP_DISPATCH_S``
  seconds (default 1), as a provider call does.
* ``make_slow_closing_dispatcher()``: a Dispatcher whose store takes a second more
  to close once its pool is closed (as a process with more to tear down does).
* ``apps.dispatcher``: a dotted path to a Dispatcher; ``not_a_runtime``,
  ``needs_arguments``, ``returns_a_number``, ``raises``: wrong targets.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import psycopg
from psycopg import sql

from pgstore import Backoff, Dispatcher, Job, PgJobStore, PgScheduleStore, RunContext, Scheduler
from pgstore.protocols import AsyncScheduleStore, ScheduleStore

DSN = os.environ.get("CLI_APP_DSN", "")
SCHEMA = os.environ.get("CLI_APP_SCHEMA", "pgstore")


def mark(kind: str, key: str, token: int | None, owner: str) -> None:
    """One row in ``<schema>.cli_app_marks`` (committed at once, on its own connection)."""
    conn: psycopg.Connection[Any]
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.cli_app_marks (kind, key, token, owner) VALUES (%s, %s, %s, %s)"
            ).format(sql.Identifier(SCHEMA)),
            (kind, key, token, owner),
        )


# The stores open their pools lazily: importing this module connects nowhere.
scheduler = Scheduler(
    PgScheduleStore(DSN, schema=SCHEMA), lease_ms=6_000, poll_interval=0.05, grace_period=5.0
)


@scheduler.every("tick", 200)
def tick(ctx: RunContext) -> None:
    mark("tick", ctx.task_id, ctx.fencing_token, ctx.owner)


@scheduler.every("boom", 300)
def boom(ctx: RunContext) -> None:
    mark("boom", ctx.task_id, ctx.fencing_token, ctx.owner)
    raise RuntimeError("boom goes the handler")


_failed_once: set[str] = set()
_lock = threading.Lock()


def make_dispatcher() -> Dispatcher:
    """The Dispatcher the tests run through the factory form ``tests.support.cli_app:make_dispatcher``."""

    def dispatch(job: Job) -> str:
        mark("dispatch", job.run_id, None, job.lease_holder or "")
        if job.run_id.startswith("flaky-"):
            with _lock:
                first = job.run_id not in _failed_once
                _failed_once.add(job.run_id)
            if first:
                raise ConnectionError("the provider did not answer")
        if job.run_id.startswith("cancel-"):
            with PgJobStore(DSN, schema=SCHEMA) as other:
                other.cancel(job.run_id)  # the meeting is cancelled meanwhile
        return f"bot-{job.run_id}"

    def recall(job: Job, worker_id: str | None) -> None:
        mark("recall", job.run_id, None, worker_id or "")

    return Dispatcher(
        PgJobStore(DSN, schema=SCHEMA),
        dispatch,
        recall,
        ttl_ms=6_000,
        poll_interval=0.2,
        grace_period=5.0,
        backoff=Backoff(base_ms=100, max_ms=200),
    )


def make_timed_dispatcher() -> Dispatcher:
    """The Dispatcher of the metrics flood test (tests/test_metrics.py)."""
    took = float(os.environ.get("CLI_APP_DISPATCH_S", "1"))

    def dispatch(job: Job) -> str:
        late = int(time.time() * 1000) - job.dispatch_at
        mark("dispatch", job.run_id, late, job.lease_holder or "")
        time.sleep(took)
        return f"bot-{job.run_id}"

    return Dispatcher(PgJobStore(DSN, schema=SCHEMA), dispatch, ttl_ms=1_500,
                      poll_interval=0.05, grace_period=5.0)


class SlowClosingJobStore(PgJobStore):
    """A PgJobStore that lingers a second after closing its pool."""

    def close(self) -> None:
        super().close()
        time.sleep(1.0)


def make_slow_closing_dispatcher() -> Dispatcher:
    """The Dispatcher of the shutdown-order test (tests/test_metrics.py)."""
    return Dispatcher(SlowClosingJobStore(DSN, schema=SCHEMA), lambda job: "bot",
                      ttl_ms=6_000, poll_interval=0.05, grace_period=1.0)


@dataclass(frozen=True)
class MarkedBackoff(Backoff):
    """Backoff that marks every delay it gives: key the delay, token the attempt."""

    def delay_ms(self, attempt: int) -> int:
        delay = super().delay_ms(attempt)
        mark("backoff", str(delay), attempt, "")
        return delay


def make_doomed_dispatcher() -> Dispatcher:
    """A Dispatcher whose provider is down: every dispatch raises (its text names the
    attempt), after marking the attempt the job was leased with."""

    def dispatch(job: Job) -> str:
        mark("attempt", job.run_id, job.attempts, job.lease_holder or "")
        raise RuntimeError(f"provider down (attempt {job.attempts})")

    return Dispatcher(
        PgJobStore(DSN, schema=SCHEMA),
        dispatch,
        ttl_ms=6_000,
        poll_interval=0.05,
        grace_period=5.0,
        backoff=MarkedBackoff(base_ms=250, factor=2, max_ms=2_000, jitter=0),
    )


apps = SimpleNamespace(dispatcher=Dispatcher(PgJobStore(DSN, schema=SCHEMA), lambda job: None))

not_a_runtime = 42


def needs_arguments(store: ScheduleStore | AsyncScheduleStore) -> Scheduler:
    return Scheduler(store)


def returns_a_number() -> int:
    return 7


def raises() -> Scheduler:
    raise LookupError("no such environment")
