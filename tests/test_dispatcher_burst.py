"""The Dispatcher under a burst: thousands of jobs due at once, cancels racing them.

Two dispatchers (``concurrency`` 200, batches of up to 100) drain a burst of
jobs while another thread cancels some of them. Checked against the store and
the provider's ledger: every job not cancelled is sent exactly once and
recorded with its bot; a cancelled job is never left with a bot in the meeting
(cancel said ``already_dispatched``, or its bot was never sent, or it was
recalled); no job is sent twice. And the path really is batched: far fewer
lease and mark calls than jobs. On the memory store and on PostgreSQL (an
asyncio store on its own pool; real parallel connections).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Callable

import pytest

from pgstore import AsyncPgJobStore, CancelResult, Job, MemoryJobStore, PgJobStore
from pgstore.protocols import AsyncJobStore, JobStore
from pgstore.runtime.dispatcher import Dispatcher
from tests.support.counting import Counts, counted

pytestmark = pytest.mark.slow

JOBS = 3_000
CANCELS = 300


class Ledger:
    """What the provider was asked to do."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.bots: dict[str, str] = {}
        self.recalled: set[str] = set()
        self.lock = threading.Lock()

    async def dispatch(self, job: Job) -> str:
        await asyncio.sleep(random.random() * 0.005)  # a provider call
        bot = f"{job.lease_holder}:{job.run_id}:{job.lease_sequence}"
        with self.lock:
            self.sent[job.run_id] += 1
            self.bots[job.run_id] = bot
        return bot

    async def recall(self, job: Job, worker_id: str | None) -> None:
        with self.lock:
            self.recalled.add(job.run_id)


def _burst(
    store: JobStore | AsyncJobStore, producer: JobStore, listen: bool = False
) -> tuple[Ledger, dict[str, CancelResult], list[Dispatcher], list[Counts]]:
    ledger = Ledger()
    run_ids = [f"burst-{n:05d}" for n in range(JOBS)]
    now = producer.now_ms()
    for start in range(0, JOBS, 1_000):
        producer.schedule_many(run_ids[start:start + 1_000], [now] * 1_000)
    doomed = random.Random(7).sample(run_ids, CANCELS)
    cancels: dict[str, CancelResult] = {}

    def cancel_all() -> None:
        while sum(ledger.sent.values()) < JOBS // 10:  # the cancels land mid-burst
            threading.Event().wait(0.001)
        for run_id in doomed:
            cancels[run_id] = producer.cancel(run_id)

    stores = [counted(store) for _ in range(2)]  # each dispatcher's calls counted apart
    dispatchers = [
        Dispatcher(counting, ledger.dispatch, ledger.recall, holder=f"d{i}", concurrency=200,
                   batch_size=100, poll_interval=0.05, listen=listen)
        for i, (counting, _) in enumerate(stores)
    ]

    async def main() -> None:
        runners = [asyncio.ensure_future(d.run(handle_signals=False)) for d in dispatchers]
        canceller = asyncio.ensure_future(asyncio.to_thread(cancel_all))
        for _ in range(600):
            await asyncio.sleep(0.1)
            if canceller.done() and sum(ledger.sent.values()) >= JOBS - CANCELS and all(
                d.running == 0 for d in dispatchers
            ):
                break
        await canceller
        for d in dispatchers:
            d.stop()
        await asyncio.gather(*runners)
        if isinstance(store, AsyncPgJobStore):
            await store.close()

    asyncio.run(main())
    return ledger, cancels, dispatchers, [counts for _, counts in stores]


def _check(ledger: Ledger, cancels: dict[str, CancelResult], counts: list[Counts],
           get: Callable[[str], Job | None]) -> None:
    assert max(ledger.sent.values()) == 1, "a job was sent twice"
    for n in range(JOBS):
        run_id = f"burst-{n:05d}"
        job = get(run_id)
        assert job is not None
        if run_id not in cancels:
            assert ledger.sent[run_id] == 1, run_id
            assert job.dispatched and job.worker_id == ledger.bots[run_id], run_id
            assert run_id not in ledger.recalled, run_id
            continue
        answer = cancels[run_id]
        if answer is CancelResult.ALREADY_DISPATCHED:
            assert job.dispatched and not job.cancelled and run_id not in ledger.recalled
        else:
            assert answer is CancelResult.CANCELLED and job.cancelled, run_id
            # Sent before the cancel landed: recalled (mark said cancelled); else never sent.
            assert (ledger.sent[run_id] == 0) or (run_id in ledger.recalled), run_id
    leases = sum(c.lease_calls for c in counts)
    marks = sum(c.mark_calls for c in counts)
    marked = sum(c.marks for c in counts)
    print(f"\n{JOBS} jobs: {leases} lease calls, {marks} mark calls for {marked} marks; "
          f"cancels {Counter(str(a) for a in cancels.values())}, "
          f"{len(ledger.recalled)} recalled")
    assert leases < JOBS / 10 and marks < marked / 5


def test_a_burst_on_the_memory_store_is_dispatched_once_per_job() -> None:
    store = MemoryJobStore()
    ledger, cancels, _, counts = _burst(store, store)
    _check(ledger, cancels, counts, store.get)


def test_a_burst_on_postgresql_is_dispatched_once_per_job(
    pgstore_database: str, pgstore_schema: str
) -> None:
    producer = PgJobStore(pgstore_database, schema=pgstore_schema)
    producer.start()
    store = AsyncPgJobStore(pgstore_database, schema=pgstore_schema)
    try:
        ledger, cancels, _, counts = _burst(store, producer, listen=True)
        _check(ledger, cancels, counts, producer.get)
    finally:
        producer.close()
