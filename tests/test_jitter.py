"""Per-schedule jitter (docs/schedule-controls.md#jitter) as hypothesis properties: the
offset's range and determinism, SQL's ``schedule_due_at`` against the Python reference
``jitter_due_at``, the DST rules of cron occurrences holding under jitter (a Scheduler
moved from due time to due time across the 2026 changes runs exactly the nominal
occurrences ``next_cron`` steps through), and the catch-up policies after downtime with
lateness counted from the jittered due time."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from pgstore import MemoryScheduleStore
from pgstore.models import MAX_JITTER_MS, CatchUp, jitter_due_at
from pgstore.runtime.occurrences import cron_between, cron_spec, next_interval
from pgstore.runtime.scheduler import Scheduler
from tests.conftest import present
from tests.support.clock import FakeClock, utc_ms

BIGINT_MAX = 2**63 - 1
BIGINT_MIN = -(2**63)
MINUTE = 60_000
HOUR = 60 * MINUTE
PROPERTIES = settings(max_examples=200, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])

ids = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
              min_size=1, max_size=40)
instants = st.one_of(st.integers(BIGINT_MIN, BIGINT_MAX),
                     st.integers(-(10**13), 10**13),
                     st.integers(BIGINT_MAX - MAX_JITTER_MS, BIGINT_MAX))
jitters = st.one_of(st.integers(0, MAX_JITTER_MS), st.sampled_from([0, 1, 2, MAX_JITTER_MS]))


@PROPERTIES
@given(id=ids, at=instants, jitter=jitters)
def test_the_offset_lies_in_zero_to_jitter_and_is_deterministic(
    id: str, at: int, jitter: int
) -> None:
    due = present(jitter_due_at(id, at, jitter))
    assert due == jitter_due_at(id, at, jitter)
    if jitter == 0:
        assert due == at
    elif at > BIGINT_MAX - jitter:
        assert at <= due <= BIGINT_MAX  # capped, never an overflow
    else:
        assert at <= due < at + jitter
    assert jitter_due_at(id, None, jitter) is None


def test_offsets_spread_over_the_window() -> None:
    """A thousand hourly schedules due at the top of the hour spread over ten minutes:
    every one-minute bucket gets some (about a hundred each)."""
    top = utc_ms(2026, 12, 6, 3)
    buckets = [0] * 10
    for n in range(1_000):
        buckets[(present(jitter_due_at(f"sync-{n}", top, 10 * MINUTE)) - top) // MINUTE] += 1
    assert min(buckets) > 50, buckets


@pytest.fixture
def conn(pgstore_database: str, pgstore_schema: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pgstore_database, autocommit=True) as connection:
        connection.execute(sql.SQL("SET search_path TO {}").format(
            sql.Identifier(pgstore_schema)))
        yield connection


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cases=st.lists(st.tuples(ids, instants, jitters), min_size=1, max_size=40))
def test_sql_computes_the_reference_offset(
    conn: psycopg.Connection[Any], cases: list[tuple[str, int, int]]
) -> None:
    rows = conn.execute(
        "SELECT schedule_due_at(c.id, c.at, c.jitter) FROM unnest(%s::text[], %s::bigint[],"
        " %s::bigint[]) WITH ORDINALITY AS c(id, at, jitter, n) ORDER BY c.n",
        ([c[0] for c in cases], [c[1] for c in cases], [c[2] for c in cases]),
    ).fetchall()
    assert [r[0] for r in rows] == [jitter_due_at(*c) for c in cases]


# --- DST rules under jitter --------------------------------------------------------------

EXPRESSIONS = ["30 2 * * *", "*/30 * * * *", "15 1,2,3 * * *", "0 * * * *"]
ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"]
#: The day before a 2026 change: Berlin 03-29 and 10-25, New York 03-08 and 11-01.
AROUND = st.sampled_from([utc_ms(2026, 3, 28, 12), utc_ms(2026, 10, 24, 12),
                          utc_ms(2026, 3, 7, 12), utc_ms(2026, 10, 31, 12),
                          utc_ms(2026, 4, 4, 6)])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=st.sampled_from(EXPRESSIONS), tz=st.sampled_from(ZONES), start=AROUND,
       fraction=st.floats(0, 0.99))
def test_a_jittered_cron_runs_every_nominal_occurrence_through_dst(
    expr: str, tz: str, start: int, fraction: float
) -> None:
    spec = cron_spec(expr, tz)
    nominal = cron_between(spec, start, start + 36 * HOUR)
    gaps = [b - a for a, b in itertools.pairwise(nominal)]
    jitter = int(fraction * min(gaps)) if gaps else 0  # below the shortest gap
    store, clock = MemoryScheduleStore(), FakeClock(start)
    sched = Scheduler(store, clock=clock, owner="host-a", lease_ms=30_000)
    runs: list[tuple[int, int]] = []
    sched.cron("c", expr, lambda ctx: runs.append((ctx.scheduled_at, ctx.started_at)), tz=tz,
               jitter=jitter)

    async def main() -> None:
        await sched.start()
        for expected in nominal:
            record = present(store.get("c"))
            assert record.next_run_at == expected
            due = present(record.due_at)
            assert due == jitter_due_at("c", expected, jitter)
            if due > expected:
                clock.set(due - 1)
                assert await sched.tick() == 0  # not before its jittered time
            clock.set(due)
            assert await sched.tick() == 1
            await sched.wait_idle()

    asyncio.run(main())
    assert [at for at, _ in runs] == nominal  # the DST rules, unchanged
    assert all(at <= claimed < at + max(jitter, 1) for at, claimed in runs)


# --- catch-up after downtime, counted from the due time --------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["skip", "once", "all"]),
       period=st.sampled_from([1_000, 7_000, MINUTE]), fraction=st.floats(0, 0.99),
       down=st.integers(0, 200_000), limit=st.integers(1, 12), grace=st.integers(1, 30_000))
def test_after_downtime_each_policy_counts_from_the_jittered_due_time(
    policy: CatchUp, period: int, fraction: float, down: int, limit: int, grace: int
) -> None:
    jitter = int(fraction * period)
    store, clock = MemoryScheduleStore(), FakeClock(0)
    sched = Scheduler(store, clock=clock, owner="host-a", lease_ms=30_000,
                      catch_up_limit=limit, catch_up_grace_ms=grace)
    runs: list[int] = []
    sched.every("tick", period, lambda ctx: runs.append(ctx.scheduled_at), catch_up=policy,
                jitter=jitter)

    def due(at: int) -> int:
        return present(jitter_due_at("tick", at, jitter))

    now = due(period) + down  # the first occurrence, claimed `down` after its due time

    async def main() -> None:
        await sched.start()
        clock.set(now)
        for _ in range(1_000):
            if await sched.tick() == 0:
                break
            await sched.wait_idle()

    asyncio.run(main())
    missed = list(range(2 * period, now + 1, period))  # nominal, after the first
    if policy == "skip":
        expected = [period] if down <= grace else []
    elif policy == "once":
        expected = [period]
    else:  # each missed one, up to the limit, as far as it is due by now
        expected = [period] + [at for at in missed[-limit:] if due(at) <= now]
    assert runs == expected
    record = present(store.get("tick"))
    left = [at for at in missed[-limit:] if due(at) > now] if policy == "all" else []
    assert record.next_run_at == (left[0] if left else next_interval(period, period, now))
    assert record.due_at == due(present(record.next_run_at))
