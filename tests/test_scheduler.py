"""The Scheduler over the memory store, with a clock moved by hand.

Each test drives the runtime one ``tick()`` at a time (claim what is due,
start the handlers) and ``wait_idle()`` (let them finish), so what ran, when,
and what was committed is deterministic.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from pgstore import InvalidArgument, MemoryScheduleStore
from pgstore.protocols import AsyncScheduleStore, ScheduleStore
from pgstore.runtime import events as ev
from pgstore.runtime.scheduler import RunContext, Scheduler
from tests.conftest import present
from tests.support.clock import FakeClock, utc_ms


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _scheduler(
    store: ScheduleStore | AsyncScheduleStore, clock: FakeClock, **kw: Any
) -> Scheduler:
    kw.setdefault("owner", "host-a")
    kw.setdefault("lease_ms", 30_000)
    return Scheduler(store, clock=clock, **kw)


def test_interval_runs_at_a_fixed_rate_and_completes() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(10_000)
    sched = _scheduler(store, clock)
    runs: list[RunContext] = []
    sched.every("tick", 1_000, runs.append)

    async def main() -> None:
        await sched.start()
        record = store.get("tick")
        assert record is not None and (record.kind, record.spec, record.next_run_at) == (
            "interval", "1000", 11_000
        )
        clock.set(10_999)
        assert await sched.tick() == 0
        clock.set(11_000)
        assert await sched.tick() == 1
        await sched.wait_idle()
        clock.set(12_250)
        assert await sched.tick() == 1
        await sched.wait_idle()

    run(main())
    assert [(r.task_id, r.fencing_token, r.scheduled_at, r.owner) for r in runs] == [
        ("tick", 1, 11_000, "host-a"), ("tick", 2, 12_000, "host-a")
    ]
    record = store.get("tick")
    assert record is not None
    assert (record.next_run_at, record.last_run_at, record.last_status) == (13_000, 12_250, "ok")
    assert (record.lease_owner, record.lease_until) == (None, None)


def test_a_process_that_was_down_runs_a_missed_interval_once_on_the_grid() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    sched = _scheduler(store, clock)
    runs: list[int] = []
    sched.every("tick", 1_000, lambda ctx: runs.append(ctx.scheduled_at))

    async def main() -> None:
        await sched.start()
        clock.set(10_500)  # ten occurrences missed
        assert await sched.tick() == 1
        await sched.wait_idle()
        assert await sched.tick() == 0

    run(main())
    assert runs == [1_000]
    record = store.get("tick")
    assert record is not None and record.next_run_at == 11_000  # the grid, not 10_500 + 1_000


def test_cron_missed_runs_once_then_follows_the_expression() -> None:
    start = utc_ms(2026, 6, 1, 9, 10)
    store, clock = MemoryScheduleStore(), FakeClock(start)
    sched = _scheduler(store, clock)
    runs: list[int] = []
    sched.cron("hourly", "0 * * * *", lambda ctx: runs.append(ctx.scheduled_at))

    async def main() -> None:
        await sched.start()
        clock.set(utc_ms(2026, 6, 1, 14, 20))  # five hours down
        assert await sched.tick() == 1
        await sched.wait_idle()
        assert await sched.tick() == 0

    run(main())
    assert runs == [utc_ms(2026, 6, 1, 10, 0)]
    record = store.get("hourly")
    assert record is not None and record.next_run_at == utc_ms(2026, 6, 1, 15, 0)
    assert record.spec == "0 * * * *"


def _daily_runs(tz: str, expr: str, first: int, last: int, step_ms: int) -> list[int]:
    """Drive a scheduler over [first, last] in steps; the scheduled times it ran."""
    store, clock = MemoryScheduleStore(), FakeClock(first)
    sched = _scheduler(store, clock)
    runs: list[int] = []
    sched.cron("job", expr, lambda ctx: runs.append(ctx.scheduled_at), tz=tz)

    async def main() -> None:
        await sched.start()
        now = first
        while now <= last:
            clock.set(now)
            await sched.tick()
            await sched.wait_idle()
            now += step_ms

    run(main())
    return runs


def test_daily_cron_runs_once_on_both_berlin_dst_days() -> None:
    minute = 60_000
    spring = _daily_runs("Europe/Berlin", "30 2 * * *", utc_ms(2026, 3, 28, 12), utc_ms(2026, 3, 30, 12), minute)
    # 2026-03-29 02:30 does not exist in Berlin: it runs right after the gap (03:00 CEST).
    assert spring == [utc_ms(2026, 3, 29, 1, 0), utc_ms(2026, 3, 30, 0, 30)]
    autumn = _daily_runs("Europe/Berlin", "30 2 * * *", utc_ms(2026, 10, 24, 12), utc_ms(2026, 10, 26, 12), minute)
    # 2026-10-25 02:30 happens twice: the first (CEST, 00:30 UTC) only.
    assert autumn == [utc_ms(2026, 10, 25, 0, 30), utc_ms(2026, 10, 26, 1, 30)]


def test_half_hourly_cron_runs_at_every_real_half_hour_through_dst() -> None:
    for day in [(2026, 3, 29), (2026, 10, 25)]:
        first, last = utc_ms(*day, 0) - 3_600_000, utc_ms(*day, 0) + 3 * 3_600_000
        runs = _daily_runs("Europe/Berlin", "*/30 * * * *", first, last, 5 * 60_000)
        assert runs == list(range(first + 1_800_000, last + 1, 1_800_000)), day


def test_stored_spec_carries_the_zone() -> None:
    store = MemoryScheduleStore()
    sched = _scheduler(store, FakeClock(0))
    sched.cron("berlin", "30 2 * * *", lambda: None, tz="Europe/Berlin")
    sched.cron("utc", "30 2 * * *", lambda: None)
    run(sched.start())
    assert [(r.id, r.spec) for r in store.list()] == [
        ("berlin", "TZ=Europe/Berlin 30 2 * * *"), ("utc", "30 2 * * *")
    ]


def test_restart_keeps_next_run_at_and_a_changed_interval_takes_effect() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(1_000)
    first = _scheduler(store, clock)
    first.every("a", 5_000, lambda: None)
    first.every("b", 5_000, lambda: None)
    run(first.start())
    before = store.get("a")
    assert before is not None and before.next_run_at == 6_000

    clock.set(4_000)  # restarted before the first run
    second = _scheduler(store, clock, owner="host-b")
    second.every("a", 5_000, lambda: None)
    second.every("b", timedelta(seconds=2), lambda: None)
    run(second.start())
    assert store.get("a") == before  # untouched
    changed = store.get("b")
    assert changed is not None and (changed.spec, changed.next_run_at) == ("2000", 6_000)


def test_orphans_are_never_run_or_changed() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(10_000)
    orphan = store.register("orphan", "interval", "1000", 0, 0)
    sched = _scheduler(store, clock)
    ran: list[str] = []
    sched.every("mine", 1_000, lambda ctx: ran.append(ctx.task_id))

    async def main() -> None:
        await sched.start()
        for now in (11_000, 12_000, 13_000):
            clock.set(now)
            await sched.tick()
            await sched.wait_idle()

    run(main())
    assert ran == ["mine"] * 3
    assert store.get("orphan") == orphan


def test_a_raising_handler_completes_with_error_and_keeps_its_schedule(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    sched = _scheduler(store, clock)

    @sched.every("flaky", 1_000)
    def flaky() -> None:
        raise RuntimeError("provider down")

    async def main() -> None:
        await sched.start()
        clock.set(1_000)
        await sched.tick()
        await sched.wait_idle()

    with caplog.at_level(logging.INFO, logger="pgstore.scheduler"):
        run(main())
    record = store.get("flaky")
    assert record is not None
    assert (record.last_status, record.next_run_at, record.lease_owner) == ("error", 2_000, None)
    assert "flaky token 1 raised" in caplog.text


def test_once_runs_once_and_leaves_a_tombstone_across_restarts() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    ran: list[int] = []
    for restart in range(2):
        sched = _scheduler(store, clock)
        sched.once("welcome", 500, lambda ctx: ran.append(ctx.fencing_token))

        async def main(sched: Scheduler) -> None:
            await sched.start()
            clock.advance(1_000)
            await sched.tick()
            await sched.wait_idle()

        run(main(sched))
        record = store.get("welcome")
        assert record is not None and record.next_run_at is None, restart
    assert ran == [1]


def test_async_handlers_run_on_the_loop() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    sched = _scheduler(store, clock)
    seen: list[tuple[str, bool]] = []

    @sched.every("async-task", 1_000)
    async def handler(ctx: RunContext) -> None:
        await asyncio.sleep(0)
        seen.append((ctx.task_id, threading.current_thread() is threading.main_thread()))

    async def main() -> None:
        await sched.start()
        clock.set(1_000)
        await sched.tick()
        await sched.wait_idle()

    run(main())
    assert seen == [("async-task", True)]
    assert present(store.get("async-task")).last_status == "ok"


def test_concurrency_bounds_what_one_tick_claims() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    sched = _scheduler(store, clock, concurrency=2)
    release = threading.Event()
    for n in range(5):
        sched.every(f"t{n}", 1_000, lambda: release.wait(5))

    async def main() -> tuple[int, int, int]:
        await sched.start()
        clock.set(1_000)
        first = await sched.tick()
        second = await sched.tick()  # both slots busy
        running = sched.running
        release.set()
        await sched.wait_idle()
        return first, second, running

    assert run(main()) == (2, 0, 2)


def test_a_full_scheduler_claims_again_as_its_runs_end_not_at_its_next_poll() -> None:
    """Concurrency 1, three due tasks, a poll interval of a minute: the end of each run
    wakes it, so all three run long before the first poll would have come."""
    store, clock = MemoryScheduleStore(), FakeClock(0)
    sched = _scheduler(store, clock, concurrency=1, poll_interval=60.0)
    ran: list[str] = []
    for n in range(3):
        sched.every(f"t{n}", 1_000, lambda ctx: ran.append(ctx.task_id))

    async def main() -> None:
        await sched.start()  # registered at 0: due at 1,000
        clock.set(1_000)
        runner = asyncio.ensure_future(sched.run(handle_signals=False))
        try:
            deadline = asyncio.get_running_loop().time() + 20
            while len(ran) < 3 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
        finally:
            sched.stop()
            await asyncio.wait_for(runner, 5)

    run(main())
    assert sorted(ran) == ["t0", "t1", "t2"]


@pytest.mark.parametrize("handler_kind", ["sync", "async"])
def test_lease_loss_tells_the_handler_and_its_complete_never_happens(
    handler_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    lease = 900  # renewed every 0.3 s of real time
    slow = _scheduler(store, clock, owner="slow", lease_ms=lease)
    fast = _scheduler(store, clock, owner="fast", lease_ms=lease)
    told = threading.Event()

    handler: Callable[[RunContext], object]
    if handler_kind == "sync":
        def blocking(ctx: RunContext) -> None:
            if ctx.owner == "slow":
                told.set() if ctx.lease_lost.wait(10) else None

        handler = blocking
    else:
        async def awaiting(ctx: RunContext) -> None:
            if ctx.owner == "slow":
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    told.set()
                    raise

        handler = awaiting

    slow.every("report", 1_000, handler)
    fast.every("report", 1_000, handler)

    async def main() -> None:
        await slow.start()
        await fast.start()
        clock.set(1_000)
        assert await slow.tick() == 1  # token 1
        clock.set(1_000 + lease)  # the slow holder's lease expired...
        assert await fast.tick() == 1  # ...and another instance claims it: token 2
        await fast.wait_idle()
        await slow.wait_idle()  # the slow one's next renew fails, it is told and stops

    with caplog.at_level(logging.INFO, logger="pgstore.scheduler"):
        run(main())
    assert told.is_set()
    record = store.get("report")
    assert record is not None
    assert (record.fencing_token, record.last_status, record.lease_owner) == (2, "ok", None)
    assert "renew of report token 1 refused: lease lost" in caplog.text
    assert "report token 1 lost its lease; not completing" in caplog.text
    assert "completed report token 1" not in caplog.text


def test_a_renew_overtaken_by_its_own_complete_is_no_lost_lease() -> None:
    """The complete commits, and its answer is slow to come back (a slow network): the
    keeper's renews meanwhile are refused by the store, since the complete ended the
    lease. That is the lease ending, not a stale holder: no ``Refused``, no
    ``LeaseLost`` (whose alert says the work may run twice)."""

    class SlowAnswers(MemoryScheduleStore):
        def complete(self, *args: Any, **kwargs: Any) -> bool:
            completed = super().complete(*args, **kwargs)
            time.sleep(1.0)  # renews every 0.3 s of real time meanwhile
            return completed

    store, clock = SlowAnswers(), FakeClock(0)
    seen: list[ev.Event] = []
    sched = _scheduler(store, clock, lease_ms=900, on_event=seen.append)
    sched.every("report", 1_000, lambda: None)

    async def main() -> None:
        await sched.start()
        clock.set(1_000)
        assert await sched.tick() == 1
        await sched.wait_idle()

    run(main())
    renews = [e for e in seen if isinstance(e, ev.Renew)]
    assert [e for e in seen if isinstance(e, (ev.LeaseLost, ev.Refused))] == []
    assert [e.outcome for e in renews] == ["renewed"] * len(renews)
    assert [(e.outcome, e.token) for e in seen if isinstance(e, ev.Complete)] == [
        ("completed", 1)]
    record = store.get("report")
    assert record is not None and (record.fencing_token, record.lease_owner) == (1, None)


def test_a_lease_lost_while_the_complete_is_sent_is_told_by_the_complete() -> None:
    """Once the complete is sent, a refused renew is left to the complete's answer: a
    lease lost meanwhile (claimed again elsewhere) is still reported, as the complete
    the store refuses to the stale holder."""
    lease = 900

    class ClaimedElsewhereFirst(MemoryScheduleStore):
        def complete(self, id: str, fencing_token: int, *args: Any) -> bool:
            # The slow holder's lease expired, and another host claims it (token 2)...
            assert self.claim_due(id, "fast", 1_000 + lease, lease) is not None
            time.sleep(0.5)  # ...while the slow one's keeper renews: refused
            return super().complete(id, fencing_token, *args)

    store, clock = ClaimedElsewhereFirst(), FakeClock(0)
    seen: list[ev.Event] = []
    slow = _scheduler(store, clock, owner="slow", lease_ms=lease, on_event=seen.append)
    slow.every("report", 1_000, lambda: None)

    async def main() -> None:
        await slow.start()
        clock.set(1_000)
        assert await slow.tick() == 1
        await slow.wait_idle()

    run(main())
    assert [(e.outcome, e.token) for e in seen if isinstance(e, ev.Complete)] == [
        ("rejected", 1)]
    assert [(e.operation, e.token) for e in seen if isinstance(e, ev.Refused)] == [
        ("complete", 1)]
    record = store.get("report")
    assert record is not None and (record.fencing_token, record.lease_owner) == (2, "fast")


def test_a_complete_rejected_as_stale_is_logged_not_retried(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    calls: list[str] = []
    original = store.complete

    def counting_complete(*args: Any, **kwargs: Any) -> bool:
        calls.append("complete")
        return original(*args, **kwargs)

    monkeypatch.setattr(store, "complete", counting_complete)
    sched = _scheduler(store, clock)

    @sched.every("report", 1_000)
    def handler(ctx: RunContext) -> None:
        # Someone deletes and re-registers the task while it runs: the claim is spent.
        store.delete("report")
        store.register("report", "interval", "1000", 5_000, 0)
        calls.append("ran")

    async def main() -> None:
        await sched.start()
        clock.set(1_000)
        await sched.tick()
        await sched.wait_idle()

    with caplog.at_level(logging.INFO, logger="pgstore.scheduler"):
        run(main())
    assert calls == ["ran", "complete"]
    assert "complete of report token 1 rejected: stale claim" in caplog.text
    record = store.get("report")
    assert record is not None and record.next_run_at == 5_000 and record.last_status is None


def test_stop_gives_running_handlers_a_grace_period_then_abandons_them() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    sched = _scheduler(store, clock, grace_period=0.2, poll_interval=0.05)
    quick_done = threading.Event()
    never = threading.Event()
    sched.every("quick", 1_000, lambda: quick_done.wait(0.05))
    sched.every("stuck", 1_000, lambda: never.wait(3))

    async def main() -> None:
        runner = asyncio.ensure_future(sched.run())
        await asyncio.sleep(0.1)  # registered at 0: due at 1_000
        clock.set(1_000)
        while sched.running < 2:
            await asyncio.sleep(0.01)
        sched.stop()
        await asyncio.wait_for(runner, 5)

    run(main())
    never.set()
    quick, stuck = store.get("quick"), store.get("stuck")
    assert quick is not None and quick.last_status == "ok" and quick.lease_owner is None
    assert stuck is not None and stuck.last_status is None  # never completed as if it had run
    assert stuck.lease_owner == "host-a"  # left to expire
    assert sched.abandoned


def test_declarations_are_validated() -> None:
    sched = _scheduler(MemoryScheduleStore(), FakeClock(0))
    with pytest.raises(InvalidArgument, match="cron"):
        sched.cron("bad", "61 * * * *", lambda: None)
    with pytest.raises(InvalidArgument, match="Mars/Olympus"):
        sched.cron("bad", "0 * * * *", lambda: None, tz="Mars/Olympus")
    with pytest.raises(InvalidArgument, match="interval"):
        sched.every("bad", 0, lambda: None)
    with pytest.raises(InvalidArgument, match="delay"):
        sched.once("bad", -5, lambda: None)
    with pytest.raises(InvalidArgument, match="id"):
        sched.every("", 1_000, lambda: None)
    sched.every("dup", 1_000, lambda: None)
    with pytest.raises(InvalidArgument, match="declared twice"):
        sched.every("dup", 1_000, lambda: None)
    with pytest.raises(InvalidArgument, match="lease_ms"):
        Scheduler(MemoryScheduleStore(), lease_ms=0)
    assert list(sched.tasks) == ["dup"]
