"""The Dispatcher's provider call: the user's ``dispatch(job)``, which sends the bot
and returns its worker id (or None), plain or ``async def``.

Each call is reported (``HandlerRun``: ``ok``, ``error``, or ``abandoned`` when
a stop cancels it; its lease is then left to expire). What the answer or the
error leads to (a mark, a release) is the caller's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pgstore.models import Job
from pgstore.runtime.base import Host, is_async_callable
from pgstore.runtime.events import HandlerRun

__all__ = ["DispatchFn", "ProviderCall"]

log = logging.getLogger("pgstore.dispatcher")

#: ``dispatch(job) -> worker_id | None``, plain or ``async def``.
DispatchFn = Callable[[Job], Any]


class ProviderCall:
    """Runs ``dispatch(job)`` for ``host``: ``async def`` on the loop, a plain function
    in the host's thread pool."""

    def __init__(self, dispatch: DispatchFn, host: Host) -> None:
        self.dispatch = dispatch
        self._host = host
        self._is_async = is_async_callable(dispatch)

    async def __call__(self, job: Job) -> Any:
        """What ``dispatch(job)`` returned; what it raised is raised."""
        started = time.monotonic()
        try:
            result = await self.call(job)
        except asyncio.CancelledError:
            self.abandoned(job, started)
            raise
        except Exception:
            self.ran(job, "error", started)
            raise
        if self._host.events_active:
            self.ran(job, "ok", started)
        return result

    # ``__call__`` in parts, for a caller that awaits the call itself (one coroutine a
    # job less: ``pgstore.runtime.run``), and must report it as ``__call__`` does.

    def call(self, job: Job) -> Awaitable[Any]:
        """``dispatch(job)``, not awaited yet: its coroutine, or its run in the pool."""
        if self._is_async:
            return self.dispatch(job)  # type: ignore[no-any-return]
        return self._host.call_user(self.dispatch, job)

    def abandoned(self, job: Job, started: float) -> None:
        """The call was cancelled (a stop): logged and reported; its lease will expire."""
        log.warning("%s: dispatch of %s abandoned at stop; its lease will expire",
                    self._host.owner, job.run_id)
        self.ran(job, "abandoned", started)

    def ran(self, job: Job, outcome: Literal["ok", "error", "abandoned"],
            started: float) -> None:
        """Report the call (``HandlerRun``), begun at ``started`` (monotonic)."""
        host = self._host
        if host.events_active:
            host.emit(HandlerRun(runtime="dispatcher", owner=host.owner, subject=job.run_id,
                                 token=job.lease_sequence, outcome=outcome,
                                 duration_s=time.monotonic() - started))
