"""``prepare``: the stores prepare their statements server-side where that is safe.

The conformance suites run stores as built by default (``prepare=None``) directly
and through pgbouncer, and a ``pg_unprepared`` one (``conftest.py``); these tests
show what the option changes on the server: the session's
``pg_prepared_statements`` hold the store's calls with ``prepare=True`` and by
default on a direct connection, and nothing with ``prepare=False`` even past
psycopg's default ``prepare_threshold`` (5); a connection opened with
``prepare_threshold=None`` (psycopg's switch for PgBouncer) prepares nothing
either way. Through pgbouncer in transaction and statement pooling, the default
prepares nothing (PgBouncer before 1.21 forwards statements as they are), and
the probe's verdict is read from what the server says.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from pgstore import AsyncPgJobStore, InvalidArgument, PgJobStore, PgScheduleStore
from pgstore.postgres import preparing
from pgstore.postgres.preparing import pooler_probe, probe, verdict
from pgstore.testing import PgBouncer, TestServer, pgbouncer_binary, start_pgbouncer


def _prepared(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute("SELECT statement FROM pg_prepared_statements ORDER BY 1").fetchall()
    return [str(r[0]) for r in rows]


@pytest.mark.parametrize(
    ("prepare", "threshold", "expected"),
    [(False, 5, False), (True, 5, True), (True, None, False), (None, 5, True), (None, None, False)],
)
def test_sync_stores_prepare_only_when_asked(
    pgstore_database: str, pgstore_schema: str, prepare: bool, threshold: int | None,
    expected: bool,
) -> None:
    with psycopg.connect(
        pgstore_database, autocommit=True, prepare_threshold=threshold
    ) as conn:
        schedules = PgScheduleStore(conn, schema=pgstore_schema, prepare=prepare)
        jobs = PgJobStore(conn, schema=pgstore_schema, prepare=prepare)
        for i in range(8):  # past psycopg's default threshold, in case it were followed
            schedules.register("p", "interval", "1000", 100 + i, 10)
            jobs.schedule(f"p{i}", 100 + i)
        assert [j.run_id for j in jobs.list_dispatched()] == []
        statements = [s for s in _prepared(conn) if "pgstore prepare probe" not in s]
    if not expected:
        assert statements == []
        return
    assert len(statements) == 3, statements  # register, schedule, list_dispatched: once each
    for name in ("schedule_register", "job_schedule", "job_list_dispatched"):
        assert any(f'"{pgstore_schema}"."{name}"(' in s for s in statements), (name, statements)


def test_async_stores_prepare_when_asked(pgstore_database: str, pgstore_schema: str) -> None:
    async def main() -> list[str]:
        aconn = await psycopg.AsyncConnection.connect(pgstore_database, autocommit=True)
        async with aconn:
            store = AsyncPgJobStore(aconn, schema=pgstore_schema, prepare=True)
            for i in range(3):
                await store.schedule(f"a{i}", 100)
                assert await store.get(f"a{i}") is not None
            cur = await aconn.execute("SELECT statement FROM pg_prepared_statements")
            return [str(r[0]) for r in await cur.fetchall()]

    statements = asyncio.run(main())
    assert len(statements) == 2, statements
    assert {s.split(".", 1)[1].split("(", 1)[0] for s in statements} == {'"job_schedule"', '"job_get"'}


@pytest.mark.parametrize("value", [0, 1, "yes", "", 2**63])
def test_prepare_must_be_a_bool_or_none(pgstore_database: str, value: object) -> None:
    with pytest.raises(InvalidArgument, match="prepare must be True, False or None"):
        PgJobStore(pgstore_database, prepare=value)  # type: ignore[arg-type]



def _store_statements(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    return [s for s in _prepared(conn) if f'"{schema}".' in s]


def test_the_default_prepares_on_an_owned_pool_and_asks_each_connection_once(
    pgstore_database: str, pgstore_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store built from a conninfo (its own pool) prepares by default: the server
    sessions behind its connections hold its statements, and nothing else."""
    asked: list[int] = []

    def counted(conn: psycopg.Connection[Any]) -> bool | None:
        asked.append(id(conn))
        return probe(conn)

    monkeypatch.setattr(preparing, "probe", counted)
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    try:
        for i in range(12):
            store.schedule(f"o{i}", 100)
        # Each connection asked once. A connection the pool replaced meanwhile (on a
        # loaded machine an attempt can time out) leaves its verdict with it.
        assert len(asked) == len(set(asked)) >= len(store._runner._verdicts)
        with psycopg.connect(pgstore_database, autocommit=True) as watcher:
            rows = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchall()
        assert rows, "the store's pool holds a connection"
        assert len(store._runner._verdicts) >= 1
        assert set(store._runner._verdicts.values()) == {True}
        assert store._runner._pool is not None
        with store._runner._pool.connection() as conn:
            mine = _store_statements(conn, pgstore_schema)
            others = [s for s in _prepared(conn) if s not in mine]
        assert any('"job_schedule"(' in s for s in mine), mine
        assert others == [], others  # a direct connection's probe prepares nothing
    finally:
        store.close()


def test_the_default_prepares_on_an_async_connection(
    pgstore_database: str, pgstore_schema: str
) -> None:
    async def main() -> list[str]:
        aconn = await psycopg.AsyncConnection.connect(pgstore_database, autocommit=True)
        async with aconn:
            store = AsyncPgJobStore(aconn, schema=pgstore_schema)
            for i in range(3):
                await store.schedule(f"d{i}", 100)
            cur = await aconn.execute("SELECT statement FROM pg_prepared_statements")
            return [str(r[0]) for r in await cur.fetchall()]

    statements = asyncio.run(main())
    assert any('"job_schedule"(' in s for s in statements), statements


def test_the_probe_inside_the_callers_transaction_leaves_it_as_it_was(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """On a connection with autocommit off, in a transaction the caller began, the probe
    runs in a savepoint: the caller's work stays in the transaction and is rolled back
    with it; a transaction already failed is not probed (the call fails as it would)."""
    with psycopg.connect(pgstore_database) as conn:
        store = PgJobStore(conn, schema=pgstore_schema)
        conn.execute("CREATE TEMP TABLE mine (x int)")
        conn.execute("INSERT INTO mine VALUES (1)")
        store.schedule("tx-1", 100)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        row = conn.execute("SELECT count(*) FROM mine").fetchone()
        assert row == (1,)
        conn.rollback()
        assert store.get("tx-1") is None
        assert store._runner._verdicts.get(conn) is True

    with psycopg.connect(pgstore_database) as conn:
        store = PgJobStore(conn, schema=pgstore_schema)
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        assert probe(conn) is None
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            store.get("tx-1")
        assert conn not in store._runner._verdicts
        conn.rollback()
        assert store.get("tx-1") is None
        assert store._runner._verdicts.get(conn) is True


def test_verdict_reads_the_servers_answer() -> None:
    """The rule itself: the same process id on both sides means a session of one's own;
    another one (a pooler) is safe only when the server holds the statement under a name
    of the pooler's (PgBouncer 1.21+ renames them ``PGBOUNCER_<n>``), not psycopg's."""
    assert verdict(41, (41, "_pg3_0")) is True
    assert verdict(41, (41, None)) is True
    assert verdict(7_000_001, (41, "_pg3_3")) is False
    assert verdict(7_000_001, (41, "PGBOUNCER_12")) is True
    assert verdict(7_000_001, (41, None)) is False
    assert verdict(7_000_001, None) is False


def test_the_probe_prepares_nothing_on_a_direct_connection(pgstore_database: str) -> None:
    """Direct: the process ids agree, and the probe stops there, preparing nothing. Its
    pooler half, run here by hand, finds itself under psycopg's name and deallocates it
    before the Sync (as it would on a pooler's shared server session)."""
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        assert probe(conn) is True
        assert _prepared(conn) == []
        statement, cleanup = pooler_probe("n0nce")
        with conn.pipeline():
            cur = conn.execute(statement, prepare=True)
            conn.execute(cleanup, prepare=False)
        row = cur.fetchone()
        assert row is not None
        assert row[0] == conn.info.backend_pid
        assert str(row[1]).startswith("_pg3_")
        assert _prepared(conn) == []


def _version(bouncer_version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in bouncer_version.split(".")[:2])


#: PgBouncer 1.21 keeps prepared statements for its clients (max_prepared_statements).
KEEPS_PREPARED = (1, 21)


@pytest.fixture
def binary(pgstore_server: TestServer) -> str:
    found = pgbouncer_binary()
    if found is None:
        pytest.skip("no pgbouncer binary")
    return found


def _binary_version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    return _version(out.stdout.split()[1])


@pytest.fixture
def bouncers(pgstore_server: TestServer, binary: str) -> Iterator[dict[str, PgBouncer]]:
    """pgbouncers in front of the session's server, one per pooling mode, each forwarding
    prepared statements as they are (``max_prepared_statements = 0`` where the setting
    exists: PgBouncer 1.21+)."""
    forward = {"max_prepared_statements": "0"} if _binary_version(binary) >= KEEPS_PREPARED else {}
    with (
        start_pgbouncer(pgstore_server, binary, settings=forward) as transaction,
        start_pgbouncer(pgstore_server, binary, settings={**forward, "pool_mode": "statement"})
        as statement,
        start_pgbouncer(pgstore_server, binary, settings={**forward, "pool_mode": "session"})
        as session,
    ):
        yield {"transaction": transaction, "statement": statement, "session": session}


def _hammer(bounced: str, schema: str, prefix: str) -> tuple[
    list[psycopg.Connection[Any]], ConnectionPool, list[PgJobStore], list[BaseException]
]:
    """4 threads on connections of their own and one on a pool, each calling a default
    store 40 times through ``bounced``: the connections, the pool, the stores, the errors.
    The caller closes the connections and the pool."""
    errors: list[BaseException] = []
    conns = [psycopg.connect(bounced, autocommit=True) for _ in range(4)]
    pool = ConnectionPool(bounced, min_size=2, max_size=4, open=True, kwargs={"autocommit": True})
    stores = [PgJobStore(c, schema=schema) for c in conns]
    stores.append(PgJobStore(pool, schema=schema))

    def work(n: int, store: PgJobStore) -> None:
        try:
            for i in range(40):
                store.schedule(f"{prefix}-{n}-{i % 3}", 100 + i)
                assert store.get(f"{prefix}-{n}-0") is not None
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n, s)) for n, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return conns, pool, stores, errors


@pytest.mark.parametrize("mode", ["transaction", "statement", "session"])
def test_the_default_prepares_nothing_behind_a_pooler_that_forwards_statements(
    bouncers: dict[str, PgBouncer], pgstore_database: str, pgstore_schema: str, mode: str
) -> None:
    """Through PgBouncer without prepared-statement support (before 1.21, or 1.21+ with
    ``max_prepared_statements = 0``), in every pooling mode: the probe sees another
    process id and its statement under psycopg's name (or cannot run: statement pooling
    refuses the transaction), so nothing is prepared; 4 threads on their own connections
    and a shared pool call the stores 40 times each without a 26000 / 42P05 error, and
    the server sessions behind hold none of the stores' statements."""
    bounced = bouncers[mode].dsn_for(pgstore_database)
    with psycopg.connect(bounced, autocommit=True) as conn:
        assert probe(conn) is False
    conns, pool, stores, errors = _hammer(bounced, pgstore_schema, mode)
    try:
        assert errors == []
        assert all(v is False for s in stores for v in s._runner._verdicts.values())
        assert sum(len(s._runner._verdicts) for s in stores) >= 5
        with psycopg.connect(pgstore_database, autocommit=True) as direct:
            # the server sessions pgbouncer holds: none prepared a store statement
            backends = direct.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchone()
        assert backends is not None and backends[0] >= 1
        for c in conns:  # whichever server session each reaches now
            assert _store_statements(c, pgstore_schema) == []
            assert [p for p in _prepared(c) if "pgstore prepare probe" in p] == []
    finally:
        for c in conns:
            c.close()
        pool.close()


@pytest.mark.parametrize("mode", ["transaction", "statement"])
def test_the_default_prepares_behind_a_pgbouncer_that_keeps_prepared_statements(
    pgstore_server: TestServer, binary: str, pgstore_database: str, pgstore_schema: str,
    mode: str,
) -> None:
    """PgBouncer 1.21+ with ``max_prepared_statements`` above 0 renames what it forwards
    (``PGBOUNCER_<n>``): the probe says so, the stores prepare, 4 threads on their own
    connections and a pool call them 40 times each without an error, and the server
    sessions behind hold the stores' statements under PgBouncer's names. (Skipped with an
    older pgbouncer: set PGSTORE_PGBOUNCER to a 1.21+ binary.)"""
    if _binary_version(binary) < KEEPS_PREPARED:
        pytest.skip(f"{binary} is older than 1.21: it cannot keep prepared statements")
    settings = {"max_prepared_statements": "100", "pool_mode": mode}
    with start_pgbouncer(pgstore_server, binary, settings=settings) as bouncer:
        bounced = bouncer.dsn_for(pgstore_database)
        with psycopg.connect(bounced, autocommit=True) as conn:
            assert probe(conn) is True
        conns, pool, stores, errors = _hammer(bounced, pgstore_schema, f"k{mode}")
        try:
            assert errors == []
            assert all(v is True for s in stores for v in s._runner._verdicts.values())
            names = [row for c in conns for row in c.execute(  # whichever server sessions
                "SELECT name, statement FROM pg_prepared_statements").fetchall()]
            ours = [(n, st) for n, st in names if f'"{pgstore_schema}".' in st]
            assert ours, names
            assert all(str(n).startswith("PGBOUNCER_") for n, _ in ours), ours
        finally:
            for c in conns:
                c.close()
            pool.close()
