"""Any store as an asyncio store: what lets the runtime await every call, typed.

An asyncio store is used as it is. A sync store's calls run in a worker
thread (``asyncio.to_thread``), one call a thread hop, so a Scheduler or a
Dispatcher never blocks its event loop on a database round trip.

The adapters hold no code per method: a Protocol method read on one is the sync
store's method wrapped once (``functools.partial`` of ``asyncio.to_thread``) and
kept on the adapter, so a call costs what a hand-written ``await
asyncio.to_thread(store.m, ...)`` did, and a method added to the Protocols needs
nothing here. mypy --strict checks the adapters against the asyncio Protocols
through ``__getattr__`` (a Protocol member found there has its return type); the
runtime is typed against the Protocols, never against the adapters.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, cast

from pgstore.protocols import AsyncJobStore, AsyncScheduleStore, JobStore, ScheduleStore

__all__ = ["as_async_job_store", "as_async_schedule_store"]


def _is_async(store: object) -> bool:
    return inspect.iscoroutinefunction(getattr(store, "start", None))


def protocol_methods(protocol: type) -> frozenset[str]:
    """The public methods a store Protocol declares."""
    return frozenset(
        name for name, value in vars(protocol).items()
        if not name.startswith("_") and callable(value)
    )


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


class _Threaded:
    """An asyncio store over a sync one: each call of a method of ``METHODS`` in a
    worker thread; any other name is not there (``AttributeError``)."""

    METHODS: frozenset[str] = frozenset()

    def __init__(self, store: object) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        # Only for a name not found on the adapter: the first read of each method.
        if name not in self.METHODS:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        threaded = partial(asyncio.to_thread, getattr(self.store, name))
        setattr(self, name, threaded)
        return threaded


class ThreadedScheduleStore(_Threaded):
    """An ``AsyncScheduleStore`` over a sync one: each call in a worker thread."""

    METHODS = protocol_methods(AsyncScheduleStore)

    def __init__(self, store: ScheduleStore) -> None:
        super().__init__(store)


class ThreadedJobStore(_Threaded):
    """An ``AsyncJobStore`` over a sync one: each call in a worker thread."""

    METHODS = protocol_methods(AsyncJobStore)

    def __init__(self, store: JobStore) -> None:
        super().__init__(store)
