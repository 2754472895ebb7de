"""The Dispatcher's wake-ups: an idle dispatcher woken when a job may be due.

A store that is a ``WakeupSource`` (``pgstore.protocols``: the PostgreSQL
stores, a LISTEN on ``job_channel()``) is asked for its ``job_wakeups``; any
other store leaves the dispatcher to its poll. A wake-up is only a hint:
leasing always goes through the store, and polling remains the fallback.
``listen=False`` turns them off; a conninfo string LISTENs there instead of on
the store's database. A lost listening connection is reported
(``ConnectionLost``, component ``listener``), and so is its return
(``Reconnected``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pgstore.protocols import JobWakeups, WakeupSource
from pgstore.runtime.base import Host
from pgstore.runtime.events import ConnectionLost, Reconnected

__all__ = ["Wake"]

log = logging.getLogger("pgstore.dispatcher")


class Wake:
    """``host``'s wake-ups from ``store`` (as given to the runtime), calling ``wake``;
    ``horizon`` (seconds: the poll interval) is as far ahead as a hint sets a timer."""

    def __init__(self, store: object, listen: bool | str, wake: Callable[[], None],
                 horizon: float, host: Host) -> None:
        self._store = store
        self._listen = listen
        self._wake = wake
        self._horizon = horizon
        self._host = host
        self._lost = False
        #: The store's wake-ups while started (None: off, or a store without them).
        self.wakeups: JobWakeups | None = None

    def start(self) -> None:
        """Start the store's wake-ups, unless off, started, or the store has none."""
        if self._listen is False or self.wakeups is not None:
            return
        if isinstance(self._store, WakeupSource):
            self.wakeups = self._store.job_wakeups(
                self._wake, self._horizon, log=log, name=self._host.owner,
                conninfo=self._listen if isinstance(self._listen, str) else None,
                on_connection=self._connection,
            )
            self.wakeups.start()

    async def stop(self) -> None:
        if self.wakeups is not None:
            await self.wakeups.stop()
            self.wakeups = None

    def _connection(self, error: str | None) -> None:
        """The listener's news: listening (``None``), or its connection lost (why)."""
        host = self._host
        if error is not None:
            self._lost = True
            host.emit(ConnectionLost(runtime="dispatcher", owner=host.owner,
                                     component="listener", error=error))
        elif self._lost:
            self._lost = False
            host.emit(Reconnected(runtime="dispatcher", owner=host.owner,
                                  component="listener"))
