"""The queue limits (docs/queues.md, "Limits"), call by call, on every job store kind.

A concurrency limit holds at most N live leases of a queue's jobs at once: a lease
counts until it expires or its job is dispatched, released or failed (a cancelled job's
live lease still counts), and a renew keeps it counting. A rate limit leases at most N
of a queue's jobs in any window of one period. A limited queue that is full is passed
over, never waited on: the lease goes on to other queues' jobs. ``list_queues`` shows
the limits. Bad input raises ``InvalidArgument`` (22023 in SQL, naming the parameter)
and changes nothing. The same rules under real concurrency:
tests/test_queue_limit_concurrency.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pgstore import InvalidArgument, Job, QueueInfo
from tests.conftest import JobStoreUnderTest

TTL = 1_000
NOW = 10_000


def _ids(jobs: list[Job]) -> list[str]:
    return [job.run_id for job in jobs]


def _queue(jobs: JobStoreUnderTest, name: str, now: int = NOW) -> QueueInfo:
    return next(q for q in jobs.store.list_queues(now) if q.queue == name)


def _due(jobs: JobStoreUnderTest, queue: str, count: int, prefix: str | None = None) -> None:
    for i in range(count):
        jobs.store.schedule(f"{prefix or queue}{i}", i, queue=queue)


def test_setters_answer_whether_they_changed_the_limit(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    assert s.set_queue_concurrency("q", None) is False  # no limit, no queue: nothing
    assert s.set_queue_rate("q", None, None) is False
    assert s.list_queues(NOW) == []
    assert s.set_queue_concurrency("q", 3) is True
    assert s.set_queue_concurrency("q", 3) is False
    assert s.set_queue_rate("q", 10, 60_000) is True
    assert s.set_queue_rate("q", 10, 60_000) is False
    assert s.set_queue_rate("q", 10, 1_000) is True
    assert s.list_queues(NOW) == [QueueInfo("q", 0, 0, 0, False, 3, 10, 1_000, 0)]
    assert s.set_queue_concurrency("q", None) is True
    assert s.set_queue_rate("q", None, None) is True
    # The queue stays listed (it has a row, as a paused and resumed one does).
    assert s.list_queues(NOW) == [QueueInfo("q", 0, 0, 0, False, None, None, None, None)]


def test_concurrency_limit_counts_live_leases(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    _due(jobs, "q", 6)
    s.set_queue_concurrency("q", 2)
    assert _ids(s.lease_many("h", NOW, TTL, 10)) == ["q0", "q1"]
    assert s.lease("h", NOW, TTL) is None
    info = _queue(jobs, "q")
    assert (info.depth, info.due, info.leased, info.concurrency_limit) == (6, 4, 2, 2)

    # Dispatched, released: the lease ended, its place is free at once.
    assert s.mark_dispatched("q0", "h", "w").recorded
    assert _ids(s.lease_many("h", NOW, TTL, 10)) == ["q2"]
    assert s.release("q1", "h", NOW + 50_000)
    assert _ids(s.lease_many("h", NOW, TTL, 10)) == ["q3"]
    assert s.lease("h", NOW, TTL) is None

    # Cancelled: its dispatch may still be running, the lease still counts.
    assert s.cancel("q2").value == "cancelled"
    assert s.lease("h", NOW, TTL) is None
    # Expired: free (q2 and q3 expire at NOW + TTL).
    assert _ids(s.lease_many("h", NOW + TTL, TTL, 10)) == ["q3", "q4"]


def test_a_renew_keeps_the_lease_counting(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    _due(jobs, "q", 3)
    s.set_queue_concurrency("q", 1)
    leased = s.lease("h", NOW, TTL)
    assert leased is not None and leased.run_id == "q0"
    assert s.renew("q0", "h", NOW + 900, TTL, leased.lease_sequence)  # until NOW + 1900
    assert s.lease("h", NOW + 1_500, TTL) is None
    assert s.renew_many(["q0"], "h", NOW + 1_800, TTL) == [True]  # until NOW + 2800
    assert s.lease("h", NOW + 2_500, TTL) is None
    got = s.lease("h", NOW + 2_800, TTL)  # q0's lease is over: it comes first again
    assert got is not None and got.run_id == "q0" and got.lease_sequence == 2


def test_a_lease_from_before_the_limit_counts_from_its_renew(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    _due(jobs, "q", 5)
    taken = s.lease_many("h", NOW, TTL, 3)
    assert _ids(taken) == ["q0", "q1", "q2"]
    s.set_queue_concurrency("q", 2)
    # The renews take the two free places; the third finds the queue full: its lease
    # ends now (the holder must stop), as a lost lease's renew answers.
    assert s.renew("q1", "h", NOW + 10, TTL) is True
    assert s.renew_many(["q2", "q0"], "h", NOW + 10, TTL) == [False, True]
    q2 = s.get("q2")
    assert q2 is not None and q2.lease_until == NOW + 10
    assert s.lease("h", NOW + 10, TTL) is None  # q0 and q1 hold both places
    assert s.renew("q2", "h", NOW + 10, TTL) is False


def test_lowering_the_limit_ends_no_lease(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    _due(jobs, "q", 5)
    s.set_queue_concurrency("q", 3)
    assert _ids(s.lease_many("h", NOW, TTL, 10)) == ["q0", "q1", "q2"]
    assert s.set_queue_concurrency("q", 1) is True
    assert s.renew_many(["q0", "q1", "q2"], "h", NOW + 10, TTL) == [True, True, True]
    assert s.mark_dispatched("q1", "h", None).recorded
    assert s.mark_dispatched("q2", "h", None).recorded
    assert s.lease("h", NOW + 10, TTL) is None  # q0 still holds the one place
    assert s.mark_dispatched("q0", "h", None).recorded
    assert _ids(s.lease_many("h", NOW + 10, TTL, 10)) == ["q3"]
    assert s.set_queue_concurrency("q", None) is True
    assert _ids(s.lease_many("h", NOW + 10, TTL, 10)) == ["q4"]


def test_no_lease_starts_while_a_lease_over_a_lowered_limit_lives(
    jobs: JobStoreUnderTest,
) -> None:
    """Lowered from 3 to 1 with three leases live: the one in the place kept ends first,
    and still no lease starts while the two over the new limit live (pgstore_0026 leased
    q3 there: three live leases under a limit of 1)."""
    s = jobs.store
    _due(jobs, "q", 6)
    s.set_queue_concurrency("q", 3)
    assert _ids(s.lease_many("h", NOW, TTL, 10)) == ["q0", "q1", "q2"]
    assert s.set_queue_concurrency("q", 1) is True
    assert s.mark_dispatched("q0", "h", None).recorded
    assert s.lease("h", NOW + 10, TTL) is None
    assert s.lease_many("h", NOW + 10, TTL, 10) == []
    assert _queue(jobs, "q", NOW + 10).leased == 2
    assert s.release("q1", "h", NOW + 50_000)
    assert s.lease_many("h", NOW + 10, TTL, 10) == []  # q2 still runs
    # q2 is cancelled: its lease still counts until it expires (NOW + TTL).
    assert s.cancel("q2").value == "cancelled"
    assert s.lease("h", NOW + TTL - 1, TTL) is None
    assert _ids(s.lease_many("h", NOW + TTL, TTL, 10)) == ["q3"]
    # A renew of q2's lease by a clock behind the leaser's finds its place gone and the
    # queue full: it ends, never a second live lease.
    assert s.renew("q2", "h", NOW + TTL - 1, TTL) is False
    assert _queue(jobs, "q", NOW + TTL - 1).leased == 1
    assert s.lease("h", NOW + TTL, TTL) is None


def test_a_lowered_limit_leases_again_once_below_it_with_its_leases_over_it(
    jobs: JobStoreUnderTest,
) -> None:
    """Lowered from 3 to 2 with three leases live: q2's place is retired. Once q0 and q1
    end, the queue holds one live lease (q2's) and takes one more, not two; and a lane
    that stood for q2's lease in that lease had its place cleared: a renew there from a
    clock behind (its lease expired by the leaser's) finds its place gone and the queue
    full, and ends."""
    s = jobs.store
    _due(jobs, "q", 6)
    s.set_queue_concurrency("q", 3)
    assert _ids(s.lease_many("h", NOW, TTL, 1)) == ["q0"]
    assert _ids(s.lease_many("h", NOW, 500, 1)) == ["q1"]  # until NOW + 500
    assert _ids(s.lease_many("h", NOW, 5 * TTL, 1)) == ["q2"]
    assert s.set_queue_concurrency("q", 2) is True
    assert s.mark_dispatched("q0", "h", None).recorded
    assert s.lease("h", NOW + 10, TTL) is None  # q1 and q2 live: full
    assert s.cancel("q1").value == "cancelled"  # its lease counts until NOW + 500
    assert _ids(s.lease_many("h", NOW + 500, TTL, 10)) == ["q3"]
    assert _queue(jobs, "q", NOW + 500).leased == 2
    assert s.renew("q1", "h", NOW + 499, TTL) is False
    assert s.lease_many("h", NOW + 500, TTL, 10) == []
    assert s.mark_dispatched("q2", "h", None).recorded
    assert _ids(s.lease_many("h", NOW + 500, TTL, 10)) == ["q4"]
    assert s.lease("h", NOW + 500, TTL) is None  # q3 and q4


def test_a_renew_without_a_place_waits_for_the_leases_over_a_lowered_limit(
    jobs: JobStoreUnderTest,
) -> None:
    """A lease from before the limit takes a free place at its renew, but not while a
    lease over a lowered limit lives: the queue is at its limit."""
    s = jobs.store
    _due(jobs, "q", 5)
    assert _ids(s.lease_many("h", NOW, TTL, 2)) == ["q0", "q1"]  # no limit yet
    s.set_queue_concurrency("q", 3)
    assert _ids(s.lease_many("h", NOW, TTL, 10)) == ["q2", "q3", "q4"]
    assert s.set_queue_concurrency("q", 2) is True  # q4's place is retired
    assert s.mark_dispatched("q2", "h", None).recorded
    assert s.renew("q0", "h", NOW + 10, TTL) is False  # q3 and q4 live: full
    assert s.mark_dispatched("q4", "h", None).recorded
    assert s.renew_many(["q1"], "h", NOW + 10, TTL) == [True]  # q2's place
    assert s.lease("h", NOW + 10, TTL) is None  # q1 and q3 hold both places


def test_rate_limit_counts_leases_in_any_window(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    _due(jobs, "q", 8)
    s.set_queue_rate("q", 2, 1_000)
    assert _ids(s.lease_many("h", NOW, TTL, 10)) == ["q0", "q1"]
    for run_id in ("q0", "q1"):
        s.mark_dispatched(run_id, "h", None)
    assert s.lease("h", NOW + 999, TTL) is None
    assert _queue(jobs, "q", NOW + 999).rate_used == 2
    assert _queue(jobs, "q", NOW + 1_000).rate_used == 0
    got = s.lease("h", NOW + 1_000, TTL)
    assert got is not None and got.run_id == "q2"
    s.mark_dispatched("q2", "h", None)
    assert _ids(s.lease_many("h", NOW + 1_500, TTL, 10)) == ["q3"]
    s.mark_dispatched("q3", "h", None)
    assert s.lease("h", NOW + 1_999, TTL) is None
    assert _ids(s.lease_many("h", NOW + 2_000, TTL, 10)) == ["q4"]  # q2's use is a period old
    assert _ids(s.lease_many("h", NOW + 2_500, TTL, 10)) == ["q5"]
    # Raised: the new rows are free at once; lowered: the rows kept are counted.
    s.set_queue_rate("q", 4, 1_000)
    assert _ids(s.lease_many("h", NOW + 2_600, TTL, 10)) == ["q6", "q7"]
    s.set_queue_rate("q", 1, 1_000)
    assert _queue(jobs, "q", NOW + 2_600).rate_used == 1


def test_a_lowered_rate_limit_keeps_the_newest_leases_in_their_windows(
    jobs: JobStoreUnderTest,
) -> None:
    """Raised from 2 to 3 and lowered back within one period: the uses kept are the
    newest two, so the window from NOW + 900 holds no third lease. pgstore_0026 kept
    the uses of places 1 and 2 (NOW, NOW + 900) and forgot place 3's (NOW + 960): q0
    was leased again at NOW + 1000, three leases in [NOW + 900, NOW + 1900)."""
    s = jobs.store
    _due(jobs, "q", 6)
    s.set_queue_rate("q", 2, 1_000)
    assert _ids(s.lease_many("h", NOW, TTL, 1)) == ["q0"]
    assert _ids(s.lease_many("h", NOW + 900, TTL, 1)) == ["q1"]
    s.set_queue_rate("q", 3, 1_000)
    assert _ids(s.lease_many("h", NOW + 960, TTL, 5)) == ["q2"]
    s.set_queue_rate("q", 2, 1_000)
    assert _queue(jobs, "q", NOW + 960).rate_used == 2
    assert s.lease("h", NOW + 1_000, TTL) is None
    assert s.lease_many("h", NOW + 1_899, TTL, 5) == []
    assert _ids(s.lease_many("h", NOW + 1_900, TTL, 5)) == ["q0"]  # q1's use is a period old
    assert s.lease("h", NOW + 1_959, TTL) is None
    assert _ids(s.lease_many("h", NOW + 1_960, TTL, 5)) == ["q1"]


def test_a_rate_window_reaching_below_the_smallest_bigint(jobs: JobStoreUnderTest) -> None:
    # now - period is below -2^63 here: the listing and the lease still answer (the
    # hostile-input suite found queue_list raising 22003 where the memory store did not).
    s = jobs.store
    low = -(2**63) + 500
    s.schedule("a", -(2**63), queue="q")
    s.schedule("b", -(2**63), queue="q")
    s.set_queue_rate("q", 1, 1_000)
    assert _queue(jobs, "q", low).rate_used == 0
    assert _ids(s.lease_many("h", low, TTL, 10)) == ["a"]
    s.mark_dispatched("a", "h", None)
    assert _queue(jobs, "q", low).rate_used == 1
    assert s.lease("h", low + 999, TTL) is None
    got = s.lease("h", low + 1_000, TTL)
    assert got is not None and got.run_id == "b"


def test_both_limits_at_once(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    _due(jobs, "q", 6)
    s.set_queue_concurrency("q", 1)
    s.set_queue_rate("q", 2, 1_000)
    got = s.lease_many("h", NOW, TTL, 10)
    assert _ids(got) == ["q0"]
    s.mark_dispatched("q0", "h", None)
    assert _ids(s.lease_many("h", NOW + 1, TTL, 10)) == ["q1"]
    s.mark_dispatched("q1", "h", None)
    assert s.lease("h", NOW + 2, TTL) is None  # the rate: two in this period
    assert _ids(s.lease_many("h", NOW + 1_000, TTL, 10)) == ["q2"]
    assert s.lease("h", NOW + 1_001, TTL) is None  # the concurrency: q2 runs


def test_a_full_queue_is_passed_over(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    for i in range(3):
        s.schedule(f"hot{i}", i, queue="hot", priority=9)
        s.schedule(f"cold{i}", i, queue="cold")
    s.set_queue_concurrency("hot", 1)
    assert _ids(s.lease_many("h", NOW, TTL, 3)) == ["hot0", "cold0", "cold1"]
    got = s.lease("h", NOW, TTL)  # hot is full: the lower-priority queue's job
    assert got is not None and got.run_id == "cold2"
    assert s.lease("h", NOW, TTL) is None
    assert s.lease("h", NOW, TTL, queues=["hot"]) is None


def test_a_job_failed_out_of_attempts_takes_no_place(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("a", 1, max_attempts=1, queue="q")
    s.schedule("b", 2, queue="q")
    s.set_queue_concurrency("q", 1)
    assert _ids(s.lease_many("h", NOW, TTL, 10)) == ["a"]
    # a's lease expires: the next lease fails it instead of leasing it (the attempt
    # counts against that call), and a holds no place.
    assert s.lease_many("h", NOW + TTL, TTL, 1) == []
    failed = s.get("a")
    assert failed is not None and failed.failed
    assert _ids(s.lease_many("h", NOW + TTL, TTL, 10)) == ["b"]


def test_a_job_failed_out_of_attempts_leaves_a_batch_its_place(jobs: JobStoreUnderTest) -> None:
    """A batch that fails a job of a limited queue leases the queue's next jobs in its
    place, as the single leases that follow would: the failed job counts against the
    batch's limit, never against the queue's. pgstore_0026 answered ["b"] (and
    ["b", "z"] beside another queue): the failed job took one of the queue's two
    candidates."""
    s = jobs.store
    s.schedule("a", 1, max_attempts=1, queue="q")
    s.schedule("b", 2, queue="q")
    s.schedule("c", 3, queue="q")
    s.schedule("d", 4, queue="q")
    s.schedule("e", 5, queue="q")
    s.schedule("z", 50, queue="other")
    s.set_queue_concurrency("q", 2)
    assert _ids(s.lease_many("h", NOW, TTL, 1)) == ["a"]
    assert _ids(s.lease_many("h", NOW + TTL, TTL, 10, queues=["q"])) == ["b", "c"]
    failed = s.get("a")
    assert failed is not None and failed.failed
    # Again with a rate limit that binds, beside another queue: a, retried and leased
    # again, uses one of two leases a period; its lease expires, and the batch that
    # fails it takes d in its place (and z), then e must wait for the period.
    assert s.retry("a", 1).value == "retried"
    for run_id in ("b", "c"):
        assert s.mark_dispatched(run_id, "h", None).recorded
    s.set_queue_concurrency("q", None)
    s.set_queue_rate("q", 2, 1_000_000)
    assert _ids(s.lease_many("h", NOW + TTL, TTL, 1)) == ["a"]
    assert _ids(s.lease_many("h", NOW + 2 * TTL, TTL, 10)) == ["d", "z"]
    assert s.lease_many("h", NOW + 2 * TTL, TTL, 10) == []  # a and d used the rate


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda s: s.set_queue_concurrency("", 1), "queue"),
        (lambda s: s.set_queue_concurrency("x" * 1025, 1), "queue"),
        (lambda s: s.set_queue_concurrency(None, 1), "queue"),
        (lambda s: s.set_queue_concurrency("q", 0), "limit"),
        (lambda s: s.set_queue_concurrency("q", -1), "limit"),
        (lambda s: s.set_queue_concurrency("q", 10_001), "limit"),
        (lambda s: s.set_queue_concurrency("q", "3"), "limit"),
        (lambda s: s.set_queue_rate("", 1, 1), "queue"),
        (lambda s: s.set_queue_rate("q", 0, 1_000), "limit"),
        (lambda s: s.set_queue_rate("q", 10_001, 1_000), "limit"),
        (lambda s: s.set_queue_rate("q", 5, None), "period_ms"),
        (lambda s: s.set_queue_rate("q", None, 1_000), "period_ms"),
        (lambda s: s.set_queue_rate("q", 5, 0), "period_ms"),
        (lambda s: s.set_queue_rate("q", 5, 31_622_400_001), "period_ms"),
        (lambda s: s.set_queue_rate("q", 5, 1.5), "period_ms"),
    ],
)
def test_bad_limits_are_refused_and_change_nothing(
    jobs: JobStoreUnderTest, call: object, param: str
) -> None:
    s = jobs.store
    _due(jobs, "q", 3)
    s.set_queue_concurrency("q", 2)
    s.set_queue_rate("q", 7, 5_000)
    s.lease("h", NOW, TTL)
    before = (s.list_queues(NOW), jobs.state())
    with pytest.raises(InvalidArgument, match=param):
        call(s)  # type: ignore[operator]
    assert (s.list_queues(NOW), jobs.state()) == before
    # And the limits still hold as they were.
    assert _ids(s.lease_many("h", NOW, TTL, 10)) == ["q1"]


@pytest.mark.parametrize("seed", range(6))
def test_the_memory_store_answers_as_postgres_through_changes_of_the_limits(
    pgstore_database: str, pgstore_schema: str, seed: int,
) -> None:
    """Random leases, batches, renews, marks, releases and changes of both limits (up,
    down, lifted, either the larger), with a clock that moves on: the in-memory store
    answers every call as PostgreSQL does (its lanes follow sql/24_queue_limits.sql)."""
    import random

    from pgstore import MemoryJobStore, PgJobStore

    rnd = random.Random(seed)
    pg = PgJobStore(pgstore_database, schema=pgstore_schema)
    pg.start()
    mem = MemoryJobStore()
    try:
        stores = (pg, mem)
        for i in range(40):
            at, queue = rnd.randint(0, 50), rnd.choice(["a", "b"])
            for s in stores:
                s.schedule(f"j{i:02d}", at, queue=queue)
        now = NOW
        held: dict[str, int] = {}  # run_id -> lease_sequence
        got: list[Any]
        for step in range(160):
            now += rnd.choice([0, 5, 20, 120])
            op = rnd.random()
            if op < 0.1:
                limit = rnd.choice([None, 1, 2, 3, 5])
                got = [s.set_queue_concurrency("a", limit) for s in stores]
            elif op < 0.2:
                rate = rnd.choice([None, 1, 2, 4, 7])
                period = None if rate is None else rnd.choice([50, 200])
                got = [s.set_queue_rate("a", rate, period) for s in stores]
            elif op < 0.5:
                limit = rnd.choice([1, 1, 3, 10])
                leased = [s.lease_many("h", now, TTL, limit) for s in stores]
                got = [[(j.run_id, j.lease_sequence) for j in js] for js in leased]
                held.update((j.run_id, j.lease_sequence) for j in leased[0])
            elif op < 0.65 and held:
                ids = rnd.sample(sorted(held), min(len(held), rnd.randint(1, 3)))
                got = [s.renew_many(ids, "h", now, TTL, [held[r] for r in ids])
                       for s in stores]
            elif op < 0.85 and held:
                run_id = rnd.choice(sorted(held))
                seq = held.pop(run_id)
                if rnd.random() < 0.7:
                    got = [s.mark_dispatched(run_id, "h", "w", seq).recorded for s in stores]
                else:
                    got = [s.release(run_id, "h", 0, seq) for s in stores]
            else:
                got = [[(q.queue, q.leased, q.rate_used) for q in s.list_queues(now)]
                       for s in stores]
            assert got[0] == got[1], (seed, step)
    finally:
        pg.close()
