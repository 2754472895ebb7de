"""The job rules and the bad-input rules of docs/contract.md for every job store: memory, PostgreSQL sync and asyncio.

Every call passes an explicit ``now`` except where the database clock is the
point, so the rules about expiry (``lease_until <= now`` is expired) are
exercised at their boundaries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from pgstore import (
    DEFAULT_MAX_ATTEMPTS,
    CancelResult,
    InvalidArgument,
    Job,
    JobNotRemovable,
    MarkResult,
    RetryResult,
)
from pgstore.protocols import JobStore
from tests.conftest import JobStoreUnderTest, present

TTL = 1_000
LONG = "x" * 1025
OK_1024 = "y" * 1024


def _job(run_id: str, dispatch_at: int, **changes: Any) -> Job:
    fields: dict[str, Any] = {
        "lease_holder": None, "lease_until": None, "worker_id": None,
        "dispatched": False, "cancelled": False,
    }
    fields.update(changes)
    # Every lease bumps both: with no retry between, attempts is the lease sequence.
    fields.setdefault("attempts", fields.get("lease_sequence", 0))
    return Job(run_id=run_id, dispatch_at=dispatch_at, **fields)


# --- schedule, get, remove ---------------------------------------------------------------


def test_get_unknown_is_none(jobs: JobStoreUnderTest) -> None:
    assert jobs.store.get("nope") is None


def test_schedule_adds_a_pending_job(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    assert s.schedule("r1", 500) is None  # type: ignore[func-returns-value]  # the contract: no value
    assert s.get("r1") == _job("r1", 500)
    assert jobs.state() == [_job("r1", 500)]


def test_schedule_existing_moves_only_dispatch_at(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    leased = s.lease("h1", 150, TTL)
    assert leased is not None
    assert s.mark_dispatched("r1", "h1", "bot-7") == MarkResult(cancelled=False, recorded=True)
    s.schedule("r1", 9_000)
    assert s.get("r1") == _job(
        "r1", 9_000, lease_holder="h1", lease_until=150 + TTL, worker_id="bot-7", dispatched=True,
        lease_sequence=1,
    )
    s.schedule("r2", 100)
    assert s.cancel("r2") == CancelResult.CANCELLED
    s.schedule("r2", 50)
    assert s.get("r2") == _job("r2", 50, cancelled=True)


def test_remove_deletes_and_unknown_is_a_no_op(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    s.schedule("r2", 100)
    assert s.remove("r1") is None  # type: ignore[func-returns-value]  # the contract: no value
    assert s.get("r1") is None
    s.remove("nope")
    assert jobs.state() == [_job("r2", 100)]


# --- lease ------------------------------------------------------------------------------


def test_lease_sets_holder_and_expiry(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    leased = s.lease("h1", 100, TTL)  # dispatch_at == now is due
    expected = _job("r1", 100, lease_holder="h1", lease_until=100 + TTL, lease_sequence=1)
    assert leased == expected
    assert s.get("r1") == expected


def test_lease_nothing_due(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    assert s.lease("h1", 1_000, TTL) is None  # empty store
    s.schedule("r1", 100)
    before = jobs.state()
    assert s.lease("h1", 99, TTL) is None
    assert jobs.state() == before


def test_leases_come_out_in_dispatch_at_order_ties_by_run_id(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    for run_id, at in [("late", 300), ("b", 200), ("a", 200), ("A", 200), ("early", 100),
                       ("future", 10_000)]:
        s.schedule(run_id, at)
    order = []
    while (leased := s.lease("h1", 500, TTL)) is not None:
        order.append(leased.run_id)
    # "A" < "a" < "b": code-point order, whatever the database's collation.
    assert order == ["early", "A", "a", "b", "late"]


def test_lease_skips_cancelled_dispatched_and_live_leases(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    for run_id in ["a-cancelled", "b-dispatched", "c-leased", "d-free"]:
        s.schedule(run_id, 100)
    assert s.cancel("a-cancelled") == CancelResult.CANCELLED
    first = s.lease("h0", 100, TTL)
    assert first is not None and first.run_id == "b-dispatched"
    assert s.mark_dispatched("b-dispatched", "h0", "w").recorded
    second = s.lease("h0", 100, TTL)
    assert second is not None and second.run_id == "c-leased"
    third = s.lease("h1", 200, TTL)
    assert third is not None and third.run_id == "d-free"
    assert s.lease("h2", 300, TTL) is None


def test_expired_lease_is_leased_again_and_first_holder_renew_fails(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    assert s.lease("h2", 100 + TTL - 1, TTL) is None  # still live
    again = s.lease("h2", 100 + TTL, TTL)  # lease_until == now: expired
    assert again == _job("r1", 100, lease_holder="h2", lease_until=100 + 2 * TTL,
                         lease_sequence=2)  # every lease bumps it
    assert s.renew("r1", "h1", 100 + TTL, TTL) is False
    assert s.get("r1") == again


# --- renew ------------------------------------------------------------------------------


def test_renew_extends_a_live_lease(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    assert s.renew("r1", "h1", 600, 5_000) is True
    assert s.get("r1") == _job("r1", 100, lease_holder="h1", lease_until=5_600, lease_sequence=1)


def test_renew_fails_when_expired_even_if_nobody_took_it(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    before = jobs.state()
    assert s.renew("r1", "h1", 100 + TTL, TTL) is False  # lease_until > now is required
    assert jobs.state() == before


def test_renew_by_another_holder_or_unknown_job_fails(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    before = jobs.state()
    assert s.renew("r1", "h2", 200, TTL) is False
    assert s.renew("nope", "h1", 200, TTL) is False
    s.schedule("r2", 100)
    assert s.renew("r2", "h1", 200, TTL) is False  # never leased
    assert jobs.state() == [*before, _job("r2", 100)]


def test_renew_live_lease_is_true_when_cancelled_or_dispatched(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("c", 100)
    s.schedule("d", 100)
    assert s.lease("h1", 100, TTL) is not None  # "c"
    assert s.lease("h1", 100, TTL) is not None  # "d"
    assert s.cancel("c") == CancelResult.CANCELLED
    assert s.mark_dispatched("d", "h1", None).recorded
    assert s.renew("c", "h1", 200, TTL) is True
    assert s.renew("d", "h1", 200, TTL) is True
    assert [j.lease_until for j in jobs.state()] == [200 + TTL, 200 + TTL]


# --- mark_dispatched -----------------------------------------------------------------------


def test_mark_dispatched_by_holder_records_and_keeps_the_lease(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    assert s.mark_dispatched("r1", "h1", "bot-1") == MarkResult(cancelled=False, recorded=True)
    assert s.get("r1") == _job(
        "r1", 100, lease_holder="h1", lease_until=100 + TTL, worker_id="bot-1", dispatched=True,
        lease_sequence=1,
    )
    assert s.lease("h2", 100 + 10 * TTL, TTL) is None  # dispatched: never leased again


def test_mark_dispatched_after_expiry_nobody_else_is_recorded(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    # The dispatch outlived the lease, but nobody took the job meanwhile.
    assert s.mark_dispatched("r1", "h1", "bot-1") == MarkResult(cancelled=False, recorded=True)
    job = s.get("r1")
    assert job is not None and job.dispatched and job.worker_id == "bot-1"


def test_mark_dispatched_after_another_holder_took_it_changes_nothing(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    assert s.lease("h2", 100 + TTL, TTL) is not None
    before = jobs.state()
    assert s.mark_dispatched("r1", "h1", "bot-1") == MarkResult(cancelled=False, recorded=False)
    assert jobs.state() == before
    assert s.cancel("r1") == CancelResult.CANCELLED
    # Not recorded: cancelled is the stored flag.
    assert s.mark_dispatched("r1", "h1", "bot-1") == MarkResult(cancelled=True, recorded=False)


def test_mark_dispatched_on_missing_or_unleased_job(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    assert s.mark_dispatched("nope", "h1", "w") == MarkResult(cancelled=False, recorded=False)
    s.schedule("r1", 100)
    before = jobs.state()
    assert s.mark_dispatched("r1", "h1", "w") == MarkResult(cancelled=False, recorded=False)
    assert jobs.state() == before


def test_mark_dispatched_again_by_holder_records_again_new_worker_wins(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    assert s.mark_dispatched("r1", "h1", "bot-1").recorded
    assert s.mark_dispatched("r1", "h1", "bot-2") == MarkResult(cancelled=False, recorded=True)
    job = s.get("r1")
    assert job is not None and job.worker_id == "bot-2"
    assert s.mark_dispatched("r1", "h1", None).recorded
    job = s.get("r1")
    assert job is not None and job.worker_id is None and job.dispatched


def test_cancel_under_live_lease_is_learned_from_mark_dispatched(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    assert s.cancel("r1") == CancelResult.CANCELLED
    job = s.get("r1")
    assert job is not None and job.cancelled and job.lease_holder == "h1"  # lease untouched
    assert s.mark_dispatched("r1", "h1", "bot-1") == MarkResult(cancelled=True, recorded=True)
    assert s.get("r1") == _job(
        "r1", 100, lease_holder="h1", lease_until=100 + TTL, worker_id="bot-1",
        dispatched=True, cancelled=True, lease_sequence=1,
    )
    assert s.cancel("r1") == CancelResult.ALREADY_DISPATCHED


# --- release ----------------------------------------------------------------------------


def test_release_clears_the_lease_and_moves_dispatch_at(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    assert s.release("r1", "h1", 5_000) is True
    assert s.get("r1") == _job("r1", 5_000, lease_sequence=1)  # kept: the next lease bumps it
    assert s.lease("h2", 4_999, TTL) is None
    leased = s.lease("h2", 5_000, TTL)
    assert leased is not None and leased.run_id == "r1"


def test_release_by_holder_after_expiry_still_works(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    # release has no now: "still holds" is lease_holder = holder, expired or not.
    assert s.release("r1", "h1", 7_000) is True
    assert s.get("r1") == _job("r1", 7_000, lease_sequence=1)


def test_release_fails_and_changes_nothing_unless_holder_holds_undispatched(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("taken", 100)
    s.schedule("dispatched", 100)
    s.schedule("never", 100)
    assert s.lease("h1", 100, TTL) is not None  # "dispatched"
    assert s.mark_dispatched("dispatched", "h1", "w").recorded
    assert s.lease("h1", 100, TTL) is not None  # "never": ties go by run_id
    assert s.lease("h2", 100, TTL) is not None
    state = {j.run_id: j.lease_holder for j in jobs.state()}
    assert state == {"dispatched": "h1", "never": "h1", "taken": "h2"}
    assert s.release("never", "h1", 9_000) is True
    before = jobs.state()
    assert s.release("taken", "h1", 9_000) is False  # another holder
    assert s.release("dispatched", "h1", 9_000) is False  # dispatched
    assert s.release("never", "h1", 9_000) is False  # released already: no holder
    assert s.release("nope", "h1", 9_000) is False  # gone
    assert jobs.state() == before


def test_release_of_a_cancelled_job_under_lease(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    assert s.cancel("r1") == CancelResult.CANCELLED
    assert s.release("r1", "h1", 9_000) is True
    assert s.get("r1") == _job("r1", 9_000, cancelled=True, lease_sequence=1)
    assert s.lease("h1", 10_000, TTL) is None  # cancelled: never leased


# --- lease sequence ---------------------------------------------------------------------


def test_lease_sequence_grows_with_every_lease_of_a_job(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    s.schedule("r2", 100)
    assert present(s.get("r1")).lease_sequence == 0  # never leased
    seen = []
    for k in range(4):  # expired, released, expired again: each lease is the next number
        job = s.lease("h1", 100 + k * 10 * TTL, TTL)
        assert job is not None and job.run_id == "r1"
        seen.append(job.lease_sequence)
        if k == 1:
            assert s.release("r1", "h1", 100, job.lease_sequence) is True
    assert seen == [1, 2, 3, 4]
    assert s.mark_dispatched("r1", "h1", "bot", 4).recorded
    other = s.lease("h1", 100 + 40 * TTL, TTL)
    assert other is not None and other.run_id == "r2" and other.lease_sequence == 1  # per job


def test_lease_sequence_fences_renew_mark_and_release(jobs: JobStoreUnderTest) -> None:
    """The same holder leasing a job again (a dispatcher restarted under one name)
    cannot renew, record or release with the number of its earlier lease; calls
    without a number behave as before."""
    s = jobs.store
    s.schedule("r1", 100)
    first = s.lease("h1", 100, TTL)
    assert first is not None
    second = s.lease("h1", 100 + TTL, TTL)  # the first expired; the same holder again
    assert second is not None and second.lease_sequence == first.lease_sequence + 1
    before = jobs.state()
    now = 100 + TTL + 1
    assert s.renew("r1", "h1", now, TTL, first.lease_sequence) is False
    assert s.mark_dispatched("r1", "h1", "bot-old", first.lease_sequence) == MarkResult(
        cancelled=False, recorded=False
    )
    assert s.release("r1", "h1", 9_000, first.lease_sequence) is False
    assert jobs.state() == before  # nothing changed
    assert s.renew("r1", "h1", now, TTL, second.lease_sequence) is True
    assert s.renew("r1", "h1", now, TTL) is True  # no fence: any lease of the holder
    assert s.mark_dispatched("r1", "h1", "bot", second.lease_sequence) == MarkResult(
        cancelled=False, recorded=True
    )
    assert s.get("r1") == _job(
        "r1", 100, lease_holder="h1", lease_until=now + TTL, worker_id="bot", dispatched=True,
        lease_sequence=2,
    )
    assert s.release("r1", "h1", 9_000, second.lease_sequence) is False  # dispatched


@pytest.mark.parametrize("bad", [0, -1])
def test_lease_sequence_must_be_positive(jobs: JobStoreUnderTest, bad: int) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    before = jobs.state()
    for call in (
        lambda: s.renew("r1", "h1", 100, TTL, bad),
        lambda: s.mark_dispatched("r1", "h1", "bot", bad),
        lambda: s.release("r1", "h1", 100, bad),
    ):
        with pytest.raises(InvalidArgument, match="lease_sequence"):
            call()
    assert jobs.state() == before


# --- cancel -----------------------------------------------------------------------------


def test_reschedule_moves_a_waiting_job_and_answers_it(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 500, max_attempts=3)
    moved = s.reschedule("r1", 9_000, now=100)
    assert moved == _job("r1", 9_000, max_attempts=3)
    assert s.get("r1") == moved
    assert s.lease("h1", 600, TTL) is None  # no longer due at the old time
    assert s.reschedule("r1", 50, now=100) == _job("r1", 50, max_attempts=3)  # earlier too
    assert s.lease("h1", 100, TTL) is not None


def test_reschedule_refuses_a_live_lease_and_finished_jobs(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    for run_id in ("leased", "sent", "gone", "failed"):
        s.schedule(run_id, 100, max_attempts=1)
    assert s.lease("h1", 100, TTL) is not None  # "failed"
    assert s.release("failed", "h1", 200) is True  # its last lease: failed
    assert s.lease("h1", 100, TTL) is not None  # "gone"
    assert s.cancel("gone") == CancelResult.CANCELLED
    assert s.lease("h1", 100, TTL) is not None  # "leased"
    assert s.lease("h2", 100, TTL) is not None  # "sent"
    assert s.mark_dispatched("sent", "h2", "bot-1").recorded
    before = jobs.state()
    for run_id in ("leased", "sent", "gone", "failed", "missing"):
        assert s.reschedule(run_id, 9_000, now=100 + TTL - 1) is None, run_id
    assert jobs.state() == before
    # and the lease's holder still marks it at the time it was leased for
    assert s.mark_dispatched("leased", "h1", "bot-2").recorded


def test_reschedule_clears_an_expired_lease(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    leased = s.lease("h1", 100, TTL)
    assert leased is not None
    moved = s.reschedule("r1", 5_000, now=100 + TTL)  # lease_until <= now: expired
    assert moved == _job("r1", 5_000, lease_sequence=leased.lease_sequence)
    # the old holder can no longer mark, release or renew it
    assert not s.mark_dispatched("r1", "h1", "bot-1").recorded
    assert s.release("r1", "h1", 200) is False
    assert s.renew("r1", "h1", 100 + TTL, TTL) is False
    again = s.lease("h2", 5_000, TTL)
    assert again is not None and again.lease_sequence > leased.lease_sequence
    assert again.attempts == 2  # attempts kept


def test_cancel_answers(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    assert s.cancel("nope") == CancelResult.MISSING
    s.schedule("r1", 100)
    assert s.cancel("r1") == CancelResult.CANCELLED
    assert s.cancel("r1") == CancelResult.CANCELLED  # again: still "cancelled"
    assert s.get("r1") == _job("r1", 100, cancelled=True)
    assert s.lease("h1", 1_000, TTL) is None


def test_cancel_dispatched_changes_nothing(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h1", 100, TTL) is not None
    assert s.mark_dispatched("r1", "h1", "bot").recorded
    before = jobs.state()
    assert s.cancel("r1") == CancelResult.ALREADY_DISPATCHED
    assert jobs.state() == before


def test_cancel_result_is_a_string_enum(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    answer = s.cancel("r1")
    assert isinstance(answer, CancelResult) and isinstance(answer, str)
    assert answer == "cancelled" and str(answer) == "cancelled"
    assert s.cancel("nope") == "missing"


# --- list_dispatched ----------------------------------------------------------------------


def test_list_dispatched_returns_every_dispatched_job_by_run_id(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    assert s.list_dispatched() == []
    for run_id in ["b", "a", "c", "pending"]:
        s.schedule(run_id, 100 if run_id != "pending" else 10_000)
    for _ in range(3):
        leased = s.lease("h1", 100, TTL)
        assert leased is not None
        assert s.mark_dispatched(leased.run_id, "h1", f"w-{leased.run_id}").recorded
    listed = s.list_dispatched()
    assert [j.run_id for j in listed] == ["a", "b", "c"]
    assert all(j.dispatched and j.worker_id == f"w-{j.run_id}" for j in listed)
    assert listed == [j for j in jobs.state() if j.dispatched]


# --- purge ----------------------------------------------------------------------------------


def _finished_and_waiting(jobs: JobStoreUnderTest) -> int:
    """Dispatched "d", cancelled "c", cancelled under a live lease "cl", pending "p", leased
    "l"; returns the store's clock after all of it (every finish lies before it)."""
    s = jobs.store
    clock = s.now_ms()
    for run_id in ("d", "c", "cl", "l"):
        s.schedule(run_id, clock - 60_000)
    s.schedule("p", clock + 3_600_000)
    leased = s.lease("h", None, 3_600_000)
    assert leased is not None and leased.run_id == "c"
    assert s.release("c", "h", clock - 60_000)  # "c" is cancelled unleased
    assert s.cancel("c") == CancelResult.CANCELLED
    for run_id in ("cl", "d", "l"):
        taken = s.lease("h", None, 3_600_000)
        assert taken is not None and taken.run_id == run_id
    assert s.cancel("cl") == CancelResult.CANCELLED
    assert s.mark_dispatched("d", "h", "w").recorded
    assert s.release("d", "h", 1) is False  # dispatched: stays
    return int(s.now_ms()) + 1


def test_purge_deletes_only_finished_jobs_without_a_live_lease(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    after = _finished_and_waiting(jobs)
    kept = [j for j in jobs.state() if j.run_id in ("cl", "l", "p")]
    # "d" was dispatched under a live lease: that lease still protects it.
    assert s.purge(after, 100) == 1
    assert [j.run_id for j in jobs.state()] == ["cl", "d", "l", "p"]
    assert [j for j in jobs.state() if j.run_id != "d"] == kept


def test_purge_honours_before_and_limit_oldest_first(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    clock = s.now_ms()
    for run_id in ("a", "b", "c"):
        s.schedule(run_id, clock + 3_600_000)
        assert s.cancel(run_id) == CancelResult.CANCELLED
    s.schedule("waiting", clock - 1)
    assert s.purge(0, 10) == 0  # nothing finished before the epoch
    assert s.purge(clock - 60_000, 10) == 0  # nor a minute before these cancels
    assert len(jobs.state()) == 4
    after = int(s.now_ms()) + 1
    assert s.purge(after, 2) == 2
    assert s.purge(after, 2) == 1
    assert s.purge(after, 2) == 0
    assert [j.run_id for j in jobs.state()] == ["waiting"]
    assert s.purge(2**63 - 1, 2**31 - 1) == 0  # the largest arguments: fine, nothing finished


def test_finished_at_is_not_moved_by_a_second_mark_or_cancel(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    clock = s.now_ms()
    s.schedule("r", clock - 1)
    assert s.cancel("r") == CancelResult.CANCELLED
    after = int(s.now_ms()) + 1
    assert s.cancel("r") == CancelResult.CANCELLED  # again, later: finished_at stays
    assert s.purge(after, 10) == 1


# --- the database clock ---------------------------------------------------------------------


def test_now_none_uses_the_store_clock(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    clock = s.now_ms()
    s.schedule("past", clock - 60_000)
    s.schedule("future", clock + 3_600_000)
    leased = s.lease("h1", None, 60_000)
    assert leased is not None and leased.run_id == "past"
    assert leased.lease_until is not None
    assert clock + 60_000 <= leased.lease_until <= s.now_ms() + 60_000
    assert s.lease("h1", None, 60_000) is None
    assert s.renew("past", "h1", None, 120_000) is True


# --- attempts, failed jobs and retry -----------------------------------------------------


def _fail_once(s: JobStore, run_id: str, at: int, error: str | None = "boom") -> Job:
    """Lease ``run_id`` (the only due job) at ``at`` and release it with ``error``."""
    leased = present(s.lease("h", at, TTL))
    assert leased.run_id == run_id
    assert s.release(run_id, "h", at, leased.lease_sequence, error) is True
    return leased


def test_every_lease_counts_an_attempt_and_the_default_maximum_is_25(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert present(s.get("r1")).max_attempts == DEFAULT_MAX_ATTEMPTS == 25
    first = present(s.lease("h", 100, TTL))
    assert (first.attempts, first.last_attempt, first.state) == (1, False, "waiting")
    assert s.release("r1", "h", 100) is True  # the old form: no error, attempts kept
    assert present(s.lease("h", 100, TTL)).attempts == 2
    # An expired lease counts too: the next lease is attempt 3.
    assert present(s.lease("h2", 100 + TTL, TTL)).attempts == 3
    assert present(s.get("r1")).attempts == 3


def test_release_of_the_last_attempt_fails_the_job_for_good(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100, 2)
    s.schedule("later", 10**6)
    _fail_once(s, "r1", 100, "timeout")
    assert present(s.get("r1")) == _job(
        "r1", 100, lease_sequence=1, attempts=1, max_attempts=2, last_error="timeout")
    last = present(s.lease("h", 200, TTL))
    assert (last.attempts, last.last_attempt) == (2, True)
    assert s.release("r1", "h", 300, last.lease_sequence) is True  # no error: the last kept
    failed = present(s.get("r1"))
    assert failed == _job("r1", 100, lease_sequence=2, attempts=2, max_attempts=2,
                          last_error="timeout", failed=True)
    assert failed.state == "failed"
    # Never leased again, whatever the time; nothing of the holder's works on it.
    assert s.lease("h", 10**7, TTL) is not None  # "later"
    assert s.lease("h", 10**7, TTL) is None
    assert s.renew("r1", "h", 200, TTL) is False
    assert s.mark_dispatched("r1", "h", "w") == MarkResult(cancelled=False, recorded=False)
    assert s.release("r1", "h", 300) is False
    # schedule moves dispatch_at only: it stays failed.
    s.schedule("r1", 50)
    assert present(s.get("r1")).failed
    assert s.list_failed() == [replace(failed, dispatch_at=50)]


def test_schedule_max_attempts_is_kept_unless_given_again(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100, 3)
    s.schedule("r1", 200)
    assert present(s.get("r1")).max_attempts == 3
    s.schedule("r1", 200, 1)
    assert present(s.get("r1")).max_attempts == 1
    _fail_once(s, "r1", 200)
    assert present(s.get("r1")).state == "failed"


def test_retry_puts_a_failed_job_back_with_attempts_reset(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100, 1)
    s.schedule("waiting", 10**6)
    _fail_once(s, "r1", 100, "e1")
    assert s.retry("waiting", 5) == RetryResult.NOT_FAILED
    assert s.retry("nope", 5) == RetryResult.MISSING
    assert s.retry("r1", 500) == RetryResult.RETRIED
    assert str(RetryResult.RETRIED) == "retried"
    assert present(s.get("r1")) == _job(
        "r1", 500, lease_sequence=1, attempts=0, max_attempts=1, last_error="e1")
    assert s.retry("r1", 500) == RetryResult.NOT_FAILED
    assert s.list_failed() == []
    assert s.lease("h", 499, TTL) is None
    again = present(s.lease("h", 500, TTL))
    assert (again.run_id, again.attempts, again.lease_sequence) == ("r1", 1, 2)
    assert s.release("r1", "h", 600, again.lease_sequence, "e2") is True
    assert present(s.get("r1")).last_error == "e2" and present(s.get("r1")).failed
    # dispatch_at None: the store's clock.
    clock = s.now_ms()
    assert s.retry("r1") == RetryResult.RETRIED
    assert clock <= present(s.get("r1")).dispatch_at <= s.now_ms()


def test_a_cancelled_failed_job_is_cancelled_and_not_retried(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100, 1)
    _fail_once(s, "r1", 100)
    assert s.cancel("r1") == CancelResult.CANCELLED
    job = present(s.get("r1"))
    assert (job.state, job.failed, job.cancelled) == ("cancelled", True, True)
    assert s.retry("r1", 0) == RetryResult.NOT_FAILED
    assert s.list_failed() == []


def test_a_cancelled_job_released_out_of_attempts_stays_cancelled(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100, 1)
    leased = present(s.lease("h", 100, TTL))
    assert s.cancel("r1") == CancelResult.CANCELLED
    assert s.release("r1", "h", 100, leased.lease_sequence, "x") is True
    assert present(s.get("r1")).state == "cancelled"


def test_list_failed_by_dispatch_at_then_run_id_with_a_limit(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    for run_id, at in (("c", 30), ("b", 10), ("a", 30), ("ok", 5)):
        s.schedule(run_id, at, 1 if run_id != "ok" else 5)
    for expected in ("ok", "b", "a", "c"):
        _fail_once(s, expected, 100)
    assert [j.run_id for j in s.list_failed()] == ["b", "a", "c"]
    assert [j.run_id for j in s.list_failed(2)] == ["b", "a"]
    assert all(j.state == "failed" and j.last_error == "boom" for j in s.list_failed())


def test_purge_deletes_failed_jobs(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("failed", 100, 1)
    s.schedule("waiting", 100, 3)
    _fail_once(s, "failed", 100)
    _fail_once(s, "waiting", 100)
    assert s.purge(2**62, 10) == 1
    assert [j.run_id for j in jobs.state()] == ["waiting"]


def test_release_error_of_4096_characters_is_kept(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    leased = present(s.lease("h", 100, TTL))
    wide = "é" * 4096  # characters, not bytes
    assert s.release("r1", "h", 100, leased.lease_sequence, wide) is True
    assert present(s.get("r1")).last_error == wide


# --- batches: the single-job rules for many jobs in one call ------------------------------


def test_schedule_many_adds_jobs_and_moves_only_dispatch_at_of_existing_ones(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("old", 100)
    assert s.lease("h1", 100, TTL) is not None
    s.schedule_many(["new", "old"], [300, 200])
    assert jobs.state() == [
        _job("new", 300),
        _job("old", 200, lease_holder="h1", lease_until=100 + TTL, lease_sequence=1),
    ]
    s.schedule_many([], [])
    assert len(jobs.state()) == 2


def test_lease_many_leases_up_to_limit_in_lease_order_as_repeated_leases_would(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule_many(["e", "d", "c", "b", "a", "later"], [20, 10, 10, 30, 40, 9_000])
    s.cancel("b")
    assert s.lease("other", 100, TTL) is not None  # c: held, skipped below
    leased = s.lease_many("h1", 100, TTL, 2)
    assert [(j.run_id, j.lease_holder, j.lease_until, j.lease_sequence) for j in leased] == [
        ("d", "h1", 100 + TTL, 1), ("e", "h1", 100 + TTL, 1)]
    assert [j.run_id for j in s.lease_many("h2", 100, TTL, 10)] == ["a"]
    assert s.lease_many("h3", 100, TTL, 10) == []
    # Expired leases are leased again, with the next lease sequence.
    again = s.lease_many("h4", 100 + TTL, TTL, 10)
    assert [(j.run_id, j.lease_sequence) for j in again] == [
        ("c", 2), ("d", 2), ("e", 2), ("a", 2)]
    assert all(s.get(j.run_id) == j for j in again)


def test_lease_many_counts_attempts_and_never_leases_a_failed_job(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("f", 10, 1)
    s.schedule_many(["a", "b"], [20, 30])
    assert present(s.get("a")).max_attempts == DEFAULT_MAX_ATTEMPTS  # the store's default
    leased = s.lease_many("h", 100, TTL, 10)
    assert [(j.run_id, j.attempts) for j in leased] == [("f", 1), ("a", 1), ("b", 1)]
    assert s.release("f", "h", 100, leased[0].lease_sequence) is True  # its last attempt
    assert present(s.get("f")).failed
    again = s.lease_many("h2", 100 + TTL, TTL, 10)  # a and b expired; f failed for good
    assert [(j.run_id, j.attempts) for j in again] == [("a", 2), ("b", 2)]
    assert [j.run_id for j in s.lease_many("h3", 10**9, TTL, 10)] == ["a", "b"]  # never f


def test_mark_dispatched_many_answers_each_job_as_mark_dispatched_would(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule_many(["a", "b", "c", "d"], [10, 20, 30, 40])
    held = {j.run_id: j for j in s.lease_many("h1", 100, TTL, 3)}  # a, b, c
    s.cancel("b")
    assert s.lease("h2", 100, TTL) is not None  # d, another holder's
    answers = s.mark_dispatched_many(
        ["d", "c", "b", "a", "gone"], "h1", ["w-d", None, "w-b", "w-a", "w"],
        [None, held["c"].lease_sequence + 1, None, held["a"].lease_sequence, None],
    )
    assert answers == [
        MarkResult(cancelled=False, recorded=False),  # d: h2 holds it
        MarkResult(cancelled=False, recorded=False),  # c: another lease's fence
        MarkResult(cancelled=True, recorded=True),  # b: recorded; the bot must leave
        MarkResult(cancelled=False, recorded=True),  # a
        MarkResult(cancelled=False, recorded=False),  # gone
    ]
    state = {j.run_id: j for j in jobs.state()}
    assert (state["a"].dispatched, state["a"].worker_id) == (True, "w-a")
    assert (state["b"].dispatched, state["b"].worker_id) == (True, "w-b")
    assert not state["c"].dispatched and not state["d"].dispatched
    assert s.mark_dispatched_many([], "h1", []) == []
    # After an expiry nobody else took: still recorded (a dispatch can outlive its lease).
    assert s.mark_dispatched_many(["c"], "h1", ["w-c"]) == [MarkResult(False, True)]


def test_mark_dispatched_many_of_only_recorded_jobs_answers_in_the_order_given(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule_many(["a", "b", "c", "d"], [10, 20, 30, 40])
    held = {j.run_id: j for j in s.lease_many("h1", 100, TTL, 4)}
    order = ["c", "a", "b"]
    assert s.mark_dispatched_many(order, "h1", ["w-c", "w-a", None],
                                  [held[r].lease_sequence for r in order]) == [
        MarkResult(cancelled=False, recorded=True)] * 3
    s.cancel("d")  # leased, then cancelled: recorded, and the bot must leave
    assert s.mark_dispatched_many(["d", "a"], "h1", ["w-d", "w-a"]) == [
        MarkResult(cancelled=True, recorded=True), MarkResult(cancelled=False, recorded=True)]
    state = {j.run_id: j for j in jobs.state()}
    assert [(state[r].dispatched, state[r].worker_id) for r in "abcd"] == [
        (True, "w-a"), (True, None), (True, "w-c"), (True, "w-d")]


def test_renew_many_answers_each_job_as_renew_would(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule_many(["a", "b", "c"], [10, 20, 30])
    held = s.lease_many("h1", 100, TTL, 2)  # a, b
    assert s.lease("h2", 100, TTL) is not None  # c
    fences = [held[0].lease_sequence, held[1].lease_sequence + 1, None, None]
    assert s.renew_many(["a", "b", "c", "gone"], "h1", 500, 5 * TTL, fences) == [
        True, False, False, False]
    assert s.get("a") == _job("a", 10, lease_holder="h1", lease_until=500 + 5 * TTL,
                              lease_sequence=1)
    assert s.get("b") == _job("b", 20, lease_holder="h1", lease_until=100 + TTL,
                              lease_sequence=1)
    assert s.renew_many(["b"], "h1", 100 + TTL, TTL) == [False]  # expired
    assert s.renew_many([], "h1", 100, TTL) == []


# --- bad input (docs/contract.md) -------------------------------------------------------------------

BAD_CALLS: list[tuple[str, str, tuple[Any, ...]]] = [
    ("schedule", "run_id", ("", 1)),
    ("schedule", "run_id", (None, 1)),
    ("schedule", "run_id", (LONG, 1)),
    ("schedule", "dispatch_at", ("r", None)),
    ("reschedule", "run_id", ("", 1)),
    ("reschedule", "run_id", (None, 1)),
    ("reschedule", "run_id", (LONG, 1)),
    ("reschedule", "dispatch_at", ("r1", None)),
    ("lease", "holder", ("", 100, TTL)),
    ("lease", "holder", (None, 100, TTL)),
    ("lease", "holder", (LONG, 100, TTL)),
    ("lease", "ttl_ms", ("h", 100, 0)),
    ("lease", "ttl_ms", ("h", 100, -1)),
    ("lease", "ttl_ms", ("h", 100, None)),
    ("renew", "run_id", ("", "h", 100, TTL)),
    ("renew", "run_id", (None, "h", 100, TTL)),
    ("renew", "holder", ("live", "", 100, TTL)),
    ("renew", "holder", ("live", LONG, 100, TTL)),
    ("renew", "ttl_ms", ("live", "h", 100, 0)),
    ("renew", "ttl_ms", ("live", "h", 100, None)),
    ("mark_dispatched", "run_id", ("", "h", "w")),
    ("mark_dispatched", "run_id", (LONG, "h", "w")),
    ("mark_dispatched", "holder", ("live", "", "w")),
    ("mark_dispatched", "holder", ("live", None, "w")),
    ("mark_dispatched", "worker_id", ("live", "h", LONG)),
    ("release", "run_id", ("", "h", 1)),
    ("release", "holder", ("live", "", 1)),
    ("release", "holder", ("live", LONG, 1)),
    ("release", "retry_at", ("live", "h", None)),
    ("release", "error", ("live", "h", 1, None, "e" * 4097)),
    ("release", "error", ("live", "h", 1, None, "é" * 4097)),
    ("schedule", "max_attempts", ("live", 1, 0)),
    ("schedule", "max_attempts", ("new", 1, -1)),
    ("schedule", "max_attempts", ("new", 1, -(2**31) - 1)),
    ("retry", "run_id", ("", 1)),
    ("retry", "run_id", (None, None)),
    ("retry", "run_id", (LONG, 1)),
    ("list_failed", "limit", (0,)),
    ("list_failed", "limit", (-1,)),
    ("cancel", "run_id", ("",)),
    ("cancel", "run_id", (None,)),
    ("cancel", "run_id", (LONG,)),
    ("get", "run_id", ("",)),
    ("get", "run_id", (LONG,)),
    ("remove", "run_id", ("",)),
    ("remove", "run_id", (None,)),
    ("purge", "before", (None, 10)),
    ("purge", "before", (-1, 10)),
    ("purge", "before", (-(2**63), 10)),
    ("purge", "limit", (2**62, 0)),
    ("purge", "limit", (2**62, -1)),
    ("purge", "limit", (2**62, None)),
    ("schedule_many", "run_ids", (None, [1])),
    ("schedule_many", "run_ids", (["r", ""], [1, 2])),
    ("schedule_many", "run_ids", (["r", None], [1, 2])),
    ("schedule_many", "run_ids", (["r", LONG], [1, 2])),
    ("schedule_many", "run_ids", (["pending", "pending"], [1, 2])),
    ("schedule_many", "run_ids", ([f"r{i}" for i in range(10_001)], [0] * 10_001)),
    ("schedule_many", "dispatch_at", (["r", "s"], [1])),
    ("schedule_many", "dispatch_at", (["r", "s"], [1, None])),
    ("lease_many", "holder", ("", 100, TTL, 5)),
    ("lease_many", "ttl_ms", ("h", 100, 0, 5)),
    ("lease_many", "limit", ("h", 100, TTL, 0)),
    ("lease_many", "limit", ("h", 100, TTL, None)),
    ("lease_many", "limit", ("h", 100, TTL, 10_001)),
    ("mark_dispatched_many", "run_ids", (["live", "live"], "h", ["w", "w"])),
    ("mark_dispatched_many", "run_ids", (["live", "live"], "h", ["w", LONG])),
    ("mark_dispatched_many", "run_ids", (["live", "live", "gone"], "h", ["w", "w", "w"])),
    ("mark_dispatched_many", "holder", (["live"], "", ["w"])),
    ("mark_dispatched_many", "worker_ids", (["live"], "h", [])),
    ("mark_dispatched_many", "worker_ids", (["live"], "h", [LONG])),
    ("mark_dispatched_many", "lease_sequences", (["live"], "h", ["w"], [0])),
    ("mark_dispatched_many", "lease_sequences", (["live"], "h", ["w"], [2, 2])),
    ("renew_many", "run_ids", ([""], "h", 100, TTL)),
    ("renew_many", "holder", (["live"], None, 100, TTL)),
    ("renew_many", "ttl_ms", (["live"], "h", 100, -1)),
    ("renew_many", "lease_sequences", (["live"], "h", 100, TTL, [-1])),
]


def _populated(jobs: JobStoreUnderTest) -> None:
    """Pending, live-leased, dispatched and cancelled jobs, for bad calls to leave alone."""
    s = jobs.store
    s.schedule("dispatched", 50)
    s.schedule("live", 60)
    s.schedule("cancelled", 70)
    s.schedule("pending", 5_000)
    assert s.lease("h", 100, TTL) is not None
    assert s.mark_dispatched("dispatched", "h", "w").recorded
    assert s.lease("h", 100, TTL) is not None
    assert s.cancel("cancelled") == CancelResult.CANCELLED


@pytest.mark.parametrize(
    ("method", "param", "args"),
    BAD_CALLS,
    ids=[f"{m}-{p}-{i}" for i, (m, p, _) in enumerate(BAD_CALLS)],
)
def test_bad_input_is_rejected_and_changes_nothing(
    jobs: JobStoreUnderTest, method: str, param: str, args: tuple[Any, ...]
) -> None:
    _populated(jobs)
    before = jobs.state()
    with pytest.raises(InvalidArgument) as raised:
        getattr(jobs.store, method)(*args)
    assert raised.value.sqlstate == "22023"
    assert param in str(raised.value)
    assert jobs.state() == before


def test_names_of_exactly_1024_characters_are_fine(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule(OK_1024, 100)
    leased = s.lease(OK_1024, 100, TTL)
    assert leased is not None and leased.lease_holder == OK_1024
    assert s.renew(OK_1024, OK_1024, 100, TTL)
    assert s.mark_dispatched(OK_1024, OK_1024, OK_1024) == MarkResult(False, True)
    job = s.get(OK_1024)
    assert job is not None and job.worker_id == OK_1024


def test_lengths_count_characters_not_bytes(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    wide = "é" * 1024  # 2048 bytes in UTF-8
    s.schedule(wide, 100)
    assert s.get(wide) is not None
    with pytest.raises(InvalidArgument):
        s.schedule(wide + "é", 100)


def test_empty_worker_id_and_none_are_accepted(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100)
    assert s.lease("h", 100, TTL) is not None
    assert s.mark_dispatched("r1", "h", "").recorded
    job = s.get("r1")
    assert job is not None and job.worker_id == ""


@pytest.mark.parametrize("method", ["lease", "renew"])
def test_lease_overflow_is_22003_and_changes_nothing(jobs: JobStoreUnderTest, method: str) -> None:
    _populated(jobs)
    before = jobs.state()
    big = 2**63 - 1
    with pytest.raises(InvalidArgument) as raised:
        if method == "lease":
            jobs.store.lease("h", big, TTL)
        else:
            jobs.store.renew("live", "h", big - 10, TTL)
    assert raised.value.sqlstate == "22003"
    assert jobs.state() == before


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.schedule("r", 2**63),
        lambda s: s.schedule("r", True),
        lambda s: s.schedule(7, 1),
        lambda s: s.schedule("r\x00", 1),
        lambda s: s.lease("h", 1, 2**63),
        lambda s: s.lease("h", "1", 1),
        lambda s: s.renew("live", "h", 1.5, 1),
        lambda s: s.mark_dispatched("live", "h", "w\x00"),
        lambda s: s.mark_dispatched("live", "h", 7),
        lambda s: s.release("live", "h", -(2**63) - 1),
        lambda s: s.cancel(b"live"),
        lambda s: s.purge(2**63, 10),
        lambda s: s.purge(2**62, 2**31),
        lambda s: s.purge(1.5, 10),
        lambda s: s.purge(2**62, True),
        lambda s: s.schedule("r", 1, 2**31),
        lambda s: s.schedule("r", 1, True),
        lambda s: s.schedule("r", 1, 1.5),
        lambda s: s.release("live", "h", 1, None, 7),
        lambda s: s.release("live", "h", 1, None, "e\x00"),
        lambda s: s.retry("live", 2**63),
        lambda s: s.retry("live", "1"),
        lambda s: s.list_failed(2**31),
        lambda s: s.list_failed(True),
        lambda s: s.schedule_many("live", [1, 2, 3, 4]),
        lambda s: s.schedule_many(["r"], [2**63]),
        lambda s: s.schedule_many(["r\x00"], [1]),
        lambda s: s.lease_many("h", 100, TTL, 2**31),
        lambda s: s.lease_many("h", 100, TTL, True),
        lambda s: s.mark_dispatched_many(["live"], "h", [7]),
        lambda s: s.mark_dispatched_many(["live"], "h", ["w"], [1.5]),
        lambda s: s.renew_many(("live",), "h", 100, TTL, [2**63]),
        lambda s: s.renew_many(["live"], "h", 2**63 - 1, TTL),
    ],
)
def test_python_level_bad_values_raise_invalid_argument(
    jobs: JobStoreUnderTest, call: Callable[[JobStore], object]
) -> None:
    _populated(jobs)
    before = jobs.state()
    with pytest.raises(InvalidArgument):
        call(jobs.store)
    assert jobs.state() == before


# --- remove: only a waiting job with no lease holder -------------------------------------


def test_remove_refuses_a_finished_or_leased_job_and_changes_nothing(
    jobs: JobStoreUnderTest,
) -> None:
    """remove is the client's: it never erases a dispatch (history is the owner's, purge),
    nor a job a dispatcher may still be dispatching, even past its lease."""
    s = jobs.store
    for run_id in ("cancelled", "dispatched", "expired", "failed", "leased"):
        s.schedule(run_id, 100, 1 if run_id == "failed" else None)
    s.schedule("released", 100)
    s.schedule("waiting", 100)
    assert s.cancel("cancelled") == CancelResult.CANCELLED
    for holder in ("h-d", "h-e", "h-f", "h-l", "h-r"):  # in lease order: d, e, f, l, r
        present(s.lease(holder, 100, TTL))
    assert s.mark_dispatched("dispatched", "h-d", "bot").recorded
    assert s.release("failed", "h-f", 100) is True  # its only attempt: failed
    assert s.release("released", "h-r", 10**9) is True  # waits again, no holder
    assert present(s.renew("leased", "h-l", 100, 10**12)) is True
    # "expired": its lease ended at 100 + TTL; nobody took it since.
    before = jobs.state()
    states = {"cancelled": "cancelled", "dispatched": "dispatched", "failed": "failed",
              "leased": "leased", "expired": "leased"}
    for run_id, state in states.items():
        with pytest.raises(JobNotRemovable, match=f"is {state}") as refused:
            s.remove(run_id)
        assert refused.value.sqlstate == "55000"
        assert jobs.state() == before, run_id
    s.remove("waiting")
    s.remove("released")
    s.remove("nope")
    assert [j for j in jobs.state()] == [j for j in before if j.run_id in states]


# --- a run id that comes back is leased above its old leases ------------------------------


def test_a_purged_run_id_scheduled_again_is_leased_above_its_old_leases(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("r", 100)
    old = [present(s.lease("h", 100 + i * TTL, TTL)).lease_sequence for i in range(3)]
    assert old == [1, 2, 3]  # each lease expired; nobody released or marked
    assert s.cancel("r") == CancelResult.CANCELLED
    assert s.purge(int(s.now_ms()) + 1, 10) == 1
    s.schedule("r", 100)
    again = present(s.lease("h", 10_000, TTL))  # the same holder name, say a restart
    assert again.lease_sequence > 3
    # The old dispatches, each past its lease, mark with their own lease's sequence:
    # none of them is taken for the new lease.
    for sequence in old:
        assert s.mark_dispatched("r", "h", "bot-old", sequence) == MarkResult(False, False)
        assert s.renew("r", "h", 10_000, TTL, sequence) is False
        assert s.release("r", "h", 0, sequence) is False
    assert present(s.get("r")) == again
    assert s.mark_dispatched("r", "h", "bot", again.lease_sequence).recorded


def test_a_removed_run_id_scheduled_again_is_leased_above_its_old_leases(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("r", 100)
    first = present(s.lease("h", 100, TTL))
    assert first.lease_sequence == 1
    assert s.release("r", "h", 100, 1) is True  # a retry, say; the job waits unleased
    s.remove("r")
    s.schedule("r", 100)
    again = present(s.lease("h", 200, TTL))
    assert again.lease_sequence == 2  # not 1 again
    assert s.mark_dispatched("r", "h", "bot-old", 1) == MarkResult(False, False)
    assert present(s.get("r")) == again
    # The mark covers every run id: a new one is leased above it too, and a removal of a
    # job never leased lowers nothing.
    s.schedule("fresh", 100)
    s.remove("fresh")
    s.schedule("other", 100)
    assert present(s.lease("h", 300, TTL)).lease_sequence == 2


# --- max_attempts: a job is leased at most that many times ---------------------------------


def test_a_job_whose_last_lease_expires_is_failed_by_the_next_lease(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("poison", 100, 2)
    first = present(s.lease("h1", 100, TTL))
    second = present(s.lease("h2", 100 + TTL, TTL))  # the first lease expired
    assert (first.attempts, second.attempts) == (1, 2) and second.last_attempt
    before = s.now_ms()
    assert s.lease("h3", 100 + 2 * TTL, TTL) is None  # the second expired too: failed
    failed = present(s.get("poison"))
    assert failed == replace(
        second, lease_holder=None, lease_until=None, failed=True,
        last_error="out of attempts: leased 2 times (max_attempts 2), the last lease expired"
                   " without a release",
    )
    assert failed.state == "failed" and s.list_failed() == [failed]
    assert s.lease("h3", 10**9, TTL) is None  # never leased again
    # Its lease is cleared, so the old holders' late calls find nothing of theirs.
    assert s.mark_dispatched("poison", "h2", "bot", 2) == MarkResult(False, False)
    assert s.release("poison", "h2", 0, 2) is False
    # finished: purge deletes it once its finish lies before the cutoff (not before).
    assert s.purge(before - 60_000, 10) == 0
    assert s.retry("poison", 100) == RetryResult.RETRIED
    back = present(s.lease("h4", 10**9, TTL))
    assert (back.run_id, back.attempts, back.failed, back.lease_sequence) == ("poison", 1, False, 3)


def test_lease_many_fails_the_jobs_out_of_attempts_and_leaves_them_out(
    jobs: JobStoreUnderTest,
) -> None:
    s = jobs.store
    s.schedule("a", 10)
    s.schedule("b", 20, 1)
    s.schedule("c", 30)
    assert [j.run_id for j in s.lease_many("h", 100, TTL, 3)] == ["a", "b", "c"]
    again = s.lease_many("h2", 100 + TTL, TTL, 3)  # every lease expired; b had its one
    assert [(j.run_id, j.attempts) for j in again] == [("a", 2), ("c", 2)]
    b = present(s.get("b"))
    assert b.failed and b.lease_holder is None and b.attempts == 1
    assert s.purge(int(s.now_ms()) + 1, 10) == 1  # b, finished; a and c are leased
    assert [j.run_id for j in jobs.state()] == ["a", "c"]
