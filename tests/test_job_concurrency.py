"""The job rules (docs/contract.md) under real concurrency: parallel connections racing the job functions.

What it proves, against a real server:

* ``job_lease`` by 8 concurrent leasers hands out each of 2,000 due jobs exactly
  once, in lease order per leaser, never a not-due, cancelled or dispatched job,
  and its empty answers are not early: once every leaser has stopped, nothing
  leasable is left.
* ``job_cancel`` racing ``job_mark_dispatched`` on a leased job: in every trial
  exactly one side learns of the other (cancel answers ``already_dispatched``, or
  mark answers ``cancelled = true``), and the stored row agrees.
* ``job_renew`` racing another holder's ``job_lease`` at one explicit ``now``:
  exactly one of them wins, and which one is decided by ``now`` against
  ``lease_until`` alone, never by the order the calls reach the server.
* ``job_retry`` of one failed job by 4 connections at once, racing 4 leasers:
  exactly one retry answers ``retried`` (the others ``not_failed``), at most one
  leaser gets the job, and only after that retry, with ``attempts`` 1.

* Across three queues at three priorities, with jobs of a higher priority not due
  yet, 8 concurrent leasers (``job_lease``, and ``job_lease_many`` of 7) hand out
  every due job exactly once, each in lease order (priority, dispatch_at, run_id),
  and stop only when nothing leasable is left; three trials each.

Every worker owns its own autocommit psycopg connection (wrapped in a
``PgJobStore``); a ``threading.Barrier`` releases them together so the calls
really overlap on the server. Workers run in a ``ThreadPoolExecutor`` and their
results are read with ``Future.result()``, so an exception in any worker fails
the test instead of passing as a lost race.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgstore import CancelResult, Job, MarkResult, PgJobStore

pytestmark = pytest.mark.slow

BARRIER_TIMEOUT = 30.0
LEASE = 600_000


@pytest.fixture
def connections(pgstore_database: str) -> Iterator[list[psycopg.Connection[Any]]]:
    conns: list[psycopg.Connection[Any]] = []
    try:
        for _ in range(9):
            conns.append(psycopg.connect(pgstore_database, autocommit=True))
        yield conns
    finally:
        for conn in conns:
            conn.close()


def _all_jobs(conn: psycopg.Connection[Any], schema: str) -> dict[str, Job]:
    """Every row of the jobs table, read directly (not through the functions under test)."""
    rows = conn.execute(
        sql.SQL(
            "SELECT run_id, dispatch_at, lease_holder, lease_until, worker_id,"
            " dispatched, cancelled FROM {}.jobs"
        ).format(sql.Identifier(schema))
    ).fetchall()
    return {row[0]: Job(*row) for row in rows}


def test_lease_workers_lease_every_job_exactly_once(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    workers = 8
    jobs = 2_000
    now = 100_000
    stores = [PgJobStore(conn, schema=pgstore_schema) for conn in connections[:workers]]
    setup = stores[0]

    # Never leasable at `now`: a dispatched job, a cancelled one, one not yet due.
    setup.schedule("done", 0)
    leased = setup.lease("setup", 0, 1)
    assert leased is not None and leased.run_id == "done"
    assert setup.mark_dispatched("done", "setup", "w-setup") == MarkResult(False, True)
    setup.schedule("gone", 1)
    assert setup.cancel("gone") is CancelResult.CANCELLED
    setup.schedule("future", now + 1)

    # dispatch_at spread with many ties and out of run_id order, so both lease
    # order keys (dispatch_at, then run_id) matter.
    dispatch_at = {f"j{n:04d}": (n * 7_919) % 499 for n in range(jobs)}
    with connections[-1].transaction():
        loader = PgJobStore(connections[-1], schema=pgstore_schema)
        for run_id, at in dispatch_at.items():
            loader.schedule(run_id, at)

    barrier = threading.Barrier(workers, timeout=BARRIER_TIMEOUT)
    lock = threading.Lock()
    leased_so_far = [0]
    # How many leases had been counted when each leaser got its empty answer.
    counted_at_empty: list[int] = [-1] * workers

    def work(i: int) -> list[Job]:
        got: list[Job] = []
        barrier.wait()
        while (job := stores[i].lease(f"w{i}", now, LEASE)) is not None:
            got.append(job)
            with lock:
                leased_so_far[0] += 1
        with lock:
            counted_at_empty[i] = leased_so_far[0]
        return got

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(work, i) for i in range(workers)]
        per_worker = [f.result(timeout=300) for f in futures]

    # An empty answer may only mean that the jobs still leasable are locked by
    # in-flight leases, at most one per other leaser; each of those is leased by
    # its locker, so when an empty answer comes, at most workers - 1 jobs are not
    # yet counted. A leaser told "nothing" while unlocked jobs were due breaks this.
    for i, counted in enumerate(counted_at_empty):
        assert jobs - counted <= workers - 1, f"w{i} got an empty answer with {counted} leased"

    for i, got in enumerate(per_worker):
        for job in got:
            assert job.run_id in dispatch_at, f"w{i} leased {job.run_id}"
            assert job == Job(
                run_id=job.run_id,
                dispatch_at=dispatch_at[job.run_id],
                lease_holder=f"w{i}",
                lease_until=now + LEASE,
                worker_id=None,
                dispatched=False,
                cancelled=False,
                lease_sequence=1,
                attempts=1,
            )
        # A row skipped because another leaser had it locked is leased by that
        # leaser, so no leaser can later be handed an earlier job.
        keys = [(job.dispatch_at, job.run_id) for job in got]
        assert keys == sorted(keys), f"w{i} leased out of order"
        assert len(set(keys)) == len(keys)
    run_ids = [job.run_id for got in per_worker for job in got]
    assert len(run_ids) == len(set(run_ids)), "a job was leased twice"
    assert set(run_ids) == set(dispatch_at)
    assert sum(1 for got in per_worker if got) >= 2  # the work really was shared

    # The empty answers were not early: nothing leasable is left.
    assert setup.lease("late", now, LEASE) is None
    state = _all_jobs(connections[-1], pgstore_schema)
    holder = {job.run_id: f"w{i}" for i, got in enumerate(per_worker) for job in got}
    for run_id in dispatch_at:
        row = state[run_id]
        assert (row.lease_holder, row.lease_until) == (holder[run_id], now + LEASE), run_id
        assert not row.dispatched and not row.cancelled and row.worker_id is None
    unleased_due = [
        r.run_id
        for r in state.values()
        if r.dispatch_at <= now
        and not r.dispatched
        and not r.cancelled
        and (r.lease_until is None or r.lease_until <= now)
    ]
    assert unleased_due == []
    assert state["done"] == Job("done", 0, "setup", 1, "w-setup", True, False)
    assert state["gone"] == Job("gone", 1, None, None, None, False, True)
    assert state["future"] == Job("future", now + 1, None, None, None, False, False)
    assert len(state) == jobs + 3


def test_cancel_racing_mark_dispatched_one_side_always_learns(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    trials = 500
    now = 1_000_000
    holder = "dispatcher"
    setup, canceller, marker = (PgJobStore(conn, schema=pgstore_schema) for conn in connections[:3])
    barrier = threading.Barrier(2, timeout=BARRIER_TIMEOUT)

    def cancel(run_id: str) -> CancelResult:
        barrier.wait()
        return canceller.cancel(run_id)

    def mark(run_id: str) -> MarkResult:
        barrier.wait()
        return marker.mark_dispatched(run_id, holder, "worker-x")

    outcomes: Counter[str] = Counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        for trial in range(trials):
            run_id = f"t{trial:03d}"
            setup.schedule(run_id, trial)
            # Every earlier trial's job is dispatched, so this one is the only leasable job.
            leased = setup.lease(holder, now, LEASE)
            assert leased is not None and leased.run_id == run_id, f"trial {trial}"
            if trial % 2:
                cancel_f, mark_f = pool.submit(cancel, run_id), pool.submit(mark, run_id)
            else:
                mark_f, cancel_f = pool.submit(mark, run_id), pool.submit(cancel, run_id)
            cancelled = cancel_f.result(timeout=BARRIER_TIMEOUT * 2)
            marked = mark_f.result(timeout=BARRIER_TIMEOUT * 2)

            assert cancelled in (CancelResult.CANCELLED, CancelResult.ALREADY_DISPATCHED)
            assert marked.recorded is True, f"trial {trial}: {marked}"
            # Exactly one side learns of the other: cancel saw the dispatch, or mark
            # saw the cancel (both is impossible: one of them ran first).
            assert (cancelled is CancelResult.ALREADY_DISPATCHED) != marked.cancelled, (
                f"trial {trial}: cancel={cancelled} mark={marked}"
            )
            assert setup.get(run_id) == Job(
                run_id=run_id,
                dispatch_at=trial,
                lease_holder=holder,
                lease_until=now + LEASE,
                worker_id="worker-x",
                dispatched=True,
                cancelled=cancelled is CancelResult.CANCELLED,
                lease_sequence=1,
                attempts=1,
            ), f"trial {trial}"
            outcomes[
                "cancel first (mark.cancelled)"
                if marked.cancelled
                else "mark first (already_dispatched)"
            ] += 1

    print(f"\ncancel vs mark_dispatched over {trials} trials: {dict(outcomes)}")
    if len(outcomes) < 2:
        print("note: only one interleaving occurred; the other was not exercised")
    assert sum(outcomes.values()) == trials


def test_renew_racing_another_holders_lease_is_decided_by_now(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    trials = 200
    ttl = 100
    leased_at = 10_000
    until = leased_at + ttl
    setup, renewer, taker = (PgJobStore(conn, schema=pgstore_schema) for conn in connections[:3])
    barrier = threading.Barrier(2, timeout=BARRIER_TIMEOUT)

    def renew(run_id: str, now: int) -> bool:
        barrier.wait()
        return renewer.renew(run_id, "h1", now, ttl)

    def take(now: int) -> Job | None:
        barrier.wait()
        return taker.lease("h2", now, ttl)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for trial in range(trials):
            run_id = f"r{trial:03d}"
            setup.schedule(run_id, 0)
            first = setup.lease("h1", leased_at, ttl)
            assert first is not None and first.run_id == run_id, f"trial {trial}"
            # Even trials race at the expiry instant (lease_until <= now: expired),
            # odd ones one ms before it (lease_until > now: live).
            expired = trial % 2 == 0
            now = until if expired else until - 1
            if trial % 4 < 2:
                renew_f, take_f = pool.submit(renew, run_id, now), pool.submit(take, now)
            else:
                take_f, renew_f = pool.submit(take, now), pool.submit(renew, run_id, now)
            renewed = renew_f.result(timeout=BARRIER_TIMEOUT * 2)
            taken = take_f.result(timeout=BARRIER_TIMEOUT * 2)

            assert renewed != (taken is not None), f"trial {trial}: {renewed=} {taken=}"
            row = setup.get(run_id)
            assert row is not None
            if expired:
                assert not renewed, f"trial {trial}: renewed an expired lease"
                assert taken == Job(run_id, 0, "h2", now + ttl, None, False, False, 2, 2)
                assert row == taken, f"trial {trial}"
            else:
                assert renewed, f"trial {trial}: a live lease was not renewed"
                assert taken is None, f"trial {trial}: took a live lease: {taken}"
                assert row == Job(run_id, 0, "h1", now + ttl, None, False, False, 1, 1)
            # So later trials lease only their own job (a leased job is the owner's
            # to delete: job_remove refuses it).
            connections[0].execute(
                sql.SQL("DELETE FROM {}.jobs WHERE run_id = %s").format(
                    sql.Identifier(pgstore_schema)), (run_id,))


def test_concurrent_retries_revive_a_failed_job_once_and_leases_follow_them(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    trials = 100
    setup = PgJobStore(connections[8], schema=pgstore_schema)
    retriers = [PgJobStore(conn, schema=pgstore_schema) for conn in connections[:4]]
    leasers = [PgJobStore(conn, schema=pgstore_schema) for conn in connections[4:8]]
    barrier = threading.Barrier(8, timeout=BARRIER_TIMEOUT)

    def retry(store: PgJobStore, run_id: str) -> str:
        barrier.wait()
        return store.retry(run_id, 500).value

    def lease(store: PgJobStore, n: int) -> Job | None:
        barrier.wait()
        return store.lease(f"leaser-{n}", 1_000, LEASE)

    outcomes: Counter[str] = Counter()
    with ThreadPoolExecutor(max_workers=8) as pool:
        for trial in range(trials):
            run_id = f"f{trial:03d}"
            setup.schedule(run_id, 0, 1)
            first = setup.lease("setup", 0, 1)
            assert first is not None and first.run_id == run_id, f"trial {trial}"
            assert setup.release(run_id, "setup", 0, first.lease_sequence, "down")
            assert present_job(setup, run_id).state == "failed"
            retries = [pool.submit(retry, store, run_id) for store in retriers]
            leases = [pool.submit(lease, store, n) for n, store in enumerate(leasers)]
            answers = Counter(f.result(timeout=BARRIER_TIMEOUT * 2) for f in retries)
            got = [job for f in leases if (job := f.result(timeout=BARRIER_TIMEOUT * 2))]

            assert answers == {"retried": 1, "not_failed": 3}, f"trial {trial}: {answers}"
            assert len(got) <= 1, f"trial {trial}: {got}"
            row = present_job(setup, run_id)
            assert (row.failed, row.last_error, row.max_attempts) == (False, "down", 1)
            if got:
                assert (got[0].run_id, got[0].attempts, got[0].dispatch_at) == (run_id, 1, 500)
                assert (row.lease_holder, row.attempts) == (got[0].lease_holder, 1)
                outcomes["retry, then a lease"] += 1
            else:
                assert (row.lease_holder, row.attempts, row.dispatch_at) == (None, 0, 500)
                outcomes["the leases first (nothing leasable)"] += 1
            # Gone before the next trial (a leased job is the owner's to delete).
            connections[8].execute(
                sql.SQL("DELETE FROM {}.jobs WHERE run_id = %s").format(
                    sql.Identifier(pgstore_schema)), (run_id,))

    print(f"\nretry x4 vs lease x4 over {trials} trials: {dict(outcomes)}")
    assert sum(outcomes.values()) == trials


def present_job(store: PgJobStore, run_id: str) -> Job:
    job = store.get(run_id)
    assert job is not None
    return job



@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("trial", range(3))
def test_leasers_across_queues_and_priorities_lease_every_job_once_in_order(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str, batch: int, trial: int
) -> None:
    """Three queues at three priorities (several groups: the merged path), and jobs of the
    highest priority not due yet: 8 leasers, each ``lease`` (batch 1) or ``lease_many``
    (batch 7), hand out every due job exactly once, each leaser in lease order
    (priority, then dispatch_at, then run_id), never a future job, and stop only when
    nothing leasable is left (at most what the others hold locked in flight)."""
    workers = 8
    now = 100_000
    stores = [PgJobStore(conn, schema=pgstore_schema) for conn in connections[:workers]]
    due: dict[str, tuple[int, int]] = {}
    with connections[-1].transaction():
        loader = PgJobStore(connections[-1], schema=pgstore_schema)
        for n in range(900):
            queue, priority = f"q{n % 3}", (n * 7 + trial) % 3
            at = (n * 7_919 + trial) % 97
            loader.schedule(f"j{n:04d}", at, queue=queue, priority=priority)
            due[f"j{n:04d}"] = (priority, at)
        for n in range(200):  # ahead in priority, not due: never leased, never in the way
            loader.schedule(f"f{n:04d}", now + 1 + n, queue=f"q{n % 3}", priority=9)

    barrier = threading.Barrier(workers, timeout=BARRIER_TIMEOUT)
    lock = threading.Lock()
    counted = [0]
    counted_at_empty = [-1] * workers

    def work(i: int) -> list[Job]:
        got: list[Job] = []
        barrier.wait()
        while True:
            if batch == 1:
                job = stores[i].lease(f"w{i}", now, LEASE)
                taken = [] if job is None else [job]
            else:
                taken = stores[i].lease_many(f"w{i}", now, LEASE, batch)
            if not taken:
                break
            got.extend(taken)
            with lock:
                counted[0] += len(taken)
        with lock:
            counted_at_empty[i] = counted[0]
        return got

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(work, i) for i in range(workers)]
        per_worker = [f.result(timeout=300) for f in futures]

    for i, at_empty in enumerate(counted_at_empty):
        assert len(due) - at_empty <= (workers - 1) * batch, f"w{i} stopped early"
    for i, got in enumerate(per_worker):
        keys = [(-job.priority, job.dispatch_at, job.run_id) for job in got]
        assert keys == sorted(keys), f"w{i} leased out of order"
        for job in got:
            assert (job.priority, job.dispatch_at) == due[job.run_id]
            assert job.lease_holder == f"w{i}" and job.attempts == 1
    run_ids = [job.run_id for got in per_worker for job in got]
    assert len(run_ids) == len(set(run_ids)), "a job was leased twice"
    assert set(run_ids) == set(due)
    assert stores[0].lease("late", now, LEASE) is None
