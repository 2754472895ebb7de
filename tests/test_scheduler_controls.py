"""Scheduler.pause, resume, trigger and ``jitter=`` over the memory store, with a clock
moved by hand (docs/schedule-controls.md).

Resume is checked against what a scheduler coming back from downtime does under each
catch-up policy: the same runs, at the same times, with the same statuses.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest

from pgstore import InvalidArgument, MemoryScheduleStore
from pgstore.models import CatchUp, jitter_due_at
from pgstore.runtime.events import Claim, Event
from pgstore.runtime.scheduler import RunContext, Scheduler
from tests.conftest import present
from tests.support.clock import FakeClock

MINUTE = 60_000
START = 10_000


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _scheduler(store: MemoryScheduleStore, clock: FakeClock, **kw: Any) -> Scheduler:
    kw.setdefault("owner", "host-a")
    kw.setdefault("lease_ms", 30_000)
    return Scheduler(store, clock=clock, **kw)


async def _tick_at(sched: Scheduler, clock: FakeClock, at: int) -> int:
    clock.set(at)
    claimed = 0
    while True:  # catch-up all makes the next occurrence due at once: drain it
        n = await sched.tick()
        await sched.wait_idle()
        if n == 0:
            return claimed
        claimed += n


def _history(policy: CatchUp, pause: bool) -> tuple[list[tuple[int, bool]], Any]:
    """Runs (scheduled_at, triggered) and the final record of an every-minute task that
    misses 5 minutes: paused (and resumed) when ``pause``, else a scheduler that is down."""
    store, clock = MemoryScheduleStore(), FakeClock(START)
    runs: list[tuple[int, bool]] = []
    sched = _scheduler(store, clock)
    sched.every("tick", MINUTE, lambda ctx: runs.append((ctx.scheduled_at, ctx.triggered)),
                catch_up=policy)

    async def main() -> None:
        await sched.start()
        await _tick_at(sched, clock, START + MINUTE)  # one regular run
        if pause:
            assert present(await sched.pause("tick")).paused
            for minute in range(2, 7):
                assert await _tick_at(sched, clock, START + minute * MINUTE) == 0
            assert not present(await sched.resume("tick")).paused
        await _tick_at(sched, clock, START + 6 * MINUTE + 5_000)
        await _tick_at(sched, clock, START + 7 * MINUTE)

    run(main())
    record = present(store.get("tick"))
    return runs, (record.next_run_at, record.last_status, record.last_run_at)


@pytest.mark.parametrize("policy", ["skip", "once", "all"])
def test_resume_meets_the_missed_occurrences_as_after_downtime(policy: CatchUp) -> None:
    paused = _history(policy, pause=True)
    down = _history(policy, pause=False)
    assert paused == down
    runs = [at for at, _ in paused[0]]
    expected = {
        "skip": [START + MINUTE, START + 7 * MINUTE],  # the missed one skipped
        "once": [START + MINUTE, START + 2 * MINUTE, START + 7 * MINUTE],
        "all": [START + m * MINUTE for m in range(1, 8)],
    }[policy]
    assert runs == expected


def test_trigger_runs_once_now_and_the_next_occurrence_stays() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(START)
    runs: list[RunContext] = []
    events: list[Event] = []
    sched = _scheduler(store, clock, on_event=events.append)
    sched.every("hourly", 3_600_000, runs.append)

    async def main() -> None:
        await sched.start()
        before = present(store.get("hourly"))
        clock.set(START + 5_000)
        asked = present(await sched.trigger("hourly"))
        assert asked.triggered_at == START + 5_000
        assert await _tick_at(sched, clock, START + 6_000) == 1
        after = present(store.get("hourly"))
        assert after.next_run_at == before.next_run_at and after.triggered_at is None
        assert after.last_status == "ok" and after.last_run_at == START + 6_000
        assert await _tick_at(sched, clock, START + 60_000) == 0  # once
        assert await _tick_at(sched, clock, START + 3_600_000) == 1  # the regular one

    run(main())
    assert [(r.scheduled_at, r.triggered, r.fencing_token) for r in runs] == [
        (START + 5_000, True, 1), (START + 3_600_000, False, 2)
    ]
    claims = [e for e in events if isinstance(e, Claim) and e.outcome == "claimed"]
    assert [c.due_at for c in claims] == [START + 5_000, START + 3_600_000]


def test_trigger_is_refused_while_a_run_is_in_progress_or_paused() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(START)
    release = threading.Event()
    sched = _scheduler(store, clock)
    sched.every("slow", MINUTE, lambda: release.wait(10))

    async def main() -> None:
        await sched.start()
        clock.set(START + MINUTE)
        assert await sched.tick() == 1  # running, its lease live
        assert await sched.trigger("slow") is None
        release.set()
        await sched.wait_idle()
        await sched.pause("slow")
        assert await sched.trigger("slow") is None
        assert await sched.trigger("unknown") is None
        await sched.resume("slow")
        assert present(await sched.trigger("slow")).triggered_at == START + MINUTE

    run(main())


def test_jitter_delays_each_occurrence_by_its_deterministic_offset() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(START)
    runs: list[RunContext] = []
    events: list[Event] = []
    sched = _scheduler(store, clock, on_event=events.append)
    sched.every("jit", 10 * MINUTE, runs.append, jitter=timedelta(minutes=5))
    dues: list[int] = []

    async def main() -> None:
        await sched.start()
        record = present(store.get("jit"))
        assert record.jitter_ms == 5 * MINUTE
        for _ in range(3):
            record = present(store.get("jit"))
            nominal, due = present(record.next_run_at), present(record.due_at)
            assert due == jitter_due_at("jit", nominal, 5 * MINUTE)
            dues.append(due)
            if due > nominal:
                assert await _tick_at(sched, clock, due - 1) == 0
            assert await _tick_at(sched, clock, due) == 1

    run(main())
    # The handler sees the nominal occurrence; the grid does not drift.
    assert [r.scheduled_at for r in runs] == [START + k * 10 * MINUTE for k in (1, 2, 3)]
    # A claim's lateness (the metrics' histogram) counts from the jittered due time.
    claims = [e for e in events if isinstance(e, Claim) and e.outcome == "claimed"]
    assert [c.due_at for c in claims] == dues
    assert dues != [r.scheduled_at for r in runs]  # the offsets are not all zero


def test_skip_counts_lateness_from_the_jittered_due_time() -> None:
    grace = MINUTE
    # An id whose first occurrence is delayed past the grace: claimed at its due time, it
    # is on time and runs (counted from the nominal time it would be skipped).
    id = next(f"j{n}" for n in range(1000)
              if present(jitter_due_at(f"j{n}", START + 30 * MINUTE, 20 * MINUTE))
              > START + 30 * MINUTE + 2 * grace)
    store, clock = MemoryScheduleStore(), FakeClock(START)
    runs: list[int] = []
    sched = _scheduler(store, clock, catch_up_grace_ms=grace)
    sched.every(id, 30 * MINUTE, lambda ctx: runs.append(ctx.scheduled_at), catch_up="skip",
                jitter=20 * MINUTE)

    async def main() -> None:
        await sched.start()
        due = present(present(store.get(id)).due_at)
        assert await _tick_at(sched, clock, due) == 1

    run(main())
    assert runs == [START + 30 * MINUTE]
    assert present(store.get(id)).last_status == "ok"


@pytest.mark.parametrize(
    "declare",
    [
        lambda s: s.every("a", 1_000, print, jitter=1_000),  # not below the interval
        lambda s: s.every("a", 1_000, print, jitter=-1),
        lambda s: s.cron("a", "0 * * * *", print, jitter=86_400_001),
        lambda s: s.cron("a", "0 * * * *", print, jitter=1.5),
        lambda s: s.cron("a", "0 * * * *", print, jitter=True),
    ],
)
def test_bad_jitter_is_refused(declare: Any) -> None:
    sched = _scheduler(MemoryScheduleStore(), FakeClock(START))
    with pytest.raises(InvalidArgument):
        declare(sched)
    assert sched.tasks == {}
