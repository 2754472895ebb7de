"""LISTEN for ``job_schedule``'s notifications, on a connection of its own.

The listener only wakes the dispatcher; leasing still goes through
``job_lease``. When the connection drops it reconnects after a pause, and
the dispatcher's polling covers the gap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from ._store import AsyncStore, SyncStore

#: Seconds between attempts to re-open a lost listening connection.
RECONNECT_PAUSE = 2.0


class JobListener:
    """Calls ``on_due(dispatch_at, now_ms)`` for every job scheduled in ``schema``."""

    def __init__(
        self,
        conninfo: str,
        schema: str,
        on_due: Callable[[int, int], None],
        log: logging.Logger,
        name: str = "dispatcher",
    ) -> None:
        self.name = name
        self.conninfo = conninfo
        self.schema = schema
        self.on_due = on_due
        self.log = log
        self.listening = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def for_store(
        cls,
        store: object,
        on_due: Callable[[int, int], None],
        log: logging.Logger,
        name: str = "dispatcher",
        conninfo: str | None = None,
    ) -> JobListener | None:
        """A listener for a PostgreSQL store (on ``conninfo``, else the store's database);
        None for stores without a database."""
        if not isinstance(store, (SyncStore, AsyncStore)):
            return None
        return cls(conninfo or store._runner.conninfo(), store.schema, on_due, log, name)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _listen(self) -> None:
        while True:
            try:
                await self._listen_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.listening.clear()
                self.log.warning("%s: job listener on %r: %s; polling until it reconnects",
                                 self.name, self.schema, exc)
                await asyncio.sleep(RECONNECT_PAUSE)

    async def _listen_once(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        async with conn:
            cur = await conn.execute(
                sql.SQL("SELECT {}.job_channel()").format(sql.Identifier(self.schema))
            )
            row = await cur.fetchone()
            assert row is not None
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(str(row[0]))))
            self.listening.set()
            # Jobs scheduled while the listener was not yet listening: look once.
            self.on_due(0, 0)
            async for note in conn.notifies():
                try:
                    dispatch_at = int(note.payload)
                except ValueError:
                    continue
                self.on_due(dispatch_at, time.time_ns() // 1_000_000)
