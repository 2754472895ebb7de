"""Schedule controls (docs/schedule-controls.md) on every schedule store: pause, resume,
trigger and per-schedule jitter, their bad input included."""

from __future__ import annotations

from typing import Any

import pytest

from pgstore import CompletePatch, InvalidArgument
from pgstore.models import MAX_JITTER_MS, jitter_due_at
from pgstore.protocols import ScheduleStore
from tests.conftest import StoreUnderTest, present

LEASE = 1_000
HOUR = 3_600_000


def _registered(s: ScheduleStore, id: str = "t", next_run_at: int | None = 100) -> None:
    s.register(id, "interval", "1000", next_run_at, 10)


# --- pause and resume ----------------------------------------------------------------------


def test_a_paused_schedule_is_never_claimed_until_resumed(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s, "t")
    _registered(s, "u", 200)
    paused = present(s.pause("t", 50))
    assert paused.paused and paused.updated_at == 50
    assert (paused.next_run_at, paused.fencing_token) == (100, 0)
    assert s.claim_due("t", "w", 5_000, LEASE) is None
    assert [c.record.id for c in s.claim_next("w", 5_000, LEASE, 10)] == ["u"]
    assert s.claim_next("w", 9_000, LEASE, 10, ["t"]) == []
    resumed = present(s.resume("t", 9_500))
    assert not resumed.paused and resumed.updated_at == 9_500
    # next_run_at is where the pause left it: the claimer meets what was missed.
    assert resumed.next_run_at == 100
    claim = present(s.claim_due("t", "w", 10_000, LEASE))
    assert claim.fencing_token == 1 and claim.record.next_run_at == 100


def test_pause_and_resume_are_idempotent_and_unknown_ids_answer_none(
    schedules: StoreUnderTest,
) -> None:
    s = schedules.store
    _registered(s)
    first = present(s.pause("t", 50))
    assert s.pause("t", 60) == first  # already paused: untouched
    assert s.pause("nope", 60) is None and s.resume("nope", 60) is None
    resumed = present(s.resume("t", 70))
    assert s.resume("t", 80) == resumed
    assert s.get("nope") is None


def test_a_lease_held_when_paused_runs_on(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    claim = present(s.claim_due("t", "w", 100, LEASE))
    assert present(s.pause("t", 150)).lease_owner == "w"
    assert s.renew("t", claim.fencing_token, 1_500)
    assert s.complete("t", claim.fencing_token, CompletePatch(2_000, 100, "ok"), 300)
    done = present(s.get("t"))
    assert done.paused and done.next_run_at == 2_000 and done.lease_owner is None
    assert s.claim_due("t", "w", 9_000, LEASE) is None


def test_register_never_unpauses(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    s.pause("t", 20)
    assert present(s.register("t", "interval", "1000", 100, 30)).paused  # a restart
    changed = s.register("t", "cron", "0 * * * *", 500, 40, "all", 1_000)  # another spec
    assert changed.paused and changed.next_run_at == 500
    assert s.claim_due("t", "w", 9_000_000, LEASE) is None


# --- trigger ---------------------------------------------------------------------------------


def test_trigger_runs_once_now_without_moving_the_next_occurrence(
    schedules: StoreUnderTest,
) -> None:
    s = schedules.store
    _registered(s, "t", 5_000)
    claim = present(s.claim_due("t", "w", 5_000, LEASE))
    assert s.complete("t", claim.fencing_token, CompletePatch(HOUR, 5_000, "ok"), 5_100)
    triggered = present(s.trigger("t", 6_000))
    assert (triggered.triggered_at, triggered.next_run_at) == (6_000, HOUR)
    assert triggered.fencing_token == claim.fencing_token  # no holder to fence
    run = present(s.claim_due("t", "w2", 6_001, LEASE))  # not due: triggered
    assert run.fencing_token == claim.fencing_token + 1
    assert run.record.triggered_at == 6_000 and run.record.lease_owner == "w2"
    # The holder's complete says 9_999, as a scheduler that knew nothing of the trigger
    # would: the regular occurrence stays where it was.
    assert s.complete("t", run.fencing_token, CompletePatch(9_999, 6_001, "error"), 6_500)
    after = present(s.get("t"))
    assert (after.next_run_at, after.due_at, after.triggered_at) == (HOUR, HOUR, None)
    assert (after.last_run_at, after.last_status, after.consecutive_failures) == (
        6_001, "error", 1
    )
    assert s.claim_due("t", "w", 7_000, LEASE) is None  # runs once
    regular = present(s.claim_due("t", "w", HOUR, LEASE))
    assert regular.record.triggered_at is None
    assert s.complete("t", regular.fencing_token, CompletePatch(2 * HOUR, HOUR, "ok"), HOUR)
    assert present(s.get("t")).next_run_at == 2 * HOUR  # a regular complete moves it


def test_trigger_is_refused_while_paused_leased_or_unknown(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s, "t")
    _registered(s, "u")
    s.pause("u", 20)
    present(s.claim_due("t", "w", 100, LEASE))  # live until 1_100
    before = schedules.state()
    assert s.trigger("t", 1_099) is None
    assert s.trigger("u", 1_099) is None
    assert s.trigger("nope", 1_099) is None
    assert schedules.state() == before


def test_trigger_fences_an_expired_holder(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    stale = present(s.claim_due("t", "w", 100, LEASE))  # expires at 1_100
    triggered = present(s.trigger("t", 1_100))
    assert triggered.fencing_token == stale.fencing_token + 1
    assert (triggered.lease_owner, triggered.lease_until) == (None, None)
    assert not s.renew("t", stale.fencing_token, 1_900)
    assert not s.complete("t", stale.fencing_token, CompletePatch(7, 100, "ok"), 1_200)
    run = present(s.claim_due("t", "w2", 1_300, LEASE))
    assert run.fencing_token == stale.fencing_token + 2
    assert s.complete("t", run.fencing_token, CompletePatch(7, 1_300, "ok"), 1_400)
    after = present(s.get("t"))
    assert (after.next_run_at, after.triggered_at) == (100, None)  # the regular one, still due
    assert present(s.claim_due("t", "w", 1_500, LEASE)).record.next_run_at == 100


def test_a_pending_trigger_keeps_its_time_and_survives_a_pause(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s, "t", HOUR)
    assert present(s.trigger("t", 100)).triggered_at == 100
    assert present(s.trigger("t", 200)).triggered_at == 100
    s.pause("t", 300)
    assert s.claim_due("t", "w", 400, LEASE) is None
    s.resume("t", 500)
    assert present(s.claim_due("t", "w", 600, LEASE)).record.triggered_at == 100


def test_a_triggered_tombstone_runs_once_and_stays_a_tombstone(schedules: StoreUnderTest) -> None:
    s = schedules.store
    s.register("t", "once", "1000", None, 10)
    run = present(s.claim_due("t", "w", 100, LEASE)) if s.trigger("t", 50) else None
    assert run is not None
    assert s.complete("t", run.fencing_token, CompletePatch(None, 100, "ok"), 150)
    assert present(s.get("t")).next_run_at is None
    assert s.claim_due("t", "w", 10**12, LEASE) is None


def test_claim_next_takes_triggered_and_due_by_the_earlier_time(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s, "a", 300)
    _registered(s, "b", HOUR)
    _registered(s, "c", 100)
    s.trigger("b", 200)
    claimed = s.claim_next("w", 1_000, LEASE, 10)
    assert [(c.record.id, c.record.triggered_at) for c in claimed] == [
        ("c", None), ("b", 200), ("a", None)
    ]


# --- jitter ----------------------------------------------------------------------------------


def test_jitter_delays_the_claim_by_the_documented_offset(schedules: StoreUnderTest) -> None:
    s = schedules.store
    plain = s.register("plain", "interval", "1000", HOUR, 10)
    assert (plain.jitter_ms, plain.due_at) == (0, HOUR)
    rec = s.register("t", "cron", "0 * * * *", HOUR, 10, "once", 600_000)
    assert rec.jitter_ms == 600_000 and rec.next_run_at == HOUR
    assert rec.due_at == jitter_due_at("t", HOUR, 600_000)
    assert rec.due_at is not None and HOUR <= rec.due_at < HOUR + 600_000
    if rec.due_at > HOUR:
        assert s.claim_due("t", "w", rec.due_at - 1, LEASE) is None
    claim = present(s.claim_due("t", "w", rec.due_at, LEASE))
    assert s.complete("t", claim.fencing_token, CompletePatch(2 * HOUR, HOUR, "ok"), HOUR)
    after = present(s.get("t"))
    assert after.due_at == jitter_due_at("t", 2 * HOUR, 600_000)


def test_another_jitter_alone_keeps_the_occurrence(schedules: StoreUnderTest) -> None:
    s = schedules.store
    s.register("t", "interval", "1000", HOUR, 10)
    changed = s.register("t", "interval", "1000", 5, 20, "once", 60_000)
    assert (changed.next_run_at, changed.jitter_ms, changed.updated_at) == (HOUR, 60_000, 20)
    assert changed.due_at == jitter_due_at("t", HOUR, 60_000)
    assert s.register("t", "interval", "1000", 5, 30, "once", 60_000) == changed  # untouched
    back = s.register("t", "interval", "1000", 5, 40)
    assert (back.jitter_ms, back.due_at) == (0, HOUR)


def test_the_stores_compute_the_reference_jitter(schedules: StoreUnderTest) -> None:
    s = schedules.store
    ids = ["a", "é" * 30, "report:daily", "x" * 1024]
    for n, id in enumerate(ids):
        for at in (0, -HOUR, 1_767_225_600_000 + n, 2**63 - 5):
            for jitter in (1, 7, 1_000, MAX_JITTER_MS):
                s.delete(id)
                rec = s.register(id, "interval", "1000", at, 1, "once", jitter)
                assert rec.due_at == jitter_due_at(id, at, jitter)
                assert rec.due_at is not None and at <= rec.due_at < max(at + jitter, at + 1)
    assert s.register("n", "once", "1", None, 1, "once", 1_000).due_at is None


# --- bad input: 22023 naming the parameter, nothing changed ----------------------------------

BAD_CALLS: list[tuple[str, str, tuple[Any, ...]]] = [
    ("pause", "id", ("",)),
    ("pause", "id", (None,)),
    ("pause", "id", ("x" * 1025,)),
    ("resume", "id", ("",)),
    ("resume", "id", (None,)),
    ("trigger", "id", ("",)),
    ("trigger", "id", (None,)),
    ("trigger", "id", ("x" * 1025,)),
    ("register", "jitter_ms", ("t", "interval", "1000", 1, 1, "once", -1)),  # present
    ("register", "jitter_ms", ("t", "interval", "1000", 1, 1, "once", MAX_JITTER_MS + 1)),
    ("register", "jitter_ms", ("t", "interval", "1000", 1, 1, "once", None)),
    ("register", "jitter_ms", ("new", "interval", "1000", 1, 1, "once", -5)),  # absent
]


@pytest.mark.parametrize(
    ("method", "param", "args"), BAD_CALLS,
    ids=[f"{m}-{p}-{i}" for i, (m, p, _) in enumerate(BAD_CALLS)],
)
def test_bad_input_is_rejected_and_changes_nothing(
    schedules: StoreUnderTest, method: str, param: str, args: tuple[Any, ...]
) -> None:
    s = schedules.store
    _registered(s, "t")
    _registered(s, "u")
    s.pause("u", 20)
    s.trigger("t", 30)
    before = schedules.state()
    with pytest.raises(InvalidArgument) as raised:
        getattr(s, method)(*args)
    assert raised.value.sqlstate == "22023"
    assert param in str(raised.value)
    assert schedules.state() == before
