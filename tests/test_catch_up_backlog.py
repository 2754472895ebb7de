"""Catch-up ``all`` at its largest limit never stalls the event loop, and an occurrence
outside the dates cron can express ends in one clear completion, not a rerun loop.

A backlog of 10,000 occurrences takes seconds to read: the scheduler reads it in a
worker thread, once per catch-up (``catch_up.advance`` keeps it for the next
completion), while the loop keeps renewing the other runs' leases.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgstore import MemoryScheduleStore
from pgstore.runtime import catch_up
from pgstore.runtime import events as ev
from pgstore.runtime.scheduler import RunContext, Scheduler
from tests.conftest import present
from tests.support.clock import FakeClock, utc_ms
from tests.test_catch_up import _cron_task, _interval_task

DAY = 86_400_000
MINUTE = 60_000
#: Five minutes an hour: a backlog of 10,000 reaches back about 83 days, read through
#: ever wider windows (the costliest shape for ``backlog``).
DENSE = "0-4 * * * *"
#: Before 0001-01-01T00:00Z: no cron date can express it.
BEFORE_YEAR_ONE = -62_135_596_800_000 - 1


@settings(max_examples=40, deadline=None)
@given(expr=st.sampled_from(["*/7 * * * *", "30 2 * * *", "0-4 * * * *"]),
       tz=st.sampled_from(["UTC", "Europe/Berlin"]), limit=st.integers(1, 40),
       down=st.integers(0, 10 * DAY), steps=st.lists(st.integers(0, 3 * MINUTE),
                                                    min_size=1, max_size=30))
def test_advance_answers_what_next_after_does_run_after_run(
    expr: str, tz: str, limit: int, down: int, steps: list[int]
) -> None:
    """Completion after completion (the clock moving on between them), ``advance`` with
    the backlog it kept answers what ``next_after`` computes from scratch."""
    task = _cron_task(expr, tz)
    scheduled = task.first_run_at(utc_ms(2026, 10, 20))
    now = scheduled + down
    last: catch_up.Backlog | None = None
    for step in steps:
        now += step
        if scheduled > now:
            break
        expected = catch_up.next_after("all", task.occurrences(scheduled), scheduled, now,
                                       limit)
        upcoming, last = catch_up.advance(task.occurrences(scheduled), last, scheduled, now,
                                          limit)
        assert upcoming == expected
        scheduled = upcoming


def test_advance_on_an_interval_grid_matches_next_after() -> None:
    task = _interval_task(7_000)
    scheduled, now, last = 7_000, 7_000 * 500, None
    for _ in range(300):
        expected = catch_up.next_after("all", task.occurrences(scheduled), scheduled, now, 50)
        upcoming, last = catch_up.advance(task.occurrences(scheduled), last, scheduled, now, 50)
        assert upcoming == expected
        scheduled, now = upcoming, now + 3_000


@pytest.mark.slow
def test_a_10000_backlog_never_costs_another_run_its_lease() -> None:
    store = MemoryScheduleStore()
    now = store.now_ms()
    # Registered before the scheduler starts: its register keeps these next_run_at.
    store.register("backlog", "cron", DENSE, now - 365 * DAY, now, "all")
    store.register("other", "interval", str(3_600_000), now, now, "once")
    seen: list[ev.Event] = []
    sched = Scheduler(store, owner="a", lease_ms=1_500, concurrency=4, poll_interval=0.05,
                      catch_up_limit=catch_up.MAX_LIMIT, on_event=seen.append)
    ran: list[int] = []
    sched.cron("backlog", DENSE, lambda ctx: ran.append(ctx.scheduled_at), catch_up="all")

    async def other(ctx: RunContext) -> None:
        await asyncio.sleep(4.0)  # renewed every 0.5 s; lost when not renewed in 1.2 s

    sched.every("other", 3_600_000, other)

    def completed() -> int:
        return sum(1 for e in seen if isinstance(e, ev.Complete) and e.subject == "backlog")

    async def main() -> None:
        runner = asyncio.ensure_future(sched.run(handle_signals=False))
        # At least 6 s (the other run's 4 s, renewed throughout), and on until ten backlog
        # runs completed: on a loaded machine reading the year's backlog takes longer.
        loop = asyncio.get_running_loop()
        begun = loop.time()
        while loop.time() - begun < 6.0 or (completed() < 10 and loop.time() - begun < 90.0):
            await asyncio.sleep(0.1)
        sched.stop()
        await runner

    started = time.monotonic()
    asyncio.run(main())
    lost = [e for e in seen if isinstance(e, ev.LeaseLost)]
    done = [e for e in seen if isinstance(e, ev.Complete) and e.subject == "backlog"]
    print(f"\n{len(ran)} backlog runs, {len(done)} completed, in {time.monotonic() - started:.1f}s; "
          f"leases lost: {[(e.subject, e.reason) for e in lost]}")
    assert lost == [], "a lease was lost while the backlog was read"
    others = [e for e in seen if isinstance(e, ev.Complete) and e.subject == "other"]
    assert [e.outcome for e in others] == ["completed"]
    assert len(done) >= 10 and all(e.outcome == "completed" for e in done)
    assert ran == sorted(ran) and len(set(ran)) == len(ran)
    # The first run (a year late), then the oldest of the 10,000 latest due (five an
    # hour: about 83 days back), then one after another.
    assert ran[0] == now - 365 * DAY and ran[1] == done[0].next_run_at
    assert 82 * DAY < now - ran[1] < 84 * DAY
    assert all(b - a in (MINUTE, 56 * MINUTE) for a, b in itertools.pairwise(ran[1:]))


def test_a_next_run_at_before_year_one_completes_once_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = MemoryScheduleStore(), FakeClock(utc_ms(2026, 1, 1))
    store.register("ancient", "cron", "* * * * *", BEFORE_YEAR_ONE, clock(), "all")
    seen: list[ev.Event] = []
    sched = Scheduler(store, owner="a", lease_ms=1_000, clock=clock, on_event=seen.append)
    ran: list[int] = []
    sched.cron("ancient", "* * * * *", lambda ctx: ran.append(ctx.scheduled_at),
               catch_up="all")

    async def main() -> None:
        await sched.start()
        for _ in range(3):  # each round past the lease: a run left open would run again
            await sched.tick()
            await sched.wait_idle()
            clock.set(clock() + 2_000)

    with caplog.at_level(logging.ERROR, logger="pgstore.scheduler"):
        asyncio.run(main())
    completes = [(e.outcome, e.status, e.next_run_at) for e in seen
                 if isinstance(e, ev.Complete)]
    print(f"\nruns {ran}; completes {completes}; errors "
          f"{[r.getMessage()[:120] for r in caplog.records]}")
    assert ran == [BEFORE_YEAR_ONE], "run exactly once"
    next_minute = utc_ms(2026, 1, 1, 0, 1)
    assert completes == [("completed", "ok", next_minute)]
    record = present(store.get("ancient"))
    assert (record.next_run_at, record.last_status, record.lease_owner) == (
        next_minute, "ok", None)
    assert any("cannot compute the next occurrence" in r.getMessage()
               for r in caplog.records)

