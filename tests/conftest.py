"""Store fixtures: the conformance suites run against every implementation."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import psycopg
import pytest

from pgstore import (
    AsyncPgJobStore,
    AsyncPgScheduleStore,
    Job,
    MemoryJobStore,
    MemoryScheduleStore,
    PgJobStore,
    PgScheduleStore,
    ScheduleRecord,
)
from pgstore.protocols import JobStore, ScheduleStore
from pgstore.testing import PgBouncer
from tests.support.sync_stores import sync_job_store, sync_schedule_store
from tests.support.xdist_groups import (  # the suite's spread over xdist workers: its hooks
    pytest_collection_modifyitems as pytest_collection_modifyitems,
)
from tests.support.xdist_groups import pytest_configure as pytest_configure
from tests.support.xdist_groups import pytest_xdist_make_scheduler as pytest_xdist_make_scheduler

# A pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment,
# where a serial run has whatever the shell exported (usually nothing). The CLI cuts
# its tables to COLUMNS, so the CLI tests set it themselves when they want a width.
for _variable in ("COLUMNS", "LINES"):
    os.environ.pop(_variable, None)

#: Every store the conformance suites run against; the ``*_bouncer`` ones talk to the
#: database through the session's pgbouncer in transaction pooling mode (the schema is
#: installed directly, and the state is read directly). The stores are built as by default
#: (``prepare=None``: they prepare on the direct connections and not through pgbouncer),
#: but ``pg_unprepared``, a sync store built with ``prepare=False``.
STORE_KINDS = ["memory", "pg", "pg_unprepared", "async_pg", "pg_bouncer", "async_pg_bouncer"]


T = TypeVar("T")


def present(value: T | None) -> T:
    """``value``, asserted to be there: a test's way to read a record it knows exists."""
    assert value is not None
    return value


def _store_dsn(request: pytest.FixtureRequest, dsn: str) -> str:
    """The conninfo a PostgreSQL store under test uses: ``dsn``, or ``dsn`` through pgbouncer."""
    if not request.param.endswith("_bouncer"):
        return dsn
    bouncer: PgBouncer = request.getfixturevalue("pgstore_pgbouncer")
    return bouncer.dsn_for(dsn)


@dataclass
class StoreUnderTest:
    """A store, and a way to read its whole state (records and fences)."""

    store: ScheduleStore
    fences: Callable[[], dict[str, int]]

    def state(self) -> tuple[list[ScheduleRecord], dict[str, int]]:
        return self.store.list(), self.fences()


def _pg_fences(dsn: str, schema: str) -> Callable[[], dict[str, int]]:
    def read() -> dict[str, int]:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                psycopg.sql.SQL("SELECT id, fencing_token FROM {}.schedule_fences").format(
                    psycopg.sql.Identifier(schema)
                )
            ).fetchall()
        return dict(rows)

    return read


@pytest.fixture(params=STORE_KINDS)
def schedules(request: pytest.FixtureRequest) -> Iterator[StoreUnderTest]:
    kind = request.param
    if kind == "memory":
        memory = MemoryScheduleStore()
        yield StoreUnderTest(memory, lambda: dict(memory._fences))
        return
    dsn = request.getfixturevalue("pgstore_database")
    store_dsn = _store_dsn(request, dsn)  # first: it may skip
    schema = request.getfixturevalue("pgstore_schema")
    if kind in ("pg", "pg_unprepared", "pg_bouncer"):
        prepare = False if kind == "pg_unprepared" else None
        store = PgScheduleStore(store_dsn, schema=schema, prepare=prepare)
        store.start()
        yield StoreUnderTest(store, _pg_fences(dsn, schema))
        store.close()
        return
    loop = asyncio.new_event_loop()
    async_store = AsyncPgScheduleStore(store_dsn, schema=schema)
    loop.run_until_complete(async_store.start())
    yield StoreUnderTest(sync_schedule_store(async_store, loop), _pg_fences(dsn, schema))
    loop.run_until_complete(async_store.close())
    loop.close()


@dataclass
class JobStoreUnderTest:
    """A job store, and a way to read its whole state (every job, by run_id)."""

    store: JobStore
    state: Callable[[], list[Job]]


def pg_jobs_state(dsn: str, schema: str) -> Callable[[], list[Job]]:
    """Every row of ``schema``.jobs as ``Job``s, ordered by run_id, read on a fresh connection."""

    def read() -> list[Job]:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                psycopg.sql.SQL(
                    "SELECT run_id, dispatch_at, lease_holder, lease_until, worker_id,"
                    " dispatched, cancelled, lease_sequence, attempts, max_attempts,"
                    " last_error, failed, queue, priority, payload FROM {}.jobs ORDER BY run_id"
                ).format(psycopg.sql.Identifier(schema))
            ).fetchall()
        return [
            Job(row[0], row[1], row[2], row[3], row[4], row[5], row[6], lease_sequence=row[7],
                attempts=row[8], max_attempts=row[9], last_error=row[10], failed=row[11],
                queue=row[12], priority=row[13], payload=row[14])
            for row in rows
        ]

    return read


@pytest.fixture(params=STORE_KINDS)
def jobs(request: pytest.FixtureRequest) -> Iterator[JobStoreUnderTest]:
    kind = request.param
    if kind == "memory":
        memory = MemoryJobStore()
        yield JobStoreUnderTest(memory, memory.list_all)
        return
    dsn = request.getfixturevalue("pgstore_database")
    store_dsn = _store_dsn(request, dsn)  # first: it may skip
    schema = request.getfixturevalue("pgstore_schema")
    if kind in ("pg", "pg_unprepared", "pg_bouncer"):
        prepare = False if kind == "pg_unprepared" else None
        store = PgJobStore(store_dsn, schema=schema, prepare=prepare)
        store.start()
        yield JobStoreUnderTest(store, pg_jobs_state(dsn, schema))
        store.close()
        return
    loop = asyncio.new_event_loop()
    async_store = AsyncPgJobStore(store_dsn, schema=schema)
    loop.run_until_complete(async_store.start())
    yield JobStoreUnderTest(sync_job_store(async_store, loop), pg_jobs_state(dsn, schema))
    loop.run_until_complete(async_store.close())
    loop.close()
