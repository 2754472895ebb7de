"""The PostgreSQL schedule stores (SPEC §4, §7): sync and asyncio.

Each method is one call of one SQL function (see ``_schedule_calls``); the two
classes differ only in how they send it.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Sequence

from . import _schedule_calls as calls
from ._runner import AsyncRunner, AsyncSource, SyncRunner, SyncSource
from ._schema import DEFAULT_SCHEMA
from ._startup import migrate, needs_migration
from .errors import SchemaNotReady
from .models import ClaimResult, CompletePatch, ScheduleKind, ScheduleRecord

__all__ = ["AsyncPgScheduleStore", "PgScheduleStore"]


class PgScheduleStore:
    """Durable scheduled tasks in PostgreSQL, for threads.

    ``source`` is a conninfo string (the store keeps a small pool of its own),
    a psycopg ``Connection`` (used as is: without autocommit, calls join the
    caller's transaction) or a ``ConnectionPool``. Times are epoch ms;
    ``now=None`` means the database clock. Bad arguments raise
    ``InvalidArgument`` and change nothing.
    """

    def __init__(
        self, source: SyncSource, *, schema: str = DEFAULT_SCHEMA, auto_migrate: bool = False
    ) -> None:
        self._runner = SyncRunner(source, schema)
        self._auto_migrate = auto_migrate

    @property
    def schema(self) -> str:
        return self._runner.schema

    def start(self) -> None:
        """Check that the schema is at the migration head (or migrate it, with
        ``auto_migrate=True``); raise ``SchemaNotReady`` saying what to run. Idempotent."""
        try:
            revision: str | None = self._runner.run(calls.schema_revision())
        except SchemaNotReady:
            revision = None
        if needs_migration(self.schema, revision, self._auto_migrate):
            migrate(self._runner.conninfo(), self.schema)

    def close(self) -> None:
        """Close the pool opened for a conninfo source (borrowed sources are left open)."""
        self._runner.close()

    def __enter__(self) -> PgScheduleStore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, id: str) -> ScheduleRecord | None:
        """The record of ``id``, or None."""
        return self._runner.run(calls.get(id))

    def register(
        self,
        id: str,
        kind: ScheduleKind,
        spec: str,
        next_run_at: int | None,
        now: int | None = None,
    ) -> ScheduleRecord:
        """Insert if absent; same kind and spec: untouched; else overwrite kind, spec,
        next_run_at (token, lease, last_* kept). Returns the stored record."""
        return self._runner.run(calls.register(id, kind, spec, next_run_at, now))

    def claim_due(
        self, id: str, owner: str, now: int | None, lease_ms: int
    ) -> ClaimResult | None:
        """Claim ``id`` if due and unleased; None: not due, leased elsewhere, or unknown."""
        return self._runner.run(calls.claim_due(id, owner, now, lease_ms))

    def renew(self, id: str, fencing_token: int, lease_until: int) -> bool:
        """Extend a claim still held with this token; False: the lease was lost."""
        return self._runner.run(calls.renew(id, fencing_token, lease_until))

    def complete(
        self, id: str, fencing_token: int, patch: CompletePatch, now: int | None = None
    ) -> bool:
        """Commit the occurrence of a claim still held with this token; False: stale."""
        return self._runner.run(calls.complete(id, fencing_token, patch, now))

    def delete(self, id: str) -> None:
        """Remove the record, keeping its token as the id's high-water mark."""
        return self._runner.run(calls.delete(id))

    def list(self) -> builtins.list[ScheduleRecord]:
        """Every record, orphans and tombstones included, ordered by id."""
        return self._runner.run(calls.list_all())

    def claim_next(
        self,
        owner: str,
        now: int | None,
        lease_ms: int,
        limit: int,
        ids: Sequence[str] | None = None,
    ) -> builtins.list[ClaimResult]:
        """Claim up to ``limit`` due, unleased records (earliest first; only ``ids`` if given)."""
        return self._runner.run(calls.claim_next(owner, now, lease_ms, limit, ids))

    def now_ms(self) -> int:
        """The database clock in epoch ms."""
        return self._runner.run(calls.now_ms())


class AsyncPgScheduleStore:
    """Durable scheduled tasks in PostgreSQL, for asyncio: ``PgScheduleStore``'s
    contract, with an ``AsyncConnection`` or ``AsyncConnectionPool`` as source."""

    def __init__(
        self, source: AsyncSource, *, schema: str = DEFAULT_SCHEMA, auto_migrate: bool = False
    ) -> None:
        self._runner = AsyncRunner(source, schema)
        self._auto_migrate = auto_migrate

    @property
    def schema(self) -> str:
        return self._runner.schema

    async def start(self) -> None:
        """See ``PgScheduleStore.start``."""
        try:
            revision: str | None = await self._runner.run(calls.schema_revision())
        except SchemaNotReady:
            revision = None
        if needs_migration(self.schema, revision, self._auto_migrate):
            await asyncio.to_thread(migrate, self._runner.conninfo(), self.schema)

    async def close(self) -> None:
        """See ``PgScheduleStore.close``."""
        await self._runner.close()

    async def __aenter__(self) -> AsyncPgScheduleStore:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def get(self, id: str) -> ScheduleRecord | None:
        return await self._runner.run(calls.get(id))

    async def register(
        self,
        id: str,
        kind: ScheduleKind,
        spec: str,
        next_run_at: int | None,
        now: int | None = None,
    ) -> ScheduleRecord:
        return await self._runner.run(calls.register(id, kind, spec, next_run_at, now))

    async def claim_due(
        self, id: str, owner: str, now: int | None, lease_ms: int
    ) -> ClaimResult | None:
        return await self._runner.run(calls.claim_due(id, owner, now, lease_ms))

    async def renew(self, id: str, fencing_token: int, lease_until: int) -> bool:
        return await self._runner.run(calls.renew(id, fencing_token, lease_until))

    async def complete(
        self, id: str, fencing_token: int, patch: CompletePatch, now: int | None = None
    ) -> bool:
        return await self._runner.run(calls.complete(id, fencing_token, patch, now))

    async def delete(self, id: str) -> None:
        return await self._runner.run(calls.delete(id))

    async def list(self) -> builtins.list[ScheduleRecord]:
        return await self._runner.run(calls.list_all())

    async def claim_next(
        self,
        owner: str,
        now: int | None,
        lease_ms: int,
        limit: int,
        ids: Sequence[str] | None = None,
    ) -> builtins.list[ClaimResult]:
        return await self._runner.run(calls.claim_next(owner, now, lease_ms, limit, ids))

    async def now_ms(self) -> int:
        return await self._runner.run(calls.now_ms())
