# generated from pgstore/postgres/store_async.py by tools/async_to_sync.py;
# edit pgstore/postgres/store_async.py and run `make generate`.
"""What every PostgreSQL store shares: its runner, ``start()``, ``close()``, for threads.

The store classes add one method per SQL function on top of these. Written once, in
``pgstore.postgres.store_async``: ``make generate`` writes ``pgstore.postgres.store``
from it.
"""

from __future__ import annotations

from typing import TypeVar

from pgstore.errors import SchemaNotReady
from pgstore.models import Fence, StoreStats
from pgstore.postgres import common_calls as common
from pgstore.postgres.runner import SyncRunner, SyncSource
from pgstore.postgres.store_async import AsyncStore
from pgstore.schema.objects import DEFAULT_SCHEMA
from pgstore.schema.startup import migrate, needs_migration

__all__ = ["AsyncStore", "SyncStore"]

_Sync = TypeVar("_Sync", bound="SyncStore")


class SyncStore:
    """A store over a sync source: conninfo (own pool), ``Connection`` or
    ``ConnectionPool``.

    A context manager: ``with PgScheduleStore(dsn) as store:`` starts it and
    closes it.
    """

    def __init__(
        self,
        source: SyncSource,
        *,
        schema: str = DEFAULT_SCHEMA,
        auto_migrate: bool = False,
        prepare: bool | None = None,
    ) -> None:
        """A store of ``schema``'s functions over ``source``; nothing is sent before the
        first call (``start()`` checks the schema).

        ``source`` is a conninfo string (the store keeps a small pool of its own, 1 to 8
        autocommit connections: ``close()`` it), a psycopg ``Connection`` (used as
        it is: with autocommit off, calls join your transaction and you commit; threads
        or tasks sharing a store on it take turns; the store keeps a cursor per
        statement on it, made at the statement's first call, so adapters registered on
        the connection later do not reach its calls) or a pool, ``ConnectionPool`` (each call
        borrows a connection).

        ``auto_migrate=True``: ``start()`` migrates the schema to the head instead of
        refusing (concurrent starts are serialised by an advisory lock).

        ``prepare`` says whether each connection prepares the store's statements
        server-side at their first use, which saves parsing and planning every call
        (about 40 µs each on the machine of the benchmark). The default, None,
        asks each connection once, at its first call (one round trip): it prepares
        where a prepared statement is sure to be found again, on a direct
        connection and through a pooler that keeps prepared statements for its
        clients (PgBouncer 1.21+ with ``max_prepared_statements`` above 0), and
        never elsewhere, whatever the connection's ``prepare_threshold``: behind
        PgBouncer's transaction pooling without that setting a prepared statement
        is missing on the next server connection, or is another client's of the
        same name (``pgstore.postgres.preparing`` says how it tells them apart).
        ``prepare=True`` and ``prepare=False`` force it either way, without asking.
        A connection opened with ``prepare_threshold=None`` prepares nothing, even
        with ``prepare=True`` (docs/pgbouncer.md).
        """
        self._runner = SyncRunner(source, schema, prepare)
        self._auto_migrate = auto_migrate

    @property
    def schema(self) -> str:
        """The schema whose functions this store calls."""
        return self._runner.schema

    def conninfo(self) -> str:
        """A conninfo string reaching the store's database (for a LISTEN connection, or a
        migration), whatever the store was given: a conninfo, a connection or a pool."""
        return self._runner.conninfo()

    def start(self) -> None:
        """Check that the schema is at the migration head (or migrate it, with
        ``auto_migrate=True``); raise ``SchemaNotReady`` saying what to run. Idempotent.
        SQL: ``schema_revision``."""
        try:
            revision: str | None = self._runner.run(common.schema_revision())
        except SchemaNotReady:
            revision = None
        if needs_migration(self.schema, revision, self._auto_migrate):
            migrate(self._runner.conninfo(), self.schema)

    def close(self) -> None:
        """Close the pool opened for a conninfo source (borrowed sources are left open)."""
        self._runner.close()

    def __enter__(self: _Sync) -> _Sync:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now_ms(self) -> int:
        """The database clock in epoch ms. SQL: ``now_ms``."""
        return self._runner.run(common.now_ms())

    def stats(self, now: int | None = None) -> StoreStats:
        """The schema's gauges at ``now`` (None: the database clock), from one snapshot:
        both stores', whichever store asks, mapped by column name (docs/sql.md, what an
        operator reads). SQL: ``store_stats``."""
        return self._runner.run(common.store_stats(now))

    def fence_after_restore(self, promotions: int = common.DEFAULT_PROMOTIONS) -> Fence:
        """Lift ``token_floor()`` above every fencing token and lease sequence a lost
        server can have handed out (``fence_after_restore()``, one call): run on a
        restored copy before any worker connects (docs/high-availability.md).
        ``promotions``: how many promotions (or fences) of the lost server the copy does
        not show, 0 to 1024: those after the copy, and for a ``pg_dump`` or logical copy
        (no timeline carried) those since which it handed out nothing. Needs EXECUTE on
        the function, which the client role lacks: connect as the schema's owner.
        ``promotions`` outside 0 to 1024 raises ``InvalidArgument`` before any call.
        SQL: ``fence_after_restore``."""
        return self._runner.run(common.fence_after_restore(promotions))
