"""Any store as a sync store, for the conformance suites: one test body for every store kind.

A sync store is used as it is. An asyncio store's calls run to completion on
the test's own event loop (``loop.run_until_complete``), one call at a time,
so a test reads the same whichever kind it runs against.

The adapters hold no code per method, like ``pgstore.runtime.stores`` (the mirror
of this module): a Protocol method read on one is the asyncio store's method run on
the loop, made at its first read and kept. The tests are typed against the sync
Protocols (what ``sync_job_store`` answers), never against the adapters.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, cast

from pgstore.protocols import AsyncJobStore, AsyncScheduleStore, JobStore, ScheduleStore
from pgstore.runtime.stores import protocol_methods

__all__ = ["LoopJobStore", "LoopScheduleStore", "sync_job_store", "sync_schedule_store"]


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
    """A sync store over an asyncio one: each call of a method of ``METHODS`` run to
    completion on ``loop``; any other name is not there (``AttributeError``)."""

    METHODS: frozenset[str] = frozenset()

    def __init__(self, store: object, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self._loop = loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        # Only for a name not found on the adapter: the first read of each method.
        if name not in self.METHODS:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        method = getattr(self.store, name)
        run = self._loop.run_until_complete

        def on_loop(*args: Any, **kwargs: Any) -> Any:
            return run(method(*args, **kwargs))

        setattr(self, name, on_loop)
        return on_loop


class LoopScheduleStore(_OnLoop):
    """A ``ScheduleStore`` over an ``AsyncScheduleStore``: each call run on ``loop``."""

    METHODS = protocol_methods(ScheduleStore)

    def __init__(self, store: AsyncScheduleStore, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(store, loop)


class LoopJobStore(_OnLoop):
    """A ``JobStore`` over an ``AsyncJobStore``: each call run on ``loop``."""

    METHODS = protocol_methods(JobStore)

    def __init__(self, store: AsyncJobStore, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(store, loop)
