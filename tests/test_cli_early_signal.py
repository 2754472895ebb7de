"""A signal in ``pgstore run``'s first moments is a graceful stop, never Python's default.

``pgstore run`` takes SIGTERM and SIGINT at the first line of its command, before the
app's module is imported (``pgstore.cli.app.StopSignals``): a signal before the
runtimes start keeps them from starting, one while they start (the store's first
calls, the scheduler's registrations) stops them as soon as they can hear it. Here a
process running a Scheduler and a Dispatcher side by side gets one signal at an early
moment, many trials each: as soon as the process catches SIGTERM (read from
``/proc/PID/status``), a random moment after that (the app's import), right after its
first log line, a random moment after that (the loop and the stores starting), and
after a runtime's first claim. Each time it exits with status 0 and leaves nothing
held that it took: no schedule leased by its scheduler, no job leased by its
dispatcher and not dispatched.
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgstore import PgJobStore, PgScheduleStore
from tests.support.cli_support import process_env

REPO = Path(__file__).resolve().parents[1]
TARGETS = ["tests.support.cli_app:scheduler", "tests.support.cli_app:make_dispatcher"]
TRIALS = 5
TIMEOUT = 30.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/PID/status")


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler of its own for ``sig`` (SigCgt)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except FileNotFoundError:
        pass
    return False


def _wait(proc: subprocess.Popen[bytes], what: str, log: Path, check: Any) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before {what}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {TIMEOUT}s:\n{log.read_text()}")
        time.sleep(0.001)


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines()


def _held(dsn: str, schema: str, pid: int) -> tuple[list[str], list[str]]:
    """What the process ``pid`` holds: schedules its scheduler leased, jobs its
    dispatcher leased and did not dispatch."""
    host = socket.gethostname()
    with PgScheduleStore(dsn, schema=schema) as schedules, PgJobStore(dsn, schema=schema) as jobs:
        leased = [r.id for r in schedules.list() if r.lease_owner == f"scheduler@{host}:{pid}"]
        page = jobs.list_jobs("all")
        undispatched = [j.run_id for j in page.jobs
                        if j.lease_holder == f"dispatcher@{host}:{pid}" and not j.dispatched]
    return leased, undispatched


@pytest.fixture
def app_schema(pgstore_database: str, pgstore_schema: str) -> str:
    conn: psycopg.Connection[Any]
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL(
            "CREATE TABLE {}.cli_app_marks (kind text NOT NULL, key text NOT NULL,"
            " token bigint, owner text NOT NULL)").format(psycopg.sql.Identifier(pgstore_schema)))
    return pgstore_schema


MOMENTS = ["caught", "caught+random", "first-line", "first-line+random", "first-claim"]


def _signal_at(proc: subprocess.Popen[bytes], log: Path, sig: signal.Signals, moment: str,
               rng: random.Random) -> None:
    """Wait for ``moment`` in ``proc``'s life, then send it ``sig``."""
    if moment.startswith("caught"):
        # SIGTERM caught: the command's own handlers are in (SIGINT's first, so this
        # says both; Python catches SIGINT from its start, KeyboardInterrupt).
        _wait(proc, "SIGTERM caught", log, lambda: _catches(proc.pid, signal.SIGTERM))
        if moment == "caught+random":
            time.sleep(rng.uniform(0, 0.15))
    elif moment.startswith("first-line"):
        _wait(proc, "a first log line", log, lambda: _lines(log) != [])
        if moment == "first-line+random":
            time.sleep(rng.uniform(0, 0.3))
    elif moment == "first-claim":
        _wait(proc, "a claim", log, lambda: any(
            ": claimed " in line or ": leased " in line for line in _lines(log)))
    proc.send_signal(sig)


@pytest.mark.parametrize(("sig", "moment"), [
    *((signal.SIGTERM, moment) for moment in MOMENTS),
    (signal.SIGINT, "caught"), (signal.SIGINT, "first-line+random"),
])
def test_a_signal_in_the_first_moments_stops_pgstore_run_gracefully(
    pgstore_database: str, app_schema: str, tmp_path: Path, sig: signal.Signals, moment: str,
) -> None:
    dsn, schema = pgstore_database, app_schema
    env = process_env(CLI_APP_DSN=dsn, CLI_APP_SCHEMA=schema)
    rng = random.Random(f"{sig.name}-{moment}")
    seen: list[str] = []
    for trial in range(TRIALS):
        with PgJobStore(dsn, schema=schema) as jobs:
            now = jobs.now_ms()
            for i in range(3):
                jobs.schedule(f"{moment}-{sig.name}-{trial}-{i}", now)
        log = tmp_path / f"run-{trial}.log"
        with log.open("wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "pgstore", "run", *TARGETS],
                                    cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            _signal_at(proc, log, sig, moment, rng)
            try:
                status = proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {TIMEOUT}s after {sig.name}:\n{log.read_text()}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = log.read_text()
        assert status == 0, f"trial {trial}: exit {status}\n{text}"
        assert "pgstore: " not in text, text  # no error, no "interrupted"
        assert text.splitlines()[-1].endswith(" INFO pgstore.run: stopped"), text
        assert _held(dsn, schema, proc.pid) == ([], []), f"trial {trial}\n{text}"
        seen.append("started" if "pgstore.run: running " in text else "not started")
    print(f"\n{sig.name} at {moment}: {seen}")
