"""Hostile schema and client-role names, at every place a name reaches SQL.

A name is only ever quoted as an identifier (or passed as a parameter): quotes,
``--``, ``/*``, ``;``, ``$$``, ``%``, ``:word``, backslashes and unicode make a
store in exactly that schema and change nothing else in the database. Names with
control characters are refused with ``InvalidArgument`` and nothing is created.
Covered: the Python API (``migrate``, ``downgrade``, ``current_revision``, every
store class's calls, ``start()`` with ``auto_migrate``), the ``pgstore`` command,
alembic's own command line (``-x schema=... -x client_role=...``), a host app's
alembic environment, and the Scheduler and Dispatcher (LISTEN included).
"""

from __future__ import annotations

import asyncio
import inspect
import io
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from alembic.config import main as alembic_main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

import pgstore
import pgstore.schema.files
from pgstore import (
    AsyncPgJobStore,
    AsyncPgScheduleStore,
    CompletePatch,
    InvalidArgument,
    PgJobStore,
    PgScheduleStore,
)
from pgstore.cli.commands import main as cli_main
from pgstore.postgres.grants import CLIENT_FUNCTIONS, OWNER_FUNCTIONS
from pgstore.runtime.dispatcher import Dispatcher
from pgstore.runtime.scheduler import Scheduler
from pgstore.schema.migrations import current_revision, downgrade, migrate
from pgstore.testing import TestServer, fresh_database, install_schema
from tests.support.clock import FakeClock
from tests.support.wakeup import wake_up_latency

HOST_APP = Path(__file__).parent / "host_app"

#: What a hostile name is made of (no control characters: those are refused).
HOSTILE_ALPHABET = [*"\"'%:;-/*$\\ {}()=,.aZ_9", "é", "ß", "😀", "\u2028", "\ufeff"]
#: Whole pieces that have broken quoting somewhere before.
PIECES = ["--", "/*", "*/", "$$", "%s", "%(x)s", ":x", " :b", "';", '";', "\\'", "{role}"]

_hostile_text = st.lists(
    st.one_of(st.sampled_from(HOSTILE_ALPHABET), st.sampled_from(PIECES)), min_size=1, max_size=40
).map("".join)


def _fits(limit: int) -> Any:
    return lambda name: 0 < len(name.encode()) <= limit and not name.lower().startswith("pg_")


#: Any hostile name PostgreSQL keeps as given (at most 63 bytes).
hostile_names = _hostile_text.filter(_fits(63))
#: A schema whose default client role ``<schema>_client_<database>`` still fits 63 bytes
#: (the test databases' names are 25 bytes).
short_schemas = _hostile_text.filter(_fits(30))

#: Names with at least one C0/C1 control character or DEL.
CONTROLS = [chr(c) for c in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]]
control_names = st.tuples(
    st.text(st.sampled_from(HOSTILE_ALPHABET), max_size=8),
    st.sampled_from(CONTROLS),
    st.text(st.sampled_from(HOSTILE_ALPHABET), max_size=8),
).map("".join)

EXAMPLES = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

#: The exploit names of the review: a newline ends a ``--`` comment.
NEWLINE_EXPLOITS = [
    "\nDROP TABLE IF EXISTS public.victim;--",
    "x\nALTER ROLE {app} SUPERUSER;--",
]


@dataclass
class Db:
    """The module's database, with a sentinel table and a non-superuser role to watch."""

    dsn: str
    name: str
    app: str

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True)

    def snapshot(self) -> dict[str, Any]:
        """What a migration of one schema must leave alone: other schemas, roles and their
        powers, the sentinel's rows."""
        with self.connect() as conn:
            return {
                "schemas": sorted(r[0] for r in conn.execute(
                    "SELECT nspname FROM pg_namespace WHERE nspname !~ '^(pg_|information_schema)'")),
                # Roles are cluster-wide and other test runs may share the server: the
                # superusers, the watched app role, and the roles tied to this database.
                "roles": sorted(conn.execute(
                    "SELECT rolname, rolsuper, rolcanlogin, rolcreaterole, rolcreatedb"
                    "  FROM pg_roles r"
                    " WHERE rolsuper OR rolname = %s"
                    "    OR EXISTS (SELECT FROM pg_shdepend d WHERE d.refobjid = r.oid AND"
                    "               d.dbid = (SELECT oid FROM pg_database"
                    "                          WHERE datname = current_database()))"
                    "    OR shobj_description(r.oid, 'pg_authid') LIKE '%%' || %s",
                    (self.app, f' of database "{self.name}"'),
                ).fetchall()),
                "victim": conn.execute("SELECT * FROM public.victim ORDER BY 1").fetchall(),
                "public": sorted(r[0] for r in conn.execute(
                    "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace")),
            }


@pytest.fixture(scope="module")
def db(pgstore_server: TestServer) -> Iterator[Db]:
    app = f"names_app_{uuid.uuid4().hex[:8]}"
    with fresh_database(pgstore_server, prefix="pgstore_test") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.victim (id int PRIMARY KEY)")
            conn.execute("INSERT INTO public.victim VALUES (1), (2)")
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(app)))
        try:
            yield Db(dsn, str(conninfo_to_dict(dsn)["dbname"]), app)
        finally:
            with psycopg.connect(pgstore_server.dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(app)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(app)))


def _default_role(db: Db, schema: str) -> str:
    return f"{schema}_client_{db.name}"


@contextmanager
def _cleaned(db: Db, schema: str, role: str | None = None) -> Iterator[None]:
    """Whatever an example leaves behind when it fails is removed, so examples stay
    independent (a passing example removes it itself, and checks that it did)."""
    try:
        yield
    finally:
        with db.connect() as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            conn.execute("DROP TABLE IF EXISTS public.alembic_version")
            # The default role, and the one an older pgstore would have made.
            for name in {role, _default_role(db, schema), f"{schema}_client"} - {None}:
                assert name is not None
                if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is not None:
                    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _assert_store_in(db: Db, schema: str, role: str | None) -> None:
    """The store is at head in exactly ``schema``; ``role`` (if any) may execute its API."""
    assert current_revision(db.dsn, schema) == pgstore.HEAD_REVISION
    with db.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE p.prosecdef),"
            "       bool_and(p.proconfig = ARRAY['search_path=' || quote_ident(%s) || ', pg_temp'])"
            "         FILTER (WHERE p.prosecdef)"
            "  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = %s",
            (schema, schema),
        ).fetchone()
        assert row is not None and row[0] >= 18 and row[1] is True, row
        assert conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename = 'jobs'", (schema,)
        ).fetchone() == (1,)
        if role is not None:
            granted = conn.execute(
                "SELECT bool_and(has_function_privilege(%s, p.oid, 'EXECUTE')),"
                "       has_schema_privilege(%s, %s, 'USAGE')"
                "  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = %s AND p.prosecdef"
                " AND p.proname <> ALL(%s)",  # job_purge: the owner's alone
                (role, role, schema, schema, [f.name for f in OWNER_FUNCTIONS]),
            ).fetchone()
            assert granted == (True, True)


def _expected_after(before: dict[str, Any], schema: str, role: str | None) -> dict[str, Any]:
    after = dict(before)
    after["schemas"] = sorted([*before["schemas"], schema])
    if role is not None and role not in {r[0] for r in before["roles"]}:
        after["roles"] = sorted([*before["roles"], (role, False, False, False, False)])
    return after


def _call_every_store_method(store: Any) -> None:
    """Each call of a schedule or job store (sync or asyncio) once, on a fresh schema;
    the store is closed after, pass or fail."""

    async def call(value: Any) -> Any:
        return await value if inspect.iscoroutine(value) else value

    async def schedules() -> None:
        await call(store.start())
        assert await call(store.now_ms()) > 0
        await call(store.register("t", "interval", "1000", 0, 0))
        claim = await call(store.claim_due("t", "w", 10, 60_000))
        assert claim is not None  # token 1, or above a fence an earlier delete left
        token = claim.fencing_token
        assert await call(store.renew("t", token, 90_000)) is True
        assert await call(store.complete("t", token, CompletePatch(2_000, 10, "ok"), 20))
        assert (await call(store.get("t"))).last_status == "ok"
        assert len(await call(store.list())) == 1
        assert len(await call(store.claim_next("w", 3_000, 1_000, 5, None))) == 1
        await call(store.delete("t"))

    async def jobs() -> None:
        await call(store.start())
        # A run id of its own: the dispatched job stays (remove refuses history), and
        # the sync and asyncio stores of one example share the schema.
        r = f"r-{uuid.uuid4().hex}"
        await call(store.schedule(r, 0))
        job = await call(store.lease("h", 10, 60_000))
        assert job is not None and job.run_id == r
        assert await call(store.renew(r, "h", 20, 60_000)) is True
        await call(store.mark_dispatched(r, "h", "w"))
        await call(store.release(r, "h", 50))
        assert (await call(store.get(r))).dispatched
        assert r in [j.run_id for j in await call(store.list_dispatched())]
        await call(store.cancel(r))
        await call(store.schedule("gone", 10**15))
        await call(store.remove("gone"))
        assert await call(store.now_ms()) > 0

    async def main() -> None:
        try:
            is_schedules = isinstance(store, (PgScheduleStore, AsyncPgScheduleStore))
            await (schedules() if is_schedules else jobs())
        finally:
            await call(store.close())

    asyncio.run(main())


# --- the exploits of the review, and the two names that broke calls -------------------


@pytest.mark.parametrize("template", NEWLINE_EXPLOITS)
def test_a_newline_in_a_name_runs_nothing(db: Db, template: str) -> None:
    before = db.snapshot()
    name = template.format(app=db.app)
    attempts: list[Callable[[], object]] = [
        lambda: migrate(db.dsn, schema=name),
        lambda: migrate(db.dsn, schema="nl_ok", client_role=name),
    ]
    for attempt in attempts:
        with pytest.raises(InvalidArgument, match="control character"):
            attempt()
    assert db.snapshot() == before
    assert current_revision(db.dsn, "nl_ok") is None


def test_the_composed_grants_hold_without_the_control_character_check(db: Db) -> None:
    """The root fix: every grant is one statement with quoted identifiers, so even names
    that ``check_name`` would refuse (newlines) cannot end a comment and run SQL."""
    from pgstore.schema import client_role as _client_role
    from pgstore.schema import objects as _schema
    from pgstore.schema.files import current_schema_sql

    schema = f"g\n; DROP TABLE public.victim; -- /* $$ '{uuid.uuid4().hex[:6]}"
    role = f"r\nALTER ROLE {db.app} SUPERUSER;--\"{uuid.uuid4().hex[:6]}"
    before = db.snapshot()
    with db.connect() as conn:
        try:
            with conn.transaction():
                _schema.load(conn, schema, current_schema_sql())
                conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
                statements = _client_role.grant_statements(
                    schema, role, CLIENT_FUNCTIONS
                )
                assert len(statements) == 1 + len(CLIENT_FUNCTIONS)
                for statement in statements:
                    conn.execute(statement)
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE has_function_privilege(%s, p.oid, 'EXECUTE'))"
                    "  FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM pg_namespace"
                    "                                          WHERE nspname = %s)",
                    (role, schema),
                ).fetchone()
                assert row == (len(CLIENT_FUNCTIONS),)
                assert conn.execute(
                    "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (db.app,)
                ).fetchone() == (False,)
                raise _Rollback
        except _Rollback:
            pass
    assert db.snapshot() == before


class _Rollback(Exception):
    pass


@pytest.mark.parametrize("schema", ["pct%store", "pct%s", "colon :b", "a:b%%c"])
def test_percent_and_colon_in_a_schema_name_migrate_and_call(db: Db, schema: str) -> None:
    role = f"r_{uuid.uuid4().hex[:8]}"
    before = db.snapshot()
    with _cleaned(db, schema, role):
        migrate(db.dsn, schema, client_role=role)
        _assert_store_in(db, schema, role)
        for store in (PgScheduleStore(db.dsn, schema=schema), PgJobStore(db.dsn, schema=schema)):
            _call_every_store_method(store)
        assert cli_main(["status", "--dsn", db.dsn, "--schema", schema]) == 0
        assert cli_main(["jobs", "--dsn", db.dsn, "--schema", schema, "--due"]) == 0
        downgrade(db.dsn, schema, client_role=role)
        assert db.snapshot() == before


# --- control characters are refused everywhere ----------------------------------------


@given(name=control_names)
@EXAMPLES
def test_control_characters_are_refused_everywhere(db: Db, name: str) -> None:
    before = db.snapshot()
    attempts: list[Any] = [
        lambda: migrate(db.dsn, name),
        lambda: migrate(db.dsn, "ctl_ok", client_role=name),
        lambda: downgrade(db.dsn, name),
        lambda: current_revision(db.dsn, name),
        lambda: PgScheduleStore(db.dsn, schema=name),
        lambda: PgJobStore(db.dsn, schema=name, auto_migrate=True),
        lambda: AsyncPgScheduleStore(db.dsn, schema=name),
        lambda: AsyncPgJobStore(db.dsn, schema=name),
        lambda: install_schema(db.dsn, name),
    ]
    for attempt in attempts:
        with pytest.raises(InvalidArgument, match="control character"):
            attempt()
    for argv in (["migrate", f"--schema={name}"], ["migrate", f"--client-role={name}"],
                 ["current", f"--schema={name}"], ["status", f"--schema={name}"]):
        assert cli_main([argv[0], "--dsn", db.dsn, *argv[1:]]) == 1
    cfg = _alembic_ini(db)
    for x in (f"schema={name}", f"client_role={name}"):
        with pytest.raises(InvalidArgument, match="control character"):
            command.upgrade(_with_x(cfg, [x, f"dsn={db.dsn}"]), "head")
    assert db.snapshot() == before
    assert current_revision(db.dsn, "ctl_ok") is None


# --- hostile names, fuzzed per entry point -----------------------------------------------


@given(schema=hostile_names, role=hostile_names)
@EXAMPLES
def test_python_api(db: Db, schema: str, role: str) -> None:
    before = db.snapshot()
    with _cleaned(db, schema, role):
        migrate(db.dsn, schema, client_role=role)
        _assert_store_in(db, schema, role)
        assert db.snapshot() == _expected_after(before, schema, role)
        for store in (
            PgScheduleStore(db.dsn, schema=schema),
            PgJobStore(db.dsn, schema=schema),
            AsyncPgScheduleStore(db.dsn, schema=schema),
            AsyncPgJobStore(db.dsn, schema=schema),
        ):
            _call_every_store_method(store)
        downgrade(db.dsn, schema, client_role=role)
        assert current_revision(db.dsn, schema) is None
        assert db.snapshot() == before


@given(schema=short_schemas)
@EXAMPLES
def test_auto_migrate_with_the_default_role(db: Db, schema: str) -> None:
    before = db.snapshot()
    with _cleaned(db, schema):
        role = _default_role(db, schema)
        with PgJobStore(db.dsn, schema=schema, auto_migrate=True) as store:
            store.schedule("r", 0)
            assert store.get("r") is not None
        _assert_store_in(db, schema, role)
        assert db.snapshot() == _expected_after(before, schema, role)
        downgrade(db.dsn, schema)  # finds and drops the default role
        assert db.snapshot() == before


#: argparse drops an argument that is exactly "--", even as an option's value.
cli_names = hostile_names.filter(lambda name: name != "--")


@given(schema=cli_names, role=cli_names)
@EXAMPLES
def test_cli(db: Db, schema: str, role: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = db.snapshot()
    with _cleaned(db, schema, role):
        # NAME=... : argparse would read a name starting with "-" as an option.
        common = ["--dsn", db.dsn, f"--schema={schema}"]
        assert cli_main(["migrate", *common, f"--client-role={role}"]) == 0
        _assert_store_in(db, schema, role)
        assert db.snapshot() == _expected_after(before, schema, role)
        capsys.readouterr()
        assert cli_main(["current", *common]) == 0
        assert capsys.readouterr().out.strip() == pgstore.HEAD_REVISION
        for command_name in ("status", "schedules", "jobs"):
            assert cli_main([command_name, *common]) == 0, capsys.readouterr().err
        assert cli_main(["downgrade", *common, f"--client-role={role}", "--yes"]) == 0
        assert db.snapshot() == before


def _alembic_ini(db: Db) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(pgstore.schema.files.migrations_dir()))
    return cfg


def _with_x(cfg: Config, x: list[str]) -> Config:
    cfg.cmd_opts = type("Opts", (), {"x": x})()
    return cfg


@given(schema=hostile_names, role=hostile_names)
@settings(EXAMPLES, max_examples=12)
def test_alembic_command_line(
    db: Db, schema: str, role: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ini = tmp_path_factory.mktemp("alembic") / "alembic.ini"
    ini.write_text(f"[alembic]\nscript_location = {pgstore.schema.files.migrations_dir()}\n")
    before = db.snapshot()
    with _cleaned(db, schema, role):
        x = ["-x", f"schema={schema}", "-x", f"client_role={role}", "-x", f"dsn={db.dsn}"]
        alembic_main(["-c", str(ini), *x, "upgrade", "head"])
        _assert_store_in(db, schema, role)
        assert db.snapshot() == _expected_after(before, schema, role)
        alembic_main(["-c", str(ini), *x, "downgrade", "base"])
        assert db.snapshot() == before


@given(schema=short_schemas)
@settings(EXAMPLES, max_examples=12)
def test_host_app_alembic_env(db: Db, schema: str) -> None:
    before = db.snapshot()
    with _cleaned(db, schema):
        cfg = Config(str(HOST_APP / "alembic.ini"))
        cfg.set_main_option("script_location", str(HOST_APP))
        cfg.set_main_option("version_locations", f"{HOST_APP / 'versions'} {pgstore.versions_dir()}")
        cfg.attributes["host_conninfo"] = db.dsn
        _with_x(cfg, [f"schema={schema}"])
        command.upgrade(cfg, "heads")
        with db.connect() as conn:
            versions = {r[0] for r in conn.execute("SELECT version_num FROM public.alembic_version")}
        assert versions == {"host_0001", pgstore.HEAD_REVISION}
        role = _default_role(db, schema)
        with db.connect() as conn:
            assert conn.execute(
                "SELECT has_schema_privilege(%s, %s, 'USAGE')", (role, schema)
            ).fetchone() == (True,)
        command.downgrade(cfg, "base")
        with db.connect() as conn:
            conn.execute("DROP TABLE public.alembic_version")
        assert db.snapshot() == before


@given(schema=hostile_names)
@settings(EXAMPLES, max_examples=6)
def test_scheduler_and_dispatcher_with_listen(db: Db, schema: str) -> None:
    before = db.snapshot()
    install_schema(db.dsn, schema)
    schedules = PgScheduleStore(db.dsn, schema=schema)
    jobs = PgJobStore(db.dsn, schema=schema)
    producer = PgJobStore(db.dsn, schema=schema)
    try:
        ran = threading.Event()
        clock = FakeClock(0)
        scheduler = Scheduler(schedules, owner="s1", lease_ms=5_000, clock=clock)
        scheduler.every("t", 1_000, lambda ctx: ran.set())

        async def one_run() -> None:
            await scheduler.start()
            clock.set(1_000)
            assert await scheduler.tick() == 1
            await scheduler.wait_idle()

        asyncio.run(one_run())
        assert ran.is_set()

        got = threading.Event()
        dispatcher = Dispatcher(jobs, lambda job: got.set(), holder="d1", poll_interval=30.0)
        producer.start()
        latency = wake_up_latency(dispatcher, producer, got)  # LISTEN on job_channel()
        assert got.is_set() and latency < 9.0  # woken by NOTIFY, not the 30 s poll
    finally:
        for store in (schedules, jobs, producer):
            store.close()
        with db.connect() as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    assert db.snapshot() == before


@pytest.mark.parametrize("schema", ['a:b %c :d"q', "x%s :y", "--/*$$'", "é :b%(x)s"])
def test_offline_sql_for_a_hostile_schema_runs_as_written(db: Db, schema: str) -> None:
    """``alembic upgrade --sql``: the script names exactly that schema, keeps the
    function bodies' ``%`` as they are, and builds the store when run."""
    out = io.StringIO()
    cfg = Config(output_buffer=out)
    cfg.set_main_option("script_location", str(pgstore.schema.files.migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", "postgresql+psycopg://")
    _with_x(cfg, [f"schema={schema}", "client_role=off"])
    command.upgrade(cfg, "head", sql=True)
    script = out.getvalue()
    assert "format('%s must be a positive integer'" in script
    before = db.snapshot()
    with _cleaned(db, schema):
        with db.connect() as conn:
            conn.execute(script.encode())
        assert current_revision(db.dsn, schema) == pgstore.HEAD_REVISION
        _assert_store_in(db, schema, None)
        downgrade(db.dsn, schema, client_role=False)
        assert db.snapshot() == before
