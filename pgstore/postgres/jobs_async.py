"""The PostgreSQL job store (docs/contract.md, the job store), for asyncio.

Each method is one call of one SQL function (see ``pgstore.postgres.job_calls``). Durable
stores have no ``forget``: they keep their records (``remove`` deletes one job).
Written once, in ``pgstore.postgres.jobs_async``: ``make generate`` writes the sync
store, ``pgstore.postgres.jobs``, from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgstore.models import (
    CancelResult,
    Job,
    JobFilter,
    JobPage,
    MarkResult,
    QueueInfo,
    RetryResult,
)
from pgstore.postgres import job_calls as calls
from pgstore.postgres.listen import Listens
from pgstore.postgres.store_async import AsyncStore

__all__ = ["AsyncPgJobStore"]


class AsyncPgJobStore(AsyncStore, Listens):
    """Delayed dispatch with holder leases in PostgreSQL, for asyncio.

    Each method is one call of the SQL function it names, one round trip. Times are
    epoch ms; ``now=None`` means the database clock. Bad arguments raise
    ``InvalidArgument`` and change nothing.
    """

    async def schedule(
        self, run_id: str, dispatch_at: int, max_attempts: int | None = None,
        queue: str | None = None, priority: int | None = None, payload: Any = None,
    ) -> None:
        """Add the job, due at ``dispatch_at``, with at most ``max_attempts`` leases (None:
        the store default, ``DEFAULT_MAX_ATTEMPTS`` unless the owner changed it), in
        ``queue`` (None: ``"default"``) at ``priority`` (higher is leased first; None: 0),
        carrying ``payload`` (any JSON value, at most the owner's
        ``store_settings.max_payload_bytes`` as JSON text, 64 KiB; None: none). An
        existing job's ``dispatch_at`` moves, and its ``max_attempts``, queue, priority
        and payload change only when given (not None).
        SQL: ``job_schedule``."""
        return await self._runner.run(
            calls.schedule(run_id, dispatch_at, max_attempts, queue, priority, payload)
        )

    async def lease(
        self, holder: str, now: int | None, ttl_ms: int, queues: Sequence[str] | None = None
    ) -> Job | None:
        """Lease the next due, uncancelled, undispatched job with no live lease of
        ``queues`` (None: every queue; else a non-empty list of names) until
        ``now + ttl_ms``: highest ``priority`` first, then earliest ``dispatch_at``, then
        ``run_id``; None: nothing leasable right now. A job is leased at most
        ``max_attempts`` times: when the earliest one's last lease expired without a
        release, this call fails it (``failed``, ``last_error`` saying so) and answers
        None; the next call leases the next job. ``ttl_ms`` above the owner's
        ``store_settings.max_lease_ms`` raises ``InvalidArgument``.
        SQL: ``job_lease``."""
        return await self._runner.run(calls.lease(holder, now, ttl_ms, queues))

    async def renew(
        self, run_id: str, holder: str, now: int | None, ttl_ms: int,
        lease_sequence: int | None = None,
    ) -> bool:
        """Extend a lease ``holder`` still holds unexpired (and, given ``lease_sequence``,
        only that lease of it); False: stop, it was lost. ``ttl_ms`` is bounded as in
        ``lease``.
        SQL: ``job_renew``."""
        return await self._runner.run(calls.renew(run_id, holder, now, ttl_ms, lease_sequence))

    async def mark_dispatched(
        self, run_id: str, holder: str, worker_id: str | None,
        lease_sequence: int | None = None,
    ) -> MarkResult:
        """Record the dispatch while ``holder`` is the lease's holder (expired or not;
        given ``lease_sequence``, only that lease); ``cancelled``: a cancel arrived,
        the bot must leave at once.
        SQL: ``job_mark_dispatched``."""
        return await self._runner.run(
            calls.mark_dispatched(run_id, holder, worker_id, lease_sequence)
        )

    async def release(
        self, run_id: str, holder: str, retry_at: int, lease_sequence: int | None = None,
        error: str | None = None,
    ) -> bool:
        """Give the lease back undispatched, keeping ``error`` (at most 4096 characters)
        as ``last_error``, and move the job to ``retry_at``, or, when that lease was its
        last (``attempts >= max_attempts``), fail it for good. False: ``holder`` no longer
        holds it (or, given ``lease_sequence``, not that lease), or it was dispatched, or
        it is gone.
        SQL: ``job_release``."""
        return await self._runner.run(
            calls.release(run_id, holder, retry_at, lease_sequence, error)
        )

    async def retry(self, run_id: str, dispatch_at: int | None = None) -> RetryResult:
        """Put a failed job back to waiting, due at ``dispatch_at`` (None: the database
        clock's now), attempts reset: ``RETRIED``, ``NOT_FAILED`` (nothing changed) or
        ``MISSING``.
        SQL: ``job_retry``."""
        return await self._runner.run(calls.retry(run_id, dispatch_at))

    async def list_failed(self, limit: int | None = None) -> list[Job]:
        """The first ``limit`` failed jobs (None: all), by ``dispatch_at``, then ``run_id``.
        SQL: ``job_list``, with ``'failed'``."""
        return await self._runner.run(calls.list_failed(limit))

    async def cancel(self, run_id: str) -> CancelResult:
        """Cancel the job: ``CANCELLED``, ``ALREADY_DISPATCHED`` (nothing changed) or
        ``MISSING``.
        SQL: ``job_cancel``."""
        return await self._runner.run(calls.cancel(run_id))

    async def reschedule(
        self, run_id: str, dispatch_at: int, now: int | None = None
    ) -> Job | None:
        """Move the job to ``dispatch_at`` when it waits (not dispatched, cancelled or
        failed) with no live lease at ``now`` (None: the database clock), and answer it as
        moved; an expired lease is cleared, so its holder can no longer mark or release it
        (attempts and lease_sequence kept). None: nothing changed (no such job, a finished
        one, or a live lease, whose holder may be dispatching it). Unlike ``schedule``,
        which moves any existing job's ``dispatch_at``.
        SQL: ``job_reschedule``."""
        return await self._runner.run(calls.reschedule(run_id, dispatch_at, now))

    async def get(self, run_id: str) -> Job | None:
        """The job, or None.
        SQL: ``job_get``."""
        return await self._runner.run(calls.get(run_id))

    async def list_dispatched(self) -> list[Job]:
        """Every dispatched job, ordered by run_id.
        SQL: ``job_list_dispatched``."""
        return await self._runner.run(calls.list_dispatched())

    async def list_jobs(
        self, filter: JobFilter = "all", now: int | None = None, limit: int | None = None,
        queues: Sequence[str] | None = None,
    ) -> JobPage:
        """The first ``limit`` jobs (None: all) by ``dispatch_at``, then ``run_id``, of
        ``filter``: ``"all"``, ``"due"`` (waiting and due at ``now``, leased or not),
        ``"dispatched"`` or ``"failed"``, in ``queues`` (None: every queue; else a
        non-empty list of names); and how many match in all. The operator's view
        (``pgstore jobs``).
        SQL: ``job_list``."""
        return await self._runner.run(calls.list_jobs(filter, now, limit, queues))

    async def remove(self, run_id: str) -> None:
        """Delete a job that waits (not dispatched, cancelled or failed) and has no lease
        holder (never leased, or released); unknown run_id: nothing. Any other job raises
        ``JobNotRemovable`` (SQLSTATE 55000) naming its state and changes nothing: a
        dispatched, cancelled or failed job is history, which the owner deletes with
        ``purge``; a leased one (even past its lease) may be mid-dispatch: ``cancel`` it.
        SQL: ``job_remove``.
        """
        return await self._runner.run(calls.remove(run_id))

    async def purge(self, before: int, limit: int) -> int:
        """Delete at most ``limit`` finished jobs (dispatched, cancelled or failed) whose
        ``finished_at`` is before ``before`` (epoch ms), oldest first; how many went.
        Never a waiting job nor one whose lease is live; rows that concurrent calls hold
        locked are skipped, so call it until it returns less than ``limit``. Needs EXECUTE
        on ``job_purge``, which the client role lacks: connect as the schema's owner.
        SQL: ``job_purge``."""
        return await self._runner.run(calls.purge(before, limit))

    async def schedule_many(
        self, run_ids: Sequence[str], dispatch_at: Sequence[int], queue: str | None = None,
        priority: int | None = None, payloads: Sequence[Any] | None = None,
    ) -> None:
        """``schedule`` for each ``(run_ids[i], dispatch_at[i])`` in one statement (at
        most 10000 distinct ids), all in ``queue`` at ``priority``, each carrying
        ``payloads[i]`` (``payloads`` None: none; else as long as ``run_ids``); one
        notification, with the earliest time.
        SQL: ``job_schedule_many``."""
        return await self._runner.run(
            calls.schedule_many(run_ids, dispatch_at, queue, priority, payloads)
        )

    async def lease_many(
        self, holder: str, now: int | None, ttl_ms: int, limit: int,
        queues: Sequence[str] | None = None,
    ) -> list[Job]:
        """``lease`` up to ``limit`` (at most 10000) jobs of ``queues`` (None: every queue)
        in one statement, in lease order; fewer (none) when no more are leasable right
        now, or when some were out of attempts (failed as ``lease`` fails them, and left
        out).
        SQL: ``job_lease_many``."""
        return await self._runner.run(calls.lease_many(holder, now, ttl_ms, limit, queues))

    async def mark_dispatched_many(
        self, run_ids: Sequence[str], holder: str, worker_ids: Sequence[str | None],
        lease_sequences: Sequence[int | None] | None = None,
    ) -> list[MarkResult]:
        """``mark_dispatched`` for each ``run_ids[i]`` with ``worker_ids[i]`` (fenced by
        ``lease_sequences[i]`` when given and not None) in one statement: one answer per
        job, in the order given.
        SQL: ``job_mark_dispatched_many``."""
        return await self._runner.run(
            calls.mark_dispatched_many(run_ids, holder, worker_ids, lease_sequences)
        )

    async def renew_many(
        self, run_ids: Sequence[str], holder: str, now: int | None, ttl_ms: int,
        lease_sequences: Sequence[int | None] | None = None,
    ) -> list[bool]:
        """``renew`` for each ``run_ids[i]`` (fenced by ``lease_sequences[i]`` when given
        and not None) in one statement: one answer per job, in the order given.
        SQL: ``job_renew_many``."""
        return await self._runner.run(
            calls.renew_many(run_ids, holder, now, ttl_ms, lease_sequences)
        )

    async def pause_queue(self, queue: str) -> bool:
        """Pause ``queue`` (any name): no lease takes its jobs until ``resume_queue``;
        leases already held run on. True: paused now; False: it was paused already.
        SQL: ``queue_pause``."""
        return await self._runner.run(calls.pause_queue(queue))

    async def resume_queue(self, queue: str) -> bool:
        """Resume a paused ``queue`` (and wake idle dispatchers). True: resumed now;
        False: it was not paused.
        SQL: ``queue_resume``."""
        return await self._runner.run(calls.resume_queue(queue))

    async def set_queue_concurrency(self, queue: str, limit: int | None) -> bool:
        """Hold at most ``limit`` live leases of ``queue``'s jobs at once, across every
        dispatcher (None: no limit). A lease counts until it expires or its job is
        dispatched, released or failed; a lease taken before the limit counts from its
        next renew, which answers False when the queue is full. True: the limit changed;
        False: it was ``limit`` already. InvalidArgument: ``limit`` not from 1 to 10000.
        SQL: ``queue_set_concurrency``."""
        return await self._runner.run(calls.set_queue_concurrency(queue, limit))

    async def set_queue_rate(
        self, queue: str, limit: int | None, period_ms: int | None
    ) -> bool:
        """Lease at most ``limit`` of ``queue``'s jobs in any window of ``period_ms``,
        across every dispatcher, measured with each lease's ``now`` (both None: no
        limit). True: the limit changed; False: it was that already. InvalidArgument:
        ``limit`` not from 1 to 10000, ``period_ms`` not from 1 to 366 days, or only one
        of them None.
        SQL: ``queue_set_rate``."""
        return await self._runner.run(calls.set_queue_rate(queue, limit, period_ms))

    async def list_queues(self, now: int | None = None) -> list[QueueInfo]:
        """Every queue that holds waiting jobs or was ever paused or limited, by name,
        with its depth, due and leased counts at ``now`` (None: the database clock),
        whether it is paused, its limits and the leases its rate limit counts now.
        Reads every waiting job.
        SQL: ``queue_list``."""
        return await self._runner.run(calls.list_queues(now))
