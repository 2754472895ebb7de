"""The Dispatcher's lease keeping: each job's lease renewed from its lease until its
mark has an answer, by the keeper the Scheduler uses too (``pgstore.runtime.keeper``).

The renews of many jobs go together (``renew_many``, through a
``pgstore.runtime.batcher.Batcher``; one alone goes as ``renew``), with one
clock read per call. The jobs one lease call returned share one anchor, so
their first renews are all due a third of the lease after it: one timer then
starts a keeper for each job still running (``LeaseKeepers``). Most dispatches
end before and cost no keeper and no timer of their own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from pgstore.models import Job
from pgstore.protocols import AsyncJobStore
from pgstore.runtime.base import Host
from pgstore.runtime.batcher import CALLS_IN_FLIGHT, Batcher
from pgstore.runtime.events import LeaseLost
from pgstore.runtime.keeper import LostReason, keep_lease, reported
from pgstore.runtime.lease import fence
from pgstore.runtime.transient import is_permanent

__all__ = ["LeaseKeepers", "Renewals"]

log = logging.getLogger("pgstore.dispatcher")

#: ``keeper(job, anchor, ending)``: the coroutine that keeps one job's lease until
#: cancelled; ``ending()`` tells whether the job's mark was sent.
Keeper = Callable[[Job, float, Callable[[], bool]], Coroutine[Any, Any, None]]


class Renewals:
    """The renews of ``host``'s leased jobs, batched, and the keeper of one job."""

    def __init__(self, jobs: AsyncJobStore, host: Host, batch_size: int) -> None:
        self._jobs = jobs
        self._host = host
        self._renews: Batcher[Job, bool] = Batcher(
            self._renew_many, max_batch=batch_size, max_in_flight=CALLS_IN_FLIGHT,
            split=is_permanent)

    def keeper(
        self, job: Job, anchor: float, ending: Callable[[], bool]
    ) -> Coroutine[Any, Any, None]:
        """The shared keeper for one job, from its lease until its mark has an answer;
        once the mark is sent (``ending()``), a refused renew was overtaken by it."""
        host = self._host

        async def renew() -> bool:
            return await self._renews.submit(job)

        def lost(reason: LostReason) -> None:
            host.emit(LeaseLost(runtime="dispatcher", owner=host.owner, subject=job.run_id,
                                token=job.lease_sequence, reason=reason))
            log.warning("%s: %s lease lost (%s); mark_dispatched will tell whether to "
                        "recall", host.owner, job.run_id, reason)

        return keep_lease(
            reported(renew, host.emit, runtime="dispatcher", owner=host.owner,
                     subject=job.run_id, token=job.lease_sequence, ending=ending),
            lease_ms=host.lease_ms, anchor=anchor, what=job.run_id, owner=host.owner,
            log=log, on_lost=lost)

    async def _renew_many(self, jobs: list[Job]) -> list[bool]:
        """One ``renew_many`` (one clock read) for the renews the keepers asked meanwhile
        (``renew`` itself for one)."""
        host = self._host
        now = await host.now()
        if len(jobs) == 1:
            job = jobs[0]
            return [bool(await self._jobs.renew(job.run_id, host.owner, now, host.lease_ms,
                                                *fence(job)))]
        return await self._jobs.renew_many(
            [job.run_id for job in jobs], host.owner, now, host.lease_ms,
            [job.lease_sequence or None for job in jobs],
        )


class LeaseKeepers:
    """The lease keepers of the jobs one lease call returned.

    Their leases share one anchor, so their first renews are all due a third of the
    lease after it: one timer then starts a keeper (``keeper(job, anchor)``) for each
    job whose dispatch and mark are still running (``watch`` without ``done``). Most
    dispatches end before and cost no keeper and no timer of their own; a run that
    starts after the timer fired (a late start under load) gets its keeper at once.
    ``ending(job)`` says the job's mark is sent: its keeper renews on (through the
    mark's retries), and a renew refused from then on was overtaken by the mark.
    """

    def __init__(self, keeper: Keeper, anchor: float, lease_ms: int) -> None:
        self._keeper = keeper
        self._anchor = anchor
        self._waiting: dict[str, Job] = {}  # by run_id: one lease call's are distinct
        self._kept: dict[str, asyncio.Future[None]] = {}
        self._ending: set[str] = set()  # the jobs whose mark was sent
        self._fired = False
        delay = anchor + lease_ms / 3000 - time.monotonic()
        asyncio.get_running_loop().call_later(max(delay, 0.0), self._fire)

    def watch(self, job: Job) -> None:
        if self._fired:
            self._kept[job.run_id] = self._start(job)
        else:
            self._waiting[job.run_id] = job

    def ending(self, job: Job) -> None:
        self._ending.add(job.run_id)

    def done(self, job: Job) -> None:
        self._ending.discard(job.run_id)
        if self._waiting.pop(job.run_id, None) is None:
            keeper = self._kept.pop(job.run_id, None)
            if keeper is not None:
                keeper.cancel()

    def _start(self, job: Job) -> asyncio.Future[None]:
        run_id = job.run_id
        return asyncio.ensure_future(
            self._keeper(job, self._anchor, lambda: run_id in self._ending))

    def _fire(self) -> None:
        self._fired = True
        for run_id, job in self._waiting.items():
            self._kept[run_id] = self._start(job)
        self._waiting.clear()
