"""Sending a ``Call``: what the sync and the asyncio runner share (``runner_async``).

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

import select
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgstore.errors import (
    InvalidArgument,
    JobNotRemovable,
    PgStoreError,
    ReadOnlyServer,
    SchemaNotReady,
)
from pgstore.postgres.call import Columns, Function, statement
from pgstore.schema.objects import check_schema

T = TypeVar("T")
ConnT = TypeVar("ConnT", psycopg.Connection[Any], psycopg.AsyncConnection[Any])
PoolT = TypeVar("PoolT", ConnectionPool[Any], AsyncConnectionPool[Any])

#: Pool bounds of a store built from a conninfo string.
OWNED_POOL_MIN = 1
OWNED_POOL_MAX = 8

#: The longest pause (seconds) between two attempts to replace a lost connection, in a
#: pool a store owns. psycopg_pool doubles its pause after every failed attempt (1 s,
#: 2 s, 4 s... up to its reconnect_timeout), so after an outage of T seconds it may wait
#: about T more before trying again; capped, such a pool reconnects within this pause
#: of the server answering again.
OWNED_POOL_RECONNECT_PAUSE = 1.0


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
