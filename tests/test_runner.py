"""The runner's own paths (pgstore.postgres.runner): what a call reads of its result,
and how it is sent on each kind of source."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from contextlib import AsyncExitStack, ExitStack
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgstore import (
    AsyncPgJobStore,
    CancelResult,
    InvalidArgument,
    Job,
    MarkResult,
    PgJobStore,
    ReadOnlyServer,
    RetryResult,
    ScheduleRecord,
    SchemaNotReady,
    StoreStats,
)
from pgstore.errors import PgStoreError
from pgstore.postgres import job_calls, preparing, runner
from pgstore.postgres import rows as _rows
from pgstore.postgres.call import Function
from pgstore.postgres.preparing import probe
from pgstore.postgres.runner import column_names


def test_column_names_are_read_from_the_result(pgstore_database: str) -> None:
    """The names, in order, whatever the alphabet; the same names give the same tuple
    back (what the row pickers' cache is keyed on); no result, or no column: none."""
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        cur = conn.cursor(row_factory=tuple_row)
        assert column_names(cur) == ()
        cur.execute('SELECT 1 AS b, 2 AS a, 3 AS "été", 4 AS "x y"')
        first = column_names(cur)
        assert first == ("b", "a", "été", "x y")
        assert first == tuple(c.name for c in cur.description or ())
        cur.execute('SELECT 5 AS b, 6 AS a, 7 AS "été", 8 AS "x y"')
        assert column_names(cur) is first
        cur.execute("SELECT")
        assert column_names(cur) == ()
        cur.execute("SET application_name = 'x'")
        assert column_names(cur) == ()


def test_column_names_of_an_async_cursor(pgstore_database: str) -> None:
    async def main() -> tuple[str, ...]:
        async with await psycopg.AsyncConnection.connect(pgstore_database) as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute("SELECT 1 AS run_id, 2 AS recorded")
            return column_names(cur)

    assert asyncio.run(main()) == ("run_id", "recorded")


# --- the sources: a caller's connection, a pool, a conninfo ---------------------------

#: Each way a store is given its connection: ``conn`` a psycopg connection (autocommit),
#: ``pool`` a psycopg_pool pool, ``conninfo`` a conninfo string (the store's own pool).
SOURCES = ["conn", "pool", "conninfo"]

BIGINT_MAX = 2**63 - 1


def _sync_store(kind: str, dsn: str, schema: str, stack: ExitStack) -> PgJobStore:
    source: Any
    if kind == "conn":
        source = stack.enter_context(psycopg.connect(dsn, autocommit=True))
    elif kind == "pool":
        source = stack.enter_context(
            ConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True})
        )
    else:
        source = dsn
    store = PgJobStore(source, schema=schema)
    stack.callback(store.close)
    return store


def _read_only(dsn: str) -> str:
    return make_conninfo(dsn, options="-c default_transaction_read_only=on")


@pytest.mark.parametrize("kind", SOURCES)
def test_a_sync_store_translates_the_servers_errors_on_every_source(
    pgstore_database: str, pgstore_schema: str, kind: str
) -> None:
    """22023 and 22003 from the SQL functions are InvalidArgument, a read-only server
    ReadOnlyServer, a schema without the functions SchemaNotReady, each with the server's
    error as its cause."""
    with ExitStack() as stack:
        store = _sync_store(kind, pgstore_database, pgstore_schema, stack)
        with pytest.raises(InvalidArgument) as bad:
            store.lease("", None, 1_000)  # an empty holder: the function's 22023
        assert bad.value.sqlstate == "22023"
        assert isinstance(bad.value.__cause__, psycopg.errors.InvalidParameterValue)
        store.schedule("r", 0)
        assert store.lease("h", 10, 1_000) is not None
        with pytest.raises(InvalidArgument) as overflow:
            store.renew("r", "h", BIGINT_MAX, 1_000)  # now + ttl_ms past bigint: 22003
        assert overflow.value.sqlstate == "22003"
        assert isinstance(overflow.value.__cause__, psycopg.errors.NumericValueOutOfRange)
        assert store.renew("r", "h", 20, 1_000) is True  # the store goes on

        missing = _sync_store(kind, pgstore_database, "no_such_schema", stack)
        with pytest.raises(SchemaNotReady, match="no_such_schema") as not_ready:
            missing.get("r")
        assert isinstance(not_ready.value.__cause__, psycopg.errors.InvalidSchemaName)

        read_only = _sync_store(kind, _read_only(pgstore_database), pgstore_schema, stack)
        assert read_only.get("r") is not None
        with pytest.raises(ReadOnlyServer) as refused:
            read_only.schedule("w", 0)
        assert isinstance(refused.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)


async def _async_store(
    kind: str, dsn: str, schema: str, stack: AsyncExitStack
) -> AsyncPgJobStore:
    source: Any
    if kind == "conn":
        source = await stack.enter_async_context(
            await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        )
    elif kind == "pool":
        source = AsyncConnectionPool(
            dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
        )
        await source.open()
        stack.push_async_callback(source.close)
    else:
        source = dsn
    store = AsyncPgJobStore(source, schema=schema)
    stack.push_async_callback(store.close)
    return store


@pytest.mark.parametrize("kind", SOURCES)
def test_an_async_store_translates_the_servers_errors_on_every_source(
    pgstore_database: str, pgstore_schema: str, kind: str
) -> None:
    """``test_a_sync_store_translates_the_servers_errors_on_every_source``, asyncio."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            store = await _async_store(kind, pgstore_database, pgstore_schema, stack)
            with pytest.raises(InvalidArgument) as bad:
                await store.lease("", None, 1_000)
            assert bad.value.sqlstate == "22023"
            assert isinstance(bad.value.__cause__, psycopg.errors.InvalidParameterValue)
            await store.schedule("r", 0)
            assert await store.lease("h", 10, 1_000) is not None
            with pytest.raises(InvalidArgument) as overflow:
                await store.renew("r", "h", BIGINT_MAX, 1_000)
            assert overflow.value.sqlstate == "22003"
            assert await store.renew("r", "h", 20, 1_000) is True

            missing = await _async_store(kind, pgstore_database, "no_such_schema", stack)
            with pytest.raises(SchemaNotReady, match="no_such_schema"):
                await missing.get("r")

            dsn = _read_only(pgstore_database)
            read_only = await _async_store(kind, dsn, pgstore_schema, stack)
            assert await read_only.get("r") is not None
            with pytest.raises(ReadOnlyServer) as refused:
                await read_only.schedule("w", 0)
            assert isinstance(refused.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)

    asyncio.run(main())


# --- a caller's connection --------------------------------------------------------------


def _status(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> TransactionStatus:
    return conn.info.transaction_status


def test_calls_on_a_callers_connection_join_its_transaction(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """Autocommit off: a call opens (or joins) the caller's transaction, which the caller
    commits or rolls back; a call in a failed transaction fails as any statement would
    (untranslated), and the store works again once the caller rolled back."""
    with psycopg.connect(pgstore_database) as conn, psycopg.connect(
        pgstore_database, autocommit=True
    ) as other:
        store, watcher = PgJobStore(conn, schema=pgstore_schema), PgJobStore(
            other, schema=pgstore_schema
        )
        store.schedule("gone", 0)
        assert _status(conn) == TransactionStatus.INTRANS
        assert watcher.get("gone") is None  # not committed
        conn.rollback()
        assert store.get("gone") is None

        conn.execute("CREATE TEMP TABLE mine (x int)")
        store.schedule("kept", 0)
        with pytest.raises(InvalidArgument):
            store.lease("", None, 1_000)
        assert _status(conn) == TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            store.get("kept")
        conn.rollback()
        assert store.get("kept") is None  # rolled back with the caller's failed transaction
        conn.commit()

        with conn.transaction():
            store.schedule("kept", 0)
            assert watcher.get("kept") is None
        assert watcher.get("kept") is not None  # committed with the caller's block


def test_async_calls_on_a_callers_connection_join_its_transaction(
    pgstore_database: str, pgstore_schema: str
) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pgstore_database) as conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            await store.schedule("gone", 0)
            assert _status(conn) == TransactionStatus.INTRANS
            await conn.rollback()
            assert await store.get("gone") is None
            with pytest.raises(InvalidArgument):
                await store.lease("", None, 1_000)
            with pytest.raises(psycopg.errors.InFailedSqlTransaction):
                await store.get("gone")
            await conn.rollback()
            async with conn.transaction():
                await store.schedule("kept", 0)
            assert _status(conn) == TransactionStatus.IDLE
            assert await store.get("kept") is not None

    asyncio.run(main())


def test_the_store_asks_its_connection_once(
    pgstore_database: str, pgstore_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's own connection is probed at its first call only (``prepare=None``),
    and its calls are then sent prepared; never with ``prepare=False``."""
    asked: list[object] = []

    def counted(conn: psycopg.Connection[Any]) -> bool | None:
        asked.append(conn)
        return probe(conn)

    monkeypatch.setattr(preparing, "probe", counted)
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        store = PgJobStore(conn, schema=pgstore_schema)
        for i in range(5):
            store.schedule(f"p{i}", 0)
        assert asked == [conn]
        prepared = conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
        assert any('"job_schedule"(' in str(row[0]) for row in prepared)

    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        store = PgJobStore(conn, schema=pgstore_schema, prepare=False)
        for i in range(5):
            store.schedule(f"u{i}", 0)
        assert len(asked) == 1
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)


def test_threads_share_a_store_on_one_connection(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """A sync store is for threads: on one connection, their calls take turns, each
    reading its own answer."""
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        store = PgJobStore(conn, schema=pgstore_schema)
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(50):
                    run_id = f"t{n}-{i}"
                    store.schedule(run_id, n * 1_000 + i)
                    job = store.get(run_id)
                    assert job is not None and job.run_id == run_id
                    assert job.dispatch_at == n * 1_000 + i
                    assert store.cancel(run_id) == CancelResult.CANCELLED
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert len(store.list_jobs().jobs) == 200


def test_the_positional_decoders_need_no_column_names() -> None:
    """The runner passes no names to ``BY_POSITION``'s decoders: each reads its rows'
    only column by position; an answer the enums do not know raises as before."""
    assert _rows.boolean([(True,)], ()) is True
    assert _rows.integer_value([(7,)], ()) == 7
    assert _rows.text_value([("pgstore_0012",)], ()) == "pgstore_0012"
    _rows.nothing([(None,)], ())
    for member in CancelResult:
        assert _rows.cancel_result([(member.value,)], ()) is member
    for retried in RetryResult:
        assert _rows.retry_result([(retried.value,)], ()) is retried
    with pytest.raises(ValueError):
        _rows.cancel_result([("maybe",)], ())
    with pytest.raises(ValueError):
        _rows.retry_result([("maybe",)], ())
    by_name = {_rows.optional_job, _rows.mark_result, _rows.optional_claim_result,
               _rows.jobs, _rows.job_page, _rows.mark_results, _rows.renewed}
    assert not by_name & _rows.BY_POSITION


# --- cursors of the store's own connection ------------------------------------------------


def _idle_cursors(store: PgJobStore | AsyncPgJobStore, function: Function) -> int:
    found = store._runner._statements.get(id(function))
    return 0 if found is None else len(found.cursors)


def test_a_store_reuses_its_connections_cursors(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """On its own connection a store runs each statement again on the cursor that last
    ran it; a call that failed drops its cursor, and so does one that read more rows
    than ``KEEP_CURSOR_ROWS``; a closed connection fails every call as psycopg says."""
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        store = PgJobStore(conn, schema=pgstore_schema)
        for i in range(3):
            store.schedule(f"c{i}", i)
            assert store.get(f"c{i}") is not None
        assert _idle_cursors(store, job_calls.SCHEDULE) == 1
        assert _idle_cursors(store, job_calls.GET) == 1
        cursor = store._runner._statements[id(job_calls.GET)].cursors[0]
        assert store.get("c0") is not None
        assert store._runner._statements[id(job_calls.GET)].cursors == [cursor]

        with pytest.raises(InvalidArgument):
            store.lease("", None, 1_000)
        assert _idle_cursors(store, job_calls.LEASE) == 0
        assert store.lease("h", 10, 1_000) is not None
        assert _idle_cursors(store, job_calls.LEASE) == 1

        many = [f"m{i}" for i in range(runner.KEEP_CURSOR_ROWS + 1)]
        store.schedule_many(many, [100] * len(many))
        assert len(store.lease_many("h", 200, 1_000, len(many))) == len(many)
        assert _idle_cursors(store, job_calls.LEASE_MANY) == 0
        assert len(store.lease_many("h", 200, 1_000, 10)) == 2  # c1 and c2
        assert _idle_cursors(store, job_calls.LEASE_MANY) == 1

    with pytest.raises(psycopg.OperationalError, match="closed"):
        store.get("c0")
    with pytest.raises(psycopg.OperationalError, match="closed"):
        store.schedule("new", 0)  # no idle cursor of its own yet: a new one, refused


def test_tasks_share_an_async_store_on_one_connection(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """Tasks calling one asyncio store on one connection at once each read their own
    answer (each takes a cursor of its own), and the cursors are kept for later. (With
    the calls pipelined, the default here, no cursor is used: tests/test_pipelined.py.)"""

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(
            pgstore_database, autocommit=True
        ) as conn:
            store = AsyncPgJobStore(conn, schema=pgstore_schema)
            store._runner.pipeline = False

            async def work(n: int) -> None:
                for i in range(10):
                    run_id = f"a{n}-{i}"
                    await store.schedule(run_id, n * 100 + i)
                    job = await store.get(run_id)
                    assert job is not None and job.dispatch_at == n * 100 + i

            await asyncio.gather(*(work(n) for n in range(8)))
            assert 1 <= _idle_cursors(store, job_calls.GET) <= 8
            assert len((await store.list_jobs()).jobs) == 80

    asyncio.run(main())


# --- rows into dataclasses ------------------------------------------------------------------


@pytest.mark.parametrize("cls", [ScheduleRecord, Job, StoreStats, MarkResult])
@pytest.mark.parametrize("maker", [_rows._slot_maker, _rows._constructor_maker])
def test_rows_become_the_same_dataclasses_as_their_constructor_builds(
    cls: type[Any], maker: Callable[[type[Any], list[int]], Callable[[Any], Any]],
) -> None:
    """pgstore's models are built by setting their slots (what their generated
    ``__init__`` does, without ``object.__setattr__``'s lookups): every field equal to
    what the constructor builds, still frozen; columns are picked by name, in any
    order, extras ignored. Built by the constructor, the same."""
    names = [f.name for f in dataclasses.fields(cls)]
    values = [f"v{i}" if i % 2 else i for i in range(len(names))]
    columns = ("extra", *reversed(names))
    row = ("ignored", *reversed(values))
    made = maker(cls, _rows._indices(cls, columns))(row)
    assert made == _rows._one(cls, row, columns)
    expected = cls(*values)
    assert type(made) is cls
    assert made == expected and hash(made) == hash(expected) and repr(made) == repr(expected)
    assert dataclasses.astuple(made) == tuple(values)
    for name, value in zip(names, values, strict=True):
        assert getattr(made, name) == value, name
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.__setattr__(names[0], "changed")
    assert _rows._all(cls, [row, row], columns) == [expected, expected]
    with pytest.raises(PgStoreError, match=f"no column {names[0]} for {cls.__name__}"):
        _rows._one(cls, row[:-1], columns[:-1])


def test_the_slot_built_models_have_nothing_more_to_their_construction() -> None:
    """What building a ``SLOT_BUILT`` model by its slots takes for granted: a frozen,
    slotted dataclass, no ``__post_init__``, no ``__new__`` of its own, every field set
    by ``__init__`` (an ``__init__`` of its own that changes a value fails the test
    above)."""
    assert {ScheduleRecord, Job, StoreStats, MarkResult} == _rows.SLOT_BUILT
    for cls in _rows.SLOT_BUILT:
        assert dataclasses.is_dataclass(cls) and "__slots__" in cls.__dict__
        assert not hasattr(cls, "__post_init__") and cls.__new__ is object.__new__
        assert all(f.init for f in dataclasses.fields(cls))
        first = dataclasses.fields(cls)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            cls(*range(len(dataclasses.fields(cls)))).__setattr__(first, 1)


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    a: int
    b: str

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a < 0")


@dataclasses.dataclass(frozen=True)
class _Unslotted:
    a: int
    b: str


@dataclasses.dataclass(frozen=True, slots=True)
class _OwnInit:
    a: int
    b: str

    def __init__(self, a: int, b: str) -> None:
        object.__setattr__(self, "a", a * 2)
        object.__setattr__(self, "b", b)


@dataclasses.dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: str


@pytest.mark.parametrize("cls", [_Checked, _Unslotted, _OwnInit, _Plain])
def test_any_other_dataclass_is_built_by_its_constructor(cls: type[Any]) -> None:
    """A ``__post_init__``, no slots, an ``__init__`` of its own, or nothing more to it:
    a class outside ``SLOT_BUILT`` is built by calling it, its ``__init__`` (and
    ``__post_init__``) run."""
    calls: list[tuple[Any, ...]] = []
    init = cls.__init__

    def counting(self: Any, *args: Any) -> None:
        calls.append(args)
        init(self, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cls, "__init__", counting)
        assert _rows._one(cls, ("x", 3), ("b", "a")) == cls(3, "x")
        assert _rows._all(cls, [("y", 4)], ("b", "a")) == [cls(4, "y")]
    assert calls == [(3, "x"), (3, "x"), (4, "y"), (4, "y")]
    if cls is _Checked:
        with pytest.raises(ValueError, match="a < 0"):
            _rows._one(cls, ("x", -1), ("b", "a"))
    if cls is _OwnInit:
        assert _rows._one(cls, ("x", 3), ("b", "a")).a == 6
    if cls in (_Checked, _Unslotted):  # what _slot_maker itself can tell
        with pytest.raises(TypeError):
            _rows._slot_maker(cls, [1, 0])


def test_mark_result_reads_a_null_as_false() -> None:
    assert _rows.mark_result([(None, True)], ("cancelled", "recorded")) == MarkResult(
        cancelled=False, recorded=True
    )
    assert _rows.mark_result([(True, False)], ("recorded", "cancelled")) == MarkResult(
        cancelled=False, recorded=True
    )
