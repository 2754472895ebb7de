"""pgstore: a PostgreSQL-native lease store for durable scheduled tasks and delayed job dispatch.

The store's API is a set of SQL functions (see sql/); this package is a thin
psycopg 3 wrapper over them, plus in-memory reference stores.
"""

from __future__ import annotations

from ._resources import versions_dir
from ._schema import DEFAULT_SCHEMA, HEAD_REVISION
from .dispatcher import Backoff, Dispatcher
from .errors import InvalidArgument, PgStoreError, ReadOnlyServer, SchemaNotReady
from .jobs import AsyncPgJobStore, PgJobStore
from .memory_jobs import MemoryJobStore
from .memory_schedules import MemoryScheduleStore
from .models import (
    CancelResult,
    ClaimResult,
    CompletePatch,
    Job,
    LastStatus,
    MarkResult,
    ScheduleKind,
    ScheduleRecord,
)
from .scheduler import RunContext, Scheduler
from .schedules import AsyncPgScheduleStore, PgScheduleStore

__all__ = [
    "DEFAULT_SCHEMA",
    "HEAD_REVISION",
    "AsyncPgJobStore",
    "AsyncPgScheduleStore",
    "Backoff",
    "CancelResult",
    "ClaimResult",
    "CompletePatch",
    "Dispatcher",
    "InvalidArgument",
    "Job",
    "LastStatus",
    "MarkResult",
    "MemoryJobStore",
    "MemoryScheduleStore",
    "PgJobStore",
    "PgScheduleStore",
    "PgStoreError",
    "ReadOnlyServer",
    "RunContext",
    "ScheduleKind",
    "ScheduleRecord",
    "Scheduler",
    "SchemaNotReady",
    "migrate",
    "versions_dir",
]


def migrate(
    conninfo: str = "",
    schema: str = DEFAULT_SCHEMA,
    revision: str = "head",
    client_role: bool | str = True,
    client_role_adopt: bool = False,
) -> None:
    """Upgrade ``schema`` on ``conninfo`` to ``revision``; see ``schema_migrations.migrate``."""
    from .schema_migrations import migrate as upgrade

    upgrade(conninfo, schema, revision, client_role, client_role_adopt)
