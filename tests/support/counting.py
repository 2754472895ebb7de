"""A job store whose lease and mark calls are counted, for the tests that check what a
burst costs (how many calls, how many marks per call) from outside the Dispatcher.

``counted(store)`` answers a wrapper that passes every call through to ``store``
(sync or asyncio, a PostgreSQL store's wake-ups included) and the ``Counts`` it
keeps: ``lease_calls`` (``lease`` and ``lease_many``), ``mark_calls`` (``mark_dispatched``
and ``mark_dispatched_many``), ``marks`` (the jobs those calls carried) and
``mark_splits`` (``mark_dispatched_many`` calls of more than one job refused for a
bad argument: the Dispatcher then sends the batch again in halves).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pgstore.protocols import AsyncJobStore, JobStore
from pgstore.runtime.transient import is_permanent

S = TypeVar("S", bound="JobStore | AsyncJobStore")


@dataclass
class Counts:
    lease_calls: int = 0
    mark_calls: int = 0
    marks: int = 0
    mark_splits: int = 0

    def called(self, name: str, args: Sequence[Any]) -> None:
        if name in ("lease", "lease_many"):
            self.lease_calls += 1
        else:
            self.mark_calls += 1
            self.marks += len(args[0]) if name == "mark_dispatched_many" else 1

    def failed(self, name: str, args: Sequence[Any], exc: Exception) -> None:
        if name == "mark_dispatched_many" and len(args[0]) > 1 and is_permanent(exc):
            self.mark_splits += 1


COUNTED = frozenset({"lease", "lease_many", "mark_dispatched", "mark_dispatched_many"})


class _Counting:
    def __init__(self, store: object, counts: Counts) -> None:
        self._store = store
        self._counts = counts
        wakeups = getattr(store, "job_wakeups", None)
        if wakeups is not None:  # found by isinstance(..., WakeupSource) on any Python
            self.job_wakeups = wakeups

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._store, name)
        if name not in COUNTED:
            return fn
        counts = self._counts
        if inspect.iscoroutinefunction(fn):
            async def counted_async(*args: Any) -> Any:
                counts.called(name, args)
                try:
                    return await fn(*args)
                except Exception as exc:
                    counts.failed(name, args, exc)
                    raise

            return counted_async

        def counted_sync(*args: Any) -> Any:
            counts.called(name, args)
            try:
                return fn(*args)
            except Exception as exc:
                counts.failed(name, args, exc)
                raise

        return cast(Callable[..., Any], counted_sync)


def counted(store: S) -> tuple[S, Counts]:
    """``store`` with its lease and mark calls counted, and the counts."""
    counts = Counts()
    return cast(S, _Counting(store, counts)), counts
