"""The Dispatcher's leasing: due jobs, in calls that grow while they come back full.

Idle, one job per call (``lease``: a wake-up costs what it always did); while
every call comes back full, twice as many with each call (``lease_many``) up
to ``batch_size``; the first short answer brings it back to one. Each leased
job is logged and reported (``Claim``, outcome ``claimed``).

A leased job carries its ``lease_sequence``: ``fence`` and ``sequence`` give it
to the calls that act under that lease (renew, mark_dispatched, release).
"""

from __future__ import annotations

import logging

from pgstore.models import Job
from pgstore.protocols import AsyncJobStore
from pgstore.runtime.base import Host
from pgstore.runtime.events import Claim

__all__ = ["Leaser", "fence", "sequence"]

log = logging.getLogger("pgstore.dispatcher")


class Leaser:
    """Leases up to the free concurrency for ``host``, in growing calls."""

    def __init__(
        self, jobs: AsyncJobStore, host: Host, batch_size: int,
        queues: list[str] | None = None,
    ) -> None:
        self._jobs = jobs
        self._host = host
        self.batch_size = batch_size
        #: The queues leased from (None: every queue). Passed only when set, so a job
        #: store written before queues existed is called exactly as before.
        self.queues = queues
        #: How many jobs the next lease call asks for: 1 when idle, doubling up to
        #: ``batch_size`` while the calls come back full.
        self.batch = 1

    async def lease(self, now: int | None, free: int) -> list[Job]:
        """Lease up to ``free`` jobs at ``now`` (None: the store's clock, read by each
        call): calls of ``batch`` jobs, doubling while they come back full (up to
        ``batch_size``), until ``free`` are leased, an answer is short (then the next
        round starts again from one job), or a call of ``batch_size`` jobs came back:
        the runtime then starts its runs before the next call, which the connection
        carries while they run (docs/performance.md, the overlap)."""
        host = self._host
        leased: list[Job] = []
        while free > 0:
            asked = min(free, self.batch)
            got = await self._call(now, asked)
            events = host.events_active
            if got and (events or log.isEnabledFor(logging.INFO)):  # once for the call
                at = now if now is not None else self.leased_at(got[0])
                if at is None:  # a store whose jobs carry no lease end
                    at = await host.now()
                for job in got:
                    log.info("%s: leased %s (due %s) until %s", host.owner, job.run_id,
                             job.dispatch_at, job.lease_until)
                    if events:
                        host.emit(Claim(runtime="dispatcher", owner=host.owner,
                                        outcome="claimed", now=at, subject=job.run_id,
                                        token=job.lease_sequence, due_at=job.dispatch_at,
                                        lease_until=job.lease_until))
            leased.extend(got)
            if len(got) < asked:
                self.batch = 1
                break
            free -= asked
            if asked == self.batch_size:
                break
            self.batch = min(self.batch * 2, self.batch_size)
        return leased

    def leased_at(self, job: Job) -> int | None:
        """When ``job`` was leased, by the store's clock: its lease's end less the lease
        (one lease call's jobs share it); None for a store whose jobs carry no lease end."""
        until = job.lease_until
        return None if until is None else until - self._host.lease_ms

    async def _call(self, now: int | None, limit: int) -> list[Job]:
        """One ``lease_many`` of up to ``limit`` jobs; ``lease`` itself for one job."""
        host = self._host
        if self.queues is None:
            if limit == 1:
                job = await self._jobs.lease(host.owner, now, host.lease_ms)
                return [] if job is None else [job]
            return await self._jobs.lease_many(host.owner, now, host.lease_ms, limit)
        if limit == 1:
            job = await self._jobs.lease(host.owner, now, host.lease_ms, self.queues)
            return [] if job is None else [job]
        return await self._jobs.lease_many(host.owner, now, host.lease_ms, limit, self.queues)


def sequence(job: Job) -> int | None:
    """``fence`` as one argument: the job's lease sequence, or None (no fence)."""
    return job.lease_sequence or None


def fence(job: Job) -> tuple[int, ...]:
    """The lease sequence to fence renew, mark_dispatched and release with: the one
    ``job``'s lease returned, or nothing for a store whose jobs carry none (0), so such
    stores are called exactly as before."""
    return (job.lease_sequence,) if job.lease_sequence else ()
