# generated from pgstore/protocols/stores_async.py by tools/async_to_sync.py;
# edit pgstore/protocols/stores_async.py and run `make generate`.
"""The store interfaces of ``pgstore.protocols``: ``ScheduleStore``, ``JobStore``.

Written once, in ``pgstore.protocols.stores_async``: ``make generate`` writes the sync
ones, ``pgstore.protocols.stores``, from it (docs/python.md, how sync code is made).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, Protocol

from pgstore.models import (
    CancelResult,
    CatchUp,
    ClaimResult,
    CompletePatch,
    Job,
    MarkResult,
    QueueInfo,
    RetryResult,
    ScheduleKind,
    ScheduleRecord,
)
from pgstore.protocols.stores_async import AsyncJobStore, AsyncScheduleStore

__all__ = ["AsyncJobStore", "AsyncScheduleStore", "JobStore", "ScheduleStore"]


class ScheduleStore(Protocol):
    """Durable scheduled tasks with claim leases and fencing tokens (sync)."""

    def start(self) -> None:
        """Make the store ready (a PostgreSQL store checks its schema revision)."""

    def now_ms(self) -> int:
        """The store's clock."""

    def get(self, id: str) -> ScheduleRecord | None:
        """The record of ``id``, or None."""

    def register(
        self,
        id: str,
        kind: ScheduleKind,
        spec: str,
        next_run_at: int | None,
        now: int | None = None,
        catch_up: CatchUp = "once",
        jitter_ms: int = 0,
    ) -> ScheduleRecord:
        """Insert if absent (token: the id's high-water mark, or 0); same kind, spec,
        ``catch_up`` and ``jitter_ms``: untouched; another kind or spec: overwrite kind,
        spec, next_run_at, catch_up and jitter_ms, keeping token, lease, last_*, paused
        and triggered_at; only another ``catch_up`` or ``jitter_ms``: just those change."""

    def claim_due(
        self, id: str, owner: str, now: int | None, lease_ms: int
    ) -> ClaimResult | None:
        """Claim ``id`` if due and unleased, with the next fencing token; else None."""

    def renew(self, id: str, fencing_token: int, lease_until: int) -> bool:
        """Move the lease's end, only for the token of a claim still held."""

    def complete(
        self, id: str, fencing_token: int, patch: CompletePatch, now: int | None = None
    ) -> bool:
        """Commit a claim still held with this token and clear its lease; False: stale."""

    def delete(self, id: str) -> None:
        """Remove the record, raising the id's high-water mark to its token."""

    def list(self) -> builtins.list[ScheduleRecord]:
        """Every record, ordered by id."""

    def claim_next(
        self,
        owner: str,
        now: int | None,
        lease_ms: int,
        limit: int,
        ids: Sequence[str] | None = None,
    ) -> builtins.list[ClaimResult]:
        """Claim up to ``limit`` due, unleased records, earliest first (only ``ids``)."""

    def pause(self, id: str, now: int | None = None) -> ScheduleRecord | None:
        """Pause ``id``: no claim takes it until ``resume``; a held lease runs on. The
        record, or None for an unknown id."""

    def resume(self, id: str, now: int | None = None) -> ScheduleRecord | None:
        """Make ``id`` claimable again, ``next_run_at`` unchanged (the missed occurrences
        meet the schedule's catch-up policy). The record, or None for an unknown id."""

    def trigger(self, id: str, now: int | None = None) -> ScheduleRecord | None:
        """Ask for one run of ``id`` out of turn: the next claim takes it, and its complete
        keeps ``next_run_at``. The record, or None: unknown, paused, or a live lease."""


class JobStore(Protocol):
    """Delayed dispatch with holder leases (sync)."""

    def start(self) -> None:
        """Make the store ready (a PostgreSQL store checks its schema revision)."""

    def now_ms(self) -> int:
        """The store's clock."""

    def schedule(
        self, run_id: str, dispatch_at: int, max_attempts: int | None = None,
        queue: str | None = None, priority: int | None = None, payload: Any = None,
    ) -> None:
        """Add the job with at most ``max_attempts`` leases (None: the store default), in
        ``queue`` (None: ``"default"``) at ``priority`` (None: 0) carrying ``payload``
        (None: none); or move its ``dispatch_at`` and change ``max_attempts``, queue,
        priority and payload only where given (not None)."""

    def lease(
        self, holder: str, now: int | None, ttl_ms: int, queues: Sequence[str] | None = None
    ) -> Job | None:
        """Lease the next due, waiting (not dispatched, cancelled or failed), unleased job
        of ``queues`` (None: every queue), highest priority first, then earliest
        ``dispatch_at``, then ``run_id``, adding one to its ``attempts``; else None. A job
        is leased at most ``max_attempts`` times: when that job's last lease expired
        without a release, it is failed instead and None is answered."""

    def renew(
        self, run_id: str, holder: str, now: int | None, ttl_ms: int,
        lease_sequence: int | None = None,
    ) -> bool:
        """Extend a live lease of ``holder`` (given ``lease_sequence``, only that lease);
        False: expired or taken, stop."""

    def mark_dispatched(
        self, run_id: str, holder: str, worker_id: str | None,
        lease_sequence: int | None = None,
    ) -> MarkResult:
        """Record the dispatch if ``holder`` still holds the job (given ``lease_sequence``,
        that lease); tells whether it was cancelled meanwhile."""

    def release(
        self, run_id: str, holder: str, retry_at: int, lease_sequence: int | None = None,
        error: str | None = None,
    ) -> bool:
        """Give an undispatched job back for a retry at ``retry_at``, keeping ``error`` as
        its ``last_error``; out of attempts (``attempts >= max_attempts``) it fails."""

    def retry(self, run_id: str, dispatch_at: int | None = None) -> RetryResult:
        """Put a failed job back to waiting at ``dispatch_at`` (None: now), attempts reset."""

    def list_failed(self, limit: int | None = None) -> list[Job]:
        """The first ``limit`` failed jobs (None: all), by ``dispatch_at``, then ``run_id``."""

    def cancel(self, run_id: str) -> CancelResult:
        """Cancel unless already dispatched."""

    def reschedule(
        self, run_id: str, dispatch_at: int, now: int | None = None
    ) -> Job | None:
        """Move a job that waits with no live lease at ``now`` to ``dispatch_at`` (an
        expired lease cleared) and answer it; None: nothing moved (unknown, finished, or
        under a live lease)."""

    def get(self, run_id: str) -> Job | None:
        """The job, or None."""

    def list_dispatched(self) -> list[Job]:
        """Every dispatched job."""

    def remove(self, run_id: str) -> None:
        """Delete the job if it waits with no lease holder (unknown: nothing); else
        ``JobNotRemovable``, nothing changed."""

    def purge(self, before: int, limit: int) -> int:
        """Delete at most ``limit`` finished jobs whose ``finished_at`` is before ``before``,
        oldest first, never a waiting job nor one under a live lease; how many went."""

    def schedule_many(
        self, run_ids: Sequence[str], dispatch_at: Sequence[int], queue: str | None = None,
        priority: int | None = None, payloads: Sequence[Any] | None = None,
    ) -> None:
        """``schedule`` for each ``(run_ids[i], dispatch_at[i])`` in ``queue`` at
        ``priority`` with ``payloads[i]``: distinct ids, at most 10000."""

    def lease_many(
        self, holder: str, now: int | None, ttl_ms: int, limit: int,
        queues: Sequence[str] | None = None,
    ) -> builtins.list[Job]:
        """``lease`` up to ``limit`` jobs (at most 10000) of ``queues``, in lease order; the
        jobs out of attempts among them are failed as ``lease`` fails them, and left out."""

    def mark_dispatched_many(
        self, run_ids: Sequence[str], holder: str, worker_ids: Sequence[str | None],
        lease_sequences: Sequence[int | None] | None = None,
    ) -> builtins.list[MarkResult]:
        """``mark_dispatched`` for each job: one answer per job, in the order given."""

    def renew_many(
        self, run_ids: Sequence[str], holder: str, now: int | None, ttl_ms: int,
        lease_sequences: Sequence[int | None] | None = None,
    ) -> builtins.list[bool]:
        """``renew`` for each job: one answer per job, in the order given."""

    def pause_queue(self, queue: str) -> bool:
        """Pause ``queue``: no lease takes its jobs until ``resume_queue`` (leases held run
        on); False: it was paused already."""

    def resume_queue(self, queue: str) -> bool:
        """Resume a paused ``queue``; False: it was not paused."""

    def set_queue_concurrency(self, queue: str, limit: int | None) -> bool:
        """At most ``limit`` live leases of ``queue``'s jobs at once (None: no limit);
        False: it was ``limit`` already."""

    def set_queue_rate(
        self, queue: str, limit: int | None, period_ms: int | None
    ) -> bool:
        """At most ``limit`` leases of ``queue``'s jobs in any window of ``period_ms``
        (both None: no limit); False: it was that already."""

    def list_queues(self, now: int | None = None) -> builtins.list[QueueInfo]:
        """Every queue with waiting jobs or ever paused or limited, by name: depth, due,
        leased, paused, limits."""
