"""The client role's scope: one schema in one database.

Roles are cluster-wide, so the default name carries the database
(``<schema>_client_<database>``); an existing role is adopted only if pgstore
created it for this schema in this database, it cannot log in, and something only
the store's owner writes vouches for it (a grant of the owner's, or a downgrade's
mark), unless the caller says to adopt it. Migrations of several databases at once never race on
``CREATE ROLE``; a downgrade keeps a client role that has members, so the next
upgrade gives the app its access back.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgstore
import pgstore.schema.files
from pgstore import InvalidArgument
from pgstore.cli.commands import main as cli_main
from pgstore.postgres.grants import CLIENT_FUNCTIONS
from pgstore.schema.client_role import role_comment
from pgstore.schema.migrations import current_revision, downgrade, migrate
from pgstore.testing import install_schema
from tests.support.catalog import INLINED_HELPERS

#: Concurrent migrations per trial, and trials per case.
DATABASES = 4
TRIALS = 3


def _dbname(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


def _role_row(dsn: str, role: str) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT rolcanlogin, rolsuper, shobj_description(oid, 'pg_authid'),"
            "       EXISTS (SELECT FROM pg_shdepend d WHERE d.refobjid = r.oid AND d.dbid ="
            "               (SELECT oid FROM pg_database WHERE datname = current_database()))"
            "  FROM pg_roles r WHERE rolname = %s",
            (role,),
        ).fetchone()


def _schemas(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace")}


def _client_of(dsn: str, schema: str) -> str:
    """The role pgstore created and granted USAGE on ``schema``, found from the catalog."""
    with psycopg.connect(dsn) as conn:
        [role] = [r[0] for r in conn.execute(
            "SELECT rolname FROM pg_roles r"
            " WHERE shobj_description(oid, 'pg_authid') LIKE 'pgstore client role:%%'"
            "   AND has_schema_privilege(r.oid, %s, 'USAGE')",
            (schema,),
        )]
    return str(role)


class Roles:
    """Roles a test makes, dropped afterwards (with whatever they were granted)."""

    def __init__(self, admin_dsn: str) -> None:
        self.dsn = admin_dsn
        self.made: list[str] = []
        self.dsns: list[str] = []  # the databases they may hold privileges in

    def create(self, options: str = "LOGIN", *member_of: str) -> str:
        role = f"pgstore_t_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE ROLE {} " + options).format(sql.Identifier(role))
            )
            for group in member_of:
                admin.execute(
                    sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(role))
                )
        self.made.append(role)
        return role

    def drop_all(self) -> None:
        for dsn in self.dsns:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for role in self.made:
                    if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is not None:
                        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        with psycopg.connect(self.dsn, autocommit=True) as admin:
            for role in self.made:
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.fixture
def roles(pgstore_server: Any) -> Iterator[Roles]:
    made = Roles(pgstore_server.dsn)
    try:
        yield made
    finally:
        made.drop_all()


def test_the_client_function_list_is_the_schemas_api(pgstore_database: str) -> None:
    """One list in Python says what the client role may execute: every SECURITY DEFINER
    function of the schema, with the same identity arguments; every other function of
    the schema is a known internal helper (``now_ms``, the clock, is granted too)."""
    from pgstore.postgres.grants import CLIENT_FUNCTIONS, OWNER_FUNCTIONS

    schema = f"list_{uuid.uuid4().hex[:8]}"
    install_schema(pgstore_database, schema)
    try:
        with psycopg.connect(pgstore_database) as conn:
            rows = conn.execute(
                "SELECT proname, oidvectortypes(proargtypes), prosecdef FROM pg_proc"
                " WHERE pronamespace = %s::regnamespace",
                (schema,),
            ).fetchall()
    finally:
        with psycopg.connect(pgstore_database, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    listed = {(f.name, ", ".join(f.arg_types)) for f in CLIENT_FUNCTIONS}
    assert len(listed) == len(CLIENT_FUNCTIONS)
    present = {(name, args) for name, args, _ in rows}
    definers = {(name, args) for name, args, secdef in rows if secdef}
    assert listed <= present  # every granted function exists with those arguments
    owner_only = {(f.name, ", ".join(f.arg_types)) for f in OWNER_FUNCTIONS}
    assert owner_only <= definers and not owner_only & listed
    # Every SECURITY DEFINER function is granted, or named as the owner's alone.
    assert definers <= listed | owner_only
    assert {name for name, args in present - listed - owner_only} <= INLINED_HELPERS - {"now_ms"}
    assert ("now_ms", "") in listed


def test_one_databases_client_role_gives_nothing_in_another(
    pgstore_fresh_database: Callable[[], str], roles: Roles
) -> None:
    """Two databases using the same schema name: a login role granted app A's client
    role cannot call app B's store."""
    app_a, app_b = pgstore_fresh_database(), pgstore_fresh_database()
    roles.dsns += [app_a, app_b]
    migrate(app_a, "shop")
    migrate(app_b, "shop")
    client_a = _client_of(app_a, "shop")
    user_a = roles.create("LOGIN", client_a)
    with psycopg.connect(make_conninfo(app_a, user=user_a), autocommit=True) as conn:
        conn.execute("SELECT shop.job_schedule('r', 0)")
    with psycopg.connect(app_b, autocommit=True) as conn:
        conn.execute("SELECT shop.job_schedule('r', 0)")
    with psycopg.connect(make_conninfo(app_b, user=user_a), autocommit=True) as conn:
        for call in ("SELECT * FROM shop.job_lease('h', NULL, 60000)", "SELECT shop.job_cancel('r')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(call)
    with psycopg.connect(app_b) as conn:
        assert conn.execute(
            "SELECT lease_holder, cancelled FROM shop.jobs WHERE run_id = 'r'"
        ).fetchone() == (None, False)
    assert client_a == f"shop_client_{_dbname(app_a)}"


def test_a_login_role_is_not_adopted_unless_told(
    pgstore_fresh_database: Callable[[], str], roles: Roles, tmp_path: Any
) -> None:
    dsn = pgstore_fresh_database()
    roles.dsns.append(dsn)
    login = roles.create("LOGIN PASSWORD 'secret'")
    before = _schemas(dsn)
    with pytest.raises(InvalidArgument, match=f"{login}.*can log in.*client_role_adopt=True"):
        migrate(dsn, "adopt_py", client_role=login)
    assert cli_main(["migrate", "--dsn", dsn, "--schema", "adopt_cli", "--client-role", login]) == 1
    assert _schemas(dsn) == before  # nothing was created
    assert current_revision(dsn, "adopt_py") is None
    assert _role_row(dsn, login) == (True, False, None, False)  # untouched, granted nothing

    migrate(dsn, "adopt_py", client_role=login, client_role_adopt=True)
    assert cli_main(["migrate", "--dsn", dsn, "--schema", "adopt_cli", "--client-role", login,
                     "--adopt-client-role"]) == 0
    cfg = Config()
    cfg.set_main_option("script_location", str(pgstore.schema.files.migrations_dir()))
    cfg.cmd_opts = type("Opts", (), {"x": [
        "schema=adopt_x", f"client_role={login}", "adopt_client_role=true", f"dsn={dsn}"]})()
    command.upgrade(cfg, "head")
    with psycopg.connect(make_conninfo(dsn, user=login, password="secret"), autocommit=True) as conn:
        for schema in ("adopt_py", "adopt_cli", "adopt_x"):
            conn.execute(sql.SQL("SELECT {}.job_schedule('r', 0)").format(sql.Identifier(schema)))
    row = _role_row(dsn, login)
    assert row is not None and row[:3] == (True, False, None)  # still the DBA's role, unmarked
    downgrade(dsn, "adopt_py", client_role=login)
    assert _role_row(dsn, login) is not None  # not pgstore's: never dropped


def test_a_role_pgstore_did_not_make_for_this_schema_and_database_is_refused(
    pgstore_fresh_database: Callable[[], str], roles: Roles
) -> None:
    dsn = pgstore_fresh_database()
    roles.dsns.append(dsn)
    plain = roles.create("NOLOGIN")
    with pytest.raises(InvalidArgument, match=f"{plain}.*did not create it for schema"):
        migrate(dsn, "other_a", client_role=plain)
    migrate(dsn, "mine", client_role="mine_callers")
    roles.made.append("mine_callers")
    with pytest.raises(InvalidArgument, match=r"mine_callers.*did not create it for schema 'other_b'"):
        migrate(dsn, "other_b", client_role="mine_callers")
    assert {"other_a", "other_b"}.isdisjoint(_schemas(dsn))
    migrate(dsn, "other_b", client_role="mine_callers", client_role_adopt=True)  # shared on purpose
    migrate(dsn, "mine", client_role="mine_callers")  # at head: nothing to do
    downgrade(dsn, "mine", "pgstore_0002", client_role="mine_callers")  # kept: other_b uses it
    migrate(dsn, "mine", client_role="mine_callers")  # its own role: adopted again


def test_a_default_name_longer_than_63_bytes_asks_for_one(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    dsn = pgstore_fresh_database()
    schema = "s" * (63 - len("_client_") - len(_dbname(dsn)) + 1)
    before = _schemas(dsn)
    with pytest.raises(InvalidArgument, match="longer than 63 bytes: name one"):
        migrate(dsn, schema)
    assert _schemas(dsn) == before
    migrate(dsn, schema, client_role="long_schema_callers")
    assert current_revision(dsn, schema) == pgstore.HEAD_REVISION
    downgrade(dsn, schema, client_role="long_schema_callers")


def test_a_client_role_made_by_an_older_pgstore_is_found_for_a_downgrade(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """Older pgstore named it ``<schema>_client`` and marked it with the schema only."""
    from pgstore.schema import client_role as _client_role

    dsn = pgstore_fresh_database()
    legacy = f"old_{uuid.uuid4().hex[:6]}"
    migrate(dsn, legacy, client_role=False)
    role = f"{legacy}_client"
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("COMMENT ON ROLE {} IS {}").format(
            sql.Identifier(role), sql.Literal(_client_role.LEGACY_COMMENT.format(legacy))))
        for statement in _client_role.grant_statements(legacy, role, CLIENT_FUNCTIONS):
            conn.execute(statement)
    downgrade(dsn, legacy)
    assert _role_row(dsn, role) is None


def _migrate_at(start: float, dsn: str, schema: str, role: bool | str, adopt: bool) -> str:
    """In a worker process: wait for ``start`` (wall clock), then migrate; the outcome."""
    time.sleep(max(0.0, start - time.time()))
    try:
        if adopt:
            migrate(dsn, schema, client_role=role, client_role_adopt=True)
        else:
            migrate(dsn, schema, client_role=role)
    except InvalidArgument as exc:
        return f"refused: {exc}"
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    return "ok"


def _ready(seconds: float) -> None:
    """Unpickled in a worker, this imports the test module (and pgstore, alembic)."""
    time.sleep(seconds)


@pytest.fixture(scope="module")
def workers() -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(DATABASES, mp_context=get_context("spawn")) as pool:
        # Start every worker (and its imports) before the first trial.
        list(pool.map(_ready, [0.5] * DATABASES))
        yield pool


def test_migrations_of_several_databases_at_once(
    pgstore_fresh_database: Callable[[], str], workers: ProcessPoolExecutor
) -> None:
    dsns = [pgstore_fresh_database() for _ in range(DATABASES)]
    for trial in range(TRIALS):
        # Their own roles (the default names): all succeed.
        schema = f"race_{trial}_{uuid.uuid4().hex[:6]}"
        start = time.time() + 0.3
        outcomes = list(workers.map(_migrate_at, [start] * DATABASES, dsns,
                                    [schema] * DATABASES, [True] * DATABASES,
                                    [False] * DATABASES))
        assert outcomes == ["ok"] * DATABASES, outcomes
        for dsn in dsns:
            row = _role_row(dsn, f"{schema}_client_{_dbname(dsn)}")
            assert row is not None and row[0] is False and row[3] is True

        # One role shared on purpose: created once, adopted by the others.
        shared = f"shared_{uuid.uuid4().hex[:8]}"
        start = time.time() + 0.3
        outcomes = list(workers.map(_migrate_at, [start] * DATABASES, dsns,
                                    [schema + "_s"] * DATABASES, [shared] * DATABASES,
                                    [True] * DATABASES))
        assert outcomes == ["ok"] * DATABASES, outcomes
        for dsn in dsns:
            with psycopg.connect(dsn) as conn:
                assert conn.execute(
                    "SELECT has_function_privilege(%s, %s, 'EXECUTE')",
                    (shared, f"{schema}_s.job_lease(text, bigint, bigint, text[])"),
                ).fetchone() == (True,)

        # One name, no adoption: one database creates it, the others are told why.
        single = f"single_{uuid.uuid4().hex[:8]}"
        start = time.time() + 0.3
        outcomes = list(workers.map(_migrate_at, [start] * DATABASES, dsns,
                                    [schema + "_n"] * DATABASES, [single] * DATABASES,
                                    [False] * DATABASES))
        assert outcomes.count("ok") == 1, outcomes
        refused = [o for o in outcomes if o != "ok"]
        assert all(o.startswith(f"refused: client role {single!r} already exists") for o in refused)


def test_a_downgrade_below_0003_keeps_the_apps_access(
    pgstore_fresh_database: Callable[[], str], roles: Roles, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = pgstore_fresh_database()
    roles.dsns.append(dsn)
    migrate(dsn, "trip")
    client = _client_of(dsn, "trip")
    app = roles.create("LOGIN", client)
    as_app = make_conninfo(dsn, user=app)
    with psycopg.connect(as_app, autocommit=True) as conn:
        conn.execute("SELECT trip.job_schedule('r', 0)")

    with caplog.at_level(logging.WARNING, logger="pgstore.migrate"):
        downgrade(dsn, "trip", "pgstore_0002")
    with (
        psycopg.connect(as_app, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT trip.now_ms()")  # no USAGE on the schema at 0002
    kept = _role_row(dsn, client)

    migrate(dsn, "trip")
    with psycopg.connect(as_app, autocommit=True) as conn:  # the app's access is back
        leased = conn.execute("SELECT * FROM trip.job_lease('h', NULL, 60000)").fetchone()
        assert leased is not None and leased[0] == "r"
    assert kept is not None and kept[3] is False  # kept at 0002, with nothing granted here
    assert f"keeping client role {client!r}" in caplog.text
    with psycopg.connect(dsn) as conn:
        assert conn.execute(
            "SELECT pg_has_role(%s, %s, 'MEMBER')", (app, client)
        ).fetchone() == (True,)

    # Without members the role goes with the store.
    roles.drop_all()
    roles.made.clear()
    downgrade(dsn, "trip")
    assert _role_row(dsn, client) is None


def test_a_role_another_createrole_role_made_with_pgstores_comment_is_refused(
    pgstore_fresh_database: Callable[[], str], roles: Roles, caplog: pytest.LogCaptureFixture
) -> None:
    """A role with CREATEROLE (no superuser) makes the default client role before the first
    migration, copies pgstore's comment onto it and makes itself a member (PostgreSQL 16
    and later: the creator holds ADMIN on it). The comment is not proof: the migration
    refuses the role and changes nothing; told to adopt it, it warns about its members."""
    dsn = pgstore_fresh_database()
    roles.dsns.append(dsn)
    schema = "squat"
    client = f"{schema}_client_{_dbname(dsn)}"
    creator = roles.create("LOGIN CREATEROLE PASSWORD 'secret'")
    roles.made.append(client)
    comment = role_comment(schema, _dbname(dsn))
    as_creator = make_conninfo(dsn, user=creator, password="secret")
    with psycopg.connect(as_creator, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(client)))
        conn.execute(sql.SQL("COMMENT ON ROLE {} IS {}").format(
            sql.Identifier(client), sql.Literal(comment)))
        conn.execute(sql.SQL("GRANT {} TO {}").format(
            sql.Identifier(client), sql.Identifier(creator)))
    before = _schemas(dsn)

    with pytest.raises(InvalidArgument, match=f"{client}.*already exists.*members: {creator}"
                       ".*CREATEROLE.*client_role_adopt=True"):
        migrate(dsn, schema)
    assert cli_main(["migrate", "--dsn", dsn, "--schema", schema]) == 1
    assert _schemas(dsn) == before and current_revision(dsn, schema) is None
    assert _role_row(dsn, client) == (False, False, comment, False)  # granted nothing here

    with caplog.at_level(logging.WARNING, logger="pgstore.migrate"):
        migrate(dsn, schema, client_role_adopt=True)
    assert f"adopting existing client role {client!r}" in caplog.text and creator in caplog.text
    assert caplog.text.count("adopting existing client role") == 1  # once, not per revision
    with psycopg.connect(as_creator, autocommit=True) as conn:  # as told: its member calls
        conn.execute(sql.SQL("SELECT {}.job_schedule('r', 0)").format(sql.Identifier(schema)))
    migrate(dsn, schema)  # granted by the owner now: later migrations need no override


def test_a_role_kept_below_0003_is_adopted_back_only_by_this_store(
    pgstore_fresh_database: Callable[[], str], roles: Roles
) -> None:
    """The mark a downgrade below 0003 keeps names the role by OID in the store's
    owner-only table: the upgrade back adopts that role, not one of the same name
    made meanwhile, and uses the mark up."""
    dsn = pgstore_fresh_database()
    roles.dsns.append(dsn)
    migrate(dsn, "kept")
    client = _client_of(dsn, "kept")
    roles.made.append(client)
    app = roles.create("LOGIN", client)
    downgrade(dsn, "kept", "pgstore_0002")
    with psycopg.connect(dsn, autocommit=True) as conn:
        oid = conn.execute("SELECT oid FROM pg_roles WHERE rolname = %s", (client,)).fetchone()
        assert conn.execute("SELECT * FROM kept.downgrade_marks").fetchall() == [
            ("client_role", oid[0] if oid else None)
        ]
        assert conn.execute(
            "SELECT has_table_privilege(%s, 'kept.downgrade_marks', 'SELECT')", (app,)
        ).fetchone() == (False,)
        # The same name, made again by someone else: not the role the mark names.
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(client)))
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(client)))
        conn.execute(sql.SQL("COMMENT ON ROLE {} IS {}").format(sql.Identifier(client), sql.Literal(
            role_comment("kept", _dbname(dsn)))))
    with pytest.raises(InvalidArgument, match="nothing only the owner"):
        migrate(dsn, "kept")
    assert current_revision(dsn, "kept") == "pgstore_0002"
