"""Catch-up policies (docs/catch-up.md): the occurrence logic as properties, the
Scheduler applying them over the memory store with a clock moved by hand, and the same
runs on every store kind."""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgstore import (
    AsyncPgScheduleStore,
    CatchUp,
    InvalidArgument,
    MemoryScheduleStore,
    PgScheduleStore,
    ScheduleRecord,
)
from pgstore.cli.format import schedules_table
from pgstore.cli.status import last_run_state
from pgstore.runtime import catch_up
from pgstore.runtime.events import Complete, HandlerRun
from pgstore.runtime.occurrences import (
    cron_between,
    cron_spec,
    interval_between,
    next_cron,
    next_interval,
)
from pgstore.runtime.scheduler import RunContext, Scheduler, Task
from tests.conftest import present
from tests.support.clock import FakeClock, utc_ms
from tests.test_scheduler import _scheduler, run

HOUR = 3_600_000
MINUTE = 60_000
POLICIES: tuple[CatchUp, ...] = ("skip", "once", "all")
PROPERTIES = settings(max_examples=60, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])

#: Expressions with a rule each around DST: daily in a gap and a fold, frequent (real
#: time), several hours in one gap, weekly, and a dense burst on one day.
EXPRESSIONS = ["30 2 * * *", "*/30 * * * *", "15 1,2,3 * * *", "0 0 * * 0", "*/20 9 * * *",
               "0 * * * *"]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]
#: Around the 2026 changes: Berlin 03-29 and 10-25, New York 03-08 and 11-01.
AROUND = st.sampled_from([utc_ms(2026, 3, 7), utc_ms(2026, 3, 28), utc_ms(2026, 6, 1),
                          utc_ms(2026, 10, 24), utc_ms(2026, 10, 31), utc_ms(2026, 4, 4)])


def _walk(following: Callable[[int], int], after: int, until: int) -> list[int]:
    """Every occurrence in (after, until], one ``following`` step at a time."""
    found, instant = [], following(after)
    while instant <= until:
        found.append(instant)
        instant = following(instant)
    return found


def _cron_task(expr: str, tz: str) -> Task:
    spec = cron_spec(expr, tz)
    return Task("t", "cron", spec.stored(), lambda: None, cron=spec)


def _interval_task(period: int) -> Task:
    return Task("t", "interval", str(period), lambda: None, period_ms=period)


# --- The occurrence logic --------------------------------------------------------------


@PROPERTIES
@given(expr=st.sampled_from(EXPRESSIONS), tz=st.sampled_from(ZONES), around=AROUND,
       offset=st.integers(0, 2 * 24 * HOUR), span=st.integers(0, 3 * 24 * HOUR))
def test_cron_between_lists_what_next_cron_steps_through(
    expr: str, tz: str, around: int, offset: int, span: int
) -> None:
    spec = cron_spec(expr, tz)
    after = around + offset
    assert cron_between(spec, after, after + span) == _walk(
        lambda t: next_cron(spec, t), after, after + span
    )


@PROPERTIES
@given(scheduled=st.integers(-10**9, 10**12), period=st.integers(1, 10**6),
       after=st.integers(0, 50), span=st.integers(0, 300), jitter=st.integers(0, 10**6))
def test_interval_between_lists_the_grid(
    scheduled: int, period: int, after: int, span: int, jitter: int
) -> None:
    start = scheduled + after * period + jitter % period
    span = span * period + jitter % 7
    assert interval_between(scheduled, period, start, start + span) == _walk(
        lambda t: next_interval(scheduled, period, t), start, start + span
    )


def _occurrence_cases() -> st.SearchStrategy[tuple[Task, int]]:
    """A task and one of its occurrences (the one scheduled, claimed late)."""
    crons = st.builds(
        lambda expr, tz, around: (task := _cron_task(expr, tz),
                                  present(task.occurrences(around).following(around))),
        st.sampled_from(EXPRESSIONS), st.sampled_from(ZONES), AROUND,
    )
    intervals = st.builds(
        lambda period, at: (_interval_task(period), at),
        st.sampled_from([1, 7, MINUTE, HOUR, 5 * HOUR]), st.integers(0, 10**12),
    )
    return st.one_of(crons, intervals)


def _late(task: Task, scheduled: int, gaps: int, jitter: int) -> int:
    """How late a claim is: ``gaps`` times the gap after ``scheduled``, plus a jitter."""
    gap = task.occurrences(scheduled).following(scheduled) - scheduled
    return gaps * gap + jitter % gap


@PROPERTIES
@given(case=_occurrence_cases(), gaps=st.integers(0, 80), jitter=st.integers(0, 10**9),
       limit=st.integers(1, 40))
def test_backlog_is_the_latest_missed_occurrences_oldest_first(
    case: tuple[Task, int], gaps: int, jitter: int, limit: int
) -> None:
    task, scheduled = case
    late = _late(task, scheduled, gaps, jitter)
    occurrences = task.occurrences(scheduled)
    missed = _walk(occurrences.following, scheduled, scheduled + late)
    assert catch_up.backlog(occurrences, scheduled, scheduled + late, limit) == missed[-limit:]


def _drain(task: Task, policy: CatchUp, scheduled: int, now: int, limit: int,
           grace: int) -> tuple[list[int], int | None]:
    """What a scheduler runs from ``scheduled`` on while the clock stands at ``now``
    (every run instant): the occurrences run, and the next_run_at left."""
    ran: list[int] = []
    at: int | None = scheduled
    while at is not None and at <= now:
        assert len(ran) <= limit + 1, "catch-up beyond its cap"
        if catch_up.runs(policy, at, now, grace):
            ran.append(at)
        at = task.next_run_at(at, now, policy, limit)
    return ran, at


@PROPERTIES
@given(case=_occurrence_cases(), gaps=st.integers(0, 80), jitter=st.integers(0, 10**9),
       limit=st.integers(1, 40), grace=st.integers(1, 2 * HOUR),
       policy=st.sampled_from(POLICIES))
def test_each_policy_runs_what_it_says_then_the_future(
    case: tuple[Task, int], gaps: int, jitter: int, limit: int, grace: int, policy: CatchUp
) -> None:
    task, scheduled = case
    late = _late(task, scheduled, gaps, jitter)
    now = scheduled + late
    following = task.occurrences(scheduled).following
    missed = _walk(following, scheduled, now)  # due after the one claimed
    ran, upcoming = _drain(task, policy, scheduled, now, limit, grace)
    if policy == "skip":
        assert ran == ([scheduled] if late <= grace else [])
    elif policy == "once":
        assert ran == [scheduled]
    else:
        assert ran == [scheduled, *missed[-limit:]]
    assert upcoming == following(now)  # then the first occurrence in the future


def test_all_with_a_long_downtime_costs_the_cap_not_the_downtime() -> None:
    task = _cron_task("* * * * *", "Europe/Berlin")
    scheduled = utc_ms(2025, 1, 1)
    now = utc_ms(2026, 1, 1)  # 525,600 missed minutes
    due = catch_up.backlog(task.occurrences(scheduled), scheduled, now, catch_up.MAX_LIMIT)
    assert len(due) == catch_up.MAX_LIMIT and due[-1] == now
    assert due == list(range(now - (catch_up.MAX_LIMIT - 1) * MINUTE, now + 1, MINUTE))


@pytest.mark.parametrize("limit", [0, -1, catch_up.MAX_LIMIT + 1, None, 2**63])
def test_backlog_limit_is_bounded(limit: Any) -> None:
    with pytest.raises(InvalidArgument):
        catch_up.backlog(_interval_task(1_000).occurrences(0), 0, 10_000, limit)


# --- The Scheduler over the memory store -------------------------------------------------


async def _settle(sched: Scheduler) -> None:
    """Tick until nothing is claimable at the clock's time."""
    for _ in range(1_000):
        if await sched.tick() == 0:
            return
        await sched.wait_idle()
    raise AssertionError("the scheduler kept claiming")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), period=st.sampled_from([1_000, 7_000, MINUTE]),
       down=st.integers(0, 200_000), limit=st.integers(1, 12),
       grace=st.integers(1, 30_000))
def test_scheduler_after_downtime_follows_its_policy_on_the_memory_store(
    policy: CatchUp, period: int, down: int, limit: int, grace: int
) -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    sched = _scheduler(store, clock, catch_up_limit=limit, catch_up_grace_ms=grace)
    runs: list[int] = []
    sched.every("tick", period, lambda ctx: runs.append(ctx.scheduled_at), catch_up=policy)

    async def main() -> None:
        await sched.start()
        clock.set(period + down)  # the first occurrence, claimed `down` late
        await _settle(sched)

    run(main())
    grid = list(range(period, period + down + 1, period))
    expected = {"skip": grid[:1] if down <= grace else [], "once": grid[:1],
                "all": grid[:1] + grid[1:][-limit:]}[policy]
    assert runs == expected
    record = present(store.get("tick"))
    assert record.catch_up == policy
    assert record.next_run_at == next_interval(period, period, period + down)
    assert record.last_status == ("ok" if runs else "skipped")
    assert record.fencing_token == len(runs) + (0 if runs else 1)


def test_cron_skip_after_downtime_runs_nothing_missed_and_records_skipped() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(utc_ms(2026, 3, 27, 12))
    sched = _scheduler(store, clock)
    runs: list[int] = []
    sched.cron("daily", "30 2 * * *", lambda ctx: runs.append(ctx.scheduled_at),
               tz="Europe/Berlin", catch_up="skip")

    async def main() -> None:
        await sched.start()
        clock.set(utc_ms(2026, 3, 30, 9))  # down over three runs, the DST one included
        await _settle(sched)
        clock.set(utc_ms(2026, 3, 31, 0, 30, 20))  # 20 s late: within the grace, runs
        await _settle(sched)

    run(main())
    assert runs == [utc_ms(2026, 3, 31, 0, 30)]
    record = present(store.get("daily"))
    assert (record.last_status, record.next_run_at) == ("ok", utc_ms(2026, 4, 1, 0, 30))
    assert record.fencing_token == 2  # one claim skipped, one ran


def test_cron_all_runs_the_missed_occurrences_in_order_through_dst_then_the_future() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(utc_ms(2026, 10, 23, 12))
    sched = _scheduler(store, clock, catch_up_limit=3)
    runs: list[int] = []
    sched.cron("daily", "30 2 * * *", lambda ctx: runs.append(ctx.scheduled_at),
               tz="Europe/Berlin", catch_up="all")
    sched.cron("halfhourly", "*/30 * * * *", lambda ctx: runs.append(-ctx.scheduled_at),
               tz="Europe/Berlin", catch_up="all")

    async def main() -> None:
        await sched.start()
        clock.set(utc_ms(2026, 10, 28, 1))  # daily: 24th .. 27th ran late, 28th not due
        await _settle(sched)

    run(main())
    daily = [at for at in runs if at > 0]
    # The first missed run, then the cap's three latest: the fold day (25th) runs once,
    # at its first 02:30 (CEST); the 26th and 27th at 02:30 CET.
    assert daily == [utc_ms(2026, 10, 24, 0, 30), utc_ms(2026, 10, 25, 0, 30),
                     utc_ms(2026, 10, 26, 1, 30), utc_ms(2026, 10, 27, 1, 30)]
    half = [-at for at in runs if at < 0]
    assert half == sorted(half) and len(half) == 4 and half[-1] == utc_ms(2026, 10, 28, 1)
    assert present(store.get("daily")).next_run_at == utc_ms(2026, 10, 28, 1, 30)


def test_a_skipped_occurrence_is_a_complete_event_without_a_handler_run() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    events: list[Any] = []
    sched = _scheduler(store, clock, on_event=events.append, catch_up_grace_ms=1_000)
    sched.every("tick", 1_000, lambda: None, catch_up="skip")

    async def main() -> None:
        await sched.start()
        clock.set(2_500)  # 1,000 is 1.5 s late: skipped
        await _settle(sched)
        clock.set(3_200)  # 3,000 is 200 ms late: runs
        await _settle(sched)

    run(main())
    completes = [e for e in events if isinstance(e, Complete)]
    assert [(e.token, e.outcome, e.status, e.next_run_at) for e in completes] == [
        (1, "completed", "skipped", 3_000), (2, "completed", "ok", 4_000)
    ]
    assert [e.token for e in events if isinstance(e, HandlerRun)] == [2]


def test_a_one_shot_with_skip_missed_is_a_tombstone_never_run() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    sched = _scheduler(store, clock, catch_up_grace_ms=1_000)
    runs: list[int] = []
    sched.once("late", 5_000, lambda ctx: runs.append(ctx.scheduled_at), catch_up="skip")
    sched.once("soon", 6_500, lambda ctx: runs.append(ctx.scheduled_at), catch_up="skip")

    async def main() -> None:
        await sched.start()
        clock.set(7_000)  # late: 2 s late, soon: 500 ms
        await _settle(sched)

    run(main())
    assert runs == [6_500]
    late, soon = present(store.get("late")), present(store.get("soon"))
    assert (late.next_run_at, late.last_status) == (None, "skipped")
    assert (soon.next_run_at, soon.last_status) == (None, "ok")


def test_the_records_policy_is_applied_and_a_new_one_alone_keeps_the_occurrence() -> None:
    store, clock = MemoryScheduleStore(), FakeClock(0)
    first = _scheduler(store, clock)
    first.every("tick", 1_000, lambda: None)
    run(first.start())
    assert present(store.get("tick")).catch_up == "once"
    runs: list[int] = []
    second = _scheduler(store, clock, owner="host-b", catch_up_grace_ms=1_000)
    second.every("tick", 1_000, lambda ctx: runs.append(ctx.scheduled_at), catch_up="all")

    async def main() -> None:
        await second.start()
        record = present(store.get("tick"))
        assert (record.catch_up, record.next_run_at) == ("all", 1_000)  # kept
        clock.set(3_500)
        await _settle(second)
        assert runs == [1_000, 2_000, 3_000]
        # Another process (any language) sets the policy: the claimer applies the record's.
        store.register("tick", "interval", "1000", 0, 3_600, "skip")
        clock.set(6_500)  # 4,000 is 2.5 s late
        await _settle(second)

    run(main())
    assert runs == [1_000, 2_000, 3_000]
    record = present(store.get("tick"))
    assert (record.last_status, record.next_run_at, record.catch_up) == ("skipped", 7_000, "skip")


def test_a_run_holding_its_lease_is_never_overlapped_by_later_occurrences() -> None:
    """While one run is in progress (its lease held and renewed), occurrences falling
    due start no second run, on this host or another; afterwards ``all`` catches them
    up one at a time, in order."""
    store, clock = MemoryScheduleStore(), FakeClock(0)
    release, started = threading.Event(), threading.Event()
    active, most, runs = [0], [0], []
    lock = threading.Lock()

    def handler(ctx: RunContext) -> None:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
            runs.append((ctx.owner, ctx.scheduled_at))
        started.set()
        if ctx.scheduled_at == 1_000:
            assert release.wait(10)
        with lock:
            active[0] -= 1

    hosts = [_scheduler(store, clock, owner=f"host-{n}", lease_ms=60_000) for n in "ab"]
    for host in hosts:
        host.every("slow", 1_000, handler, catch_up="all")

    async def main() -> None:
        for host in hosts:
            await host.start()
        clock.set(1_000)
        assert await hosts[0].tick() == 1
        assert await asyncio.to_thread(started.wait, 10)
        for now in range(1_100, 6_000, 300):  # five occurrences fall due
            clock.set(now)
            assert await hosts[1].tick() == 0
            assert await hosts[0].tick() == 0
            record = present(store.get("slow"))
            assert record.lease_owner == "host-a" and record.next_run_at == 1_000
        release.set()
        await hosts[0].wait_idle()
        for host in hosts:
            await _settle(host)

    run(main())
    assert most[0] == 1
    assert [at for _, at in runs] == [1_000, 2_000, 3_000, 4_000, 5_000]


def test_declarations_and_settings_are_validated() -> None:
    sched = Scheduler(MemoryScheduleStore())
    for bad in ("", "ALL", None, "skipped", 1):
        with pytest.raises(InvalidArgument, match="catch_up"):
            sched.every("a", 1_000, lambda: None, catch_up=bad)  # type: ignore[call-overload]
        with pytest.raises(InvalidArgument, match="catch_up"):
            sched.cron("b", "* * * * *", lambda: None, catch_up=bad)  # type: ignore[call-overload]
    with pytest.raises(InvalidArgument, match="one-shot"):
        sched.once("c", 1_000, lambda: None, catch_up="all")
    assert sched.tasks == {}
    for limit in (0, -1, catch_up.MAX_LIMIT + 1, None, 2**63, 1.5, True):
        with pytest.raises(InvalidArgument, match="catch_up_limit"):
            Scheduler(MemoryScheduleStore(), catch_up_limit=limit)  # type: ignore[arg-type]
    for grace in (0, -1, 2**63, 1.5, "60"):
        with pytest.raises(InvalidArgument, match="catch_up_grace_ms"):
            Scheduler(MemoryScheduleStore(), catch_up_grace_ms=grace)  # type: ignore[arg-type]
    assert Scheduler(MemoryScheduleStore()).catch_up_grace_ms == catch_up.DEFAULT_GRACE_MS
    assert Scheduler(MemoryScheduleStore(), poll_interval=30).catch_up_grace_ms == 90_000
    assert Scheduler(MemoryScheduleStore(), catch_up_limit=catch_up.MAX_LIMIT).catch_up_limit == (
        catch_up.MAX_LIMIT
    )


def test_the_command_line_shows_a_skipped_occurrence_and_the_policy() -> None:
    now = 1_700_000_000_000
    record = ScheduleRecord("t", "interval", "1000", now + 1_000, now - 12_000, "skipped", 3,
                            None, None, now, 2, "skip")
    assert last_run_state(record, now) == "skipped 12s ago"  # not a failure count
    table = schedules_table([record], now).splitlines()
    cells = dict(zip(re.split(r" {2,}", table[0]), re.split(r" {2,}", table[2]), strict=True))
    assert (cells["last_status"], cells["failures"], cells["catch_up"]) == ("skipped", "2", "skip")


# --- Every store kind ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "pg", "pg_async"])
def test_each_policy_after_downtime_on_every_store_kind(
    kind: str, request: pytest.FixtureRequest
) -> None:
    dsn = schema = ""
    if kind != "memory":
        dsn = request.getfixturevalue("pgstore_database")
        schema = request.getfixturevalue("pgstore_schema")
    clock = FakeClock(utc_ms(2026, 6, 1, 9, 10))
    runs: list[tuple[str, int]] = []

    async def main() -> dict[str, Any]:
        store: Any = (MemoryScheduleStore() if kind == "memory"
                      else PgScheduleStore(dsn, schema=schema) if kind == "pg"
                      else AsyncPgScheduleStore(dsn, schema=schema))
        sched = _scheduler(store, clock, catch_up_limit=2)
        for policy in POLICIES:
            sched.cron(policy, "0 * * * *", lambda ctx: runs.append((ctx.task_id, ctx.scheduled_at)),
                       catch_up=policy)
        await sched.start()
        clock.set(utc_ms(2026, 6, 1, 14, 20))  # 10:00 .. 14:00 missed
        await _settle(sched)
        records = await store.list() if kind == "pg_async" else store.list()
        if kind == "pg_async":
            await store.close()
        elif kind == "pg":
            store.close()
        return {r.id: r for r in records}

    records = run(main())
    hour = [utc_ms(2026, 6, 1, h) for h in range(10, 16)]
    assert sorted(runs) == sorted([("all", hour[0]), ("all", hour[3]), ("all", hour[4]),
                                   ("once", hour[0])])
    assert [at for task, at in runs if task == "all"] == [hour[0], hour[3], hour[4]]
    assert {id: (r.catch_up, r.last_status, r.next_run_at) for id, r in records.items()} == {
        "all": ("all", "ok", hour[5]), "once": ("once", "ok", hour[5]),
        "skip": ("skip", "skipped", hour[5]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_slow_runs_are_never_overlapped_by_parallel_schedulers_on_postgres(
    policy: CatchUp, pgstore_database: str, pgstore_schema: str
) -> None:
    """Three schedulers, each on its own connections, in real parallel, on a task due
    every 40 ms whose runs take 150 ms: at no instant do two runs of it overlap, no
    occurrence runs twice, and the occurrences run in order. ``all`` keeps catching up
    (several runs per period's worth of backlog), ``once`` and ``skip`` go on with the
    future."""
    lock = threading.Lock()
    active, most = [0], [0]
    runs: list[tuple[int, int]] = []

    async def slow(ctx: RunContext) -> None:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
            runs.append((ctx.scheduled_at, ctx.fencing_token))
        await asyncio.sleep(0.15)
        with lock:
            active[0] -= 1

    async def main() -> None:
        stores = [AsyncPgScheduleStore(pgstore_database, schema=pgstore_schema)
                  for _ in range(3)]
        schedulers = []
        for n, store in enumerate(stores):
            s = Scheduler(store, owner=f"host-{n}", lease_ms=5_000, poll_interval=0.01,
                          # A cap above any backlog 2.5 s can build: under load the runs
                          # take longer, and a cap reached would make ``all`` jump ahead.
                          grace_period=2.0, catch_up_limit=10_000, catch_up_grace_ms=1_000)
            s.every(f"slow-{policy}", 40, slow, catch_up=policy)
            schedulers.append(s)
        tasks = [asyncio.ensure_future(s.run()) for s in schedulers]
        await asyncio.sleep(2.5)
        for s in schedulers:
            s.stop()
        await asyncio.gather(*tasks)
        for store in stores:
            await store.close()

    run(main())
    assert most[0] == 1, "two runs of one schedule overlapped"
    scheduled = [at for at, _ in runs]
    assert len(set(scheduled)) == len(scheduled) and scheduled == sorted(scheduled)
    tokens = [token for _, token in runs]
    assert tokens == sorted(tokens)
    assert len(runs) >= 3, runs  # 2.5 s of 150 ms runs, on a loaded machine too
    gaps = {b - a for a, b in itertools.pairwise(scheduled)}
    assert all(g % 40 == 0 for g in gaps), gaps  # on the grid
    if policy == "all":
        assert 40 in gaps  # caught up occurrence by occurrence
