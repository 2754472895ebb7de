"""Least privilege, tested as real login roles.

The migration revokes EXECUTE from PUBLIC, makes the functions SECURITY
DEFINER with a pinned search_path, and grants a NOLOGIN ``<schema>_client_<database>``
role USAGE on the schema and EXECUTE on the API functions, nothing else.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgstore.cli.commands import main as cli_main
from pgstore.postgres.grants import CLIENT_FUNCTIONS, MONITOR_FUNCTIONS
from pgstore.schema.migrations import downgrade, migrate
from tests.support.catalog import HELPER_CONFIG, INLINED_HELPERS

SCHEMA = "shop"


def client(dsn: str) -> str:
    """The default client role of SCHEMA in the database at ``dsn``."""
    return f"{SCHEMA}_client_{conninfo_to_dict(dsn)['dbname']}"


#: Every API function with arguments that succeed on an empty store.
API_CALLS = [
    "schema_revision()",
    "now_ms()",
    "job_channel()",
    "schedule_get('t')",
    "schedule_register('t', 'interval', '1000', 0, 0)",
    "schedule_claim_due('t', 'w', 10, 1000)",
    "schedule_renew('t', 1, 5000)",
    "schedule_complete('t', 1, 2000, 10, 'ok', 20)",
    "schedule_list()",
    "schedule_claim_next('w', 3000, 1000, 5, NULL)",
    "schedule_register('p', 'cron', '0 * * * *', 0, 0, 'once', 600000)",
    "schedule_pause('p')",
    "schedule_resume('p')",
    "schedule_trigger('p')",
    "schedule_delete('t')",
    "job_schedule('r', 0)",
    "job_lease('h', 10, 1000)",
    "job_renew('r', 'h', 20, 1000)",
    "job_mark_dispatched('r', 'h', 'w')",
    "job_release('r', 'h', 50)",
    "job_schedule('r', 0, 3)",
    "job_lease('h', 60, 1000)",
    "job_release('r', 'h', 50, NULL, 'boom')",
    "job_retry('r', NULL)",
    "job_cancel('r')",
    "job_get('r')",
    "job_list_dispatched()",
    "store_stats(NULL)",
    "job_list('all', NULL, 10)",
    "job_list('failed', NULL, 10)",
    "job_schedule_many(ARRAY['m'], ARRAY[0])",
    "job_lease_many('h', 10, 1000, 5)",
    "job_renew_many(ARRAY['m'], 'h', 20, 1000)",
    "job_mark_dispatched_many(ARRAY['m'], 'h', ARRAY['w'])",
    "job_schedule('x', 0)",
    "job_remove('x')",
    "job_schedule('q', 0, NULL, 'provider', 5, '{\"seat\": 3}')",
    "queue_set_concurrency('provider', 2)",
    "queue_set_rate('provider', 5, 1000)",
    "job_lease_many('h', 10, 1000, 5, ARRAY['provider'])",
    "job_renew_many(ARRAY['q'], 'h', 20, 1000)",
    "queue_pause('provider')",
    "queue_list(NULL)",
    "queue_resume('provider')",
]
TABLES = ["schedules", "schedule_fences", "jobs", "store_settings", "job_fences", "store_epoch",
          "job_history", "queues", "queue_slots"]
#: The helpers the API functions call: internal, granted to no one.
HELPER_CALLS = ["check_name('id', 'x')", "check_length('spec', 'x')", "check_now(0)"]
TABLE_WRITES = [
    "SELECT * FROM {t}",
    "INSERT INTO {t} DEFAULT VALUES",
    "UPDATE {t} SET {c} = {c}",
    "DELETE FROM {t}",
    "TRUNCATE {t}",
]
FIRST_COLUMN = {
    "schedules": "id", "schedule_fences": "id", "jobs": "run_id",
    "store_settings": "max_clock_skew_ms", "job_fences": "lease_sequence",
    "store_epoch": "epoch",
    "job_history": "upto",
    "queues": "queue",
    "queue_slots": "queue",
}


class Roles:
    """Login roles made for one test, dropped afterwards."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.made: list[str] = []

    def login(self, *member_of: str) -> str:
        role = f"pgstore_t_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            for group in member_of:
                admin.execute(
                    sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(role))
                )
        self.made.append(role)
        return role

    def connect(self, role: str) -> psycopg.Connection[Any]:
        return psycopg.connect(make_conninfo(self.dsn, user=role), autocommit=True)

    def drop_all(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as admin:
            for role in self.made:
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def shop(pgstore_fresh_database: Callable[[], str]) -> Iterator[tuple[str, Roles]]:
    dsn = pgstore_fresh_database()
    migrate(dsn, SCHEMA)
    roles = Roles(dsn)
    try:
        yield dsn, roles
    finally:
        roles.drop_all()


def _state(dsn: str) -> list[Any]:
    """The store's rows. Not job_history: store_stats() moves that bookkeeping forward
    (job_history_advance) and must, whoever reads the gauges."""
    with psycopg.connect(dsn) as conn:
        return [
            conn.execute(sql.SQL("SELECT * FROM {}.{} ORDER BY 1").format(
                sql.Identifier(SCHEMA), sql.Identifier(t))).fetchall()
            for t in TABLES if t != "job_history"
        ]


def test_the_migration_creates_a_nologin_client_role(shop: tuple[str, Roles]) -> None:
    dsn, _ = shop
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb FROM pg_roles"
            " WHERE rolname = %s", (client(dsn),)
        ).fetchone()
        assert row == (False, False, False, False)
        definers = conn.execute(
            "SELECT proname, prosecdef, proconfig FROM pg_proc"
            " WHERE pronamespace = %s::regnamespace ORDER BY 1", (SCHEMA,)
        ).fetchall()
    # The helpers the API functions inline run as their caller, on the caller's pinned
    # path: a SET clause or SECURITY DEFINER would stop the planner inlining them.
    for name, secdef, config in definers:
        helper = name in INLINED_HELPERS
        assert secdef is (not helper), name
        pinned = [f"search_path={SCHEMA}, pg_temp"]
        assert config == (HELPER_CONFIG.get(name) if helper else pinned), name


def test_a_role_without_the_grant_is_refused_everywhere(shop: tuple[str, Roles]) -> None:
    dsn, roles = shop
    stranger = roles.login()
    with psycopg.connect(dsn, autocommit=True) as admin:
        # Even with USAGE on the schema, EXECUTE is not PUBLIC's.
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(SCHEMA), sql.Identifier(stranger)))
    before = _state(dsn)
    with roles.connect(stranger) as conn:
        for call in [*API_CALLS, *HELPER_CALLS]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {SCHEMA}.{call}")
        for table in TABLES:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("SELECT * FROM {}.{}").format(
                    sql.Identifier(SCHEMA), sql.Identifier(table)))
    assert _state(dsn) == before


def test_a_client_calls_every_function_but_touches_no_table(shop: tuple[str, Roles]) -> None:
    dsn, roles = shop
    app = roles.login(client(dsn))
    with roles.connect(app) as conn:
        answers = {call: conn.execute(f"SELECT * FROM {SCHEMA}.{call}").fetchall()
                   for call in API_CALLS}
        assert answers["schedule_claim_due('t', 'w', 10, 1000)"][0][6] == 1  # the token
        assert answers["schedule_complete('t', 1, 2000, 10, 'ok', 20)"] == [(True,)]
        assert answers["job_mark_dispatched('r', 'h', 'w')"] == [(False, True)]
        for call in HELPER_CALLS:  # helpers are not granted
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT {SCHEMA}.{call}")
        before = _state(dsn)
        for table in TABLES:
            for template in TABLE_WRITES:
                statement = template.format(
                    t=f"{SCHEMA}.{table}", c=FIRST_COLUMN[table]
                )
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
    assert _state(dsn) == before


def test_look_alike_objects_on_the_callers_search_path_change_nothing(
    shop: tuple[str, Roles],
) -> None:
    dsn, roles = shop
    app = roles.login(client(dsn))
    with psycopg.connect(dsn, autocommit=True) as admin:
        dbname = admin.info.dbname
        admin.execute(sql.SQL("GRANT CREATE, TEMPORARY ON DATABASE {} TO {}").format(
            sql.Identifier(dbname), sql.Identifier(app)))
    with roles.connect(app) as conn:
        conn.execute("CREATE SCHEMA evil")
        conn.execute("CREATE TABLE evil.schedules (LIKE pg_catalog.pg_class)")
        conn.execute("CREATE TABLE evil.jobs (run_id text, dispatch_at bigint)")
        conn.execute("CREATE TABLE evil.schedule_fences (id text, fencing_token bigint)")
        for schema in ("evil", "pg_temp"):
            conn.execute(f"CREATE FUNCTION {schema}.now_ms() RETURNS bigint LANGUAGE sql"
                         " AS 'SELECT 0::bigint'")
            conn.execute(f"CREATE FUNCTION {schema}.check_name(text, text) RETURNS void"
                         " LANGUAGE sql AS 'SELECT'")
            conn.execute(f"CREATE FUNCTION {schema}.coalesce_(bigint) RETURNS bigint"
                         " LANGUAGE sql AS 'SELECT 0::bigint'")
        conn.execute("CREATE TEMP TABLE jobs (run_id text, dispatch_at bigint)")
        conn.execute("CREATE TEMP TABLE schedules (id text)")
        conn.execute(f"SET search_path = pg_temp, evil, {SCHEMA}")

        # The store's own now_ms(), not a look-alike returning 0.
        clock = conn.execute(f"SELECT {SCHEMA}.now_ms()").fetchone()
        assert clock is not None and clock[0] > 1_700_000_000_000
        # check_name is the store's: a bad id is still rejected.
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute(f"SELECT {SCHEMA}.job_schedule('', 0)")
        # Writes land in the store's tables; NULL now is the real clock.
        conn.execute(f"SELECT {SCHEMA}.job_schedule('r', 5)")
        leased = conn.execute(f"SELECT * FROM {SCHEMA}.job_lease('h', NULL, 60000)").fetchone()
        assert leased is not None and leased[3] > 1_700_000_000_000
        row = conn.execute(f"SELECT * FROM {SCHEMA}.schedule_register('t', 'once', '1', 0, NULL)").fetchone()
        assert row is not None and row[9] > 1_700_000_000_000
        assert conn.execute("SELECT count(*) FROM pg_temp.jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM evil.jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_temp.schedules").fetchone() == (0,)
    state = _state(dsn)
    assert [r[0] for r in state[0]] == ["t"] and [r[0] for r in state[2]] == ["r"]


def test_client_role_off_grants_nothing_and_downgrade_drops_the_role(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    dsn = pgstore_fresh_database()
    migrate(dsn, "bare", client_role=False)
    migrate(dsn, "named", client_role="named_callers")
    roles = Roles(dsn)
    try:
        with psycopg.connect(dsn) as conn:
            found = conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname IN (%s, 'named_callers')",
                (f"bare_client_{conninfo_to_dict(dsn)['dbname']}",),
            ).fetchall()
            assert found == [("named_callers",)]
        caller = roles.login("named_callers")
        with roles.connect(caller) as conn:
            assert conn.execute("SELECT named.schema_revision()").fetchone() is not None
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT bare.now_ms()")
        roles.drop_all()
        roles.made.clear()
        downgrade(dsn, "named", client_role="named_callers")
        with psycopg.connect(dsn) as conn:
            assert conn.execute(
                "SELECT count(*) FROM pg_roles WHERE rolname = 'named_callers'"
            ).fetchone() == (0,)
    finally:
        roles.drop_all()


def _documented_monitor_grants() -> str:
    """The monitoring role's GRANTs, as docs/privileges.md gives them."""
    text = (Path(__file__).parent.parent / "docs" / "privileges.md").read_text()
    section = text.split("## A read-only monitoring role", 1)[1]
    return section.split("```sql\n", 1)[1].split("```", 1)[0]


def test_the_documented_monitoring_role_runs_status_and_reads_no_table(
    shop: tuple[str, Roles], capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/privileges.md's monitoring role, granted as written there: ``pgstore status``,
    ``schedules`` and ``jobs`` run as it, and it reads no table and writes nothing."""
    dsn, roles = shop
    monitor = roles.login()
    grants = _documented_monitor_grants()
    assert "SELECT" not in grants
    granted = {
        (name, tuple(t.strip() for t in args.split(",") if t.strip()))
        for name, args in re.findall(r"pgstore\.(\w+)\(([^)]*)\)", grants)
    }
    assert granted == {(f.name, f.arg_types) for f in MONITOR_FUNCTIONS}
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"SELECT {SCHEMA}.job_schedule('m-due', 1)")
        admin.execute(f"SELECT {SCHEMA}.schedule_register('m', 'interval', '1000', 5, 0)")
        admin.execute(
            grants.replace("pgstore", SCHEMA).replace("monitor", f'"{monitor}"').encode()
        )
    before = _state(dsn)
    as_monitor = make_conninfo(dsn, user=monitor)
    for command in ("status", "schedules", "jobs"):
        capsys.readouterr()
        status = cli_main([command, "--dsn", as_monitor, "--schema", SCHEMA])
        out, err = capsys.readouterr()
        assert (status, err) == (0, ""), (command, err)
        assert "m-due" in out if command != "schedules" else "m " in out
    with roles.connect(monitor) as conn:
        assert conn.execute(f"SELECT jobs_due FROM {SCHEMA}.store_stats(NULL)").fetchone() == (1,)
        for table in TABLES:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("SELECT * FROM {}.{}").format(
                    sql.Identifier(SCHEMA), sql.Identifier(table)))
        for call in ("job_lease('h', 10, 1000)", "job_cancel('m-due')", "job_purge(0, 10)",
                     "schedule_delete('m')", "job_retry('m-due', NULL)",
                     "schedule_pause('m')", "schedule_resume('m')", "schedule_trigger('m')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {SCHEMA}.{call}")
    assert _state(dsn) == before


def test_the_monitoring_functions_write_nothing() -> None:
    """Every function MONITOR_FUNCTIONS names is one the client role may call, and its body
    in sql/ writes no row (no INSERT, UPDATE, DELETE, nor a row lock)."""
    from pgstore.schema.files import current_schema_sql

    script = current_schema_sql()
    for function in MONITOR_FUNCTIONS:
        assert function in CLIENT_FUNCTIONS
        found = re.search(
            rf"CREATE (?:OR REPLACE )?FUNCTION {function.name}\(.*?(\$\w*\$)(.*?)\1",
            script, re.S,
        )
        assert found is not None, function
        body = found.group(2)
        assert not re.search(r"\b(INSERT|UPDATE|DELETE|TRUNCATE|FOR SHARE)\b", body, re.I), (
            function, body)


def test_a_client_cannot_lift_the_bound_on_now(shop: tuple[str, Roles]) -> None:
    """The owner sets the bound with a plain UPDATE; a client can neither change it,
    nor shadow the table, nor reach it through a setting of its session."""
    dsn, roles = shop
    app = roles.login(client(dsn))
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("UPDATE shop.store_settings SET max_clock_skew_ms = 60000")
        admin.execute(sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(
            sql.Identifier(admin.info.dbname), sql.Identifier(app)))
    far = "now_ms() + 600000"
    with roles.connect(app) as conn:
        for statement in [
            "UPDATE shop.store_settings SET max_clock_skew_ms = NULL",
            "DELETE FROM shop.store_settings",
            "TRUNCATE shop.store_settings",
            "SELECT * FROM shop.store_settings",
            "ALTER TABLE shop.store_settings DROP CONSTRAINT store_settings_pkey",
            "DROP TABLE shop.store_settings",
        ]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        conn.execute("CREATE TEMP TABLE store_settings (singleton boolean,"
                     " max_clock_skew_ms bigint)")
        conn.execute("INSERT INTO pg_temp.store_settings VALUES (true, NULL)")
        conn.execute("SET search_path = pg_temp, shop")
        conn.execute("SET pgstore.max_clock_skew_ms = 0")  # a GUC would be the client's
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="now must be within"):
            conn.execute(f"SELECT * FROM shop.job_lease('h', {far}, 1000)")
        assert conn.execute(  # the database clock is still fine
            "SELECT count(*) FROM shop.job_lease('h', NULL, 1000)").fetchone() == (0,)
    with psycopg.connect(dsn) as admin:
        assert admin.execute("SELECT * FROM shop.store_settings").fetchall() == [
            (True, 60000, 25, None, 65536)]


def test_a_monitoring_role_reads_the_gauges_and_nothing_else(shop: tuple[str, Roles]) -> None:
    """What a DBA grants a monitoring role (USAGE on the schema, EXECUTE on store_stats and
    job_list) reads the same numbers as the command line, and nothing else."""
    dsn, roles = shop
    monitor = roles.login()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"SELECT {SCHEMA}.job_schedule('m-due', 1)")
        admin.execute(f"SELECT {SCHEMA}.schedule_register('m', 'interval', '1000', 5, 0)")
        ident = sql.Identifier(monitor)
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(SCHEMA), ident))
        for function in ("store_stats(bigint)", "job_list(text, bigint, integer, text[])"):
            admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {}.{} TO {}").format(
                sql.Identifier(SCHEMA), sql.SQL(function), ident))
    before = _state(dsn)
    with roles.connect(monitor) as conn:
        stats = conn.execute(
            f"SELECT schedules, schedules_due, jobs_due, oldest_due_job_id"
            f" FROM {SCHEMA}.store_stats(100)"
        ).fetchone()
        assert stats == (1, 1, 1, "m-due")
        listed = conn.execute(f"SELECT run_id, matching FROM {SCHEMA}.job_list('due', 100, 5)")
        assert listed.fetchall() == [("m-due", 1)]
        for call in ("job_lease('h', 10, 1000)", "schedule_list()", "job_cancel('m-due')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {SCHEMA}.{call}")
        for table in TABLES:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql.SQL("SELECT * FROM {}.{}").format(
                    sql.Identifier(SCHEMA), sql.Identifier(table)))
    assert _state(dsn) == before
