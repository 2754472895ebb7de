"""A Scheduler and a Dispatcher on one event loop, for tests/test_signals.py.

``python -m tests.support.signal_app MODE``, over ``SIGNAL_APP_DSN`` / ``SIGNAL_APP_SCHEMA``
(the test creates ``<schema>.signal_app_marks``). The scheduler's one-shot task
``slow`` and the dispatch of every job each write a ``*-started`` mark, hold for
``SIGNAL_APP_HOLD`` seconds, then write a ``*-finished`` mark. Modes:

* ``default``: ``asyncio.gather(scheduler.run(), dispatcher.run())``, no arguments;
* ``off``: the same with ``handle_signals=False``;
* ``own``: the application handles SIGTERM itself (``loop.add_signal_handler``): its
  handler writes an ``own-handler`` mark and stops both runtimes.

Prints ``stopped`` once both ``run()`` calls have returned. On SIGUSR1 it writes
every thread's stack to stderr (``faulthandler``), for a test that timed out.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

from pgstore import Dispatcher, Job, PgJobStore, PgScheduleStore, RunContext, Scheduler

DSN = os.environ["SIGNAL_APP_DSN"]
SCHEMA = os.environ["SIGNAL_APP_SCHEMA"]
HOLD = float(os.environ.get("SIGNAL_APP_HOLD", "1.0"))


def mark(kind: str, key: str) -> None:
    conn: psycopg.Connection[Any]
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.signal_app_marks (kind, key) VALUES (%s, %s)").format(
                sql.Identifier(SCHEMA)
            ),
            (kind, key),
        )


def slow(ctx: RunContext) -> None:
    mark("run-started", f"{ctx.task_id}:{ctx.fencing_token}")
    time.sleep(HOLD)
    mark("run-finished", f"{ctx.task_id}:{ctx.fencing_token}")


def dispatch(job: Job) -> str:
    mark("dispatch-started", job.run_id)
    time.sleep(HOLD)
    mark("dispatch-finished", job.run_id)
    return f"bot-{job.run_id}"


async def main(mode: str, schedules: PgScheduleStore, jobs: PgJobStore) -> None:
    scheduler = Scheduler(schedules, poll_interval=0.05, grace_period=20.0)
    scheduler.once("slow", 100, slow)
    dispatcher = Dispatcher(jobs, dispatch, poll_interval=0.05, grace_period=20.0)
    if mode == "own":

        def own() -> None:
            mark("own-handler", "SIGTERM")
            scheduler.stop()
            dispatcher.stop()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, own)
    if mode == "off":
        await asyncio.gather(
            scheduler.run(handle_signals=False), dispatcher.run(handle_signals=False)
        )
    else:
        await asyncio.gather(scheduler.run(), dispatcher.run())
    print("stopped" + (" (work abandoned)" if scheduler.abandoned or dispatcher.abandoned
                       else ""), flush=True)


if __name__ == "__main__":
    # For a test that times out: SIGUSR1 writes every thread's stack to stderr, which
    # also says how the process found its stop signals.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    print(f"at start: SIGINT {signal.getsignal(signal.SIGINT)!r},"
          f" SIGTERM {signal.getsignal(signal.SIGTERM)!r},"
          f" blocked {sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}",
          file=sys.stderr, flush=True)
    # An app started from a shell in the foreground finds SIGINT at Python's default.
    # A test run started in the background (a shell without job control starts its
    # ``&`` jobs with SIGINT ignored) hands its children an ignored SIGINT, which run()
    # rightly leaves alone (the signal ignored, as nohup and shells do): this puts the
    # foreground's back, since the tests ask what a foreground app gets.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    with PgScheduleStore(DSN, schema=SCHEMA) as schedules, PgJobStore(DSN, schema=SCHEMA) as jobs:
        asyncio.run(main(sys.argv[1], schedules, jobs))
