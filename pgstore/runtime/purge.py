"""The Dispatcher's retention (off by default): the jobs that finished (dispatched, or
cancelled) more than ``purge_after`` ago are deleted through the store's ``purge``
(``job_purge``): a round at start and then every ``purge_interval`` seconds, in
calls of ``purge_batch`` jobs (one transaction each) until a call deletes fewer.

``job_purge`` is the schema owner's alone, so a store connected as the client
role fails ``start()`` with ``NotPermitted`` (checked by a purge that can delete
nothing). A failed round is logged and retried at the next interval; it never
stops the dispatching. Each round is reported (``Purge``).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from pgstore import _validate as v
from pgstore.errors import InvalidArgument, NotPermitted
from pgstore.protocols import AsyncJobStore
from pgstore.runtime.base import Host, positive_seconds
from pgstore.runtime.events import Purge

__all__ = ["PURGE_BATCH", "PURGE_INTERVAL", "Purger"]

log = logging.getLogger("pgstore.dispatcher")

#: Retention defaults: a round every hour, 1000 jobs per ``job_purge`` call.
PURGE_INTERVAL = 3600.0
PURGE_BATCH = 1000


class Purger:
    """``host``'s retention rounds: ``after`` (a ``timedelta`` or ms; None: never),
    ``interval`` seconds apart, ``batch`` jobs per call."""

    def __init__(self, jobs: AsyncJobStore, host: Host, after: timedelta | int | None,
                 interval: float, batch: int) -> None:
        self._purge = jobs.purge
        self._host = host
        #: Jobs finished this many ms ago are purged (None: never).
        self.after_ms = _purge_after_ms(after)
        self.interval = positive_seconds("purge_interval", interval)
        self.batch = v.positive("purge_batch", batch, maximum=v.INTEGER_MAX)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """With ``after`` set: check the store may purge, then start the rounds (once)."""
        if self.after_ms is not None and self._task is None:
            await self._check()
            self._task = asyncio.get_running_loop().create_task(self._rounds())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _check(self) -> None:
        """Fail at start when the store may not purge: a purge of what finished before
        the epoch, which deletes nothing."""
        try:
            await self._purge(0, 1)
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != "42501":
                raise
            raise NotPermitted(
                f"{self._host.owner}: purge_after needs EXECUTE on job_purge, which only "
                "the schema's owner has (the client role does not): give this Dispatcher "
                "a store connected as the owner, or leave purge_after unset and run "
                f"`pgstore purge` as the owner ({type(exc).__name__}: {exc})"
            ) from None

    async def _rounds(self) -> None:
        """A retention round now, then one every ``interval`` s, until cancelled."""
        while True:
            await self.round()
            await asyncio.sleep(self.interval)

    async def round(self) -> int:
        """One retention round: purge, ``batch`` jobs per call, what finished more than
        ``after`` before now, until a call deletes fewer (or stop); returns how many
        went. A failure is logged (and reported), never raised."""
        assert self.after_ms is not None, "purge_after is not set"
        host = self._host
        before: int | None = None
        deleted = batches = 0
        try:
            before = max(0, await host.now() - self.after_ms)
            while not host.stopping:
                went = await self._purge(before, self.batch)
                deleted += went
                batches += 1
                if went < self.batch:
                    break
        except Exception as exc:
            log.warning("%s: purge of jobs finished before %s failed after %d deleted: "
                        "%s: %s; retrying in %gs", host.owner, before, deleted,
                        type(exc).__name__, exc, self.interval)
            host.emit(Purge(runtime="dispatcher", owner=host.owner, before=before,
                            deleted=deleted, batches=batches, outcome="error",
                            error=f"{type(exc).__name__}: {exc}"))
            return deleted
        log.info("%s: purged %d jobs finished before %s (%d call(s))", host.owner, deleted,
                 before, batches)
        host.emit(Purge(runtime="dispatcher", owner=host.owner, before=before,
                        deleted=deleted, batches=batches, outcome="ok"))
        return deleted


def _purge_after_ms(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise InvalidArgument("purge_after must be a positive age")
        value = value // timedelta(milliseconds=1)
    return v.positive("purge_after", value)
