"""The store interfaces: what the runtime, the listener and the conformance suites rely on.

Every store kind implements one of these: ``PgScheduleStore`` and
``MemoryScheduleStore`` are ``ScheduleStore``s, ``AsyncPgScheduleStore`` is an
``AsyncScheduleStore``; likewise for jobs. They are typing Protocols: a store
of your own needs no base class, only these methods with these meanings.

Times are epoch milliseconds; ``now=None`` means the store's clock
(``now_ms()``, the database's for a PostgreSQL store). Bad arguments raise
``InvalidArgument`` and change nothing.

The asyncio Protocols are written once, in ``pgstore.protocols.stores_async``;
``make generate`` makes the sync ones (``pgstore.protocols.stores``) from them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from pgstore.protocols.stores import JobStore, ScheduleStore
from pgstore.protocols.stores_async import AsyncJobStore, AsyncScheduleStore

__all__ = [
    "AsyncJobStore", "AsyncScheduleStore", "JobStore", "JobWakeups", "ScheduleStore",
    "WakeupSource",
]


class JobWakeups(Protocol):
    """Wake-ups for an idle runtime: once ``start()``ed (on the running loop) it calls
    the ``wake`` it was made with when a job may be due, until ``stop()``. A wake-up is
    only a hint: the runtime still leases through the store, and keeps polling.
    ``listening`` is set while the wake-ups can arrive (for a LISTEN: while listening)."""

    @property
    def listening(self) -> asyncio.Event: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class WakeupSource(Protocol):
    """A store that can wake a runtime when a job may be due. The PostgreSQL stores
    are (a LISTEN on ``job_channel()``, ``pgstore.postgres.listen``); a store that is
    not (the memory stores) leaves the runtime to its poll.

    ``job_wakeups`` makes (does not start) wake-ups calling ``wake()``, coalesced,
    with no timer for a job due more than ``horizon`` seconds ahead (the poll comes
    first); ``conninfo`` LISTENs there instead of on the store's own database;
    ``on_connection`` hears ``None`` each time it listens and the error (one line)
    each time its connection is lost; ``log`` and ``name`` are for its log lines."""

    def job_wakeups(
        self,
        wake: Callable[[], None],
        horizon: float,
        *,
        log: logging.Logger,
        name: str,
        conninfo: str | None = None,
        on_connection: Callable[[str | None], None] | None = None,
    ) -> JobWakeups: ...
