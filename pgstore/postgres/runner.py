"""Sending a ``Call``: one statement on a connection from the store's source.

A store's source is a conninfo string (the store then owns a small pool of
autocommit connections), a psycopg connection (used as it is: with autocommit
off, calls join the caller's transaction and the caller commits), or a
psycopg_pool pool (each call borrows a connection; the pool commits).

A pool the store owns waits at most ``OWNED_POOL_RECONNECT_PAUSE`` between two
attempts to replace a lost connection, so it resumes within about a second of
the server answering again after an outage of any length (``owned_pool``: through
psycopg_pool's public ``reconnect_timeout`` and ``reconnect_failed`` only).
"""

from __future__ import annotations

import asyncio
import select
import threading
import weakref
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Generic, TypeVar, Union

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgstore.errors import (
    InvalidArgument,
    JobNotRemovable,
    PgStoreError,
    ReadOnlyServer,
    SchemaNotReady,
)
from pgstore.postgres.call import Call, Columns, Function, Row, statement
from pgstore.postgres.preparing import probe, probe_async
from pgstore.postgres.rows import BY_POSITION
from pgstore.schema.objects import check_schema

T = TypeVar("T")
ConnT = TypeVar("ConnT", psycopg.Connection[Any], psycopg.AsyncConnection[Any])
PoolT = TypeVar("PoolT", ConnectionPool[Any], AsyncConnectionPool[Any])

#: What a sync store accepts as its connection source.
SyncSource = Union[str, "psycopg.Connection[Any]", "ConnectionPool[Any]"]
#: What an async store accepts as its connection source.
AsyncSource = Union[str, "psycopg.AsyncConnection[Any]", "AsyncConnectionPool[Any]"]

#: Pool bounds of a store built from a conninfo string.
OWNED_POOL_MIN = 1
OWNED_POOL_MAX = 8

#: The longest pause (seconds) between two attempts to replace a lost connection, in a
#: pool a store owns. psycopg_pool doubles its pause after every failed attempt (1 s,
#: 2 s, 4 s... up to its reconnect_timeout), so after an outage of T seconds it may wait
#: about T more before trying again; capped, such a pool reconnects within this pause
#: of the server answering again.
OWNED_POOL_RECONNECT_PAUSE = 1.0


def _reconnect_again(pool: ConnectionPool[Any]) -> None:
    """An owned pool's ``reconnect_failed``: a reconnection that gave up (after
    ``OWNED_POOL_RECONNECT_PAUSE``) starts again at once, for as long as the pool is open.

    ``check()`` is the public way to have the pool grow back to its size. Only when no
    connection is idle: ``check()`` would also test those, a round trip each in the
    pool's worker (hung for as long as a blackholed link does), and a store's call
    replaces an idle connection found dead by itself (``_dead``)."""
    if not pool.closed and pool.get_stats().get("pool_available", 0) == 0:
        pool.check()


async def _reconnect_again_async(pool: AsyncConnectionPool[Any]) -> None:
    """``_reconnect_again`` for an asyncio pool."""
    if not pool.closed and pool.get_stats().get("pool_available", 0) == 0:
        await pool.check()


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


def owned_pool_async(conninfo: str) -> AsyncConnectionPool[Any]:
    """``owned_pool`` for an asyncio store."""
    return AsyncConnectionPool(
        conninfo,
        min_size=OWNED_POOL_MIN,
        max_size=OWNED_POOL_MAX,
        kwargs={"autocommit": True},
        open=False,
        reconnect_timeout=OWNED_POOL_RECONNECT_PAUSE,
        reconnect_failed=_reconnect_again_async,
    )


def translated(exc: psycopg.Error, schema: str) -> PgStoreError | None:
    """pgstore's exception for the server's answer ``exc`` to a bad call; None: ``exc`` is
    raised as it is."""
    if isinstance(exc, (psycopg.errors.InvalidParameterValue,
                        psycopg.errors.NumericValueOutOfRange)):
        message = exc.diag.message_primary or str(exc)
        return InvalidArgument(message, sqlstate=exc.sqlstate or "22023")
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return ReadOnlyServer(exc.diag.message_primary or str(exc))
    if isinstance(exc, psycopg.errors.ObjectNotInPrerequisiteState):  # only job_remove's
        return JobNotRemovable(exc.diag.message_primary or str(exc))
    if isinstance(exc, (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName)):
        return SchemaNotReady(
            f"schema {schema!r} has no pgstore functions at this revision "
            f"({exc.diag.message_primary}): run `pgstore migrate --dsn DSN --schema {schema}`"
        )
    return None


#: Column names by their bytes in a result: a store meets only a handful of lists.
_COLUMNS: dict[tuple[bytes | None, ...], Columns] = {}
_COLUMNS_MAX = 1024


def column_names(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> Columns:
    """The names of the columns of the cursor's last result.

    Read from the result itself: ``cursor.description`` builds a ``Column`` (type
    lookups included) per column at every access, 18 µs for a job's 13 columns. The
    same names give the same tuple back, so the row pickers' cache finds it at once.
    Our column names are ASCII, the same bytes in every client encoding; a name in
    another alphabet is decoded with the connection's encoding, the first time seen.
    """
    res = cur.pgresult
    if res is None:
        return ()
    names = tuple(map(res.fname, range(res.nfields)))
    found = _COLUMNS.get(names)
    if found is None:
        encoding = cur.connection.info.encoding
        found = tuple((name or b"").decode(encoding, "replace") for name in names)
        if len(_COLUMNS) < _COLUMNS_MAX:
            _COLUMNS[names] = found
    return found


def _pool_conninfo(conninfo: object, kwargs: object) -> str:
    if not isinstance(conninfo, str) or not isinstance(kwargs, (dict, type(None))):
        raise SchemaNotReady(
            "auto_migrate cannot derive a conninfo from a pool configured by callables: "
            "run `pgstore migrate` first"
        )
    # A pool's kwargs mix libpq options with connection settings (autocommit...).
    libpq = {k: v for k, v in (kwargs or {}).items() if k not in _CONNECTION_SETTINGS}
    return make_conninfo(conninfo, **libpq)


_CONNECTION_SETTINGS = frozenset(
    {"autocommit", "prepare_threshold", "row_factory", "cursor_factory", "context"}
)


def _has_input(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when the server has sent something to this idle connection: what a terminated
    backend sends (FATAL 57P01, then EOF), or a stray notice. A poll, no round trip."""
    fd = conn.fileno()
    if hasattr(select, "poll"):  # select() cannot watch descriptors past FD_SETSIZE
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _dead(conn: psycopg.Connection[Any]) -> bool:
    """A pooled connection known to be dead: closed, or with input that an empty query
    (a round trip, only then) proves fatal."""
    if conn.closed:
        return True
    if _has_input(conn):
        with suppress(psycopg.Error):
            ConnectionPool.check_connection(conn)
    return conn.closed


async def _dead_async(conn: psycopg.AsyncConnection[Any]) -> bool:
    """``_dead`` for an asyncio connection."""
    if conn.closed:
        return True
    if _has_input(conn):
        with suppress(psycopg.Error):
            await AsyncConnectionPool.check_connection(conn)
    return conn.closed


#: A cursor of the store's own connection goes back to its statement's free list after a
#: call that read at most this many rows (a batch's large result is not kept alive).
KEEP_CURSOR_ROWS = 100


class _Statement:
    """One of a store's statements: its text, and the idle cursors of the store's own
    connection that last ran it.

    Run again on the same cursor, the same query object keeps psycopg's Transformer,
    with the dumpers and loaders it found (a new cursor builds its adapters and a
    Transformer, then looks each parameter's dumper and each column's loader up:
    18,000 instructions a call for the cursor alone). A call takes a cursor off the
    list (``list.pop`` and ``append`` are atomic: threads or tasks sharing the store
    never share a cursor) and puts it back once it has read the answer; a call that
    failed drops its cursor.
    """

    __slots__ = ("cursors", "function", "query")

    def __init__(self, function: Function, query: str) -> None:
        self.function = function  # kept alive: its id() keys the runner's statements
        self.query = query
        self.cursors: list[Any] = []


class _Runner(Generic[ConnT, PoolT]):
    """What both runners share: sorting out the source, its conninfo, the statements
    (with the idle cursors of the store's own connection) and the prepare verdicts.

    A call on the store's own connection goes straight to it (``_send_own``): no
    context manager, the verdict kept on the runner, a cursor reused; a pooled call
    borrows a live connection (``_send_pooled``) and gets a new cursor. Both run in
    one ``try`` that turns the server's answers to bad calls into pgstore's
    exceptions (``translated``), and decode once the connection is given back.
    """

    def __init__(
        self,
        source: str | ConnT | PoolT,
        schema: str,
        conn_type: type[ConnT],
        pool_type: type[PoolT],
        make_owned_pool: Callable[[str], PoolT],
        prepare: bool | None,
    ) -> None:
        self.schema = check_schema(schema)
        if prepare is not None and not isinstance(prepare, bool):
            raise InvalidArgument("prepare must be True, False or None")
        # None asks each connection once (pgstore.postgres.preparing); what is sent to
        # psycopg is never None, which would defer to the connection's prepare_threshold
        # (a query prepared at its 5th run), breaking behind transaction pooling.
        self.prepare = prepare
        self._verdicts: weakref.WeakKeyDictionary[ConnT, bool] = weakref.WeakKeyDictionary()
        # What a call on the store's own connection sends as ``prepare``: ``prepare``, or
        # that connection's verdict once known (None: not asked yet, or to ask again).
        self._conn_prepare: bool | None = prepare
        # The statements of this store's schema, by the identity of their Function (each
        # holds its Function, so that id is not reused while it is here).
        self._statements: dict[int, _Statement] = {}
        self._conn: ConnT | None = None
        self._pool: PoolT | None = None
        self._owns_pool = False
        self._opened = False
        if isinstance(source, str):
            self._pool = make_owned_pool(source)
            self._owns_pool = True
        elif isinstance(source, pool_type):
            self._pool = source
        elif isinstance(source, conn_type):
            self._conn = source
        else:
            raise InvalidArgument(
                f"source must be a conninfo string, a psycopg {conn_type.__name__} "
                f"or a {pool_type.__name__}"
            )

    def _statement(self, function: Function) -> _Statement:
        """``function``'s statement in this store's schema, looked up by identity (the
        lru_cache of ``statement`` hashes the dataclass, a Python ``__hash__``)."""
        found = self._statements.get(id(function))
        if found is None:
            found = _Statement(function, statement(self.schema, function))
            self._statements[id(function)] = found
        return found

    def _known(self, conn: ConnT, verdict: bool) -> None:
        """Keep ``conn``'s verdict for as long as it lives."""
        self._verdicts[conn] = verdict
        if conn is self._conn:
            self._conn_prepare = verdict

    def conninfo(self) -> str:
        """A conninfo string reaching the same database (for migrations)."""
        if self._pool is not None:
            return _pool_conninfo(self._pool.conninfo, self._pool.kwargs)
        assert self._conn is not None
        return make_conninfo(self._conn.info.dsn, password=self._conn.info.password)


class SyncRunner(_Runner["psycopg.Connection[Any]", "ConnectionPool[Any]"]):
    """Runs calls for a sync store."""

    def __init__(self, source: SyncSource, schema: str, prepare: bool | None) -> None:
        super().__init__(source, schema, psycopg.Connection, ConnectionPool, owned_pool, prepare)
        self._lock = threading.Lock()

    def _open(self, pool: ConnectionPool[Any]) -> None:
        """Open the pool the store owns, at its first call."""
        with self._lock:
            if not self._opened:
                pool.open()
                self._opened = True

    def _prepares(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether calls on ``conn`` are sent prepared: ``prepare``, or the connection's
        verdict (asked at its first call, kept as long as the connection lives)."""
        if self.prepare is not None:
            return self.prepare
        known = self._verdicts.get(conn)
        if known is not None:
            return known
        verdict = probe(conn)
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

    def _send(self, conn: psycopg.Connection[Any], call: Call[Any]) -> tuple[list[Row], Columns]:
        """Send ``call`` on ``conn``, a pooled connection: its rows and their column names."""
        prepare = self._prepares(conn)
        cur = conn.cursor(row_factory=tuple_row)
        cur.execute(self._statement(call.function).query, call.args, prepare=prepare)
        rows = cur.fetchall()
        return rows, () if call.decode in BY_POSITION else column_names(cur)

    def _send_pooled(self, pool: ConnectionPool[Any], call: Call[Any]) -> tuple[list[Row], Columns]:
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


class AsyncRunner(_Runner["psycopg.AsyncConnection[Any]", "AsyncConnectionPool[Any]"]):
    """Runs calls for an asyncio store."""

    def __init__(self, source: AsyncSource, schema: str, prepare: bool | None) -> None:
        super().__init__(
            source, schema, psycopg.AsyncConnection, AsyncConnectionPool, owned_pool_async, prepare
        )
        self._lock: asyncio.Lock | None = None

    async def _open(self, pool: AsyncConnectionPool[Any]) -> None:
        """Open the pool the store owns, at its first call."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._opened:
                await pool.open()
                self._opened = True

    async def _prepares(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """See ``SyncRunner._prepares``."""
        if self.prepare is not None:
            return self.prepare
        known = self._verdicts.get(conn)
        if known is not None:
            return known
        verdict = await probe_async(conn)
        if verdict is None:
            return False
        self._known(conn, verdict)
        return verdict

    async def _send_own(
        self, conn: psycopg.AsyncConnection[Any], call: Call[Any]
    ) -> tuple[list[Row], Columns]:
        """See ``SyncRunner._send_own``."""
        prepare = self._conn_prepare
        if prepare is None:
            prepare = await self._prepares(conn)
        st = self._statement(call.function)
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
        """See ``SyncRunner._send``."""
        prepare = await self._prepares(conn)
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(self._statement(call.function).query, call.args, prepare=prepare)
        rows = await cur.fetchall()
        return rows, () if call.decode in BY_POSITION else column_names(cur)

    async def _send_pooled(
        self, pool: AsyncConnectionPool[Any], call: Call[Any]
    ) -> tuple[list[Row], Columns]:
        """See ``SyncRunner._send_pooled``."""
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
            if self._conn is not None:
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
