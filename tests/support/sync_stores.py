"""Any store as a sync store, for the conformance suites: one test body for every store kind.

A sync store is used as it is. An asyncio store's calls run to completion on
the test's own event loop (``loop.run_until_complete``), one call at a time,
so a test reads the same whichever kind it runs against.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar, cast

from pgstore import (
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

__all__ = ["LoopJobStore", "LoopScheduleStore", "sync_job_store", "sync_schedule_store"]

T = TypeVar("T")


def _is_async(store: object) -> bool:
    return inspect.iscoroutinefunction(getattr(store, "start", None))


def sync_schedule_store(
    store: ScheduleStore | AsyncScheduleStore, loop: asyncio.AbstractEventLoop
) -> ScheduleStore:
    """``store`` itself when it is a sync store, else its calls driven on ``loop``."""
    if _is_async(store):
        return LoopScheduleStore(cast(AsyncScheduleStore, store), loop)
    return cast(ScheduleStore, store)


def sync_job_store(store: JobStore | AsyncJobStore, loop: asyncio.AbstractEventLoop) -> JobStore:
    """``store`` itself when it is a sync store, else its calls driven on ``loop``."""
    if _is_async(store):
        return LoopJobStore(cast(AsyncJobStore, store), loop)
    return cast(JobStore, store)


class _OnLoop:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(call)


class LoopScheduleStore(_OnLoop):
    """A ``ScheduleStore`` over an ``AsyncScheduleStore``: each call run on ``loop``."""

    def __init__(self, store: AsyncScheduleStore, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.store = store

    def start(self) -> None:
        self._run(self.store.start())

    def now_ms(self) -> int:
        return self._run(self.store.now_ms())

    def get(self, id: str) -> ScheduleRecord | None:
        return self._run(self.store.get(id))

    def register(
        self,
        id: str,
        kind: ScheduleKind,
        spec: str,
        next_run_at: int | None,
        now: int | None = None,
        catch_up: CatchUp = "once",
    ) -> ScheduleRecord:
        return self._run(self.store.register(id, kind, spec, next_run_at, now, catch_up))

    def claim_due(
        self, id: str, owner: str, now: int | None, lease_ms: int
    ) -> ClaimResult | None:
        return self._run(self.store.claim_due(id, owner, now, lease_ms))

    def renew(self, id: str, fencing_token: int, lease_until: int) -> bool:
        return self._run(self.store.renew(id, fencing_token, lease_until))

    def complete(
        self, id: str, fencing_token: int, patch: CompletePatch, now: int | None = None
    ) -> bool:
        return self._run(self.store.complete(id, fencing_token, patch, now))

    def delete(self, id: str) -> None:
        self._run(self.store.delete(id))

    def list(self) -> builtins.list[ScheduleRecord]:
        return self._run(self.store.list())

    def claim_next(
        self,
        owner: str,
        now: int | None,
        lease_ms: int,
        limit: int,
        ids: Sequence[str] | None = None,
    ) -> builtins.list[ClaimResult]:
        return self._run(self.store.claim_next(owner, now, lease_ms, limit, ids))


class LoopJobStore(_OnLoop):
    """A ``JobStore`` over an ``AsyncJobStore``: each call run on ``loop``."""

    def __init__(self, store: AsyncJobStore, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.store = store

    def start(self) -> None:
        self._run(self.store.start())

    def now_ms(self) -> int:
        return self._run(self.store.now_ms())

    def schedule(self, run_id: str, dispatch_at: int, max_attempts: int | None = None) -> None:
        self._run(self.store.schedule(run_id, dispatch_at, max_attempts))

    def lease(self, holder: str, now: int | None, ttl_ms: int) -> Job | None:
        return self._run(self.store.lease(holder, now, ttl_ms))

    def renew(
        self, run_id: str, holder: str, now: int | None, ttl_ms: int,
        lease_sequence: int | None = None,
    ) -> bool:
        return self._run(self.store.renew(run_id, holder, now, ttl_ms, lease_sequence))

    def mark_dispatched(
        self, run_id: str, holder: str, worker_id: str | None,
        lease_sequence: int | None = None,
    ) -> MarkResult:
        return self._run(self.store.mark_dispatched(run_id, holder, worker_id, lease_sequence))

    def release(
        self, run_id: str, holder: str, retry_at: int, lease_sequence: int | None = None,
        error: str | None = None,
    ) -> bool:
        return self._run(self.store.release(run_id, holder, retry_at, lease_sequence, error))

    def retry(self, run_id: str, dispatch_at: int | None = None) -> RetryResult:
        return self._run(self.store.retry(run_id, dispatch_at))

    def list_failed(self, limit: int | None = None) -> list[Job]:
        return self._run(self.store.list_failed(limit))

    def cancel(self, run_id: str) -> CancelResult:
        return self._run(self.store.cancel(run_id))

    def get(self, run_id: str) -> Job | None:
        return self._run(self.store.get(run_id))

    def list_dispatched(self) -> list[Job]:
        return self._run(self.store.list_dispatched())

    def remove(self, run_id: str) -> None:
        self._run(self.store.remove(run_id))

    def purge(self, before: int, limit: int) -> int:
        return self._run(self.store.purge(before, limit))

    def schedule_many(self, run_ids: Sequence[str], dispatch_at: Sequence[int]) -> None:
        self._run(self.store.schedule_many(run_ids, dispatch_at))

    def lease_many(self, holder: str, now: int | None, ttl_ms: int, limit: int) -> list[Job]:
        return self._run(self.store.lease_many(holder, now, ttl_ms, limit))

    def mark_dispatched_many(
        self, run_ids: Sequence[str], holder: str, worker_ids: Sequence[str | None],
        lease_sequences: Sequence[int | None] | None = None,
    ) -> list[MarkResult]:
        return self._run(
            self.store.mark_dispatched_many(run_ids, holder, worker_ids, lease_sequences)
        )

    def renew_many(
        self, run_ids: Sequence[str], holder: str, now: int | None, ttl_ms: int,
        lease_sequences: Sequence[int | None] | None = None,
    ) -> list[bool]:
        return self._run(self.store.renew_many(run_ids, holder, now, ttl_ms, lease_sequences))
