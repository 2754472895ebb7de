"""Sending a ``Call``: one statement on a connection from the store's source.

A store's source is a conninfo string (the store then owns a small pool of
autocommit connections), a psycopg connection (used as it is: with autocommit
off, calls join the caller's transaction and the caller commits), or a
psycopg_pool pool (each call borrows a connection; the pool commits).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar, Union

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ._call import Call, statement
from ._schema import check_schema
from .errors import InvalidArgument, SchemaNotReady

T = TypeVar("T")

#: What a sync store accepts as its connection source.
SyncSource = Union[str, "psycopg.Connection[Any]", "ConnectionPool[Any]"]
#: What an async store accepts as its connection source.
AsyncSource = Union[str, "psycopg.AsyncConnection[Any]", "AsyncConnectionPool[Any]"]

#: Pool bounds of a store built from a conninfo string.
OWNED_POOL_MIN = 1
OWNED_POOL_MAX = 8


@contextmanager
def translated_errors(schema: str) -> Iterator[None]:
    """Turn the server's answers to bad calls into pgstore's exceptions."""
    try:
        yield
    except (psycopg.errors.InvalidParameterValue, psycopg.errors.NumericValueOutOfRange) as exc:
        message = exc.diag.message_primary or str(exc)
        raise InvalidArgument(message, sqlstate=exc.sqlstate or "22023") from exc
    except (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName) as exc:
        raise SchemaNotReady(
            f"schema {schema!r} has no pgstore functions at this revision "
            f"({exc.diag.message_primary}): run `pgstore migrate --schema {schema}`"
        ) from exc


def _conninfo_of(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> str:
    return make_conninfo(conn.info.dsn, password=conn.info.password)


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


class SyncRunner:
    """Runs calls for a sync store."""

    def __init__(self, source: SyncSource, schema: str) -> None:
        self.schema = check_schema(schema)
        self._conn: psycopg.Connection[Any] | None = None
        self._pool: ConnectionPool[Any] | None = None
        self._owns_pool = False
        self._opened = False
        self._lock = threading.Lock()
        if isinstance(source, str):
            self._pool = ConnectionPool(
                source,
                min_size=OWNED_POOL_MIN,
                max_size=OWNED_POOL_MAX,
                kwargs={"autocommit": True},
                open=False,
            )
            self._owns_pool = True
        elif isinstance(source, ConnectionPool):
            self._pool = source
        elif isinstance(source, psycopg.Connection):
            self._conn = source
        else:
            raise InvalidArgument(
                "source must be a conninfo string, a psycopg Connection or a ConnectionPool"
            )

    def conninfo(self) -> str:
        """A conninfo string reaching the same database (for migrations)."""
        if self._pool is not None:
            return _pool_conninfo(self._pool.conninfo, self._pool.kwargs)
        assert self._conn is not None
        return _conninfo_of(self._conn)

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self._conn is not None:
            yield self._conn
            return
        assert self._pool is not None
        if self._owns_pool and not self._opened:
            with self._lock:
                if not self._opened:
                    self._pool.open()
                    self._opened = True
        with self._pool.connection() as conn:
            yield conn

    def run(self, call: Call[T]) -> T:
        query = statement(self.schema, call.function)
        with (
            translated_errors(self.schema),
            self._connection() as conn,
            conn.cursor(row_factory=tuple_row) as cur,
        ):
            cur.execute(query, call.args)
            rows = cur.fetchall()
        return call.decode(rows)

    def close(self) -> None:
        """Close the pool the store opened for a conninfo; borrowed sources stay open."""
        if self._owns_pool and self._pool is not None:
            self._pool.close()
            self._opened = False


class AsyncRunner:
    """Runs calls for an asyncio store."""

    def __init__(self, source: AsyncSource, schema: str) -> None:
        self.schema = check_schema(schema)
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._pool: AsyncConnectionPool[Any] | None = None
        self._owns_pool = False
        self._opened = False
        self._lock: asyncio.Lock | None = None
        if isinstance(source, str):
            self._pool = AsyncConnectionPool(
                source,
                min_size=OWNED_POOL_MIN,
                max_size=OWNED_POOL_MAX,
                kwargs={"autocommit": True},
                open=False,
            )
            self._owns_pool = True
        elif isinstance(source, AsyncConnectionPool):
            self._pool = source
        elif isinstance(source, psycopg.AsyncConnection):
            self._conn = source
        else:
            raise InvalidArgument(
                "source must be a conninfo string, a psycopg AsyncConnection "
                "or an AsyncConnectionPool"
            )

    def conninfo(self) -> str:
        """A conninfo string reaching the same database (for migrations)."""
        if self._pool is not None:
            return _pool_conninfo(self._pool.conninfo, self._pool.kwargs)
        assert self._conn is not None
        return _conninfo_of(self._conn)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._conn is not None:
            yield self._conn
            return
        assert self._pool is not None
        if self._owns_pool and not self._opened:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if not self._opened:
                    await self._pool.open()
                    self._opened = True
        async with self._pool.connection() as conn:
            yield conn

    async def run(self, call: Call[T]) -> T:
        query = statement(self.schema, call.function)
        with translated_errors(self.schema):
            async with self._connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(query, call.args)
                rows = await cur.fetchall()
        return call.decode(rows)

    async def close(self) -> None:
        """Close the pool the store opened for a conninfo; borrowed sources stay open."""
        if self._owns_pool and self._pool is not None:
            await self._pool.close()
            self._opened = False
