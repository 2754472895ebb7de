"""``python -m tests.support.console_shots [--dsn DSN] [--out docs/console]``: the PNGs of
docs/console.md.

Fills a throwaway schema (``console_shots``, dropped at the end) with an hour of a
small dispatcher fleet's work, serves the console on it in this process, and saves a
screenshot of each page from the system's headless chromium (``tests/support/web.py``),
plus the failed jobs as the read-only monitoring role sees them. The database:
``--dsn``, else ``PGSTORE_DSN``, else the machine's PostgreSQL 15 on 127.0.0.1:5432.

Everything is written through the store's functions but one thing: the chart needs an
hour of history, and a dispatch's ``finished_at`` is the database clock at its mark,
so the script moves the dispatched jobs' ``dispatch_at`` and ``finished_at`` back into
the last hour with an owner's ``UPDATE`` of the table (the console itself never writes
a table, nor reads one).
"""

from __future__ import annotations

import argparse
import os
import random
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgstore import CompletePatch, PgJobStore, PgScheduleStore
from pgstore.postgres.grants import MONITOR_FUNCTIONS
from pgstore.schema.migrations import migrate
from tests.support.web import chromium, console

SCHEMA = "console_shots"
DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
PAGES = [
    ("overview", "/"),
    ("jobs", "/jobs?state=waiting&limit=30"),
    ("failed", "/failed"),
    ("leases", "/leases"),
    ("queues", "/queues"),
    ("schedules", "/schedules"),
    ("workers", "/workers"),
]
ERRORS = [
    "provider 503: no bot available in region eu-west",
    "provider 409: meeting has not started; the host is not in the room",
    "timeout after 30 s waiting for the provider's join confirmation",
]


def fill(dsn: str) -> None:
    """An hour of three dispatchers' work, some leases in flight, failures, schedules."""
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    migrate(dsn, SCHEMA, client_role=False)
    with PgJobStore(dsn, schema=SCHEMA) as jobs, PgScheduleStore(dsn, schema=SCHEMA) as sched:
        now = jobs.now_ms()
        # an hour of meetings, dispatched as they fell due
        history = [f"meeting-{n:04d}" for n in range(260)]
        jobs.schedule_many(history, [now - 10_000] * len(history))
        holders = [f"dispatcher-{h}@host-{h}" for h in "abc"]
        for i in range(len(history)):
            holder = holders[i % 3]
            job = jobs.lease(holder, None, 30_000)
            assert job is not None
            jobs.mark_dispatched(job.run_id, holder, f"bot-{rng.randrange(1000):03d}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            table = sql.Identifier(SCHEMA, "jobs")
            for run_id in history:
                due = now - rng.randrange(60_000, 3_600_000)
                late = int(rng.lognormvariate(6.5, 0.9))  # mostly well under a second
                if rng.random() < 0.04:
                    late += rng.randrange(5_000, 40_000)  # a slow provider now and then
                conn.execute(
                    sql.SQL("UPDATE {} SET dispatch_at = %s, finished_at = %s, lease_until = %s"
                            " WHERE run_id = %s").format(table),
                    (due, due + late, due + late + 30_000, run_id),
                )
        # a cancel that came during a dispatch (recalled), and one before (cancelled)
        jobs.schedule("meeting-standup-0900", now - 2000)
        job = jobs.lease(holders[0], None, 30_000)
        assert job is not None
        jobs.cancel(job.run_id)
        jobs.mark_dispatched(job.run_id, holders[0], "bot-417")
        jobs.schedule("meeting-offsite-planning", now + 86_400_000)
        jobs.cancel("meeting-offsite-planning")
        # failed: out of attempts
        for n, error in enumerate(ERRORS):
            run_id = f"meeting-retro-{n + 1}"
            jobs.schedule(run_id, now - 600_000 - n, max_attempts=3)
            for attempt in range(3):
                got = jobs.lease(holders[attempt], None, 30_000)
                assert got is not None and got.run_id == run_id
                jobs.release(run_id, holders[attempt], now - 600_000 - n, error=error)
        # in flight: leased now, one expired, due and pending
        for n in range(5):
            jobs.schedule(f"meeting-live-{n}", now - 3000 + n * 100)
        for n in range(4):
            jobs.lease(holders[n % 3], None, 20_000 + 10_000 * n)
        jobs.lease("dispatcher-d@host-d", None, 1)  # its lease runs out at once
        for n in range(6):
            jobs.schedule(f"meeting-{'abcdef'[n]}-{uuid.UUID(int=rng.getrandbits(128))}",
                          now + 300_000 * (n + 1))
        # queues: a provider's queue paused through its outage, another waiting
        for n in range(4):
            jobs.schedule(f"meeting-zoom-{n}", now - 90_000 + n * 20_000, queue="provider-zoom",
                          priority=5, payload={"meeting": n})
        for n in range(3):
            jobs.schedule(f"meeting-teams-{n}", now + 600_000 * (n + 1), queue="provider-teams")
        jobs.pause_queue("provider-zoom")
        # schedules
        sched.register("nightly-report", "cron", "TZ=Europe/Berlin 30 2 * * *", now + 20_000_000)
        sched.register("invoices", "cron", "0 * * * *", now + 1_500_000)
        sched.register("heartbeat", "interval", "5000", now - 200)
        claim = sched.claim_due("heartbeat", "scheduler-2@host-b", None, 15_000)
        assert claim is not None
        sched.register("sync-calendars", "interval", "60000", now - 1000)
        claim = sched.claim_due("sync-calendars", "scheduler-1@host-a", None, 30_000)
        assert claim is not None
        sched.complete("sync-calendars", claim.fencing_token,
                       CompletePatch(now + 59_000, now - 1000, "error"))
        sched.register("welcome-mail", "once", "0", now - 5000)
        claim = sched.claim_due("welcome-mail", "scheduler-1@host-a", None, 30_000)
        assert claim is not None
        sched.complete("welcome-mail", claim.fencing_token,
                       CompletePatch(None, now - 4000, "ok"))


def _shoot(browser: Any, url: str, path: Path) -> None:
    """The whole page (at most 2400 px tall) at 1400 px wide."""
    metrics = {"width": 1400, "height": 800, "deviceScaleFactor": 1, "mobile": False}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    browser.get(url)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    metrics["height"] = min(max(600, height), 2400)
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    browser.save_screenshot(str(path))
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.console_shots")
    parser.add_argument("--dsn", default=os.environ.get("PGSTORE_DSN") or DEFAULT_DSN)
    parser.add_argument("--out", type=Path, default=Path("docs/console"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    fill(args.dsn)
    monitor = f"pgstore_shots_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(monitor)))
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(SCHEMA), sql.Identifier(monitor)))
        for f in MONITOR_FUNCTIONS:
            admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {}.{}({}) TO {}").format(
                sql.Identifier(SCHEMA), sql.Identifier(f.name),
                sql.SQL(", ").join(sql.SQL(t) for t in f.arg_types), sql.Identifier(monitor)))
    try:
        with chromium() as browser:
            with console(args.dsn, SCHEMA) as server:
                for name, page in PAGES:
                    _shoot(browser, server.url + page, args.out / f"{name}.png")
            with console(make_conninfo(args.dsn, user=monitor), SCHEMA) as server:
                _shoot(browser, server.url + "/failed", args.out / "failed-read-only.png")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(SCHEMA)))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(monitor)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(monitor)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
