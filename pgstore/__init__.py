"""pgstore: a PostgreSQL-native lease store for durable scheduled tasks and delayed job dispatch.

The store's API is a set of SQL functions (see sql/); this package is a thin
psycopg 3 wrapper over them, plus in-memory reference stores.
"""

from __future__ import annotations

from pgstore.errors import (
    InvalidArgument,
    JobNotRemovable,
    NotPermitted,
    PgStoreError,
    ReadOnlyServer,
    SchemaNotReady,
)
from pgstore.memory.jobs import MemoryJobStore
from pgstore.memory.schedules import MemoryScheduleStore
from pgstore.models import (
    DEFAULT_MAX_ATTEMPTS,
    CancelResult,
    CatchUp,
    ClaimResult,
    CompletePatch,
    Fence,
    Job,
    JobFilter,
    JobPage,
    JobState,
    LastStatus,
    MarkResult,
    QueueInfo,
    RetryResult,
    ScheduleKind,
    ScheduleRecord,
    StoreStats,
)
from pgstore.postgres.jobs import AsyncPgJobStore, PgJobStore
from pgstore.postgres.schedules import AsyncPgScheduleStore, PgScheduleStore
from pgstore.protocols import AsyncJobStore, AsyncScheduleStore, JobStore, ScheduleStore
from pgstore.runtime.dispatcher import Backoff, Dispatcher
from pgstore.runtime.scheduler import RunContext, Scheduler
from pgstore.schema.files import versions_dir
from pgstore.schema.objects import DEFAULT_SCHEMA, HEAD_REVISION

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_SCHEMA",
    "HEAD_REVISION",
    "AsyncJobStore",
    "AsyncPgJobStore",
    "AsyncPgScheduleStore",
    "AsyncScheduleStore",
    "Backoff",
    "CancelResult",
    "CatchUp",
    "ClaimResult",
    "CompletePatch",
    "Dispatcher",
    "Fence",
    "InvalidArgument",
    "Job",
    "JobFilter",
    "JobNotRemovable",
    "JobPage",
    "JobState",
    "JobStore",
    "LastStatus",
    "MarkResult",
    "MemoryJobStore",
    "MemoryScheduleStore",
    "NotPermitted",
    "PgJobStore",
    "PgScheduleStore",
    "PgStoreError",
    "QueueInfo",
    "ReadOnlyServer",
    "RetryResult",
    "RunContext",
    "ScheduleKind",
    "ScheduleRecord",
    "ScheduleStore",
    "Scheduler",
    "SchemaNotReady",
    "StoreStats",
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
    """Upgrade ``schema`` on ``conninfo`` to ``revision`` (the head by default), in one
    transaction: ``pgstore.schema.migrations.migrate``, which says what ``client_role``
    and ``client_role_adopt`` do (docs/migrations.md)."""
    from pgstore.schema.migrations import migrate as upgrade

    upgrade(conninfo, schema, revision, client_role, client_role_adopt)
