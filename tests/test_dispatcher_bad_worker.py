"""A bad worker id, or any mark refused for a bad argument, costs its own job only.

``dispatch`` may return a worker id the store refuses (over 1024 characters): the
dispatcher checks it by the SQL's rule before its mark joins a batch, and handles
that job the same on the single-job path and in a batch (its bot recalled, the job
released with the refusal's text); the other jobs of the batch are marked once,
never recalled, never sent again. A batch refused as a whole anyway is split until
only the bad job gets the refusal, and an ``InvalidArgument`` is never retried
(not by the mark's retries, not by a keeper's renews). On the memory store and on
PostgreSQL.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from pgstore import InvalidArgument, Job, MarkResult, MemoryJobStore, PgJobStore
from pgstore.protocols import JobStore
from pgstore.runtime import events as ev
from pgstore.runtime.dispatcher import Backoff, Dispatcher
from pgstore.runtime.keeper import keep_lease
from tests.support.counting import counted
from tests.support.waiting import until

JOBS = 20
BAD = "job-07"
BAD_WORKER = "w" * 2_000
REFUSAL = "worker_id must be a string of at most 1024 characters"


@pytest.fixture(params=["memory", "pg"])
def store(request: pytest.FixtureRequest) -> Iterator[JobStore]:
    if request.param == "memory":
        yield MemoryJobStore()
        return
    dsn = request.getfixturevalue("pgstore_database")
    schema = request.getfixturevalue("pgstore_schema")
    pg = PgJobStore(dsn, schema=schema)
    pg.start()
    try:
        yield pg
    finally:
        pg.close()


class Provider:
    """Sends a bot per dispatch (the one for ``BAD`` has a 2,000-character id)."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.bots: dict[str, str] = {}
        self.recalled: list[tuple[str, str | None]] = []
        self.lock = threading.Lock()

    async def dispatch(self, job: Job) -> str:
        bot = BAD_WORKER if job.run_id == BAD else f"bot-{job.run_id}-{job.lease_sequence}"
        with self.lock:
            self.sent[job.run_id] += 1
            self.bots[job.run_id] = bot
        return bot

    async def recall(self, job: Job, worker_id: str | None) -> None:
        with self.lock:
            self.recalled.append((job.run_id, worker_id))


@pytest.mark.parametrize("batch_size", [JOBS, 1], ids=["batched", "single"])
def test_one_bad_worker_id_costs_only_its_own_job(store: JobStore, batch_size: int) -> None:
    run_ids = [f"job-{n:02d}" for n in range(JOBS)]
    store.schedule_many(run_ids, [store.now_ms()] * JOBS)
    provider = Provider()
    seen: list[ev.Event] = []
    # A short lease and mark_timeout: a retried refusal recalls the bots within the
    # test, and their leases expire, so a second dispatch would show here.
    counting, counts = counted(store)
    d = Dispatcher(counting, provider.dispatch, provider.recall, holder="d1", ttl_ms=1_500,
                   concurrency=JOBS, batch_size=batch_size, poll_interval=0.05,
                   mark_timeout=1.0, listen=False, on_event=seen.append,
                   backoff=Backoff(base_ms=600_000))

    def settled() -> bool:
        bad = store.get(BAD)
        return bad is not None and bad.last_error is not None and all(
            (job := store.get(r)) is not None and job.dispatched
            for r in run_ids if r != BAD)

    async def main() -> None:
        runner = asyncio.ensure_future(d.run(handle_signals=False))
        try:
            await until("the good jobs marked and the bad one released", settled, timeout=6)
        finally:
            await asyncio.sleep(2.0)  # past a lease: a recalled job would be sent again
            d.stop()
            await runner

    failure: AssertionError | None = None
    try:
        asyncio.run(main())
    except AssertionError as exc:
        failure = exc
    marks = Counter(type(e).__name__ + ":" + getattr(e, "outcome", "")
                    for e in seen if isinstance(e, ev.Complete))
    print(f"\nbatch_size {batch_size}: sent {dict(Counter(provider.sent.values()))} "
          f"(times: jobs), recalled {sorted({r for r, _ in provider.recalled})}, "
          f"{counts.mark_calls} mark call(s) for {counts.marks} marks, completes {dict(marks)}"
          f"{'' if failure is None else f'; {failure}'}")
    assert failure is None, failure
    for run_id in run_ids:
        job = store.get(run_id)
        assert job is not None
        assert provider.sent[run_id] == 1, f"{run_id} sent {provider.sent[run_id]} times"
        if run_id == BAD:
            continue
        assert job.dispatched and job.worker_id == provider.bots[run_id], run_id
    assert provider.recalled == [(BAD, BAD_WORKER)], "only the bad job's bot is recalled"
    bad = store.get(BAD)
    assert bad is not None and not bad.dispatched and not bad.failed
    assert bad.lease_holder is None and bad.attempts == 1  # released, for a retry later
    assert bad.last_error is not None and REFUSAL in bad.last_error
    recalls = [e for e in seen if isinstance(e, ev.Recall)]
    assert [(e.subject, e.reason) for e in recalls] == [(BAD, "unrecorded")]
    completes = {e.subject: e.outcome for e in seen if isinstance(e, ev.Complete)}
    assert completes == {r: ("failed" if r == BAD else "completed") for r in run_ids}
    releases = [(e.subject, e.outcome) for e in seen if isinstance(e, ev.Release)]
    assert releases == [(BAD, "released")]
    if batch_size > 1:
        assert counts.mark_calls < JOBS - 1, "the good jobs' marks went in batches"


def test_the_bad_job_on_its_last_attempt_fails_for_good(store: JobStore) -> None:
    store.schedule(BAD, store.now_ms(), max_attempts=1)
    provider = Provider()
    d = Dispatcher(store, provider.dispatch, provider.recall, holder="d1", listen=False,
                   mark_timeout=2.0)

    async def main() -> None:
        await d.start()
        assert await d.tick() == 1
        await d.wait_idle()

    asyncio.run(main())
    bad = store.get(BAD)
    assert bad is not None and bad.failed and not bad.dispatched
    assert bad.last_error is not None and REFUSAL in bad.last_error
    assert provider.recalled == [(BAD, BAD_WORKER)]


def test_a_batch_refused_as_a_whole_is_split_and_nothing_is_retried(store: JobStore) -> None:
    """Past the dispatcher's own check (a mark submitted directly): the store refuses the
    whole batch (22023 from PostgreSQL), the batcher splits it, the good jobs are
    recorded by the split calls and the bad one alone is refused, at once."""
    run_ids = [f"job-{n:02d}" for n in range(8)]
    store.schedule_many(run_ids, [store.now_ms()] * len(run_ids))
    counting, counts = counted(store)
    d = Dispatcher(counting, lambda job: None, holder="d1", batch_size=8, mark_timeout=3.0,
                   listen=False)

    async def main() -> tuple[dict[str, object], float]:
        await d.start()
        jobs = store.lease_many("d1", store.now_ms(), 30_000, len(run_ids))
        assert len(jobs) == len(run_ids)
        started = time.monotonic()
        answers = await asyncio.gather(
            *(d._marker.mark(job, BAD_WORKER if job.run_id == BAD else f"bot-{job.run_id}")
              for job in jobs), return_exceptions=True)
        took = time.monotonic() - started
        return {job.run_id: a[0] if isinstance(a, tuple) else a
                for job, a in zip(jobs, answers, strict=True)}, took

    by_id, took = asyncio.run(main())
    print(f"\nanswers {dict(Counter(type(a).__name__ for a in by_id.values()))} in "
          f"{took:.2f}s, "
          f"{counts.mark_calls} mark calls, {counts.mark_splits} split(s)")
    assert isinstance(by_id[BAD], InvalidArgument) and REFUSAL in str(by_id[BAD])
    for run_id, answer in by_id.items():
        job = store.get(run_id)
        assert job is not None
        if run_id == BAD:
            assert not job.dispatched and job.worker_id is None
        else:
            assert answer == MarkResult(cancelled=False, recorded=True), (run_id, answer)
            assert job.dispatched and job.worker_id == f"bot-{run_id}"
    assert took < 1.0, "a refusal is never retried until mark_timeout"
    assert counts.mark_splits >= 1 and counts.mark_calls <= 1 + 2 * 3 * 2


def test_a_refused_single_mark_is_not_retried(store: JobStore) -> None:
    store.schedule(BAD, store.now_ms())
    counting, counts = counted(store)
    d = Dispatcher(counting, lambda job: None, holder="d1", batch_size=1, mark_timeout=3.0,
                   listen=False)

    async def main() -> BaseException | None:
        await d.start()
        job = store.lease("d1", store.now_ms(), 30_000)
        assert job is not None
        try:
            await d._marker.mark(job, BAD_WORKER)
        except InvalidArgument as exc:
            return exc
        return None

    refused = asyncio.run(main())
    print(f"\n{counts.mark_calls} mark call(s); raised {refused!r:.80}")
    assert isinstance(refused, InvalidArgument)
    assert counts.mark_calls == 1, "an InvalidArgument is not retried"


def test_a_renew_refused_for_a_bad_argument_is_not_retried(store: JobStore) -> None:
    store.schedule("job", store.now_ms())
    job = store.lease("k1", store.now_ms(), 30_000)
    assert job is not None
    calls: list[float] = []
    lost: list[str] = []

    async def renew() -> bool:
        calls.append(time.monotonic())
        # ttl_ms 0: 22023 from the store, whatever the retry.
        return await asyncio.to_thread(store.renew, "job", "k1", store.now_ms(), 0)

    async def main() -> None:
        await asyncio.wait_for(keep_lease(
            renew, lease_ms=600, anchor=time.monotonic(), what="job", owner="k1",
            log=logging.getLogger("test"), on_lost=lost.append), timeout=5)

    asyncio.run(main())
    print(f"\nrenews {len(calls)}, lost {lost}")
    assert lost == ["refused"] and len(calls) == 1


def test_invalid_argument_is_permanent_and_never_transient() -> None:
    from pgstore.runtime.transient import is_permanent, is_transient

    exc = InvalidArgument("worker_id must be a string of at most 1024 characters")
    assert is_permanent(exc) and not is_transient(exc)
