"""The schedule rules and the bad-input rules of docs/contract.md for every schedule store: memory, PostgreSQL sync and asyncio."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pgstore import CompletePatch, InvalidArgument, LastStatus, ScheduleRecord
from pgstore.protocols import ScheduleStore
from tests.conftest import StoreUnderTest, present

LEASE = 1_000


def _registered(
    s: ScheduleStore, id: str = "t", next_run_at: int | None = 100, now: int = 10
) -> ScheduleRecord:
    return s.register(id, "interval", "1000", next_run_at, now)


def test_get_unknown_is_none(schedules: StoreUnderTest) -> None:
    assert schedules.store.get("nope") is None


def test_register_absent_inserts_at_token_zero(schedules: StoreUnderTest) -> None:
    s = schedules.store
    rec = s.register("t", "cron", "TZ=Europe/Berlin 30 2 * * *", 500, 42)
    assert (rec.id, rec.kind, rec.spec, rec.next_run_at) == (
        "t", "cron", "TZ=Europe/Berlin 30 2 * * *", 500
    )
    assert rec.fencing_token == 0
    assert rec.updated_at == 42
    assert (rec.last_run_at, rec.last_status, rec.lease_owner, rec.lease_until) == (
        None, None, None, None
    )
    assert s.get("t") == rec


def test_register_same_kind_and_spec_is_untouched(schedules: StoreUnderTest) -> None:
    s = schedules.store
    first = _registered(s)
    claim = s.claim_due("t", "w1", 150, LEASE)
    assert claim is not None
    again = s.register("t", "interval", "1000", 9_999, 77)
    assert again == claim.record
    assert again.next_run_at == 100 and again.updated_at == first.updated_at


def test_register_changed_spec_overwrites_but_keeps_token_lease_last(
    schedules: StoreUnderTest,
) -> None:
    s = schedules.store
    _registered(s)
    claim = s.claim_due("t", "w1", 150, LEASE)
    assert claim is not None
    assert s.complete("t", claim.fencing_token, CompletePatch(2_000, 150, "error"), 160)
    claim2 = s.claim_due("t", "w2", 2_000, LEASE)
    assert claim2 is not None
    changed = s.register("t", "interval", "5000", 7_000, 2_100)
    assert (changed.kind, changed.spec, changed.next_run_at, changed.updated_at) == (
        "interval", "5000", 7_000, 2_100
    )
    assert changed.fencing_token == claim2.fencing_token == 2
    assert (changed.lease_owner, changed.lease_until) == ("w2", 3_000)
    assert (changed.last_run_at, changed.last_status) == (150, "error")


def test_register_changed_kind_overwrites(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    changed = s.register("t", "once", "1000", None, 20)
    assert (changed.kind, changed.next_run_at, changed.updated_at) == ("once", None, 20)


def test_register_keeps_the_catch_up_policy_once_by_default(schedules: StoreUnderTest) -> None:
    s = schedules.store
    assert _registered(s).catch_up == "once"
    for catch_up in ("skip", "all"):
        rec = s.register(catch_up, "cron", "0 * * * *", 500, 42, catch_up)
        assert rec.catch_up == catch_up and present(s.get(catch_up)) == rec
    assert [r.catch_up for r in s.list()] == ["all", "skip", "once"]


def test_register_another_catch_up_alone_keeps_the_occurrence_token_lease_last(
    schedules: StoreUnderTest,
) -> None:
    s = schedules.store
    _registered(s)
    claim = s.claim_due("t", "w1", 150, LEASE)
    assert claim is not None
    assert s.complete("t", claim.fencing_token, CompletePatch(2_000, 150, "ok"), 160)
    claim2 = s.claim_due("t", "w2", 2_000, LEASE)
    assert claim2 is not None
    changed = s.register("t", "interval", "1000", 9_999, 2_100, "all")
    assert changed == ScheduleRecord(
        "t", "interval", "1000", 2_000, 150, "ok", 2, "w2", 3_000, 2_100, 0, "all",
        due_at=2_000,
    )
    assert s.register("t", "interval", "1000", 7_777, 2_200, "all") == changed  # untouched
    back = s.register("t", "interval", "1000", 5_555, 2_300)  # an old caller: once again
    assert (back.catch_up, back.next_run_at, back.updated_at) == ("once", 2_000, 2_300)
    assert s.complete("t", claim2.fencing_token, CompletePatch(3_000, 2_000, "ok"), 2_400)


def test_register_another_spec_and_catch_up_overwrites_both(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    changed = s.register("t", "interval", "5000", 7_000, 20, "skip")
    assert (changed.spec, changed.next_run_at, changed.catch_up) == ("5000", 7_000, "skip")


def test_complete_skipped_records_an_occurrence_not_run(schedules: StoreUnderTest) -> None:
    s = schedules.store
    s.register("t", "interval", "1000", 100, 10, "skip")
    claim = s.claim_due("t", "w1", 5_050, LEASE)
    assert claim is not None
    assert s.complete("t", claim.fencing_token, CompletePatch(6_100, 5_050, "skipped"), 5_060)
    rec = present(s.get("t"))
    assert (rec.next_run_at, rec.last_run_at, rec.last_status, rec.lease_owner) == (
        6_100, 5_050, "skipped", None
    )
    assert rec.catch_up == "skip"


def test_a_held_lease_is_never_overlapped_by_the_next_occurrence(
    schedules: StoreUnderTest,
) -> None:
    """While a run holds its lease, later occurrences falling due claim nothing, whatever
    the policy: the record's next_run_at moves only when the run completes."""
    s = schedules.store
    for catch_up in ("skip", "once", "all"):
        s.register(catch_up, "interval", "100", 100, 10, catch_up)
    held = {c.record.id: c for c in s.claim_next("w1", 100, LEASE, 10)}
    assert sorted(held) == ["all", "once", "skip"]
    for now in (200, 500, 1_099):  # occurrences 200 .. 1000 are due, the lease runs to 1100
        assert s.claim_next("w2", now, LEASE, 10) == []
        assert all(s.claim_due(id, "w2", now, LEASE) is None for id in held)
    assert all(s.renew(id, c.fencing_token, 2_100) for id, c in held.items())
    assert s.claim_next("w2", 2_000, LEASE, 10) == []
    assert sorted(c.record.id for c in s.claim_next("w2", 2_100, LEASE, 10)) == [
        "all", "once", "skip"
    ]


def test_claim_due_sets_lease_and_bumps_token(schedules: StoreUnderTest) -> None:
    s = schedules.store
    before = _registered(s)
    claim = s.claim_due("t", "w1", 100, LEASE)
    assert claim is not None
    assert claim.fencing_token == 1 == claim.record.fencing_token
    assert (claim.record.lease_owner, claim.record.lease_until) == ("w1", 1_100)
    assert claim.record.updated_at == before.updated_at  # claims do not move updated_at
    assert s.get("t") == claim.record


@pytest.mark.parametrize("now", [99, 0, -5])
def test_claim_due_not_due(schedules: StoreUnderTest, now: int) -> None:
    _registered(schedules.store)
    before = schedules.state()
    assert schedules.store.claim_due("t", "w1", now, LEASE) is None
    assert schedules.state() == before


def test_claim_due_unknown_and_tombstone(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s, next_run_at=None)
    assert s.claim_due("t", "w1", 10**12, LEASE) is None
    assert s.claim_due("unknown", "w1", 10**12, LEASE) is None


def test_claim_due_live_lease_blocks_until_it_expires(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    first = s.claim_due("t", "w1", 100, LEASE)
    assert first is not None
    assert s.claim_due("t", "w2", 1_099, LEASE) is None
    second = s.claim_due("t", "w2", 1_100, LEASE)  # lease_until <= now: expired
    assert second is not None
    assert second.fencing_token == first.fencing_token + 1
    assert second.record.lease_owner == "w2"


def test_renew_with_current_token(schedules: StoreUnderTest) -> None:
    s = schedules.store
    before = _registered(s)
    claim = s.claim_due("t", "w1", 100, LEASE)
    assert claim is not None
    assert s.renew("t", claim.fencing_token, 5_000) is True
    rec = s.get("t")
    assert rec is not None
    assert rec.lease_until == 5_000 and rec.lease_owner == "w1"
    assert rec.updated_at == before.updated_at


def test_renew_after_lease_expired_but_unclaimed_still_works(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    claim = s.claim_due("t", "w1", 100, LEASE)
    assert claim is not None
    assert s.renew("t", claim.fencing_token, 50_000) is True


def test_renew_to_the_past_gives_the_lease_up_early(schedules: StoreUnderTest) -> None:
    """Not a bug: renew takes no now, so it cannot tell a past lease_until from a
    future one. The lease ends there: the holder's complete still succeeds until
    someone claims the record, and from that lease_until on anyone may."""
    s = schedules.store
    _registered(s)
    claim = s.claim_due("t", "w1", 100, LEASE)
    assert claim is not None
    assert s.renew("t", claim.fencing_token, 50) is True  # before the claim's own now
    rec = s.get("t")
    assert rec is not None
    assert (rec.lease_owner, rec.lease_until) == ("w1", 50)
    assert rec.fencing_token == claim.fencing_token
    assert s.complete("t", claim.fencing_token, CompletePatch(2_000, 100, "ok"), 150) is True
    assert present(s.get("t")).lease_owner is None


def test_renew_to_the_past_lets_others_claim_from_then_on(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    claim = s.claim_due("t", "w1", 100, LEASE)
    assert claim is not None
    assert s.renew("t", claim.fencing_token, 120) is True
    assert s.claim_due("t", "w2", 119, LEASE) is None  # still live before 120
    taken = s.claim_due("t", "w2", 120, LEASE)  # within the original lease (until 1,100)
    assert taken is not None and taken.fencing_token == claim.fencing_token + 1
    before = schedules.state()
    assert s.renew("t", claim.fencing_token, 99_999) is False
    assert s.complete("t", claim.fencing_token, CompletePatch(2_000, 100, "ok"), 150) is False
    assert schedules.state() == before


def test_renew_and_complete_with_stale_token_fail(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    stale = s.claim_due("t", "w1", 100, LEASE)
    fresh = s.claim_due("t", "w2", 1_200, LEASE)
    assert stale is not None and fresh is not None
    before = schedules.state()
    assert s.renew("t", stale.fencing_token, 99_999) is False
    assert s.complete("t", stale.fencing_token, CompletePatch(5_000, 1_300, "ok"), 1_300) is False
    assert schedules.state() == before
    assert s.complete("t", fresh.fencing_token, CompletePatch(5_000, 1_300, "ok"), 1_300)


def test_complete_writes_patch_and_clears_lease(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    claim = s.claim_due("t", "w1", 100, LEASE)
    assert claim is not None
    assert s.complete("t", claim.fencing_token, CompletePatch(2_000, 100, "ok"), 150) is True
    rec = s.get("t")
    assert rec is not None
    assert (rec.next_run_at, rec.last_run_at, rec.last_status) == (2_000, 100, "ok")
    assert (rec.lease_owner, rec.lease_until, rec.updated_at) == (None, None, 150)
    assert rec.fencing_token == claim.fencing_token


def test_complete_counts_consecutive_failures_and_ok_resets_them(
    schedules: StoreUnderTest,
) -> None:
    s = schedules.store
    assert _registered(s).consecutive_failures == 0
    seen = []
    statuses: list[LastStatus] = ["error", "error", "skipped", "error", "ok", "skipped", "error"]
    for at, status in enumerate(statuses, start=1):
        claim = present(s.claim_due("t", "w1", 100 * at, LEASE))
        assert s.complete("t", claim.fencing_token, CompletePatch(100 * (at + 1), at, status))
        rec = present(s.get("t"))
        seen.append((rec.last_status, rec.consecutive_failures))
    # A skipped occurrence did not run: it neither counts as a failure nor resets them.
    assert seen == [("error", 1), ("error", 2), ("skipped", 2), ("error", 3), ("ok", 0),
                    ("skipped", 0), ("error", 1)]
    # A stale complete counts nothing; a new spec keeps the count, a delete drops it.
    before = schedules.state()
    assert s.complete("t", 1, CompletePatch(0, 0, "error")) is False
    assert schedules.state() == before
    assert s.register("t", "interval", "5000", 10, 20).consecutive_failures == 1
    s.delete("t")
    assert _registered(s).consecutive_failures == 0


def test_complete_with_null_next_run_at_is_a_tombstone(schedules: StoreUnderTest) -> None:
    s = schedules.store
    s.register("o", "once", "500", 100, 10)
    claim = s.claim_due("o", "w1", 100, LEASE)
    assert claim is not None
    assert s.complete("o", claim.fencing_token, CompletePatch(None, 100, "ok"), 120)
    assert present(s.get("o")).next_run_at is None
    assert s.claim_due("o", "w1", 10**12, LEASE) is None


def test_spent_claim_cannot_renew_or_complete_again(schedules: StoreUnderTest) -> None:
    """Tightening: once completed, a claim is spent."""
    s = schedules.store
    _registered(s)
    claim = s.claim_due("t", "w1", 100, LEASE)
    assert claim is not None
    assert s.complete("t", claim.fencing_token, CompletePatch(2_000, 100, "ok"), 150)
    before = schedules.state()
    assert s.renew("t", claim.fencing_token, 9_000) is False
    assert s.complete("t", claim.fencing_token, CompletePatch(3_000, 100, "ok"), 160) is False
    assert schedules.state() == before


def test_reregistered_id_cannot_be_renewed_or_completed_by_old_holder(
    schedules: StoreUnderTest,
) -> None:
    """Tightening: a re-registered id starts at its high-water mark with no lease."""
    s = schedules.store
    _registered(s)
    claim = s.claim_due("t", "w1", 100, LEASE)
    assert claim is not None
    s.delete("t")
    again = _registered(s, now=200)
    assert again.fencing_token == claim.fencing_token and again.lease_owner is None
    before = schedules.state()
    assert s.renew("t", claim.fencing_token, 9_000) is False
    assert s.complete("t", claim.fencing_token, CompletePatch(3_000, 100, "ok"), 300) is False
    assert schedules.state() == before


def test_complete_after_delete_is_false(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s)
    claim = s.claim_due("t", "w1", 100, LEASE)
    assert claim is not None
    s.delete("t")
    assert s.complete("t", claim.fencing_token, CompletePatch(3_000, 100, "ok"), 300) is False
    assert s.renew("t", claim.fencing_token, 3_000) is False
    assert s.get("t") is None


def test_tokens_never_go_backwards_across_delete_and_register(schedules: StoreUnderTest) -> None:
    s = schedules.store
    seen: list[int] = []
    now = 100
    for _cycle in range(4):
        _registered(s, next_run_at=now, now=now)
        for _ in range(3):
            claim = s.claim_due("t", "w", now, LEASE)
            assert claim is not None
            seen.append(claim.fencing_token)
            now += LEASE
        s.delete("t")
        assert schedules.fences()["t"] == seen[-1]
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert seen[-1] == 12


def test_a_purged_tombstone_reregistered_gets_a_higher_token(schedules: StoreUnderTest) -> None:
    """Retention deletes a finished schedule's record (its tombstone), never its fence: the
    id registered again is claimed with a token above every token it had before."""
    s = schedules.store
    s.register("t", "once", "0", 100, 10)
    claim = s.claim_due("t", "w1", 100, LEASE)
    assert claim is not None
    assert s.complete("t", claim.fencing_token, CompletePatch(None, 100, "ok"), 150)
    tombstone = s.get("t")
    assert tombstone is not None and tombstone.next_run_at is None
    s.delete("t")  # the tombstone is purged
    assert s.get("t") is None and schedules.fences()["t"] == claim.fencing_token
    s.register("t", "once", "0", 200, 200)
    again = s.claim_due("t", "w2", 200, LEASE)
    assert again is not None and again.fencing_token > claim.fencing_token
    assert s.complete("t", claim.fencing_token, CompletePatch(None, 300, "ok"), 300) is False


def test_delete_unknown_is_a_no_op(schedules: StoreUnderTest) -> None:
    before = schedules.state()
    schedules.store.delete("ghost")
    assert schedules.state() == before


def test_list_returns_every_record_including_tombstones(schedules: StoreUnderTest) -> None:
    s = schedules.store
    _registered(s, "b")
    _registered(s, "a", next_run_at=None)
    _registered(s, "c")
    assert [r.id for r in s.list()] == ["a", "b", "c"]


def test_claim_next_order_limit_and_filter(schedules: StoreUnderTest) -> None:
    s = schedules.store
    for id, at in [("e", 50), ("d", 10), ("c", 10), ("b", 30), ("a", 5_000)]:
        _registered(s, id, next_run_at=at)
    _registered(s, "z", next_run_at=None)
    got = s.claim_next("w", 100, LEASE, 3)
    assert [c.record.id for c in got] == ["c", "d", "b"]
    assert all(c.fencing_token == 1 and c.record.lease_owner == "w" for c in got)
    assert [c.record.id for c in s.claim_next("w", 100, LEASE, 10)] == ["e"]
    assert s.claim_next("w", 100, LEASE, 10) == []


def test_claim_next_ids_filter(schedules: StoreUnderTest) -> None:
    s = schedules.store
    for id in ["a", "b", "c"]:
        _registered(s, id)
    before = schedules.state()
    assert s.claim_next("w", 100, LEASE, 10, []) == []
    assert schedules.state() == before
    got = s.claim_next("w", 100, LEASE, 10, ["c", "a", "unknown"])
    assert [c.record.id for c in got] == ["a", "c"]
    assert [c.record.id for c in s.claim_next("w", 100, LEASE, 10, None)] == ["b"]


def test_now_none_uses_the_store_clock(schedules: StoreUnderTest) -> None:
    s = schedules.store
    clock = s.now_ms()
    rec = s.register("t", "interval", "1000", 0, None)
    assert clock - 60_000 <= rec.updated_at <= clock + 60_000
    claim = s.claim_due("t", "w", None, 60_000)
    assert claim is not None and claim.record.lease_until is not None
    assert clock <= claim.record.lease_until <= clock + 120_000


# --- Bad input is rejected with 22023 naming the parameter, and changes nothing.

LONG = "x" * 1025
OK_1024 = "y" * 1024
PATCH = CompletePatch(2_000, 100, "ok")

BAD_CALLS: list[tuple[str, str, tuple[Any, ...]]] = [
    ("get", "id", ("",)),
    ("get", "id", (LONG,)),
    ("register", "id", ("", "interval", "1", 1, 1)),
    ("register", "id", (None, "interval", "1", 1, 1)),
    ("register", "id", (LONG, "interval", "1", 1, 1)),
    ("register", "kind", ("t", "weekly", "1", 1, 1)),
    ("register", "kind", ("t", None, "1", 1, 1)),
    ("register", "spec", ("t", "interval", None, 1, 1)),
    ("register", "spec", ("t", "interval", "1" * 1025, 1, 1)),  # present
    ("register", "spec", ("new", "interval", "1" * 1025, 1, 1)),  # absent
    ("register", "spec", ("gone", "interval", "1" * 1025, 1, 1)),  # absent, fenced
    ("register", "spec", ("t", "cron", "é" * 1025, 1, 1)),  # characters, not bytes
    ("register", "catch_up", ("t", "interval", "1000", 1, 1, None)),  # present
    ("register", "catch_up", ("t", "interval", "1000", 1, 1, "")),
    ("register", "catch_up", ("t", "interval", "1000", 1, 1, "ALL")),
    ("register", "catch_up", ("t", "interval", "1000", 1, 1, "skipped")),
    ("register", "catch_up", ("new", "interval", "1", 1, 1, "never")),  # absent
    ("register", "catch_up", ("gone", "interval", "1", 1, 1, "once ")),  # absent, fenced
    ("claim_due", "id", ("", "w", 100, LEASE)),
    ("claim_due", "id", (LONG, "w", 100, LEASE)),
    ("claim_due", "owner", ("t", "", 100, LEASE)),
    ("claim_due", "owner", ("t", None, 100, LEASE)),
    ("claim_due", "owner", ("t", LONG, 100, LEASE)),
    ("claim_due", "lease_ms", ("t", "w", 100, 0)),
    ("claim_due", "lease_ms", ("t", "w", 100, -1)),
    ("claim_due", "lease_ms", ("t", "w", 100, None)),
    ("renew", "id", ("", 1, 5)),
    ("renew", "fencing_token", ("t", None, 5)),
    ("renew", "lease_until", ("t", 1, None)),
    ("complete", "id", ("", 1, PATCH, 1)),
    ("complete", "fencing_token", ("t", None, PATCH, 1)),
    ("complete", "last_run_at", ("t", 1, CompletePatch(1, None, "ok"), 1)),  # type: ignore[arg-type]
    ("complete", "last_status", ("t", 1, CompletePatch(1, 1, "fine"), 1)),  # type: ignore[arg-type]
    ("complete", "last_status", ("t", 1, CompletePatch(1, 1, None), 1)),  # type: ignore[arg-type]
    ("delete", "id", ("",)),
    ("delete", "id", (LONG,)),
    ("claim_next", "owner", ("", 100, LEASE, 1)),
    ("claim_next", "owner", (LONG, 100, LEASE, 1)),
    ("claim_next", "lease_ms", ("w", 100, 0, 1)),
    ("claim_next", "limit", ("w", 100, LEASE, 0)),
    ("claim_next", "limit", ("w", 100, LEASE, None)),
    ("claim_next", "limit", ("w", 100, LEASE, -(2**40))),  # below integer's range: still 22023
    ("claim_next", "ids", ("w", 100, LEASE, 1, ["t", ""])),
    ("claim_next", "ids", ("w", 100, LEASE, 1, ["t", None])),
    ("claim_next", "ids", ("w", 100, LEASE, 1, [LONG])),
]


def _populated(schedules: StoreUnderTest) -> None:
    """A state with a live claim, a completed record and a fence, for bad calls to leave alone."""
    s = schedules.store
    _registered(s, "t")
    _registered(s, "u")
    assert s.claim_due("t", "w", 100, LEASE) is not None
    claim = s.claim_due("u", "w", 100, LEASE)
    assert claim is not None
    assert s.complete("u", claim.fencing_token, PATCH, 120)
    _registered(s, "gone")
    s.delete("gone")


@pytest.mark.parametrize(
    ("method", "param", "args"), BAD_CALLS, ids=[f"{m}-{p}-{i}" for i, (m, p, _) in enumerate(BAD_CALLS)]
)
def test_bad_input_is_rejected_and_changes_nothing(
    schedules: StoreUnderTest, method: str, param: str, args: tuple[Any, ...]
) -> None:
    _populated(schedules)
    before = schedules.state()
    with pytest.raises(InvalidArgument) as raised:
        getattr(schedules.store, method)(*args)
    assert raised.value.sqlstate == "22023"
    assert param in str(raised.value)
    assert schedules.state() == before


def test_names_of_exactly_1024_characters_are_fine(schedules: StoreUnderTest) -> None:
    s = schedules.store
    s.register(OK_1024, "interval", "1", 100, 1)
    claim = s.claim_due(OK_1024, OK_1024, 100, LEASE)
    assert claim is not None and claim.record.lease_owner == OK_1024
    assert len(s.claim_next(OK_1024, 100, LEASE, 1, [OK_1024])) == 0


def test_spec_of_exactly_1024_characters_is_fine(schedules: StoreUnderTest) -> None:
    s = schedules.store
    assert s.register("t", "cron", "x" * 1024, 100, 1).spec == "x" * 1024
    assert s.register("t", "cron", "é" * 1024, 100, 2).spec == "é" * 1024  # 2,048 bytes
    assert s.register("u", "once", "", 100, 3).spec == ""  # empty is a spec like any other
    assert present(s.get("t")).spec == "é" * 1024


def test_lengths_count_characters_not_bytes(schedules: StoreUnderTest) -> None:
    s = schedules.store
    wide = "é" * 1024  # 2048 bytes in UTF-8
    assert s.register(wide, "interval", "1", 100, 1).id == wide
    with pytest.raises(InvalidArgument):
        s.register(wide + "é", "interval", "1", 100, 1)


@pytest.mark.parametrize("method", ["claim_due", "claim_next"])
def test_lease_overflow_is_22003_and_changes_nothing(schedules: StoreUnderTest, method: str) -> None:
    _populated(schedules)
    before = schedules.state()
    big = 2**63 - 1
    with pytest.raises(InvalidArgument) as raised:
        if method == "claim_due":
            schedules.store.claim_due("t", "w", big, LEASE)
        else:
            schedules.store.claim_next("w", big, LEASE, 1)
    assert raised.value.sqlstate == "22003"
    assert schedules.state() == before


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.claim_due("t", "w", 1, 2**63),
        lambda s: s.claim_due("t", "w", True, 1),
        lambda s: s.claim_due(7, "w", 1, 1),
        lambda s: s.register("t\x00", "interval", "1", 1, 1),
        lambda s: s.register("t", "interval", "a\x00b", 1, 1),
        lambda s: s.register("t", "interval", "1000", 1, 1, "all\x00"),
        lambda s: s.register("t", "interval", "1000", 1, 1, 2**63),
        lambda s: s.register("t", "interval", "1000", 1, 1, -1),
        lambda s: s.claim_next("w", 1, 1, 2**31),
        lambda s: s.complete("t", 1, "patch", 1),
    ],
)
def test_python_level_bad_values_raise_invalid_argument(
    schedules: StoreUnderTest, call: Callable[[ScheduleStore], object]
) -> None:
    _populated(schedules)
    before = schedules.state()
    with pytest.raises(InvalidArgument):
        call(schedules.store)
    assert schedules.state() == before
