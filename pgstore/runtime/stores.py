"""Any store as an asyncio store: what lets the runtime await every call, typed.

An asyncio store is used as it is. A sync store's calls run in a worker
thread (``asyncio.to_thread``), one call a thread hop, so a Scheduler or a
Dispatcher never blocks its event loop on a database round trip.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
from collections.abc import Sequence
from typing import cast

from pgstore.models import (
    CancelResult,
    CatchUp,
    ClaimResult,
    CompletePatch,
    Job,
    MarkResult,
    RetryResult,
    ScheduleKind,
    ScheduleRecord,
)
from pgstore.protocols import AsyncJobStore, AsyncScheduleStore, JobStore, ScheduleStore

__all__ = ["as_async_job_store", "as_async_schedule_store"]


def _is_async(store: object) -> bool:
    return inspect.iscoroutinefunction(getattr(store, "start", None))


def as_async_schedule_store(store: ScheduleStore | AsyncScheduleStore) -> AsyncScheduleStore:
    """``store`` itself when it is an asyncio store, else its calls in worker threads."""
    if _is_async(store):
        return cast(AsyncScheduleStore, store)
    return ThreadedScheduleStore(cast(ScheduleStore, store))


def as_async_job_store(store: JobStore | AsyncJobStore) -> AsyncJobStore:
    """``store`` itself when it is an asyncio store, else its calls in worker threads."""
    if _is_async(store):
        return cast(AsyncJobStore, store)
    return ThreadedJobStore(cast(JobStore, store))


class ThreadedScheduleStore:
    """An ``AsyncScheduleStore`` over a sync one: each call in a worker thread."""

    def __init__(self, store: ScheduleStore) -> None:
        self.store = store

    async def start(self) -> None:
        await asyncio.to_thread(self.store.start)

    async def now_ms(self) -> int:
        return await asyncio.to_thread(self.store.now_ms)

    async def get(self, id: str) -> ScheduleRecord | None:
        return await asyncio.to_thread(self.store.get, id)

    async def register(
        self,
        id: str,
        kind: ScheduleKind,
        spec: str,
        next_run_at: int | None,
        now: int | None = None,
        catch_up: CatchUp = "once",
    ) -> ScheduleRecord:
        return await asyncio.to_thread(
            self.store.register, id, kind, spec, next_run_at, now, catch_up
        )

    async def claim_due(
        self, id: str, owner: str, now: int | None, lease_ms: int
    ) -> ClaimResult | None:
        return await asyncio.to_thread(self.store.claim_due, id, owner, now, lease_ms)

    async def renew(self, id: str, fencing_token: int, lease_until: int) -> bool:
        return await asyncio.to_thread(self.store.renew, id, fencing_token, lease_until)

    async def complete(
        self, id: str, fencing_token: int, patch: CompletePatch, now: int | None = None
    ) -> bool:
        return await asyncio.to_thread(self.store.complete, id, fencing_token, patch, now)

    async def delete(self, id: str) -> None:
        await asyncio.to_thread(self.store.delete, id)

    async def list(self) -> builtins.list[ScheduleRecord]:
        return await asyncio.to_thread(self.store.list)

    async def claim_next(
        self,
        owner: str,
        now: int | None,
        lease_ms: int,
        limit: int,
        ids: Sequence[str] | None = None,
    ) -> builtins.list[ClaimResult]:
        return await asyncio.to_thread(self.store.claim_next, owner, now, lease_ms, limit, ids)


class ThreadedJobStore:
    """An ``AsyncJobStore`` over a sync one: each call in a worker thread."""

    def __init__(self, store: JobStore) -> None:
        self.store = store

    async def start(self) -> None:
        await asyncio.to_thread(self.store.start)

    async def now_ms(self) -> int:
        return await asyncio.to_thread(self.store.now_ms)

    async def schedule(
        self, run_id: str, dispatch_at: int, max_attempts: int | None = None
    ) -> None:
        await asyncio.to_thread(self.store.schedule, run_id, dispatch_at, max_attempts)

    async def lease(self, holder: str, now: int | None, ttl_ms: int) -> Job | None:
        return await asyncio.to_thread(self.store.lease, holder, now, ttl_ms)

    async def renew(
        self, run_id: str, holder: str, now: int | None, ttl_ms: int,
        lease_sequence: int | None = None,
    ) -> bool:
        return await asyncio.to_thread(
            self.store.renew, run_id, holder, now, ttl_ms, lease_sequence
        )

    async def mark_dispatched(
        self, run_id: str, holder: str, worker_id: str | None,
        lease_sequence: int | None = None,
    ) -> MarkResult:
        return await asyncio.to_thread(
            self.store.mark_dispatched, run_id, holder, worker_id, lease_sequence
        )

    async def release(
        self, run_id: str, holder: str, retry_at: int, lease_sequence: int | None = None,
        error: str | None = None,
    ) -> bool:
        return await asyncio.to_thread(
            self.store.release, run_id, holder, retry_at, lease_sequence, error
        )

    async def retry(self, run_id: str, dispatch_at: int | None = None) -> RetryResult:
        return await asyncio.to_thread(self.store.retry, run_id, dispatch_at)

    async def list_failed(self, limit: int | None = None) -> list[Job]:
        return await asyncio.to_thread(self.store.list_failed, limit)

    async def cancel(self, run_id: str) -> CancelResult:
        return await asyncio.to_thread(self.store.cancel, run_id)

    async def get(self, run_id: str) -> Job | None:
        return await asyncio.to_thread(self.store.get, run_id)

    async def list_dispatched(self) -> list[Job]:
        return await asyncio.to_thread(self.store.list_dispatched)

    async def remove(self, run_id: str) -> None:
        await asyncio.to_thread(self.store.remove, run_id)

    async def purge(self, before: int, limit: int) -> int:
        return await asyncio.to_thread(self.store.purge, before, limit)

    async def schedule_many(self, run_ids: Sequence[str], dispatch_at: Sequence[int]) -> None:
        await asyncio.to_thread(self.store.schedule_many, run_ids, dispatch_at)

    async def lease_many(
        self, holder: str, now: int | None, ttl_ms: int, limit: int
    ) -> builtins.list[Job]:
        return await asyncio.to_thread(self.store.lease_many, holder, now, ttl_ms, limit)

    async def mark_dispatched_many(
        self, run_ids: Sequence[str], holder: str, worker_ids: Sequence[str | None],
        lease_sequences: Sequence[int | None] | None = None,
    ) -> builtins.list[MarkResult]:
        return await asyncio.to_thread(
            self.store.mark_dispatched_many, run_ids, holder, worker_ids, lease_sequences
        )

    async def renew_many(
        self, run_ids: Sequence[str], holder: str, now: int | None, ttl_ms: int,
        lease_sequences: Sequence[int | None] | None = None,
    ) -> builtins.list[bool]:
        return await asyncio.to_thread(
            self.store.renew_many, run_ids, holder, now, ttl_ms, lease_sequences
        )
