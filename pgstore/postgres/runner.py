# generated from pgstore/postgres/runner_async.py by tools/async_to_sync.py;
# edit pgstore/postgres/runner_async.py and run `make generate`.
"""Sending a ``Call``: one statement on a connection from the store's source, for threads.

A store's source is a conninfo string (the store then owns a small pool of
autocommit connections), a psycopg connection (used as it is: with autocommit
off, calls join the caller's transaction and the caller commits), or a
psycopg_pool pool (each call borrows a connection; the pool commits).

A pool the store owns waits at most ``OWNED_POOL_RECONNECT_PAUSE`` between two
attempts to replace a lost connection, so it resumes within about a second of
the server answering again after an outage of any length (``owned_pool``: through
psycopg_pool's public ``reconnect_timeout`` and ``reconnect_failed`` only).

Written once, in ``pgstore.postgres.runner_async``: ``make generate`` writes the sync
runner, ``pgstore.postgres.runner``, from it; what both share is in
``pgstore.postgres.runner_common``.
"""

from __future__ import annotations

import threading
from contextlib import suppress
from typing import Any, TypeVar, Union

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool

from pgstore.postgres.call import Call, Columns, Row
from pgstore.postgres.preparing import verdict_for
from pgstore.postgres.rows import BY_POSITION
from pgstore.postgres.runner_async import AsyncRunner, AsyncSource, owned_pool_async
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
    "SyncRunner",
    "SyncSource",
    "column_names",
    "owned_pool",
    "owned_pool_async",
    "translated",
]

T = TypeVar("T")

#: What a sync store accepts as its connection source.
SyncSource = Union[str, "psycopg.Connection[Any]", "ConnectionPool[Any]"]


def _reconnect_again(pool: ConnectionPool[Any]) -> None:
    """An owned pool's ``reconnect_failed``: a reconnection that gave up (after
    ``OWNED_POOL_RECONNECT_PAUSE``) starts again at once, for as long as the pool is open.

    ``check()`` is the public way to have the pool grow back to its size. Only when no
    connection is idle: ``check()`` would also test those, a round trip each in the
    pool's worker (hung for as long as a blackholed link does), and a store's call
    replaces an idle connection found dead by itself (``_dead``)."""
    if not pool.closed and pool.get_stats().get("pool_available", 0) == 0:
        pool.check()


def owned_pool(conninfo: str) -> ConnectionPool[Any]:
    """The pool of a sync store built from ``conninfo`` (not opened yet): autocommit
    connections, at most ``OWNED_POOL_RECONNECT_PAUSE`` between two attempts to
    reconnect.

    psycopg_pool gives up a reconnection after ``reconnect_timeout`` seconds and calls
    ``reconnect_failed``: set to that pause, one attempt tries at once and again that
    pause later (its first pause is 1 s with 10% jitter, cut to what is left of the
    timeout), then gives up, and ``_reconnect_again`` starts the next one. So no pause
    ever doubles, with public options only."""
    return ConnectionPool(
        conninfo,
        min_size=OWNED_POOL_MIN,
        max_size=OWNED_POOL_MAX,
        kwargs={"autocommit": True},
        open=False,
        reconnect_timeout=OWNED_POOL_RECONNECT_PAUSE,
        reconnect_failed=_reconnect_again,
    )


def _dead(conn: psycopg.Connection[Any]) -> bool:
    """A pooled connection known to be dead: closed, or with input that an empty query
    (a round trip, only then) proves fatal."""
    if conn.closed:
        return True
    if _has_input(conn):
        with suppress(psycopg.Error):
            ConnectionPool.check_connection(conn)
    return conn.closed


class SyncRunner(_Runner["psycopg.Connection[Any]", "ConnectionPool[Any]"]):
    """Runs calls for a sync store."""

    def __init__(self, source: SyncSource, schema: str, prepare: bool | None) -> None:
        super().__init__(
            source, schema, psycopg.Connection, ConnectionPool, owned_pool, prepare
        )
        self._lock = threading.Lock()

    def _open(self, pool: ConnectionPool[Any]) -> None:
        """Open the pool the store owns, at its first call."""
        with self._lock:
            if not self._opened:
                pool.open()
                self._opened = True

    def _prepares(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether calls on ``conn`` are sent prepared: ``prepare``, or the connection's
        verdict (asked at its first call, kept as long as the connection lives; calls
        made at once on a connection not asked yet wait for one probe,
        ``pgstore.postgres.preparing``)."""
        if self.prepare is not None:
            return self.prepare
        known = self._verdicts.get(conn)
        if known is not None:
            return known
        verdict = verdict_for(conn)
        if verdict is None:
            return False
        self._known(conn, verdict)
        return verdict

    def _send_own(
        self, conn: psycopg.Connection[Any], call: Call[Any]
    ) -> tuple[list[Row], Columns]:
        """Send ``call`` on the store's own connection, on an idle cursor of its statement
        (see ``_Statement``): its rows and their column names."""
        prepare = self._conn_prepare
        if prepare is None:
            prepare = self._prepares(conn)
        st = self._statement(call.function)
        cursors = st.cursors
        try:
            cur: psycopg.Cursor[Row] = cursors.pop()
        except IndexError:
            cur = conn.cursor(row_factory=tuple_row)
        cur.execute(st.query, call.args, prepare=prepare)
        rows = cur.fetchall()
        columns = () if call.decode in BY_POSITION else column_names(cur)
        if len(rows) <= KEEP_CURSOR_ROWS:
            cursors.append(cur)
        return rows, columns

    def _send(
        self, conn: psycopg.Connection[Any], call: Call[Any]
    ) -> tuple[list[Row], Columns]:
        """Send ``call`` on ``conn``, a pooled connection: its rows and their column names."""
        prepare = self._prepares(conn)
        cur = conn.cursor(row_factory=tuple_row)
        cur.execute(self._statement(call.function).query, call.args, prepare=prepare)
        rows = cur.fetchall()
        return rows, () if call.decode in BY_POSITION else column_names(cur)

    def _send_pooled(
        self, pool: ConnectionPool[Any], call: Call[Any]
    ) -> tuple[list[Row], Columns]:
        """``_send`` on a connection of ``pool``, which commits when it takes it back.

        A connection whose server went away while it sat idle in the pool (backend
        terminated, server restarted) is handed back, and the pool replaces it: the call
        runs on a live one. psycopg_pool's own ``check=`` would cost a round trip per
        call, and sleeps 1 s, 2 s, 4 s... between consecutive dead connections."""
        if not self._opened and self._owns_pool:
            self._open(pool)
        attempts = pool.max_size + 1
        for attempt in range(attempts):
            with pool.connection() as conn:
                if attempt + 1 < attempts and _dead(conn):
                    continue
                return self._send(conn, call)
        raise AssertionError("unreachable: the last attempt is not checked")

    def run(self, call: Call[T]) -> T:
        try:
            if self._conn is not None:  # used as it is: in the caller's transaction, if any
                rows, columns = self._send_own(self._conn, call)
            else:
                assert self._pool is not None
                rows, columns = self._send_pooled(self._pool, call)
        except psycopg.Error as exc:
            error = translated(exc, self.schema)
            if error is None:
                raise
            raise error from exc
        return call.decode(rows, columns)

    def close(self) -> None:
        """Close the pool the store opened for a conninfo; borrowed sources stay open."""
        if self._owns_pool and self._pool is not None:
            self._pool.close()
            self._opened = False
