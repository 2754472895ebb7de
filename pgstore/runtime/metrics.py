"""Prometheus metrics for the runtimes (the ``metrics`` extra: ``prometheus_client``).

Two parts, registered into any ``CollectorRegistry`` (the default one unless told):

* ``RuntimeMetrics``: counters and histograms fed by the runtimes' events
  (``pgstore.runtime.events``): ``metrics.observe(runtime)`` subscribes it to a
  Scheduler or Dispatcher; one instance observes every runtime of the process
  (series are labelled by ``runtime``, never by owner or subject).
* ``StoreStatsCollector``: gauges from ONE call of ``store_stats()`` (one
  snapshot). A scrape serves the last reading, which ``StoreStatsReader`` takes
  every ``interval`` seconds on a connection of its own (a thread: a sync or an
  asyncio store alike), so a scrape never reaches the database, however many
  scrapers there are, and never takes a connection the runtime needs.
  (``read=store.stats``, reading at each scrape on the caller's connection, and
  ``poll_store_stats``, a task of the application's loop, remain for
  applications that wire their own.)

Wiring into an application's own registry::

    from prometheus_client import CollectorRegistry
    from pgstore.runtime.metrics import RuntimeMetrics, StoreStatsCollector, StoreStatsReader

    registry = CollectorRegistry()
    RuntimeMetrics(registry).observe(dispatcher)
    gauges = StoreStatsCollector()
    registry.register(gauges)
    reader = StoreStatsReader(store.conninfo(), store.schema, gauges, interval=15.0)
    reader.start()          # ... reader.close() at shutdown, before the store's close

``pgstore run --metrics-port N`` does the same on the default registry and
serves it (``prometheus_client.start_http_server``); the gauges only with
``--store-gauges`` (one process of the fleet), or from ``pgstore exporter``.
docs/metrics.md lists every series; docs/alerts.yml holds the alert rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

import psycopg
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgstore.models import StoreStats
from pgstore.postgres.store import SyncStore
from pgstore.runtime import events as ev
from pgstore.runtime.events import RuntimeKind

if TYPE_CHECKING:
    from pgstore.runtime.base import Runtime

__all__ = [
    "HANDLER_BUCKETS",
    "LATENESS_BUCKETS",
    "STATS_INTERVAL",
    "RuntimeMetrics",
    "StoreStatsCollector",
    "StoreStatsReader",
    "poll_store_stats",
]

#: How often ``StoreStatsReader`` reads ``store_stats()`` unless told (``pgstore run``'s
#: ``--stats-interval`` default).
STATS_INTERVAL = 15.0

log = logging.getLogger("pgstore.metrics")

#: Lateness (seconds after the due time a claim took the work): a healthy runtime
#: claims within its poll interval (or at once, woken by LISTEN).
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 300.0, 900.0, 3600.0)
#: Handler / dispatch durations (seconds).
HANDLER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0, 60.0, 300.0)



class RuntimeMetrics:
    """The runtimes' counters and histograms, registered into ``registry``, fed by
    events. Create one per registry (the names are registered once)."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY,
                 *, namespace: str = "pgstore") -> None:
        self._registry = registry

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
            return Counter(name, doc, labels, namespace=namespace, registry=registry)

        self.claims = counter(
            "claims", "Claims by outcome: claimed (per piece), empty (a round that found "
            "nothing due), error (the claim call raised). Mixes pieces and rounds: kept for "
            "compatibility; claimed_total, claim_rounds_empty_total and "
            "claim_errors_total split it.", ("runtime", "outcome"))
        self.claimed = counter(
            "claimed", "Pieces claimed: schedules claimed (scheduler), jobs leased "
            "(dispatcher).", ("runtime",))
        self.claim_rounds_empty = counter(
            "claim_rounds_empty", "Claim rounds that found nothing due.", ("runtime",))
        self.claim_errors = counter(
            "claim_errors", "Claim rounds whose store call raised.", ("runtime",))
        self.renews = counter(
            "renews", "Lease renews by outcome: renewed, refused, error.",
            ("runtime", "outcome"))
        self.completes = counter(
            "completes", "Completes (scheduler) and mark_dispatched (dispatcher) by outcome: "
            "completed, cancelled, rejected, failed.", ("runtime", "outcome"))
        self.refusals = counter(
            "stale_holder_refusals", "Store calls refused because the lease they were made "
            "under is no longer the caller's, by operation.", ("runtime", "operation"))
        self.leases_lost = counter(
            "leases_lost", "Leases given up while the work ran, by reason: refused (a renew "
            "was refused), expired (no renew succeeded in time).", ("runtime", "reason"))
        self.recalls = counter(
            "recalls", "Bots recalled, by reason (cancelled, taken, unrecorded) and outcome "
            "(ok, error, none).", ("reason", "outcome"))
        self.releases = counter(
            "releases", "Jobs released for a retry after a failed dispatch, by outcome "
            "(released, failed: its last attempt spent, refused, error).", ("outcome",))
        self.connection_losses = counter(
            "connection_losses", "Connections lost: listener (the LISTEN connection), store "
            "(unreachable at start).", ("runtime", "component"))
        self.reconnects = counter(
            "reconnects", "Connections restored after a loss, by component.",
            ("runtime", "component"))
        self.purges = counter(
            "purges", "Retention rounds (purge_after) by outcome: ok, error.", ("outcome",))
        self.purged = counter(
            "purged_jobs", "Finished jobs deleted by the retention rounds.", ())
        self.lateness = Histogram(
            "dispatch_lateness_seconds", "Seconds from the due time to the claim: now - "
            "dispatch_at (jobs), now - next_run_at (schedules).", ("runtime",),
            namespace=namespace, registry=registry, buckets=LATENESS_BUCKETS)
        self.handler = Histogram(
            "handler_duration_seconds", "Duration of each handler run (scheduler) and "
            "dispatch(job) call (dispatcher), by outcome: ok, error, lease_lost, abandoned.",
            ("runtime", "outcome"), namespace=namespace, registry=registry,
            buckets=HANDLER_BUCKETS)

    def _zeroes(self, runtime: RuntimeKind) -> None:
        """The series a healthy runtime of this kind has, at 0 before anything happens
        (an alert on the rate of a series that does not exist yet never fires)."""
        for outcome in ("claimed", "empty", "error"):
            self.claims.labels(runtime, outcome)
        self.claimed.labels(runtime)
        self.claim_rounds_empty.labels(runtime)
        self.claim_errors.labels(runtime)
        for outcome in ("renewed", "refused", "error"):
            self.renews.labels(runtime, outcome)
        for outcome in ("completed", "rejected", "failed"):
            self.completes.labels(runtime, outcome)
        for reason in ("refused", "expired"):
            self.leases_lost.labels(runtime, reason)
        self.lateness.labels(runtime)
        self.connection_losses.labels(runtime, "store")
        self.reconnects.labels(runtime, "store")
        if runtime == "scheduler":
            for operation in ("renew", "complete"):
                self.refusals.labels(runtime, operation)
            return
        for operation in ("renew", "mark_dispatched", "release"):
            self.refusals.labels(runtime, operation)
        self.completes.labels(runtime, "cancelled")
        self.connection_losses.labels(runtime, "listener")
        self.reconnects.labels(runtime, "listener")
        for outcome in ("released", "failed", "refused", "error"):
            self.releases.labels(outcome)
        for outcome in ("ok", "error"):
            self.purges.labels(outcome)
        for reason in ("cancelled", "taken", "unrecorded"):
            for outcome in ("ok", "error", "none"):
                self.recalls.labels(reason, outcome)

    def unregister(self) -> None:
        """Take every series of this instance out of its registry (a later
        ``RuntimeMetrics`` may register the names again)."""
        if self._registry is None:
            return
        for metric in (self.claims, self.claimed, self.claim_rounds_empty, self.claim_errors,
                       self.renews, self.completes, self.refusals,
                       self.leases_lost, self.recalls, self.releases, self.connection_losses,
                       self.reconnects, self.purges, self.purged, self.lateness, self.handler):
            self._registry.unregister(metric)
        self._registry = None

    def observe(self, runtime: Runtime) -> Callable[[], None]:
        """Count ``runtime``'s events from now on (its kind's series start at 0); returns
        the function that stops it."""
        self._zeroes(runtime.kind)
        return runtime.subscribe(self)

    def __call__(self, event: ev.Event) -> None:
        """Count one event (the subscriber ``observe`` registers)."""
        r = event.runtime
        if isinstance(event, ev.Claim):
            self.claims.labels(r, event.outcome).inc()
            if event.outcome == "empty":
                self.claim_rounds_empty.labels(r).inc()
            elif event.outcome == "error":
                self.claim_errors.labels(r).inc()
            else:
                self.claimed.labels(r).inc()
                if event.now is not None and event.due_at is not None:
                    self.lateness.labels(r).observe(max(0, event.now - event.due_at) / 1000)
        elif isinstance(event, ev.HandlerRun):
            self.handler.labels(r, event.outcome).observe(event.duration_s)
        elif isinstance(event, ev.Renew):
            self.renews.labels(r, event.outcome).inc()
        elif isinstance(event, ev.Refused):
            self.refusals.labels(r, event.operation).inc()
        elif isinstance(event, ev.LeaseLost):
            self.leases_lost.labels(r, event.reason).inc()
        elif isinstance(event, ev.Complete):
            self.completes.labels(r, event.outcome).inc()
        elif isinstance(event, ev.Recall):
            self.recalls.labels(event.reason, event.outcome).inc()
        elif isinstance(event, ev.Release):
            self.releases.labels(event.outcome).inc()
        elif isinstance(event, ev.ConnectionLost):
            self.connection_losses.labels(r, event.component).inc()
        elif isinstance(event, ev.Reconnected):
            self.reconnects.labels(r, event.component).inc()
        elif isinstance(event, ev.Purge):
            self.purges.labels(event.outcome).inc()
            self.purged.inc(event.deleted)


class StoreStatsCollector(Collector):
    """Gauges from one ``store_stats()`` reading: the last reading given to ``update``
    (``StoreStatsReader``, ``poll_store_stats``), or, with ``read`` (a sync store's
    ``stats``), one read at each scrape. A failed read is logged and reported as
    ``pgstore_store_stats_up 0`` and ``pgstore_store_stats_stale 1``; the gauges keep
    the last good reading, whose age ``pgstore_store_stats_age_seconds`` and
    ``pgstore_store_stats_last_success_timestamp_seconds`` show (no gauge at all
    before a first good reading). The scrape itself never fails."""

    def __init__(self, read: Callable[[], StoreStats] | None = None,
                 *, namespace: str = "pgstore") -> None:
        self._read = read
        self._prefix = namespace + "_" if namespace else ""
        self._lock = threading.Lock()
        self._last: StoreStats | None = None  # the last good reading (None: none yet)
        self._last_at = 0.0  # time.time() of that reading
        self._ok = False  # whether the latest read succeeded
        self._last_seconds = 0.0  # how long the latest read took

    def update(self, stats: StoreStats | None, seconds: float = 0.0) -> None:
        """A new reading (``None``: the read failed; the last good one is kept, stale),
        which took ``seconds``."""
        with self._lock:
            self._ok, self._last_seconds = stats is not None, seconds
            if stats is not None:
                self._last, self._last_at = stats, time.time()

    def describe(self) -> Iterable[Metric]:
        """The families without samples (registering reads nothing from the store)."""
        return self._families(None, samples=False)

    def collect(self) -> Iterable[Metric]:
        if self._read is not None:
            started = time.monotonic()
            try:
                stats: StoreStats | None = self._read()
            except Exception as exc:
                log.warning("store_stats() for the metrics failed: %s: %s",
                            type(exc).__name__, exc)
                stats = None
            self.update(stats, time.monotonic() - started)
        return self._families(time.time())

    def _families(self, now: float | None, *, samples: bool = True) -> list[Metric]:
        p = self._prefix
        up = GaugeMetricFamily(p + "store_stats_up",
                               "1 when the last store_stats() read succeeded, else 0.")
        took = GaugeMetricFamily(p + "store_stats_read_seconds",
                                 "How long the last store_stats() read took.")
        stale = GaugeMetricFamily(
            p + "store_stats_stale", "1 when the gauges are an older reading, kept because "
            "the last read failed; else 0.")
        last_at = GaugeMetricFamily(
            p + "store_stats_last_success_timestamp_seconds",
            "Unix time of the reading the gauges show (absent before the first).")
        age = GaugeMetricFamily(
            p + "store_stats_age_seconds",
            "Seconds since the reading the gauges show was taken (absent before the first).")
        schedules = GaugeMetricFamily(
            p + "schedules", "Schedules by state at the reading: due (claimable), leased, "
            "done (one-shots run), all.", labels=["state"])
        jobs = GaugeMetricFamily(
            p + "jobs", "Jobs by state at the reading: pending (not yet due), due (due, no "
            "live lease: what a lease would take), leased, dispatched, cancelled, failed "
            "(out of attempts); the states add up to every job.",
            labels=["state"])
        expired = GaugeMetricFamily(p + "jobs_due_expired_lease",
                                    "Due jobs whose last lease expired undispatched.")
        recalled = GaugeMetricFamily(p + "jobs_recalled",
                                     "Dispatched jobs cancelled meanwhile (bots recalled).")
        failed = GaugeMetricFamily(p + "jobs_failed",
                                   "Jobs that failed for good: their last attempt spent "
                                   "(pgstore jobs retry revives one); the same as "
                                   "pgstore_jobs{state=\"failed\"}, kept for compatibility.")
        job_age = GaugeMetricFamily(
            p + "oldest_due_job_age_seconds",
            "Seconds the oldest due job has waited past its dispatch_at (0: none due).")
        schedule_age = GaugeMetricFamily(
            p + "oldest_due_schedule_age_seconds",
            "Seconds the longest-claimable schedule has been due (0: none due).")
        families: list[Metric] = [up, took, stale, last_at, age, schedules, jobs, expired,
                                  recalled, failed, job_age, schedule_age]
        if not samples or now is None:
            return families
        with self._lock:
            stats, ok, seconds, at = self._last, self._ok, self._last_seconds, self._last_at
        up.add_metric([], 1 if ok else 0)
        took.add_metric([], seconds)
        if stats is None:
            return families
        stale.add_metric([], 0 if ok else 1)
        last_at.add_metric([], at)
        age.add_metric([], max(0.0, now - at))
        for state, count in (("all", stats.schedules), ("due", stats.schedules_due),
                             ("leased", stats.schedules_leased),
                             ("done", stats.schedules_done)):
            schedules.add_metric([state], count)
        for state, count in (("pending", stats.jobs_pending), ("due", stats.jobs_due),
                             ("leased", stats.jobs_leased),
                             ("dispatched", stats.jobs_dispatched),
                             ("cancelled", stats.jobs_cancelled),
                             ("failed", stats.jobs_failed)):
            jobs.add_metric([state], count)
        expired.add_metric([], stats.jobs_due_expired_lease)
        recalled.add_metric([], stats.jobs_recalled)
        job_age.add_metric([], _age(stats.now, stats.oldest_due_job_at))
        schedule_age.add_metric([], _age(stats.now, stats.oldest_due_schedule_since))
        failed.add_metric([], stats.jobs_failed)
        return families


class StoreStatsReader:
    """Reads ``store_stats()`` every ``interval`` seconds into ``collector``, from a
    thread of its own, on a connection of its own to ``conninfo`` (opened at the
    first read, opened again after a failed one; never the runtime store's pool), so
    neither scrapes nor a slow read can take a connection or the event loop from the
    runtime. The first read starts at once. A failed read is logged and leaves the
    last good reading in place, stale (``StoreStatsCollector``). ``close()`` stops the
    thread (a read under way finishes first) and closes the connection."""

    def __init__(self, conninfo: str, schema: str, collector: StoreStatsCollector,
                 interval: float = STATS_INTERVAL) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive, not {interval!r}")
        self._conninfo, self._schema = conninfo, schema
        self._collector, self._interval = collector, interval
        self._stop = threading.Event()
        self._conn: psycopg.Connection[object] | None = None
        self._thread = threading.Thread(target=self._loop, name="pgstore-stats", daemon=True)

    def start(self) -> None:
        """Start reading (once)."""
        self._thread.start()

    def read_once(self) -> StoreStats | None:
        """One reading into the collector, now; the reading, or None when it failed."""
        started = time.monotonic()
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(_with_timeout(self._conninfo), autocommit=True)
            stats: StoreStats | None = SyncStore(self._conn, schema=self._schema).stats()
        except Exception as exc:
            log.warning("store_stats() for the metrics failed: %s: %s", type(exc).__name__, exc)
            stats = None
            self._disconnect()  # a fresh connection at the next read
        self._collector.update(stats, time.monotonic() - started)
        return stats

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.read_once()
                self._stop.wait(self._interval)
        finally:
            self._disconnect()

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                conn.close()

    def close(self) -> None:
        """Stop reading and close the connection; waits for a read under way."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._disconnect()


#: The ``application_name`` of the reader's connection unless its conninfo sets one, so
#: ``pg_stat_activity`` tells it from the runtime's.
READER_APPLICATION_NAME = "pgstore metrics"


def _with_timeout(conninfo: str) -> str:
    """``conninfo`` with a connect timeout (10 s) unless it sets one (``close()`` waits
    for a read under way, a connection attempt included), and with
    ``READER_APPLICATION_NAME`` unless it names one."""
    given = conninfo_to_dict(conninfo)
    extra: dict[str, str | int] = {}
    if "connect_timeout" not in given:
        extra["connect_timeout"] = 10
    if "application_name" not in given:
        extra["application_name"] = READER_APPLICATION_NAME
    return make_conninfo(conninfo, **extra) if extra else conninfo


def _age(now: int, since: int | None) -> float:
    return 0.0 if since is None else max(0, now - since) / 1000


async def poll_store_stats(
    collector: StoreStatsCollector,
    read: Callable[[], Awaitable[StoreStats]],
    interval: float,
) -> None:
    """Read ``store_stats()`` every ``interval`` seconds into ``collector`` until
    cancelled (the interval mode, for asyncio stores and ``pgstore run``)."""
    while True:
        started = time.monotonic()
        try:
            stats: StoreStats | None = await read()
        except Exception as exc:
            log.warning("store_stats() for the metrics failed: %s: %s", type(exc).__name__, exc)
            stats = None
        collector.update(stats, time.monotonic() - started)
        await asyncio.sleep(interval)
