"""The demo's worker processes, each what one host would run in production::

    PGSTORE_DSN=... python -m pgstore.demo.worker scheduler N
    PGSTORE_DSN=... python -m pgstore.demo.worker dispatcher N

A scheduler runs three tasks (two intervals and a cron) with a ``Scheduler``
over a ``PgScheduleStore``; the three schedulers share them, and each
occurrence runs on one of them. A dispatcher sends a pretend bot into every
due meeting with a ``Dispatcher`` over a ``PgJobStore``, and recalls it when
the meeting was cancelled meanwhile. Both run until SIGTERM (a graceful
stop: running work finishes, nothing new is claimed) and write what they do
to the demo's trace (``pgstore.demo.trace``), from the runtime's events.

Each one also serves its Prometheus metrics (``pgstore.runtime.metrics``: its
runtime's counters, and the store's gauges read at each scrape) on a free port
of 127.0.0.1, whose URL it writes to the trace (a ``metrics`` event); when it
stops it writes its last page there too (``metrics-final``), which the report
checks against the trace.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time

from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from pgstore.demo.trace import STORE_SCHEMA, Trace, TraceEvents
from pgstore.models import Job
from pgstore.postgres.jobs import PgJobStore
from pgstore.postgres.schedules import PgScheduleStore
from pgstore.runtime.dispatcher import Dispatcher
from pgstore.runtime.metrics import RuntimeMetrics, StoreStatsCollector, StoreStatsReader
from pgstore.runtime.scheduler import RunContext, Scheduler

__all__ = ["LEASE_MS", "PROVIDER_SECONDS", "RUN_SECONDS", "TTL_MS", "main"]

#: Schedule lease: renewed every third of it while a handler runs.
LEASE_MS = 1_500
#: Job lease: renewed every third of it while the provider works.
TTL_MS = 1_500
#: How long each task's handler works.
RUN_SECONDS = {"heartbeat": 0.1, "report": 0.6, "minutely": 0.1}
#: How long the pretend provider takes to put a bot into a meeting.
PROVIDER_SECONDS = 0.7
POLL_SECONDS = 0.1
GRACE_SECONDS = 5.0


def scheduler(n: int, dsn: str) -> None:
    """Run scheduler N until SIGTERM."""
    owner = f"scheduler-{n}"
    trace = Trace(dsn, owner)
    store = PgScheduleStore(dsn, schema=STORE_SCHEMA)
    runtime = Scheduler(store, owner=owner, lease_ms=LEASE_MS, poll_interval=POLL_SECONDS,
                        grace_period=GRACE_SECONDS)

    def work(ctx: RunContext) -> None:
        with trace.run(ctx):
            time.sleep(RUN_SECONDS[ctx.task_id])

    runtime.every("heartbeat", 1_000, work)
    runtime.every("report", 1_500, work)
    runtime.cron("minutely", "* * * * *", work)  # at the top of each minute (UTC)
    _run(runtime, store, trace)


def dispatcher(n: int, dsn: str) -> None:
    """Run dispatcher N until SIGTERM."""
    holder = f"dispatcher-{n}"
    trace = Trace(dsn, holder)
    bots = itertools.count(1)

    def dispatch(job: Job) -> str:
        trace.event("send", job.run_id)  # the provider is asked for a bot
        time.sleep(PROVIDER_SECONDS)
        bot = f"bot-{n}.{next(bots):02d}"
        trace.event("bot", job.run_id, worker=bot)  # the bot is in the meeting now
        return bot

    def recall(job: Job, worker_id: str | None) -> None:
        trace.event("recall", job.run_id, worker=worker_id)  # ... and has left it

    store = PgJobStore(dsn, schema=STORE_SCHEMA)
    runtime = Dispatcher(store, dispatch, recall, holder=holder, ttl_ms=TTL_MS,
                         poll_interval=POLL_SECONDS, grace_period=GRACE_SECONDS)
    _run(runtime, store, trace)


def _run(runtime: Scheduler | Dispatcher, store: PgScheduleStore | PgJobStore,
         trace: Trace) -> None:
    runtime.subscribe(TraceEvents(trace))
    registry = CollectorRegistry()
    RuntimeMetrics(registry).observe(runtime)
    gauges = StoreStatsCollector()
    registry.register(gauges)
    # As `pgstore run` does: the gauges are read on a connection of their own, on an
    # interval, so a scrape never takes a connection from the runtime's store.
    reader = StoreStatsReader(store.conninfo(), STORE_SCHEMA, gauges, interval=1.0)
    reader.start()
    server, _ = start_http_server(0, "127.0.0.1", registry)
    trace.event("metrics", detail=f"http://127.0.0.1:{server.server_port}/metrics")
    trace.event("start", detail=f"pid {os.getpid()}")
    try:
        runtime.run_sync()  # until SIGTERM / SIGINT
    finally:
        server.shutdown()
        reader.close()
        reader.read_once()  # the final page's gauges: one reading after the run
        reader.close()
        trace.event("metrics-final", detail=generate_latest(registry).decode())
        store.close()
        trace.event("stopped")
        trace.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("scheduler", "dispatcher") or not argv[1].isdigit():
        print("usage: python -m pgstore.demo.worker scheduler|dispatcher N", file=sys.stderr)
        return 2
    dsn = os.environ.get("PGSTORE_DSN")
    if not dsn:
        print("PGSTORE_DSN must name the demo's database", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    (scheduler if argv[0] == "scheduler" else dispatcher)(int(argv[1]), dsn)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
