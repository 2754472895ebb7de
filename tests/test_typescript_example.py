"""examples/typescript: the TypeScript client driven from Node, next to a Python Dispatcher.

The Node program (the @pgstore/client package of clients/typescript, over node-postgres;
built first here) registers a schedule, claims it twice (the second
claim after the first lease ran out), completes with the stale and then the current
fencing token, and schedules a job due now. Everything is checked from the database,
and the job must be dispatched by a Python Dispatcher whose poll interval is far longer
than the test waits: only the LISTEN wake-up that ``job_schedule`` notifies can do it.

Skips, with one line saying which, when ``node`` or ``npm`` is missing or the npm
registry cannot be reached for the first install. ``npm ci`` runs only when
package-lock.json changed since the last install, and ``tsc`` only when the sources
did (a digest stamped in node_modules/ and dist/, both ignored by git).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pgstore import Dispatcher, PgJobStore, PgScheduleStore, migrate
from pgstore.models import Job
from tests.support.node import CLIENT, NodeProject, node_url

#: With tests/test_typescript_client.py: both install and build clients/typescript, which
#: two xdist workers must not do at once.
pytestmark = pytest.mark.xdist_group("node_projects")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "typescript"
BUILT = EXAMPLE / "dist" / ".pgstore-source-sha256"
#: Quotes and a space: the program must quote the schema, not splice it.
SCHEMA = 'ts "example" store'
#: Longer than anything the test waits: a dispatch within the test is the wake-up's.
POLL_INTERVAL = 600.0
WAIT = 60.0


def _digest(*paths: Path) -> str:
    sha = hashlib.sha256()
    for path in paths:
        sha.update(path.relative_to(EXAMPLE).as_posix().encode() + b"\0" + path.read_bytes())
    return sha.hexdigest()


def _build(project: NodeProject) -> None:
    """``tsc`` unless dist/ was built from exactly these sources and dependencies."""
    sources = sorted((EXAMPLE / "src").rglob("*.ts"))
    # The package's declarations are compiled into the example too.
    package = [p.relative_to(EXAMPLE.parent.parent) for p in sorted((CLIENT / "src").rglob("*.ts"))]
    digest = _digest(*sources, EXAMPLE / "tsconfig.json", EXAMPLE / "package-lock.json")
    digest = hashlib.sha256(
        digest.encode() + b"".join((EXAMPLE.parent.parent / p).read_bytes() for p in package)
    ).hexdigest()
    if BUILT.exists() and BUILT.read_text() == digest:
        return
    built = project.npm(["run", "--silent", "build"], timeout=300)
    assert built.returncode == 0, f"tsc failed:\n{built.stdout}{built.stderr}"
    BUILT.write_text(digest)


@pytest.fixture(scope="module")
def example() -> list[str]:
    """The argv that runs the built example (installed and compiled when they changed)."""
    client = NodeProject(CLIENT)  # the package the example depends on (file:), built first
    client.install()
    client.build(["run", "--silent", "build"], sources=["src"])
    project = NodeProject(EXAMPLE)
    project.install()  # npm ci unless node_modules holds exactly this package-lock.json
    _build(project)
    return [project.node_bin, str(EXAMPLE / "dist" / "main.js")]


class _Background:
    """A Dispatcher running in a thread of its own, idle in its poll wait once ready."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="dispatcher", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            runner = asyncio.ensure_future(self.dispatcher.run(handle_signals=False))
            while self.dispatcher._wakeups.wakeups is None:
                await asyncio.sleep(0.01)
            await asyncio.wait_for(self.dispatcher._wakeups.wakeups.listening.wait(), WAIT)
            await asyncio.sleep(0.3)  # past its first claim, idle in the poll wait
            self.ready.set()
            await runner

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the test, never lost in the thread
            self.error = exc
            self.ready.set()


@pytest.fixture
def dispatcher_in_background() -> Iterator[Callable[[Dispatcher], _Background]]:
    started: list[_Background] = []

    def start(dispatcher: Dispatcher) -> _Background:
        background = _Background(dispatcher)
        started.append(background)
        background.thread.start()
        assert background.ready.wait(WAIT), "the dispatcher never started listening"
        assert background.error is None, background.error
        return background

    yield start
    for background in started:
        background.dispatcher.stop()
        background.thread.join(WAIT)
        assert not background.thread.is_alive(), "the dispatcher did not stop"
        assert background.error is None, background.error
        store = background.dispatcher.store
        assert isinstance(store, PgJobStore), store  # what dispatcher_in_background is given
        store.close()


def test_typescript_example_against_the_store_and_a_python_dispatcher(
    example: list[str],
    pgstore_fresh_database: Callable[[], str],
    dispatcher_in_background: Callable[[Dispatcher], _Background],
) -> None:
    dsn = pgstore_fresh_database()
    migrate(dsn, SCHEMA, client_role=False)

    sent: list[Job] = []
    got = threading.Event()

    def dispatch(job: Job) -> str:
        sent.append(job)
        got.set()
        return f"bot-{job.run_id}"

    dispatcher = Dispatcher(PgJobStore(dsn, schema=SCHEMA), dispatch, poll_interval=POLL_INTERVAL, grace_period=5.0)
    dispatcher_in_background(dispatcher)

    env = {**os.environ, "PGSTORE_DSN": node_url(dsn), "PGSTORE_SCHEMA": SCHEMA}
    done = subprocess.run(
        example, env=env, capture_output=True, text=True, timeout=WAIT, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    steps = [json.loads(line) for line in done.stdout.splitlines()]
    assert [s["step"] for s in steps] == [
        "register", "claim", "claim", "complete", "complete", "bad_input", "job_schedule"
    ], done.stdout
    registered, claim_a, claim_b, stale, fresh, bad, scheduled = steps

    # Tokens as the Node side saw them: the second claim got the next one.
    assert registered["fencing_token"] == "0"
    assert (claim_a["owner"], claim_a["fencing_token"]) == ("node-a", "1")
    assert (claim_b["owner"], claim_b["fencing_token"]) == ("node-b", "2")
    assert (stale["fencing_token"], stale["completed"]) == ("1", False)
    assert (fresh["fencing_token"], fresh["completed"]) == ("2", True)
    assert bad["sqlstate"] == "22023" and "owner" in bad["message"]

    # The database agrees: completed by node-b's token, the bad claim changed nothing.
    with PgScheduleStore(dsn, schema=SCHEMA) as schedules:
        record = schedules.get(registered["id"])
    assert record is not None
    assert (record.kind, record.spec) == ("interval", "60000")
    assert record.fencing_token == 2
    assert (record.lease_owner, record.lease_until) == (None, None)
    assert record.last_status == "ok"
    assert record.last_run_at == int(claim_a["lease_until"])  # node-b ran when a's lease ended
    assert record.next_run_at == int(registered["next_run_at"]) + 60_000

    # The job scheduled from Node was dispatched by the Python Dispatcher, woken by NOTIFY.
    run_id = scheduled["run_id"]
    assert got.wait(WAIT), f"{run_id} was not dispatched within {WAIT} s"
    assert [job.run_id for job in sent] == [run_id]
    with PgJobStore(dsn, schema=SCHEMA) as jobs:
        deadline = time.monotonic() + WAIT  # mark_dispatched follows dispatch() returning
        while (job := jobs.get(run_id)) is not None and not job.dispatched:
            assert time.monotonic() < deadline, f"{run_id} was never marked dispatched"
            time.sleep(0.05)
    assert job is not None and job.dispatched, job
    assert job.dispatch_at == int(scheduled["dispatch_at"])
    assert (job.worker_id, job.lease_holder) == (f"bot-{run_id}", dispatcher.holder)
