"""Sending a ``Call``: one statement on a connection from the store's source, for asyncio.

A store's source is a conninfo string (the store then owns a small pool of
autocommit connections), a psycopg connection (used as it is: with autocommit
off, calls join the caller's transaction and the caller commits), or a
psycopg_pool pool (each call borrows a connection; the pool commits).

A pool the store owns waits at most ``OWNED_POOL_RECONNECT_PAUSE`` between two
attempts to replace a lost connection, so it resumes within about a second of
the server answering again after an outage of any length (``owned_pool_async``: through
psycopg_pool's public ``reconnect_timeout`` and ``reconnect_failed`` only).

Written once, in ``pgstore.postgres.runner_async``: ``make generate`` writes the sync
runner, ``pgstore.postgres.runner``, from it; what both share is in
``pgstore.postgres.runner_common``.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any, TypeVar, Union

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from pgstore.postgres.call import Call, Columns, Row
from pgstore.postgres.pipelined import Pipeline, can_pipeline, direct
from pgstore.postgres.preparing import verdict_for_async
from pgstore.postgres.rows import BY_POSITION
from pgstore.postgres.runner_common import (
    KEEP_CURSOR_ROWS,
    OWNED_POOL_MAX,
    OWNED_POOL_MIN,
    OWNED_POOL_RECONNECT_PAUSE,
    _has_input,
    _Runner,
    column_names,
    translated,
)

__all__ = [
    "KEEP_CURSOR_ROWS",
    "OWNED_POOL_MAX",
    "OWNED_POOL_MIN",
    "OWNED_POOL_RECONNECT_PAUSE",
    "AsyncRunner",
    "AsyncSource",
    "column_names",
    "owned_pool_async",
    "translated",
]

T = TypeVar("T")

#: What an asyncio store accepts as its connection source.
AsyncSource = Union[str, "psycopg.AsyncConnection[Any]", "AsyncConnectionPool[Any]"]


async def _reconnect_again_async(pool: AsyncConnectionPool[Any]) -> None:
    """An owned pool's ``reconnect_failed``: a reconnection that gave up (after
    ``OWNED_POOL_RECONNECT_PAUSE``) starts again at once, for as long as the pool is open.

    ``check()`` is the public way to have the pool grow back to its size. Only when no
    connection is idle: ``check()`` would also test those, a round trip each in the
    pool's worker (hung for as long as a blackholed link does), and a store's call
    replaces an idle connection found dead by itself (``_dead_async``)."""
    if not pool.closed and pool.get_stats().get("pool_available", 0) == 0:
        await pool.check()


def owned_pool_async(conninfo: str) -> AsyncConnectionPool[Any]:
    """The pool of an asyncio store built from ``conninfo`` (not opened yet): autocommit
    connections, at most ``OWNED_POOL_RECONNECT_PAUSE`` between two attempts to
    reconnect.

    psycopg_pool gives up a reconnection after ``reconnect_timeout`` seconds and calls
    ``reconnect_failed``: set to that pause, one attempt tries at once and again that
    pause later (its first pause is 1 s with 10% jitter, cut to what is left of the
    timeout), then gives up, and ``_reconnect_again_async`` starts the next one. So no pause
    ever doubles, with public options only."""
    return AsyncConnectionPool(
        conninfo,
        min_size=OWNED_POOL_MIN,
        max_size=OWNED_POOL_MAX,
        kwargs={"autocommit": True},
        open=False,
        reconnect_timeout=OWNED_POOL_RECONNECT_PAUSE,
        reconnect_failed=_reconnect_again_async,
    )


async def _dead_async(conn: psycopg.AsyncConnection[Any]) -> bool:
    """A pooled connection known to be dead: closed, or with input that an empty query
    (a round trip, only then) proves fatal."""
    if conn.closed:
        return True
    if _has_input(conn):
        with suppress(psycopg.Error):
            await AsyncConnectionPool.check_connection(conn)
    return conn.closed


class AsyncRunner(_Runner["psycopg.AsyncConnection[Any]", "AsyncConnectionPool[Any]"]):
    """Runs calls for an asyncio store."""

    def __init__(self, source: AsyncSource, schema: str, prepare: bool | None) -> None:
        super().__init__(
            source, schema, psycopg.AsyncConnection, AsyncConnectionPool, owned_pool_async, prepare
        )
        self._lock = asyncio.Lock()
        if True:  # ASYNC
            #: Calls on the store's own connection are pipelined where they may be.
            self.pipeline = True
            self._pipeline: Pipeline | None = None
            self._direct: bool | None = None  # the own connection reaches the server itself
            self._asking_direct = asyncio.Lock()  # one task asks it; the others wait

    async def _open(self, pool: AsyncConnectionPool[Any]) -> None:
        """Open the pool the store owns, at its first call."""
        async with self._lock:
            if not self._opened:
                await pool.open()
                self._opened = True

    async def _prepares(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether calls on ``conn`` are sent prepared: ``prepare``, or the connection's
        verdict (asked at its first call, kept as long as the connection lives; calls
        made at once on a connection not asked yet wait for one probe,
        ``pgstore.postgres.preparing``)."""
        if self.prepare is not None:
            return self.prepare
        known = self._verdicts.get(conn)
        if known is not None:
            return known
        verdict = await verdict_for_async(conn)
        if verdict is None:
            return False
        self._known(conn, verdict)
        return verdict

    async def _send_own(
        self, conn: psycopg.AsyncConnection[Any], call: Call[Any]
    ) -> tuple[list[Row], Columns]:
        """Send ``call`` on the store's own connection, on an idle cursor of its statement
        (see ``_Statement``): its rows and their column names."""
        prepare = self._conn_prepare
        if prepare is None:
            prepare = await self._prepares(conn)
        st = self._statement(call.function)
        if True:  # ASYNC
            # Straight to PostgreSQL (it prepares), in autocommit and idle: pipelined,
            # sent at once behind the calls still out (pgstore.postgres.pipelined).
            pipeline = self._pipeline
            if pipeline is not None and pipeline.busy:  # its own calls are out
                return await pipeline.run(st.query, call.args)
            if prepare and self.pipeline and can_pipeline(conn):
                if self._direct is None:  # asked once: no pooler between (not even one
                    async with self._asking_direct:  # that keeps prepared statements)
                        if self._direct is None:
                            self._direct = await direct(conn)
                if self._direct:
                    if self._pipeline is None:
                        self._pipeline = Pipeline(conn)
                    return await self._pipeline.run(st.query, call.args)
        cursors = st.cursors
        try:
            cur: psycopg.AsyncCursor[Row] = cursors.pop()
        except IndexError:
            cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(st.query, call.args, prepare=prepare)
        rows = await cur.fetchall()
        columns = () if call.decode in BY_POSITION else column_names(cur)
        if len(rows) <= KEEP_CURSOR_ROWS:
            cursors.append(cur)
        return rows, columns

    async def _send(
        self, conn: psycopg.AsyncConnection[Any], call: Call[Any]
    ) -> tuple[list[Row], Columns]:
        """Send ``call`` on ``conn``, a pooled connection: its rows and their column names."""
        prepare = await self._prepares(conn)
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(self._statement(call.function).query, call.args, prepare=prepare)
        rows = await cur.fetchall()
        return rows, () if call.decode in BY_POSITION else column_names(cur)

    async def _send_pooled(
        self, pool: AsyncConnectionPool[Any], call: Call[Any]
    ) -> tuple[list[Row], Columns]:
        """``_send`` on a connection of ``pool``, which commits when it takes it back.

        A connection whose server went away while it sat idle in the pool (backend
        terminated, server restarted) is handed back, and the pool replaces it: the call
        runs on a live one. psycopg_pool's own ``check=`` would cost a round trip per
        call, and sleeps 1 s, 2 s, 4 s... between consecutive dead connections."""
        if not self._opened and self._owns_pool:
            await self._open(pool)
        attempts = pool.max_size + 1
        for attempt in range(attempts):
            async with pool.connection() as conn:
                if attempt + 1 < attempts and await _dead_async(conn):
                    continue
                return await self._send(conn, call)
        raise AssertionError("unreachable: the last attempt is not checked")

    async def run(self, call: Call[T]) -> T:
        try:
            if self._conn is not None:  # used as it is: in the caller's transaction, if any
                rows, columns = await self._send_own(self._conn, call)
            else:
                assert self._pool is not None
                rows, columns = await self._send_pooled(self._pool, call)
        except psycopg.Error as exc:
            error = translated(exc, self.schema)
            if error is None:
                raise
            raise error from exc
        return call.decode(rows, columns)

    async def close(self) -> None:
        """Close the pool the store opened for a conninfo; borrowed sources stay open."""
        if self._owns_pool and self._pool is not None:
            await self._pool.close()
            self._opened = False
