"""Prometheus metrics (pgstore.runtime.metrics) on PostgreSQL, scraped over HTTP: the
counters match what the runtimes did, the gauges match the store (read per scrape, or by
StoreStatsReader on its own connection, a failed read kept stale), and ``pgstore run
--metrics-port`` serves them on 127.0.0.1, unharmed by a scrape flood, closed before its
store."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from pgstore import AsyncPgJobStore, Job, PgJobStore, PgScheduleStore, StoreStats
from pgstore.runtime import events as ev
from pgstore.runtime.dispatcher import Backoff, Dispatcher
from pgstore.runtime.metrics import (
    READER_APPLICATION_NAME,
    RuntimeMetrics,
    StoreStatsCollector,
    StoreStatsReader,
    poll_store_stats,
)
from pgstore.runtime.scheduler import Scheduler
from tests.support.cli_support import process_env
from tests.support.waiting import WAIT, until

REPO = Path(__file__).resolve().parents[1]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of the page at ``url``: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name, tuple(sorted(labels.items()))]


@pytest.fixture
def served() -> Iterator[tuple[CollectorRegistry, str]]:
    """A fresh registry served on a free port: (registry, its /metrics URL)."""
    registry = CollectorRegistry()
    server, thread = start_http_server(0, "127.0.0.1", registry)
    try:
        yield registry, f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)



def test_the_counters_count_what_a_scheduler_and_a_dispatcher_did(
    pgstore_database: str, pgstore_schema: str, served: tuple[CollectorRegistry, str]
) -> None:
    registry, url = served
    metrics = RuntimeMetrics(registry)
    seen: list[ev.Event] = []
    lock = threading.Lock()
    ran: list[str] = []

    def record(event: ev.Event) -> None:
        with lock:
            seen.append(event)

    def boom() -> None:
        ran.append("boom")
        raise RuntimeError("boom")

    schedules = PgScheduleStore(pgstore_database, schema=pgstore_schema)
    jobs = PgJobStore(pgstore_database, schema=pgstore_schema)
    other = PgJobStore(pgstore_database, schema=pgstore_schema)
    s = Scheduler(schedules, owner="s1", lease_ms=5_000, poll_interval=0.02, on_event=record)
    s.every("tick", 100, lambda: ran.append("tick"))
    s.every("boom", 150, boom)
    now = jobs.now_ms()
    for n in range(5):
        jobs.schedule(f"late-{n}", now - 3_000)
    jobs.schedule("flaky", now - 3_000)
    jobs.schedule("cancel", now - 3_000)
    failed_once: set[str] = set()

    def dispatch(job: Job) -> str:
        if job.run_id == "flaky" and not failed_once:
            failed_once.add(job.run_id)
            raise ConnectionError("provider down")
        if job.run_id == "cancel":
            other.cancel("cancel")
        return "bot"

    d = Dispatcher(jobs, dispatch, lambda job, worker: None, holder="d1", poll_interval=0.02,
                   listen=False, backoff=Backoff(base_ms=1, max_ms=1, jitter=0),
                   on_event=record)
    metrics.observe(s)
    stop_d = metrics.observe(d)

    def completes() -> int:
        with lock:
            return sum(isinstance(e, ev.Complete) and e.runtime == "dispatcher" for e in seen)

    async def main() -> None:
        tasks = [asyncio.ensure_future(r.run(handle_signals=False)) for r in (s, d)]
        await until("every job answered", lambda: completes() == 7 and len(ran) >= 6)
        s.stop()
        d.stop()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    stop_d()
    for store in (schedules, jobs, other):
        store.close()
    page = scrape(url)

    def count(kind: type[ev.Event], runtime: str, **fields: str) -> int:
        return sum(isinstance(e, kind) and e.runtime == runtime
                   and all(getattr(e, k) == v for k, v in fields.items()) for e in seen)

    for runtime in ("scheduler", "dispatcher"):
        for outcome in ("claimed", "empty", "error"):
            assert value(page, "pgstore_claims_total", runtime=runtime, outcome=outcome) \
                == count(ev.Claim, runtime, outcome=outcome), (runtime, outcome)
        for outcome in ("completed", "rejected", "failed"):
            assert value(page, "pgstore_completes_total", runtime=runtime, outcome=outcome) \
                == count(ev.Complete, runtime, outcome=outcome), (runtime, outcome)
        claimed = count(ev.Claim, runtime, outcome="claimed")
        assert value(page, "pgstore_dispatch_lateness_seconds_count", runtime=runtime) \
            == claimed
        # The split series: pieces claimed apart from the rounds that found nothing.
        assert value(page, "pgstore_claimed_total", runtime=runtime) == claimed > 0
        assert value(page, "pgstore_claim_rounds_empty_total", runtime=runtime) \
            == count(ev.Claim, runtime, outcome="empty")
        assert value(page, "pgstore_claim_errors_total", runtime=runtime) \
            == count(ev.Claim, runtime, outcome="error")
    # What happened, independently of the events: the handlers' own record, the jobs.
    assert value(page, "pgstore_completes_total", runtime="scheduler", outcome="completed") \
        == len(ran)
    assert value(page, "pgstore_handler_duration_seconds_count", runtime="scheduler",
                 outcome="error") == ran.count("boom")
    assert value(page, "pgstore_handler_duration_seconds_count", runtime="scheduler",
                 outcome="ok") == ran.count("tick")
    assert value(page, "pgstore_claims_total", runtime="dispatcher", outcome="claimed") == 8
    assert value(page, "pgstore_completes_total", runtime="dispatcher", outcome="completed") == 6
    assert value(page, "pgstore_completes_total", runtime="dispatcher", outcome="cancelled") == 1
    assert value(page, "pgstore_handler_duration_seconds_count", runtime="dispatcher",
                 outcome="error") == 1
    assert value(page, "pgstore_releases_total", outcome="released") == 1
    assert value(page, "pgstore_recalls_total", reason="cancelled", outcome="ok") == 1
    # The seven first leases were 3 s late or more: none in the buckets below 2.5 s.
    assert value(page, "pgstore_dispatch_lateness_seconds_bucket", runtime="dispatcher",
                 le="2.5") <= 1
    assert value(page, "pgstore_dispatch_lateness_seconds_sum", runtime="dispatcher") >= 7 * 3
    assert value(page, "pgstore_stale_holder_refusals_total", runtime="dispatcher",
                 operation="mark_dispatched") == 0
    assert value(page, "pgstore_leases_lost_total", runtime="scheduler", reason="refused") == 0
    # Each observed kind's series exist from the start, at 0 until it happens.
    assert value(page, "pgstore_reconnects_total", runtime="dispatcher", component="listener") == 0
    assert value(page, "pgstore_releases_total", outcome="error") == 0


def test_stale_holder_refusals_and_lost_leases_are_counted(
    pgstore_database: str, pgstore_schema: str, served: tuple[CollectorRegistry, str]
) -> None:
    registry, url = served
    metrics = RuntimeMetrics(registry)
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    now = store.now_ms()
    trials = 3
    for n in range(trials):
        store.schedule(f"stolen-{n}", now - 10 + n)
    stolen = 0

    def dispatch(job: Job) -> str:
        nonlocal stolen
        with PgJobStore(pgstore_database, schema=pgstore_schema) as thief:
            taken = thief.lease("thief", thief.now_ms() + 60_000, 60_000)
            assert taken is not None and taken.run_id == job.run_id
        stolen += 1
        return "bot"

    d = Dispatcher(store, dispatch, holder="d1", poll_interval=0.02, listen=False,
                   concurrency=1)
    metrics.observe(d)

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await until("the stolen marks", lambda: value(
            scrape(url), "pgstore_completes_total", runtime="dispatcher",
            outcome="rejected") == trials)
        d.stop()
        await task

    asyncio.run(main())
    store.close()
    page = scrape(url)
    assert stolen == trials
    assert value(page, "pgstore_stale_holder_refusals_total", runtime="dispatcher",
                 operation="mark_dispatched") == trials
    assert value(page, "pgstore_recalls_total", reason="taken", outcome="none") == trials


def _fill(dsn: str, schema: str) -> int:
    """Jobs in every state; the database clock's now at the start."""
    with PgJobStore(dsn, schema=schema) as jobs:
        now = jobs.now_ms()
        jobs.schedule("due-old", now - 5_000)
        jobs.schedule("due-new", now - 1_000)
        jobs.schedule("due-leased", now - 9_000)
        jobs.schedule("pending-1", now + 60_000)
        jobs.schedule("pending-2", now + 120_000)
        jobs.schedule("gone", now + 60_000)
        jobs.schedule("sent", now - 20_000)
        leased = jobs.lease("x", None, 60_000)  # "sent", the earliest
        assert leased is not None and leased.run_id == "sent"
        assert jobs.mark_dispatched("sent", "x", "bot").recorded
        leased = jobs.lease("x", None, 60_000)
        assert leased is not None and leased.run_id == "due-leased"
        jobs.cancel("gone")
    with PgScheduleStore(dsn, schema=schema) as schedules:
        schedules.register("s-due", "interval", "1000", now - 7_000, now)
        schedules.register("s-later", "interval", "1000", now + 60_000, now)
    return now


def test_the_gauges_are_one_store_stats_call_per_scrape(
    pgstore_database: str, pgstore_schema: str, served: tuple[CollectorRegistry, str]
) -> None:
    registry, url = served
    now = _fill(pgstore_database, pgstore_schema)
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    reads: list[StoreStats] = []

    def read() -> StoreStats:
        reads.append(store.stats())
        return reads[-1]

    registry.register(StoreStatsCollector(read))
    assert reads == []  # registering reads nothing
    page = scrape(url)
    assert len(reads) == 1
    stats = reads[0]
    assert value(page, "pgstore_store_stats_up") == 1
    assert value(page, "pgstore_store_stats_read_seconds") > 0
    assert {state: value(page, "pgstore_jobs", state=state) for state in
            ("pending", "due", "leased", "dispatched", "cancelled")} == {
        "pending": 2, "due": 2, "leased": 1, "dispatched": 1, "cancelled": 1}
    assert value(page, "pgstore_schedules", state="due") == 1
    assert value(page, "pgstore_schedules", state="all") == 2
    # The oldest due job ("due-old", 5 s before now): its age at the reading's instant.
    assert value(page, "pgstore_oldest_due_job_age_seconds") == (stats.now - (now - 5_000)) / 1000
    assert 5 <= value(page, "pgstore_oldest_due_job_age_seconds") < 5 + WAIT
    assert 7 <= value(page, "pgstore_oldest_due_schedule_age_seconds") < 7 + WAIT
    scrape(url)
    scrape(url)
    assert len(reads) == 3
    store.close()


def test_a_failed_read_is_up_0_and_the_scrape_still_answers(
    pgstore_database: str, served: tuple[CollectorRegistry, str]
) -> None:
    registry, url = served
    store = PgJobStore(pgstore_database, schema="no_such_schema")
    registry.register(StoreStatsCollector(store.stats))
    page = scrape(url)
    assert value(page, "pgstore_store_stats_up") == 0
    assert not any(name == "pgstore_jobs" for name, _ in page)  # no stale numbers
    store.close()


def _wait(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_the_reader_reads_on_its_own_connection_and_keeps_a_stale_reading(
    pgstore_database: str, pgstore_schema: str, served: tuple[CollectorRegistry, str]
) -> None:
    """StoreStatsReader reads on a connection of its own (no store, no pool here), a
    scrape reads nothing, and a failed read keeps the last reading, marked stale."""
    registry, url = served
    _fill(pgstore_database, pgstore_schema)
    collector = StoreStatsCollector()
    registry.register(collector)
    reader = StoreStatsReader(pgstore_database, pgstore_schema, collector, interval=0.05)
    moved = f"{pgstore_schema}_away"
    try:
        reader.start()
        _wait("a reading", lambda: value(scrape(url), "pgstore_store_stats_up") == 1)
        page = scrape(url)
        assert value(page, "pgstore_store_stats_stale") == 0
        assert value(page, "pgstore_jobs", state="due") == 2
        assert 0 <= value(page, "pgstore_store_stats_age_seconds") < WAIT
        assert value(page, "pgstore_store_stats_last_success_timestamp_seconds") > 1.7e9
        with psycopg.connect(pgstore_database, autocommit=True) as conn:
            backends = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = %s", (READER_APPLICATION_NAME,)).fetchone()
            assert backends == (1,)  # the reader's one connection
            conn.execute(psycopg.sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                psycopg.sql.Identifier(pgstore_schema), psycopg.sql.Identifier(moved)))
        _wait("a failed read", lambda: value(scrape(url), "pgstore_store_stats_up") == 0)
        time.sleep(0.2)
        page = scrape(url)
        assert value(page, "pgstore_store_stats_stale") == 1
        assert value(page, "pgstore_jobs", state="due") == 2  # the last good reading
        assert value(page, "pgstore_store_stats_age_seconds") >= 0.2
    finally:
        with psycopg.connect(pgstore_database, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                            (moved,)).fetchone():
                conn.execute(psycopg.sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                    psycopg.sql.Identifier(moved), psycopg.sql.Identifier(pgstore_schema)))
    _wait("read again", lambda: value(scrape(url), "pgstore_store_stats_stale") == 0)
    reader.close()

    def readers() -> int:
        with psycopg.connect(pgstore_database, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = %s", (READER_APPLICATION_NAME,)).fetchone()
        assert row is not None
        return int(row[0])

    # Closed with the reader (a backend leaves pg_stat_activity a moment after its
    # client closes the connection).
    _wait("the reader's backend to end", lambda: readers() == 0)


def test_the_interval_mode_reads_an_asyncio_store_on_the_loop(
    pgstore_database: str, pgstore_schema: str, served: tuple[CollectorRegistry, str]
) -> None:
    registry, url = served
    _fill(pgstore_database, pgstore_schema)
    collector = StoreStatsCollector()
    registry.register(collector)
    assert value(scrape(url), "pgstore_store_stats_up") == 0  # no reading yet
    store = AsyncPgJobStore(pgstore_database, schema=pgstore_schema)
    reads = 0

    async def read() -> StoreStats:
        nonlocal reads
        reads += 1
        return await store.stats()

    async def main() -> None:
        poller = asyncio.ensure_future(poll_store_stats(collector, read, 0.05))
        await until("two reads", lambda: reads >= 2)
        page = await asyncio.to_thread(scrape, url)
        assert value(page, "pgstore_store_stats_up") == 1
        assert value(page, "pgstore_jobs", state="due") == 2
        before = reads
        await asyncio.to_thread(scrape, url)
        assert reads - before <= 2  # scrapes read nothing; only the interval does
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
        await store.close()

    asyncio.run(main())


def test_two_registries_are_independent() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    a, b = RuntimeMetrics(first), RuntimeMetrics(second)
    a(ev.Claim(runtime="dispatcher", owner="d", outcome="empty"))
    assert first.get_sample_value(
        "pgstore_claims_total", {"runtime": "dispatcher", "outcome": "empty"}) == 1
    assert second.get_sample_value(
        "pgstore_claims_total", {"runtime": "dispatcher", "outcome": "empty"}) is None
    assert b is not a
    with pytest.raises(ValueError, match="Duplicated"):
        RuntimeMetrics(first)  # one per registry
    a.unregister()
    again = RuntimeMetrics(first)  # the names are free again
    assert first.get_sample_value(
        "pgstore_claims_total", {"runtime": "dispatcher", "outcome": "empty"}) is None
    again(ev.Claim(runtime="dispatcher", owner="d", outcome="empty"))
    assert first.get_sample_value(
        "pgstore_claims_total", {"runtime": "dispatcher", "outcome": "empty"}) == 1


# --- pgstore run --metrics-port ------------------------------------------------------


def _create_marks(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL(
            "CREATE TABLE {}.cli_app_marks (kind text NOT NULL, key text NOT NULL,"
            " token bigint, owner text NOT NULL)").format(psycopg.sql.Identifier(schema)))


def test_pgstore_run_serves_the_metrics_page(
    pgstore_database: str, pgstore_schema: str, tmp_path: Path
) -> None:
    dsn, schema = pgstore_database, pgstore_schema
    _create_marks(dsn, schema)
    with PgJobStore(dsn, schema=schema) as jobs:
        now = jobs.now_ms()
        for run_id in ("meeting-a", "flaky-c", "cancel-d"):
            jobs.schedule(run_id, now - 1_000)
        jobs.schedule("later", now + 3_600_000)
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgstore", "run", "tests.support.cli_app:make_dispatcher",
             "tests.support.cli_app:scheduler",  # both, side by side in one process
             "--metrics-port", "0", "--metrics-addr", "127.0.0.1", "--store-gauges"],
            cwd=REPO, env=process_env(CLI_APP_DSN=dsn, CLI_APP_SCHEMA=schema),
            stderr=err, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        url = None
        page: Samples = {}
        while time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"metrics at (http://[\d.]+:\d+/metrics)", log_path.read_text())
            if found:
                url = found[1]
                page = scrape(url)
                if value(page, "pgstore_completes_total", runtime="dispatcher",
                         outcome="completed") == 2:
                    break
            time.sleep(0.1)
        assert url is not None, log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert value(page, "pgstore_completes_total", runtime="dispatcher", outcome="completed") == 2
    assert value(page, "pgstore_completes_total", runtime="dispatcher", outcome="cancelled") == 1
    assert value(page, "pgstore_releases_total", outcome="released") == 1
    assert value(page, "pgstore_claims_total", runtime="dispatcher", outcome="claimed") == 4
    assert value(page, "pgstore_dispatch_lateness_seconds_count", runtime="dispatcher") == 4
    assert value(page, "pgstore_store_stats_up") == 1
    assert value(page, "pgstore_jobs", state="pending") == 1  # "later", read at the scrape
    assert value(page, "pgstore_jobs", state="failed") == 0
    assert ("process_cpu_seconds_total", ()) in page  # the default registry's own
    # The scheduler ran in the same process, on the same page.
    assert value(page, "pgstore_claim_rounds_empty_total", runtime="scheduler") >= 0
    assert ("pgstore_claimed_total", (("runtime", "scheduler"),)) in page
    assert "running scheduler" in log_path.read_text()


def test_only_the_process_told_reads_the_store_gauges(
    pgstore_database: str, pgstore_schema: str, tmp_path: Path
) -> None:
    """Without --store-gauges, ``pgstore run`` serves its counters only (no store_stats()
    read); ``pgstore exporter`` serves the gauges only."""
    env = process_env(CLI_APP_DSN=pgstore_database, CLI_APP_SCHEMA=pgstore_schema)
    where = ["--dsn", pgstore_database, "--schema", pgstore_schema]
    for argv, gauges in (
        (["run", "tests.support.cli_app:make_dispatcher", "--metrics-port", "0"], False),
        (["exporter", *where, "--metrics-port", "0", "--stats-interval", "0.2"], True),
    ):
        log_path = tmp_path / f"{argv[0]}.log"
        with log_path.open("wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "pgstore", *argv], cwd=REPO,
                                    env=env, stderr=err, stdout=subprocess.DEVNULL)
        try:
            page: Samples = {}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                found = re.search(r"metrics at (http://[\d.]+:\d+/metrics)",
                                  log_path.read_text())
                if found:
                    page = scrape(found[1])
                    # The run: signalled as soon as its page answers, perhaps before
                    # its runtime started (a graceful stop all the same).
                    if not gauges or ("pgstore_jobs", (("state", "failed"),)) in page:
                        break
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0, log_path.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        names = {name for name, _ in page}
        assert page, log_path.read_text()
        assert ("pgstore_store_stats_up" in names) is gauges, names
        assert ("pgstore_jobs" in names) is gauges
        assert ("pgstore_claimed_total" in names) is not gauges
        if not gauges:  # a dispatcher's recalls exist at 0 before the first one
            for reason in ("cancelled", "taken", "unrecorded"):
                assert value(page, "pgstore_recalls_total", reason=reason, outcome="ok") == 0


@pytest.mark.parametrize("args", [
    ["--metrics-port", "-1"], ["--metrics-port", "65536"], ["--metrics-port", "http"],
    ["--metrics-port", "0", "--stats-interval", "0"],
    ["--metrics-port", "0", "--stats-interval", "nan"],
    ["--store-gauges"],  # without --metrics-port: nothing would serve them
])
def test_pgstore_run_metrics_usage_errors(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pgstore", "run", "tests.support.cli_app:scheduler", *args],
        cwd=REPO, env=process_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "usage:" in done.stderr


def test_a_job_that_fails_for_good_is_counted_and_shown_as_failed(
    pgstore_database: str, pgstore_schema: str, served: tuple[CollectorRegistry, str]
) -> None:
    registry, url = served
    metrics = RuntimeMetrics(registry)
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    registry.register(StoreStatsCollector(store.stats))
    store.schedule("doomed", store.now_ms() - 1, max_attempts=2)
    store.schedule("fine", store.now_ms() - 1)
    assert value(scrape(url), "pgstore_jobs_failed") == 0

    def dispatch(job: Job) -> str:
        if job.run_id == "doomed":
            raise ConnectionError("provider down")
        return "bot"

    d = Dispatcher(store, dispatch, holder="d1", poll_interval=0.02, listen=False,
                   backoff=Backoff(base_ms=1, max_ms=1, jitter=0))
    metrics.observe(d)

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await until("the job failed for good", lambda: value(
            scrape(url), "pgstore_releases_total", outcome="failed") == 1)
        d.stop()
        await task

    asyncio.run(main())
    page = scrape(url)
    store.close()
    assert value(page, "pgstore_releases_total", outcome="released") == 1  # attempt 1 of 2
    assert value(page, "pgstore_releases_total", outcome="failed") == 1
    assert value(page, "pgstore_jobs_failed") == 1
    assert value(page, "pgstore_jobs", state="failed") == 1  # the states add up to every job
    assert value(page, "pgstore_jobs", state="dispatched") == 1
    assert value(page, "pgstore_jobs", state="due") == 0  # a failed job is not due


def _dispatched(dsn: str, schema: str) -> dict[str, list[int]]:
    """The timed dispatcher's marks: run id -> how late each dispatch of it started (ms)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(psycopg.sql.SQL(
            "SELECT key, token FROM {}.cli_app_marks WHERE kind = 'dispatch'").format(
            psycopg.sql.Identifier(schema))).fetchall()
    found: dict[str, list[int]] = {}
    for key, token in rows:
        found.setdefault(key, []).append(token)
    return found


def _dispatch_round(dsn: str, schema: str, prefix: str, count: int) -> dict[str, list[int]]:
    """Schedule ``count`` jobs due 0.4 s apart from 0.5 s on; wait until each started."""
    with PgJobStore(dsn, schema=schema) as jobs:
        now = jobs.now_ms()
        ids = [f"{prefix}-{i}" for i in range(count)]
        for i, run_id in enumerate(ids):
            jobs.schedule(run_id, now + 500 + 400 * i)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        marks = _dispatched(dsn, schema)
        if all(run_id in marks for run_id in ids):
            time.sleep(1.5)  # the last dispatch's run, its renews and its mark
            return {run_id: _dispatched(dsn, schema)[run_id] for run_id in ids}
        time.sleep(0.1)
    raise AssertionError(f"not dispatched within 40 s: {_dispatched(dsn, schema)}")


#: The finished jobs under the flood test's dispatcher: a scan of them costs visibly
#: (about 0.1 s), and so did every scrape until the gauges were read on an interval.
HISTORY = 1_000_000


@pytest.mark.slow
def test_a_scrape_flood_delays_no_dispatch_and_costs_no_lease(
    pgstore_database: str, pgstore_schema: str, tmp_path: Path
) -> None:
    """32 scrapers hammering ``pgstore run --metrics-port`` of a Dispatcher over a million
    finished jobs: its dispatches start as late as without them (a bound from a
    baseline round in this test), no lease is lost and no job is dispatched twice.
    (Scrapes used to run store_stats(), which scanned the history, on the runtime's own
    pool: the dispatcher waited for connections, its keeper's renews came too late.)"""
    dsn, schema = pgstore_database, pgstore_schema
    _create_marks(dsn, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL(
            "INSERT INTO {}.jobs (run_id, dispatch_at, lease_holder, lease_until, worker_id,"
            " dispatched, cancelled, finished_at)"
            " SELECT 'old-' || g, g, 'h', g + 1000, 'w', true, g %% 100 = 0, g + 500"
            " FROM generate_series(1, %s) AS g").format(psycopg.sql.Identifier(schema)),
            (HISTORY,))
        conn.execute(psycopg.sql.SQL("ANALYZE {}.jobs").format(psycopg.sql.Identifier(schema)))
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgstore", "run", "tests.support.cli_app:make_timed_dispatcher",
             "--metrics-port", "0", "--store-gauges"],
            cwd=REPO, env=process_env(CLI_APP_DSN=dsn, CLI_APP_SCHEMA=schema),
            stderr=err, stdout=subprocess.DEVNULL)
    stop = threading.Event()
    scrapes = [0] * 32
    errors: list[BaseException] = []

    def scraper(i: int) -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(url, timeout=30) as response:
                    response.read()
                scrapes[i] += 1
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=scraper, args=(i,)) for i in range(32)]
    try:
        deadline = time.monotonic() + 30
        found = None
        while found is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"metrics at (http://([\d.]+):\d+/metrics)", log_path.read_text())
            time.sleep(0.05)
        assert found is not None, log_path.read_text()
        url, host = found[1], found[2]
        baseline = _dispatch_round(dsn, schema, "calm", 4)
        for t in threads:
            t.start()
        time.sleep(1.0)  # the flood is on
        flooded = _dispatch_round(dsn, schema, "flood", 4)
        stop.set()
        for t in threads:
            t.join()
        page = scrape(url)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    calm_late = max(late for lates in baseline.values() for late in lates)
    flood_late = max(late for lates in flooded.values() for late in lates)
    bound = 3 * calm_late + 250
    print(f"scrapes {sum(scrapes)}; latest dispatch start: calm {calm_late} ms, "
          f"flooded {flood_late} ms (bound {bound} ms)")
    assert not errors, errors[:3]
    assert sum(scrapes) >= 32 * 5  # the flood did hammer
    assert "lease lost" not in log, log
    assert value(page, "pgstore_leases_lost_total", runtime="dispatcher", reason="expired") == 0
    assert value(page, "pgstore_leases_lost_total", runtime="dispatcher", reason="refused") == 0
    assert all(len(lates) == 1 for lates in [*baseline.values(), *flooded.values()])  # one bot
    assert flood_late <= bound
    assert value(page, "pgstore_jobs", state="dispatched") >= HISTORY  # the gauges: read
    assert host == "127.0.0.1"  # this host only, unless --metrics-addr says otherwise


def test_pgstore_run_stops_serving_before_it_closes_the_store(
    pgstore_database: str, pgstore_schema: str, tmp_path: Path
) -> None:
    """Scrapes while ``pgstore run`` shuts down never meet the store's closed pool: the
    metrics server and the gauges' reader stop first (a scrape then finds no server)."""
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgstore", "run", "tests.support.cli_app:make_slow_closing_dispatcher",
             "--metrics-port", "0", "--store-gauges"],
            cwd=REPO, env=process_env(CLI_APP_DSN=pgstore_database,
                                      CLI_APP_SCHEMA=pgstore_schema),
            stderr=err, stdout=subprocess.DEVNULL)
    stop = threading.Event()
    answered = [0, 0]  # scrapes answered before the signal, after it

    def scraper(url: str) -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    response.read()
                answered[signalled.is_set()] += 1
            except OSError:
                time.sleep(0.01)  # no server (any more)

    signalled = threading.Event()
    try:
        deadline = time.monotonic() + 30
        found = None
        while found is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"metrics at (http://[\d.]+:\d+/metrics)", log_path.read_text())
            time.sleep(0.05)
        assert found is not None, log_path.read_text()
        threads = [threading.Thread(target=scraper, args=(found[1],)) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        signalled.set()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log_path.read_text()
        stop.set()
        for t in threads:
            t.join()
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    assert answered[0] > 0, log
    assert "PoolClosed" not in log, log
    assert "failed" not in log, log


def test_pgstore_run_help_says_where_and_how_often() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pgstore", "run", "--help"],
        cwd=REPO, env=process_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "default: 127.0.0.1, this host only" in text
    assert "--stats-interval SECONDS" in text and "(default: 15)" in text
    assert "never reaches the database" in text
