"""The job rules and the bad-input rules of docs/contract.md as a state machine: PgJobStore against MemoryJobStore, side by side.

Hypothesis draws random sequences of every job operation (schedule, lease,
renew, mark_dispatched, release, retry, cancel, get, list_dispatched,
list_failed, remove) with
explicit ``now`` values from a clock that mostly moves forward, and now and
then lands exactly on, or one millisecond either side of, a lease's end or a
job's due time (``lease_until == now`` is expired for lease and for renew).
Run ids are few and include code-point ordering cases ("A" < "a" < "ab" <
"b") and ties in ``dispatch_at``; holders are few, so calls collide. Bad
inputs (empty or NULL run_id and holder, 1025-character holder and worker_id,
non-positive ttl and max_attempts, a 4097-character error, NULL dispatch_at /
retry_at, ``now + ttl`` past bigint) are
drawn too. After every step both stores must have given the same answer (or
both raised ``InvalidArgument`` with the same SQLSTATE, naming the same
parameter, changing nothing) and hold the same jobs, column for column.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

from pgstore import InvalidArgument, Job, JobNotRemovable, MemoryJobStore, PgJobStore
from pgstore.testing import drop_schema, install_schema

pytestmark = pytest.mark.slow

# "A" < "a" < "ab" < "b" < "c" in code-point order: lease ties on dispatch_at and
# list_dispatched() must follow it in both stores.
RUN_IDS = st.sampled_from(["a", "b", "c", "A", "ab"])
# Exactly 1024 characters is a valid holder (docs/contract.md), drawn now and then; 1025 is not
# (see bad_input).
LONG_HOLDER = "h" * 1024
HOLDERS = st.sampled_from(["h1", "h2", "h3", "h1", "h2", LONG_HOLDER])
WORKERS = st.sampled_from([None, "bot-1", "bot-2", "w" * 1024])
TOO_LONG = "x" * 1025
# Mostly valid ttls, small ones often (a 1 ms lease ends on the next tick); now and
# then 0 or negative, which both stores must reject.
TTLS = st.integers(min_value=1, max_value=800) | st.sampled_from([1, 1, 2, 100, 0, -1])
STEPS = st.integers(min_value=0, max_value=400)
# Offsets from the clock for dispatch_at and retry_at; the sampled ones repeat, so
# jobs scheduled at one clock reading tie on dispatch_at.
OFFSETS = st.sampled_from([0, -10, -100, 50]) | st.integers(min_value=-300, max_value=600)
BIGINT_MAX = 2**63 - 1
# Small maxima, so jobs run out of attempts (and fail) within a run; None: the default.
MAX_ATTEMPTS = st.sampled_from([None, 1, 1, 2, 3])
ERRORS = st.sampled_from([None, "timeout", "", "é" * 4096])


class _Context:
    """Where the machine finds its PostgreSQL store (set by the module fixture)."""

    conn: psycopg.Connection[Any] | None = None
    schema: str = ""


@pytest.fixture(scope="module")
def pg_context(pgstore_database: str) -> Iterator[None]:
    schema = f"pgstore_jobstateful_{uuid.uuid4().hex[:12]}"
    install_schema(pgstore_database, schema)
    conn = psycopg.connect(pgstore_database, autocommit=True)
    _Context.conn, _Context.schema = conn, schema
    try:
        yield
    finally:
        _Context.conn = None
        conn.close()
        drop_schema(pgstore_database, schema)


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """The answer, or for a rejected call its SQLSTATE and the parameter it names."""
    try:
        return ("ok", call())
    except InvalidArgument as exc:
        return ("invalid", (exc.sqlstate, str(exc).split(" ", 1)[0]))
    except JobNotRemovable as exc:  # remove of a job that does not wait unleased
        return ("not_removable", (exc.sqlstate, str(exc)))


class JobMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        conn = _Context.conn
        assert conn is not None, "the pg_context fixture must run first"
        self.conn = conn
        conn.execute(sql.SQL("TRUNCATE {}.jobs").format(sql.Identifier(_Context.schema)))
        # The memory store starts with no fence: so does the table's mark.
        conn.execute(sql.SQL("UPDATE {}.job_fences SET lease_sequence = 0").format(
            sql.Identifier(_Context.schema)))
        self.pg = PgJobStore(conn, schema=_Context.schema)
        self.memory = MemoryJobStore()
        self.now = 1_000

    # -- helpers ---------------------------------------------------------------

    def both(self, name: str, *args: Any) -> tuple[str, Any]:
        """Call ``name`` on both stores; they must agree; return the answer. A rejected
        call must leave both stores as they were."""
        memory_before = self.memory.list_all()
        mem = _outcome(lambda: getattr(self.memory, name)(*args))
        # Read the table first only when the call should fail: it saves a round trip.
        pg_before = self.pg_jobs() if mem[0] != "ok" else None
        pg = _outcome(lambda: getattr(self.pg, name)(*args))
        assert pg == mem, f"{name}{args}: pg {pg!r} != memory {mem!r}"
        if mem[0] != "ok":
            what = mem[1][1] if mem[0] == "invalid" else "a job that does not wait unleased"
            event(f"{name} rejected: {what} ({mem[1][0]})")
            assert self.memory.list_all() == memory_before, f"memory {name}{args} changed state"
            assert self.pg_jobs() == pg_before, f"pg {name}{args} raised but changed the state"
        return mem

    def pg_jobs(self) -> list[Job]:
        """Every row of the jobs table, by run_id in code-point order."""
        rows = self.conn.execute(
            sql.SQL(
                "SELECT run_id, dispatch_at, lease_holder, lease_until, worker_id,"
                " dispatched, cancelled, lease_sequence, attempts, max_attempts, last_error,"
                ' failed FROM {}.jobs ORDER BY run_id COLLATE "C"'
            ).format(sql.Identifier(_Context.schema))
        ).fetchall()
        return [Job(*row) for row in rows]

    def state(self) -> tuple[list[Job], list[Job]]:
        """Both stores' whole state."""
        return self.memory.list_all(), self.pg_jobs()

    def lease_ends(self, run_id: str | None = None) -> list[int]:
        """Every lease's end (only ``run_id``'s, when it has a lease)."""
        jobs = self.memory.list_all()
        own = [j.lease_until for j in jobs if j.run_id == run_id and j.lease_until is not None]
        return own or sorted({j.lease_until for j in jobs if j.lease_until is not None})

    def due_times(self) -> list[int]:
        return sorted({job.dispatch_at for job in self.memory.list_all()})

    def draw_now(self, data: st.DataObject, run_id: str | None = None) -> int:
        """Mostly the clock; sometimes a little behind it (a slow caller); often on a
        lease's end (``run_id``'s own, if it has one) or a due time, or one ms off it."""
        how = data.draw(
            st.sampled_from(["clock", "clock", "lag", "lease end", "lease end", "due"]),
            label="now is",
        )
        edges = self.lease_ends(run_id) if how == "lease end" else self.due_times()
        if how in ("lease end", "due") and edges:
            edge = data.draw(st.sampled_from(edges), label=how)
            return edge + data.draw(st.sampled_from([0, 0, -1, 1]), label="off by")
        if how == "lag":
            return self.now - data.draw(st.sampled_from([1, 50]), label="lag")
        return self.now

    def draw_time(self, data: st.DataObject, label: str) -> int:
        return self.now + data.draw(OFFSETS, label=label)

    def draw_run_id(self, data: st.DataObject) -> str:
        """Often a job that has a lease holder (so renew, mark and release have
        something to act on), else any run id."""
        leased = [job.run_id for job in self.memory.list_all() if job.lease_holder is not None]
        if leased and data.draw(st.sampled_from([True, True, False]), label="a leased job"):
            return data.draw(st.sampled_from(leased), label="run_id")
        return data.draw(RUN_IDS, label="run_id")

    def holder_of(self, run_id: str) -> str | None:
        job = self.memory.get(run_id)
        return None if job is None else job.lease_holder

    def draw_holder(self, run_id: str, data: st.DataObject) -> str:
        """Usually the job's lease holder, when it has one (so calls succeed), else any."""
        current = self.holder_of(run_id)
        if current is not None and data.draw(
            st.sampled_from([True, True, False]), label="the job's holder"
        ):
            return current
        return data.draw(HOLDERS, label="holder")

    # -- rules -----------------------------------------------------------------

    @initialize()
    def empty_at_start(self) -> None:
        assert self.pg_jobs() == []

    @rule(step=STEPS)
    def tick(self, step: int) -> None:
        self.now += step

    @rule(data=st.data())
    def tick_to_edge(self, data: st.DataObject) -> None:
        """Move the clock onto a lease end or due time still ahead (or one ms off it)."""
        edges = self.lease_ends() + self.due_times()
        ahead = sorted({t for t in edges if t >= self.now})
        if ahead:
            edge = data.draw(st.sampled_from(ahead), label="edge")
            off = data.draw(st.sampled_from([0, 0, -1, 1]), label="off by")
            self.now = max(self.now, edge + off)

    @rule(run_id=RUN_IDS, max_attempts=MAX_ATTEMPTS, data=st.data())
    def schedule(self, run_id: str, max_attempts: int | None, data: st.DataObject) -> None:
        self.both("schedule", run_id, self.draw_time(data, "dispatch_at offset"), max_attempts)

    @rule(run_ids=st.lists(RUN_IDS, min_size=2, max_size=5, unique=True), data=st.data())
    def schedule_many_due(self, run_ids: list[str], data: st.DataObject) -> None:
        """Several jobs due at one instant (now or just before): lease then has ties on
        dispatch_at, broken by run_id in code-point order."""
        due = self.now - data.draw(st.sampled_from([0, 10, 100]), label="due ago")
        for run_id in run_ids:
            self.both("schedule", run_id, due, data.draw(MAX_ATTEMPTS, label="max_attempts"))

    @rule(holder=HOLDERS, ttl_ms=TTLS, data=st.data())
    def lease(self, holder: str, ttl_ms: int, data: st.DataObject) -> None:
        failed_before = set(self.failed_ids())
        kind, answer = self.both("lease", holder, self.draw_now(data), ttl_ms)
        if kind == "ok":
            event("lease got a job" if answer is not None else "lease got nothing")
            if set(self.failed_ids()) - failed_before:
                event("lease failed a job whose last lease expired")

    @rule(holder=HOLDERS, ttl_ms=st.integers(min_value=1, max_value=800), data=st.data())
    def lease_and_dispatch(self, holder: str, ttl_ms: int, data: st.DataObject) -> None:
        """A worker's happy path, so dispatched jobs are common: lease the next job, then
        record its dispatch."""
        kind, job = self.both("lease", holder, self.draw_now(data), ttl_ms)
        if kind == "ok" and job is not None:
            self.both("mark_dispatched", job.run_id, holder, data.draw(WORKERS, label="worker"))

    @rule(holder=HOLDERS, error=ERRORS, data=st.data())
    def lease_and_fail(self, holder: str, error: str | None, data: st.DataObject) -> None:
        """A worker whose dispatch raised, so jobs run out of attempts (and fail, and get
        retried) within a run: lease the next job, then release it with the error."""
        kind, job = self.both("lease", holder, self.draw_now(data), 500)
        if kind == "ok" and job is not None:
            retry_at = self.draw_time(data, "retry_at offset")
            self.both("release", job.run_id, holder, retry_at, job.lease_sequence, error)

    @precondition(lambda self: any(j.lease_until is not None for j in self.memory.list_all()))
    @rule(ttl_ms=TTLS, data=st.data())
    def at_a_lease_end(self, ttl_ms: int, data: st.DataObject) -> None:
        """At a lease's last instant (``lease_until == now``: expired), one ms before or
        one after: its holder renews and another worker leases, in either order."""
        leased = [j for j in self.memory.list_all() if j.lease_until is not None]
        job = data.draw(st.sampled_from(leased), label="leased job")
        assert job.lease_holder is not None and job.lease_until is not None
        now = job.lease_until + data.draw(st.sampled_from([0, 0, -1, 1]), label="off by")
        other = data.draw(HOLDERS, label="other holder")
        renew: tuple[Any, ...] = ("renew", job.run_id, job.lease_holder, now, ttl_ms)
        lease: tuple[Any, ...] = ("lease", other, now, ttl_ms)
        for call in data.draw(st.sampled_from([(renew, lease), (lease, renew)]), label="order"):
            self.both(*call)

    @rule(ttl_ms=TTLS, data=st.data())
    def renew(self, ttl_ms: int, data: st.DataObject) -> None:
        run_id = self.draw_run_id(data)
        holder = self.draw_holder(run_id, data)
        kind, answer = self.both("renew", run_id, holder, self.draw_now(data, run_id), ttl_ms)
        if kind == "ok":
            event(f"renew answered {answer}")

    @rule(worker_id=WORKERS, data=st.data())
    def mark_dispatched(self, worker_id: str | None, data: st.DataObject) -> None:
        run_id = self.draw_run_id(data)
        holder = self.draw_holder(run_id, data)
        kind, answer = self.both("mark_dispatched", run_id, holder, worker_id)
        if kind == "ok":
            event(f"mark_dispatched recorded={answer.recorded} cancelled={answer.cancelled}")

    @rule(error=ERRORS, data=st.data())
    def release(self, error: str | None, data: st.DataObject) -> None:
        run_id = self.draw_run_id(data)
        holder = self.draw_holder(run_id, data)
        retry_at = self.draw_time(data, "retry_at offset")
        kind, answer = self.both("release", run_id, holder, retry_at, None, error)
        job = self.memory.get(run_id)
        if kind == "ok" and answer and job is not None:
            event(f"release left the job {job.state}")

    def failed_ids(self) -> list[str]:
        return [j.run_id for j in self.memory.list_all() if j.state == "failed"]

    @rule(run_id=RUN_IDS, data=st.data())
    def retry(self, run_id: str, data: st.DataObject) -> None:
        kind, answer = self.both("retry", run_id, self.draw_time(data, "dispatch_at offset"))
        if kind == "ok":
            event(f"retry answered {answer}")

    @precondition(lambda self: bool(self.failed_ids()))
    @rule(data=st.data())
    def retry_a_failed_job(self, data: st.DataObject) -> None:
        run_id = data.draw(st.sampled_from(self.failed_ids()), label="failed run_id")
        kind, answer = self.both("retry", run_id, self.draw_time(data, "dispatch_at offset"))
        assert (kind, str(answer)) == ("ok", "retried")

    @rule(limit=st.sampled_from([None, 1, 2, 10]))
    def list_failed(self, limit: int | None) -> None:
        self.both("list_failed", limit)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        run_id = self.draw_run_id(data)
        event(f"cancel answered {self.both('cancel', run_id)[1]}")

    @rule(run_id=RUN_IDS)
    def get(self, run_id: str) -> None:
        self.both("get", run_id)

    @rule()
    def list_dispatched(self) -> None:
        self.both("list_dispatched")

    @rule(run_id=RUN_IDS)
    def remove(self, run_id: str) -> None:
        self.both("remove", run_id)

    # -- bad inputs: both raise InvalidArgument and change nothing ---------------

    @rule(data=st.data())
    def bad_input(self, data: st.DataObject) -> None:
        """One bad argument, the others good; the holder is often the job's own, so the
        call would otherwise succeed."""
        run_id = self.draw_run_id(data)
        holder = self.draw_holder(run_id, data)
        bad = data.draw(st.sampled_from(["", None, TOO_LONG]), label="bad name")
        now = self.now
        args: tuple[Any, ...] = data.draw(
            st.sampled_from(
                [
                    ("schedule", bad, now),
                    ("renew", bad, holder, now, 100),
                    ("mark_dispatched", bad, holder, "bot-1"),
                    ("release", bad, holder, now),
                    ("cancel", bad),
                    ("get", bad),
                    ("remove", bad),
                    ("lease", bad, now, 100),
                    ("renew", run_id, bad, now, 100),
                    ("mark_dispatched", run_id, bad, "bot-1"),
                    ("release", run_id, bad, now),
                    ("lease", holder, now, 0),
                    ("lease", holder, now, -5),
                    ("lease", holder, now, None),
                    ("renew", run_id, holder, now, 0),
                    ("renew", run_id, holder, now, -1),
                    ("lease", holder, BIGINT_MAX - 10, 100),  # lease end beyond bigint
                    ("renew", run_id, holder, BIGINT_MAX - 10, 100),
                    ("schedule", run_id, None),
                    ("release", run_id, holder, None),
                    ("release", run_id, holder, now, None, "e" * 4097),
                    ("schedule", run_id, now, 0),
                    ("schedule", run_id, now, -1),
                    ("retry", bad, now),
                    ("list_failed", 0),
                ]
            ),
            label="call",
        )
        assert self.both(*args)[0] == "invalid"

    @rule(worker_id=st.sampled_from([TOO_LONG, "w" * 2000]), data=st.data())
    def bad_worker_id(self, worker_id: str, data: st.DataObject) -> None:
        """A worker id over 1024 characters, mostly from the job's own holder: the call
        that would otherwise record the dispatch must record nothing."""
        run_id = self.draw_run_id(data)
        holder = self.draw_holder(run_id, data)
        assert self.both("mark_dispatched", run_id, holder, worker_id)[0] == "invalid"

    # -- same state after every step ---------------------------------------------

    @invariant()
    def same_state(self) -> None:
        memory, pg = self.state()
        assert pg == memory, f"state: pg {pg!r} != memory {memory!r}"


def test_pg_job_store_matches_memory_job_store(pg_context: None) -> None:
    # 100 examples, not the schedule machine's 40: with 40, bugs planted in a copy of
    # the memory store at the lease-expiry boundary, in tie order or on dispatched jobs
    # were found in only 3 to 7 runs out of 10; with 100, in 8 to 10 out of 10.
    run_state_machine_as_test(
        JobMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
