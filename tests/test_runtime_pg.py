"""The Scheduler and the Dispatcher end to end on PostgreSQL: several instances, each
with its own connections, in real parallel; and wake-ups through LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import threading
import time
from collections import Counter
from typing import Any

import pytest

from pgstore import AsyncPgJobStore, AsyncPgScheduleStore, Job, PgJobStore, PgScheduleStore
from pgstore.runtime.dispatcher import Dispatcher
from pgstore.runtime.scheduler import RunContext, Scheduler
from tests.support.clock import FakeClock
from tests.support.wakeup import wake_up_latency

pytestmark = pytest.mark.slow


def test_three_schedulers_run_every_occurrence_once(
    pgstore_database: str, pgstore_schema: str
) -> None:
    runs: list[tuple[str, int, int, str]] = []
    lock = threading.Lock()

    def record(ctx: RunContext) -> None:
        with lock:
            runs.append((ctx.task_id, ctx.scheduled_at, ctx.fencing_token, ctx.owner))
        time.sleep(random.uniform(0, 0.05))

    async def arecord(ctx: RunContext) -> None:
        with lock:
            runs.append((ctx.task_id, ctx.scheduled_at, ctx.fencing_token, ctx.owner))
        await asyncio.sleep(random.uniform(0, 0.05))

    stores: list[Any] = [
        PgScheduleStore(pgstore_database, schema=pgstore_schema),
        PgScheduleStore(pgstore_database, schema=pgstore_schema),
        AsyncPgScheduleStore(pgstore_database, schema=pgstore_schema),
    ]
    schedulers = []
    for n, store in enumerate(stores):
        s = Scheduler(store, owner=f"host-{n}", lease_ms=5_000, poll_interval=0.02,
                      grace_period=2.0)
        s.every("fast", 100, record)
        s.every("slower", 250, arecord)
        s.every("third", 170, record)
        schedulers.append(s)

    async def main() -> None:
        tasks = [asyncio.ensure_future(s.run()) for s in schedulers]
        await asyncio.sleep(3.0)
        for s in schedulers:
            s.stop()
        await asyncio.gather(*tasks)
        await _close(stores)

    asyncio.run(main())
    with PgScheduleStore(pgstore_database, schema=pgstore_schema) as check:
        records = {r.id: r for r in check.list()}

    occurrences = Counter((task, at) for task, at, _, _ in runs)
    assert [k for k, n in occurrences.items() if n > 1] == []  # no occurrence ran twice
    for task, interval in [("fast", 100), ("slower", 250), ("third", 170)]:
        mine = sorted((at, token) for t, at, token, _ in runs if t == task)
        tokens = [token for _, token in mine]
        assert tokens == list(range(1, len(tokens) + 1)), task  # one claim per run, in order
        gaps = {b - a for (a, _), (b, _) in itertools.pairwise(mine)}
        assert all(g % interval == 0 for g in gaps), (task, gaps)  # on the fixed-rate grid
        assert len(mine) >= 3000 // interval // 3, (task, len(mine))
        assert records[task].fencing_token in (len(mine), len(mine) + 1), task
    assert len({owner for _, _, _, owner in runs}) >= 2  # the work was shared


def test_lease_loss_on_postgres_told_and_stale_complete_rejected(
    pgstore_database: str, pgstore_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(0)
    lease = 900
    slow_store = PgScheduleStore(pgstore_database, schema=pgstore_schema)
    fast_store = PgScheduleStore(pgstore_database, schema=pgstore_schema)
    slow = Scheduler(slow_store, owner="slow", lease_ms=lease, clock=clock)
    fast = Scheduler(fast_store, owner="fast", lease_ms=lease, clock=clock)
    told = threading.Event()
    frozen = threading.Event()  # the slow handler of token 3 waits on it
    thawed = threading.Event()  # the slow keeper's renews wait on it

    def handler(ctx: RunContext) -> None:
        if ctx.owner == "slow" and ctx.fencing_token == 1:
            told.set() if ctx.lease_lost.wait(10) else None
        if ctx.owner == "slow" and ctx.fencing_token == 3:
            frozen.wait(10)  # its keeper is frozen too (below): finishes after losing the lease

    for s in (slow, fast):
        s.every("report", 1_000, handler)

    async def main() -> None:
        await slow.start()
        await fast.start()
        # 1. renew refused: the handler is told and nothing is completed.
        clock.set(1_000)
        assert await slow.tick() == 1  # token 1
        clock.set(1_000 + lease)
        assert await fast.tick() == 1  # token 2, completes at once
        await fast.wait_idle()
        await slow.wait_idle()
        # 2. a frozen holder (no renews) finishes late: its complete is rejected.
        original = slow._renew

        async def frozen_renew(id: str, fencing_token: int, lease_until: int) -> bool:
            await asyncio.to_thread(thawed.wait, 10)
            return await original(id, fencing_token, lease_until)

        slow._renew = frozen_renew
        clock.set(2_000)
        assert await slow.tick() == 1  # token 3
        clock.set(2_000 + lease)
        assert await fast.tick() == 1  # token 4
        await fast.wait_idle()
        frozen.set()
        await slow.wait_idle()
        thawed.set()

    with caplog.at_level(logging.INFO, logger="pgstore.scheduler"):
        asyncio.run(main())
    slow_store.close()
    fast_store.close()
    assert told.is_set()
    assert "renew of report token 1 refused: lease lost" in caplog.text
    assert "complete of report token 3 rejected: stale claim" in caplog.text
    with PgScheduleStore(pgstore_database, schema=pgstore_schema) as check:
        record = check.get("report")
    assert record is not None and record.fencing_token == 4 and record.lease_owner is None
    assert record.next_run_at == 3_000 and record.last_run_at == 2_000 + lease


def test_three_dispatchers_send_each_bot_once_and_recall_cancelled_ones(
    pgstore_database: str, pgstore_schema: str
) -> None:
    sent: list[tuple[str, str]] = []
    recalled: list[tuple[str, str | None]] = []
    lock = threading.Lock()

    def dispatch(job: Job) -> str:
        time.sleep(random.uniform(0, 0.03))
        with lock:
            sent.append((job.run_id, job.lease_holder or "?"))
            return f"bot-{job.run_id}"

    async def adispatch(job: Job) -> str:
        await asyncio.sleep(random.uniform(0, 0.03))
        with lock:
            sent.append((job.run_id, job.lease_holder or "?"))
        return f"bot-{job.run_id}"

    def recall(job: Job, worker_id: str | None) -> None:
        with lock:
            recalled.append((job.run_id, worker_id))

    producer = PgJobStore(pgstore_database, schema=pgstore_schema)
    producer.start()
    now = producer.now_ms()
    run_ids = [f"meeting-{n:02d}" for n in range(48)]
    for n, run_id in enumerate(run_ids):
        producer.schedule(run_id, now + 40 * n)  # due over about 2 s
    stores: list[Any] = [
        PgJobStore(pgstore_database, schema=pgstore_schema),
        PgJobStore(pgstore_database, schema=pgstore_schema),
        AsyncPgJobStore(pgstore_database, schema=pgstore_schema),
    ]
    dispatchers = [
        Dispatcher(store, adispatch if n == 2 else dispatch, recall, holder=f"d{n}",
                   ttl_ms=5_000, poll_interval=0.05, concurrency=3)
        for n, store in enumerate(stores)
    ]
    cancelled: dict[str, str] = {}

    async def cancel_some() -> None:
        for run_id in random.Random(7).sample(run_ids, 16):
            await asyncio.sleep(0.08)
            answer = await asyncio.to_thread(producer.cancel, run_id)
            cancelled[run_id] = answer.value

    async def main() -> None:
        tasks = [asyncio.ensure_future(d.run()) for d in dispatchers]
        await cancel_some()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pending = await asyncio.to_thread(_pending, producer, run_ids)
            if not pending:
                break
            await asyncio.sleep(0.1)
        for d in dispatchers:
            d.stop()
        await asyncio.gather(*tasks)
        await _close(stores)

    asyncio.run(main())
    final = {run_id: producer.get(run_id) for run_id in run_ids}
    producer.close()

    counts = Counter(run_id for run_id, _ in sent)
    assert [r for r, n in counts.items() if n > 1] == []  # no bot sent twice
    for run_id in run_ids:
        job = final[run_id]
        assert job is not None
        if cancelled.get(run_id) == "cancelled":
            # No bot stays in a cancelled meeting: never sent, or sent and recalled.
            if counts[run_id]:
                assert (run_id, f"bot-{run_id}") in recalled, run_id
        else:
            assert counts[run_id] == 1 and job.dispatched, run_id
            assert job.worker_id == f"bot-{run_id}"
    for run_id, _ in recalled:
        assert cancelled.get(run_id) == "cancelled"
    assert len({holder for _, holder in sent}) >= 2
    assert set(cancelled.values()) <= {"cancelled", "already_dispatched"}


async def _close(stores: list[Any]) -> None:
    for store in stores:
        closed = store.close()
        if asyncio.iscoroutine(closed):
            await closed


def _pending(store: PgJobStore, run_ids: list[str]) -> list[str]:
    out = []
    for run_id in run_ids:
        job = store.get(run_id)
        if job is not None and not job.dispatched and not job.cancelled:
            out.append(run_id)
    return out


def test_an_idle_dispatcher_wakes_on_notify(pgstore_database: str, pgstore_schema: str) -> None:
    got = threading.Event()
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    dispatcher = Dispatcher(store, lambda job: got.set(), holder="idle", poll_interval=30.0)
    producer = PgJobStore(pgstore_database, schema=pgstore_schema)
    producer.start()

    latency = wake_up_latency(dispatcher, producer, got)
    producer.close()
    store.close()
    print(f"wake-up latency: {latency * 1000:.1f} ms")
    assert got.is_set()
    assert latency < 5.0  # far below the 30 s poll: it was the notification
