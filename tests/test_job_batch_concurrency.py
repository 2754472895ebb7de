"""The batch calls under real concurrency: parallel connections racing them.

What it proves, against a real server:

* ``job_lease_many`` by 8 concurrent leasers in batches of up to 50 hands out
  each of 3,000 due jobs exactly once, each answer in lease order, and leaves
  nothing leasable behind once every leaser has had an empty answer.
* ``job_cancel`` racing ``job_mark_dispatched_many`` (500 trials): a batch of
  four leased jobs is marked in one call while two other connections cancel
  two of them; for every cancelled job exactly one side learns of the other
  (cancel answers ``already_dispatched``, or the mark's row says
  ``cancelled = true``), the jobs not cancelled are recorded plainly, and the
  stored rows agree: the per-job rule of ``job_mark_dispatched``.
* ``job_renew_many`` racing another holder's ``job_lease_many`` at one
  explicit ``now`` past some leases' ends: exactly the live leases renew,
  exactly the expired ones are taken, whatever order the calls reach the server.

Each worker owns an autocommit connection; a ``threading.Barrier`` releases
them together; results are read with ``Future.result()`` so an exception in a
worker fails the test.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from pgstore import CancelResult, Job, MarkResult, PgJobStore
from tests import test_job_concurrency

#: The fixture of the single-job race suite: nine autocommit connections.
connections = test_job_concurrency.connections

pytestmark = pytest.mark.slow

BARRIER_TIMEOUT = 30.0
LEASE = 600_000


def test_batched_leasers_lease_every_job_exactly_once(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    workers, jobs, now = 8, 3_000, 100_000
    stores = [PgJobStore(conn, schema=pgstore_schema) for conn in connections[:workers]]
    dispatch_at = {f"j{n:04d}": (n * 7_919) % 499 for n in range(jobs)}
    ids = list(dispatch_at)
    for start in range(0, jobs, 1_000):
        stores[0].schedule_many(ids[start:start + 1_000],
                                [dispatch_at[r] for r in ids[start:start + 1_000]])
    stores[0].schedule("future", now + 1)
    barrier = threading.Barrier(workers, timeout=BARRIER_TIMEOUT)

    def work(i: int) -> list[list[Job]]:
        answers: list[list[Job]] = []
        barrier.wait()
        while got := stores[i].lease_many(f"w{i}", now, LEASE, 1 + (i * 7) % 50):
            answers.append(got)
        return answers

    with ThreadPoolExecutor(max_workers=workers) as pool:
        per_worker = [f.result(timeout=300) for f in [pool.submit(work, i) for i in range(workers)]]

    leased = [job for answers in per_worker for got in answers for job in got]
    assert len(leased) == len({job.run_id for job in leased}) == jobs, "a job leased twice"
    assert {job.run_id for job in leased} == set(dispatch_at)
    for i, answers in enumerate(per_worker):
        for got in answers:
            keys = [(job.dispatch_at, job.run_id) for job in got]
            assert keys == sorted(keys), f"w{i}: an answer out of lease order"
            assert all(job.lease_holder == f"w{i}" and job.lease_until == now + LEASE
                       and job.lease_sequence == 1 for job in got)
    assert sum(1 for answers in per_worker if answers) >= 2  # the work really was shared
    assert stores[0].lease_many("late", now, LEASE, 100) == []  # the empty answers were not early


def test_cancel_racing_mark_dispatched_many_one_side_always_learns(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    trials, size, now, holder = 500, 4, 1_000_000, "dispatcher"
    setup, marker, canceller_a, canceller_b = (
        PgJobStore(conn, schema=pgstore_schema) for conn in connections[:4])
    barrier = threading.Barrier(3, timeout=BARRIER_TIMEOUT)

    def cancel(store: PgJobStore, run_id: str) -> CancelResult:
        barrier.wait()
        return store.cancel(run_id)

    def mark(batch: list[Job]) -> list[MarkResult]:
        barrier.wait()
        return marker.mark_dispatched_many(
            [job.run_id for job in batch], holder, [f"bot-{job.run_id}" for job in batch],
            [job.lease_sequence for job in batch])

    outcomes: Counter[str] = Counter()
    with ThreadPoolExecutor(max_workers=3) as pool:
        for trial in range(trials):
            run_ids = [f"t{trial:03d}-{n}" for n in range(size)]
            setup.schedule_many(run_ids, [trial] * size)
            # Every earlier trial's jobs are dispatched: these are the only leasable ones.
            batch = setup.lease_many(holder, now, LEASE, 10)
            assert [job.run_id for job in batch] == run_ids, f"trial {trial}"
            # Two of the four, a different pair and order from trial to trial.
            first = run_ids[trial % size]
            second = run_ids[(trial + 1 + (trial // size) % (size - 1)) % size]
            # The mark is submitted first, between or last: the barrier releases all three.
            cancel_fs: dict[str, Future[CancelResult]] = {}
            mark_f: Future[list[MarkResult]] | None = None
            for slot in range(3):
                if slot == trial % 3:
                    mark_f = pool.submit(mark, batch)
                else:
                    run_id = second if first in cancel_fs else first
                    store = canceller_b if first in cancel_fs else canceller_a
                    cancel_fs[run_id] = pool.submit(cancel, store, run_id)
            assert mark_f is not None
            cancels = {r: f.result(timeout=BARRIER_TIMEOUT * 2) for r, f in cancel_fs.items()}
            marks = mark_f.result(timeout=BARRIER_TIMEOUT * 2)

            for job, marked in zip(batch, marks, strict=True):
                assert marked.recorded is True, f"trial {trial} {job.run_id}: {marked}"
                stored = setup.get(job.run_id)
                assert stored is not None and stored.dispatched
                assert stored.worker_id == f"bot-{job.run_id}"
                if job.run_id not in cancels:
                    assert not marked.cancelled and not stored.cancelled, f"trial {trial}"
                    continue
                cancelled = cancels[job.run_id]
                assert cancelled in (CancelResult.CANCELLED, CancelResult.ALREADY_DISPATCHED)
                # Exactly one side learns of the other.
                assert (cancelled is CancelResult.ALREADY_DISPATCHED) != marked.cancelled, (
                    f"trial {trial} {job.run_id}: cancel={cancelled} mark={marked}")
                assert stored.cancelled == (cancelled is CancelResult.CANCELLED)
                outcomes["cancel first" if marked.cancelled else "mark first"] += 1

    print(f"\ncancel vs mark_dispatched_many over {trials} trials: {dict(outcomes)}")
    assert sum(outcomes.values()) == 2 * trials


def test_renew_many_racing_lease_many_is_decided_by_now(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    trials, size = 100, 6
    setup, renewer, taker = (PgJobStore(conn, schema=pgstore_schema) for conn in connections[:3])
    barrier = threading.Barrier(2, timeout=BARRIER_TIMEOUT)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for trial in range(trials):
            base = 10_000_000 * (trial + 1)
            run_ids = [f"r{trial:03d}-{n}" for n in range(size)]
            setup.schedule_many(run_ids, [base] * size)
            held = setup.lease_many("h1", base, 1_000, size)
            assert [job.run_id for job in held] == run_ids
            # Half the leases end before the race's now, half after.
            for n, run_id in enumerate(run_ids):
                assert setup.renew(run_id, "h1", base, 500 if n % 2 else 5_000)
            now = base + 1_000

            def renew(run_ids: list[str], now: int) -> list[bool]:
                barrier.wait()
                return renewer.renew_many(run_ids, "h1", now, 10_000)

            def take(now: int) -> list[Job]:
                barrier.wait()
                return taker.lease_many("h2", now, 10_000, size)

            renew_f, take_f = pool.submit(renew, run_ids, now), pool.submit(take, now)
            renewed = renew_f.result(timeout=BARRIER_TIMEOUT * 2)
            taken = {job.run_id for job in take_f.result(timeout=BARRIER_TIMEOUT * 2)}
            assert renewed == [n % 2 == 0 for n in range(size)], f"trial {trial}"
            assert taken == {r for n, r in enumerate(run_ids) if n % 2}, f"trial {trial}"
            for run_id in run_ids:  # finish the trial's jobs, so the next trial's are alone
                holder = "h2" if run_id in taken else "h1"
                assert setup.mark_dispatched(run_id, holder, "w").recorded
