"""SIGTERM / SIGINT stop ``run()`` gracefully by default, in a real process.

tests/support/signal_app.py runs a Scheduler and a Dispatcher on one event loop; the test
waits until a scheduled run and a dispatch are both mid-way, sends the signal, and
checks from the database that both finished within the grace period and were
committed, and that the process exited 0 after both ``run()`` calls returned.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgstore import MemoryJobStore, PgJobStore, PgScheduleStore
from pgstore.runtime.dispatcher import Dispatcher

REPO = Path(__file__).resolve().parents[1]
WAIT = 30.0
RUN_ID = "meeting-sig"
BOTH_STARTED = {("run-started", "slow:1"), ("dispatch-started", RUN_ID)}
BOTH_FINISHED = {("run-finished", "slow:1"), ("dispatch-finished", RUN_ID)}


def _marks(dsn: str, schema: str) -> set[tuple[str, str]]:
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT kind, key FROM {}.signal_app_marks").format(sql.Identifier(schema))
        ).fetchall()
    return {(kind, key) for kind, key in rows}


class _App:
    """``python -m tests.support.signal_app MODE`` as a child process, its output in files."""

    def __init__(self, mode: str, dsn: str, schema: str, tmp_path: Path, hold: float) -> None:
        self.dsn, self.schema = dsn, schema
        self.out_path, self.err_path = tmp_path / "app.out", tmp_path / "app.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTORE_")}
        env.update(SIGNAL_APP_DSN=dsn, SIGNAL_APP_SCHEMA=schema, SIGNAL_APP_HOLD=str(hold))
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.signal_app", mode],
                cwd=REPO, env=env, stdout=out, stderr=err,
            )

    def output(self) -> str:
        return f"stdout:\n{self.out_path.read_text()}\nstderr:\n{self.err_path.read_text()}"

    def wait_for_marks(self, wanted: set[tuple[str, str]]) -> None:
        deadline = time.monotonic() + WAIT
        while not wanted <= _marks(self.dsn, self.schema):
            if self.proc.poll() is not None:
                pytest.fail(f"exited {self.proc.returncode} before {wanted}:\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {wanted} after {WAIT} s:\n{self.output()}")
            time.sleep(0.05)

    def signal_and_wait(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # its threads' stacks, to its stderr
            time.sleep(2.0)
            pytest.fail(f"still running {WAIT} s after {sig.name}:\n{self.output()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def app(pgstore_database: str, pgstore_schema: str, tmp_path: Path) -> Iterator[Callable[..., _App]]:
    """Starts the app on a fresh schema with job ``meeting-sig`` due; kills it afterwards."""
    dsn, schema = pgstore_database, pgstore_schema
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {}.signal_app_marks (kind text NOT NULL, key text NOT NULL)")
            .format(sql.Identifier(schema))
        )
    with PgJobStore(dsn, schema=schema) as jobs:
        jobs.schedule(RUN_ID, jobs.now_ms())
    started: list[_App] = []

    def start(mode: str, hold: float = 1.0) -> _App:
        started.append(_App(mode, dsn, schema, tmp_path, hold))
        return started[-1]

    yield start
    for each in started:
        each.kill()


def _committed(dsn: str, schema: str) -> None:
    """The one-shot run and the dispatch were both committed, nothing left leased."""
    with PgScheduleStore(dsn, schema=schema) as schedules:
        record = schedules.get("slow")
    assert record is not None
    assert (record.fencing_token, record.last_status) == (1, "ok")
    assert (record.lease_owner, record.lease_until, record.next_run_at) == (None, None, None)
    with PgJobStore(dsn, schema=schema) as jobs:
        job = jobs.get(RUN_ID)
    assert job is not None
    assert (job.dispatched, job.worker_id) == (True, f"bot-{RUN_ID}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_scheduler_and_a_dispatcher_gracefully_by_default(
    app: Callable[..., _App], pgstore_database: str, pgstore_schema: str, sig: signal.Signals
) -> None:
    proc = app("default")
    proc.wait_for_marks(BOTH_STARTED)  # both handlers are mid-run now
    status = proc.signal_and_wait(sig)
    assert status == 0, proc.output()
    assert proc.out_path.read_text() == "stopped\n", proc.output()  # nothing abandoned
    assert _marks(pgstore_database, pgstore_schema) >= BOTH_FINISHED
    _committed(pgstore_database, pgstore_schema)


def test_handle_signals_false_leaves_sigterm_alone(
    app: Callable[..., _App], pgstore_database: str, pgstore_schema: str
) -> None:
    proc = app("off", hold=120.0)
    proc.wait_for_marks(BOTH_STARTED)
    status = proc.signal_and_wait(signal.SIGTERM)
    assert status == -signal.SIGTERM, proc.output()  # the default action: killed
    assert proc.out_path.read_text() == ""
    with PgScheduleStore(pgstore_database, schema=pgstore_schema) as schedules:
        record = schedules.get("slow")
    assert record is not None and record.lease_owner is not None  # never completed


def test_an_application_sigterm_handler_is_left_in_place(
    app: Callable[..., _App], pgstore_database: str, pgstore_schema: str
) -> None:
    proc = app("own")
    proc.wait_for_marks(BOTH_STARTED)
    status = proc.signal_and_wait(signal.SIGTERM)
    assert status == 0, proc.output()
    assert proc.out_path.read_text() == "stopped\n", proc.output()
    marks = _marks(pgstore_database, pgstore_schema)
    assert ("own-handler", "SIGTERM") in marks  # the application's handler ran
    assert marks >= BOTH_FINISHED
    _committed(pgstore_database, pgstore_schema)


def test_outside_the_main_thread_the_default_takes_no_signal() -> None:
    """run() in another thread starts and stops without touching signal handlers."""
    dispatcher = Dispatcher(MemoryJobStore(), lambda job: None, poll_interval=0.05)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    errors: list[BaseException] = []

    def main() -> None:
        async def run_then_stop() -> None:
            runner = asyncio.ensure_future(dispatcher.run())
            await asyncio.sleep(0.1)
            dispatcher.stop()
            await runner

        try:
            asyncio.run(run_then_stop())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=main)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive() and errors == []
    assert {sig: signal.getsignal(sig) for sig in before} == before


def _waiting_on_a_lock(dsn: str) -> bool:
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'").fetchone()
    return row is not None and row[0] > 0


@pytest.mark.parametrize("trial", range(3))
def test_a_signal_while_a_runtime_starts_stops_them_all_gracefully(
    app: Callable[..., _App], pgstore_database: str, pgstore_schema: str, trial: int
) -> None:
    """SIGTERM while the scheduler is still starting (registering its task waits on a
    lock held on the schedules table), the dispatcher beside it perhaps claiming
    already: ``run()`` takes the signal at its first step, before its store starts, so
    both hear it; once the lock goes, the scheduler claims nothing, both ``run()``
    calls return and the process exits 0, nothing left held. (Before, the signal met
    Python's default, or only the dispatcher, which had taken it, stopped.)"""
    dsn, schema = pgstore_database, pgstore_schema
    with psycopg.connect(dsn) as locker:
        locker.execute(sql.SQL("LOCK TABLE {}.schedules IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(schema)))
        proc = app("default")
        deadline = time.monotonic() + WAIT
        while not _waiting_on_a_lock(dsn):
            if proc.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the scheduler never waited on the lock:\n{proc.output()}")
            time.sleep(0.01)
        proc.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # handled meanwhile, if it was taken
        locker.rollback()
    try:
        status = proc.proc.wait(timeout=WAIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {WAIT} s after SIGTERM:\n{proc.output()}")
    assert status == 0, proc.output()
    assert proc.out_path.read_text() == "stopped\n", proc.output()
    assert ("run-started", "slow:1") not in _marks(dsn, schema)  # never claimed
    with PgScheduleStore(dsn, schema=schema) as schedules:
        record = schedules.get("slow")
    assert record is not None and record.lease_owner is None
    with PgJobStore(dsn, schema=schema) as jobs:
        job = jobs.get(RUN_ID)
    assert job is not None and (job.lease_holder is None or job.dispatched)
