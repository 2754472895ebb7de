"""Migrations: head equals sql/, schemas are independent, downgrade removes everything,
and a host app's alembic history can carry pgstore's as a branch."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

import pgstore
import pgstore.schema.files
from pgstore import PgJobStore, PgScheduleStore, SchemaNotReady
from pgstore.schema.files import current_schema_sql
from pgstore.schema.migrations import alembic_config, current_revision, downgrade, migrate
from pgstore.testing import install_schema
from tests.conftest import present
from tests.support.catalog import catalog, without_marks

HOST_APP = Path(__file__).parent / "host_app"


def _namespaces(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname !~ '^(pg_|information_schema)'"
        ).fetchall()
    return {r[0] for r in rows}


def test_head_revision_is_what_sql_describes() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    assert script.get_heads() == [pgstore.HEAD_REVISION]
    assert f"'{pgstore.HEAD_REVISION}'::text" in current_schema_sql()


def test_the_head_revision_is_named_only_by_its_module() -> None:
    """sql/ names no revision: the loader sets ``schema_revision()`` to the head."""
    for path in sorted(pgstore.schema.files.sql_dir().glob("*.sql")):
        named = re.findall(r"pgstore_\d{4}'::text", path.read_text())
        assert not named, (path.name, named)


def test_a_new_revision_module_is_the_new_head(tmp_path: Path) -> None:
    """Adding a revision is a one-place change: its module's ``revision`` line is the head."""
    from pgstore.schema.files import head_of, versions_dir

    for module in versions_dir().glob("*.py"):
        (tmp_path / module.name).write_text(module.read_text())
    assert head_of(tmp_path) == pgstore.HEAD_REVISION
    (tmp_path / "9999_next.py").write_text(
        f'revision = "pgstore_9999"\ndown_revision = "{pgstore.HEAD_REVISION}"\n'
    )
    assert head_of(tmp_path) == "pgstore_9999"
    (tmp_path / "9998_sibling.py").write_text(
        f'revision: str = "pgstore_9998"\ndown_revision = ("{pgstore.HEAD_REVISION}",)\n'
    )
    with pytest.raises(RuntimeError, match="expected one head revision"):
        head_of(tmp_path)


def test_a_fresh_load_of_sql_answers_the_head(pgstore_fresh_database: Callable[[], str]) -> None:
    dsn = pgstore_fresh_database()
    install_schema(dsn, "loaded_head")
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT loaded_head.schema_revision()").fetchone()
    assert row == (pgstore.HEAD_REVISION,)


def test_upgrade_head_equals_loading_sql(pgstore_fresh_database: Callable[[], str]) -> None:
    dsn = pgstore_fresh_database()
    migrate(dsn, "via_alembic")  # its client role: via_alembic_client_<database>
    database = conninfo_to_dict(dsn)["dbname"]
    install_schema(dsn, "via_sql", client_role=f"via_sql_client_{database}")
    with psycopg.connect(dsn) as conn:
        migrated, loaded = catalog(conn, "via_alembic"), catalog(conn, "via_sql")
    for part in loaded:
        assert migrated[part] == loaded[part], part
    assert len(loaded["functions"]) >= 10 and len(loaded["columns"]) >= 12


def test_two_schemas_are_independent(pgstore_fresh_database: Callable[[], str]) -> None:
    dsn = pgstore_fresh_database()
    migrate(dsn, "app_one")
    migrate(dsn, "app_two")
    one = PgScheduleStore(dsn, schema="app_one")
    two = PgScheduleStore(dsn, schema="app_two")
    with one, two:
        one.register("t", "interval", "1000", 0, 0)
        claim = one.claim_due("t", "w", 10, 1000)
        assert claim is not None and claim.fencing_token == 1
        assert two.get("t") is None and two.list() == []
        two.register("t", "once", "5", 0, 0)
        assert present(two.claim_due("t", "w", 10, 1000)).fencing_token == 1
        one.delete("t")
        assert two.get("t") is not None
    downgrade(dsn, "app_one")
    assert "app_one" not in _namespaces(dsn)
    assert current_revision(dsn, "app_two") == pgstore.HEAD_REVISION


def test_upgrade_downgrade_upgrade(pgstore_fresh_database: Callable[[], str]) -> None:
    dsn = pgstore_fresh_database()
    before = _namespaces(dsn)
    migrate(dsn, "cycle")
    assert current_revision(dsn, "cycle") == pgstore.HEAD_REVISION
    migrate(dsn, "cycle")  # at head already: nothing to do
    downgrade(dsn, "cycle")
    assert _namespaces(dsn) == before
    assert current_revision(dsn, "cycle") is None
    migrate(dsn, "cycle")
    with PgScheduleStore(dsn, schema="cycle") as store:
        assert store.register("t", "interval", "1", 0, 0).fencing_token == 0


def test_a_downgrade_to_base_keeps_a_schema_the_migration_did_not_create(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """A store put into ``public`` (empty otherwise), or into a schema the DBA made, goes
    at ``base`` and leaves the schema, empty, with its comment; a schema the migration
    made is dropped with the store."""
    dsn = pgstore_fresh_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA mine")
        conn.execute("COMMENT ON SCHEMA mine IS 'the app''s own'")
    for schema in ("public", "mine", "made"):
        migrate(dsn, schema, client_role=False)
        assert current_revision(dsn, schema) == pgstore.HEAD_REVISION
        downgrade(dsn, schema, client_role=False)
        assert current_revision(dsn, schema) is None
    names = _namespaces(dsn)
    assert {"public", "mine"} <= names and "made" not in names
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT obj_description('mine'::regnamespace, 'pg_namespace')"
        ).fetchone() == ("the app's own",)
        assert conn.execute(
            "SELECT count(*) FROM pg_class"
            " WHERE relnamespace IN ('mine'::regnamespace, 'public'::regnamespace)"
        ).fetchone() == (0,)


def test_upgrade_from_0001_keeps_schedules_and_downgrade_back_to_it(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig_upgraded", "pgstore_0001")
    migrate(dsn, "mig_reference", "pgstore_0001")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT * FROM mig_upgraded.schedule_register('t', 'interval', '1000', 0, 0)")
        conn.execute("SELECT * FROM mig_upgraded.schedule_claim_due('t', 'w', 10, 60000)")
        conn.execute("SELECT mig_upgraded.schedule_delete('t')")
        conn.execute("SELECT * FROM mig_upgraded.schedule_register('t', 'interval', '1000', 0, 0)")
        conn.execute("SELECT * FROM mig_upgraded.schedule_claim_due('t', 'w', 10, 60000)")
        before = conn.execute("SELECT * FROM mig_upgraded.schedules").fetchall()
        assert before[0][6] == 2  # the fencing token, lifted across the delete
    store = PgScheduleStore(dsn, schema="mig_upgraded")
    with pytest.raises(SchemaNotReady, match="is at revision pgstore_0001"):
        store.start()
    store.close()

    migrate(dsn, "mig_upgraded")
    assert current_revision(dsn, "mig_upgraded") == pgstore.HEAD_REVISION
    with PgScheduleStore(dsn, schema="mig_upgraded") as schedules, PgJobStore(dsn, schema="mig_upgraded") as jobs:
        record = schedules.get("t")
        assert record is not None and record.fencing_token == 2 and record.lease_owner == "w"
        jobs.schedule("r", 0)
        assert jobs.lease("h", 10, 1000) is not None

    downgrade(dsn, "mig_upgraded", "pgstore_0001")
    with psycopg.connect(dsn) as conn:
        # The jobs are gone, and the mark of their lease sequences with them.
        assert catalog(conn, "mig_upgraded") == catalog(conn, "mig_reference")
        assert conn.execute("SELECT mig_upgraded.schema_revision()").fetchone() == ("pgstore_0001",)
        assert conn.execute("SELECT * FROM mig_upgraded.schedules").fetchall() == before
        assert conn.execute("SELECT to_regclass('mig_upgraded.jobs')").fetchone() == (None,)


def test_upgrade_from_0005_keeps_data_and_downgrade_back_to_it(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0006 adds store_settings (off), the spec limit and the bound on now; rows
    stored before it, a spec past the new limit among them, are kept both ways."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig6_upgraded", "pgstore_0005")
    migrate(dsn, "mig6_reference", "pgstore_0005")
    long_spec = "1" * 2000  # fine at 0005
    tables = ("schedules", "schedule_fences", "jobs")

    def rows(conn: psycopg.Connection[Any]) -> list[Any]:
        return [conn.execute(f"SELECT * FROM mig6_upgraded.{t} ORDER BY 1").fetchall()
                for t in tables]

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig6_upgraded")
        conn.execute("SELECT schedule_register('t', 'interval', '1000', 0, 0)")
        conn.execute("SELECT schedule_claim_due('t', 'w', 10, 60000)")
        conn.execute("SELECT schedule_register('gone', 'once', '1', 0, 0)")
        conn.execute("SELECT schedule_claim_due('gone', 'w', 10, 5)")
        conn.execute("SELECT schedule_delete('gone')")
        conn.execute("SELECT schedule_register('long', 'interval', %s, 0, 0)", (long_spec,))
        conn.execute("SELECT job_schedule('r', 0)")
        conn.execute("SELECT job_lease('h', 10, 60000)")
        before = rows(conn)

    migrate(dsn, "mig6_upgraded", "pgstore_0006")
    assert current_revision(dsn, "mig6_upgraded") == "pgstore_0006"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig6_upgraded")
        assert rows(conn) == before
        assert conn.execute("SELECT * FROM store_settings").fetchall() == [(True, None)]
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="spec"):
            conn.execute("SELECT schedule_register('long', 'interval', %s, 0, 0)", (long_spec,))
        assert conn.execute("SELECT schedule_claim_due('t', 'w2', 1000000000000000, 1)").fetchall() != []
        conn.execute("UPDATE store_settings SET max_clock_skew_ms = 60000")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="now must be within"):
            conn.execute("SELECT job_renew('r', 'h', 1000000000000000, 1000)")
        before = rows(conn)

    downgrade(dsn, "mig6_upgraded", "pgstore_0005")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "mig6_upgraded") == catalog(conn, "mig6_reference")
        assert conn.execute("SELECT mig6_upgraded.schema_revision()").fetchone() == ("pgstore_0005",)
        assert rows(conn) == before
        conn.execute("SET search_path = mig6_upgraded")
        conn.execute("SELECT schedule_register('longer', 'interval', %s, 0, 0)", (long_spec * 2,))
        assert conn.execute("SELECT job_renew('r', 'h', 1000000000000000, 1000)").fetchone() == (False,)


def test_upgrade_from_0006_keeps_jobs_and_serves_old_and_new_callers(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0007 adds jobs.lease_sequence (0 for stored jobs), the token floor and the
    standby check, and a lease-sequence fence on three job functions whose
    signature changes. Rows are kept both ways; the client role may call the
    old forms (no fence) and the new ones after the upgrade, and the old ones
    after the downgrade."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig7_upgraded", "pgstore_0006")
    migrate(dsn, "mig7_reference", "pgstore_0006")
    client = f"mig7_upgraded_client_{conninfo_to_dict(dsn)['dbname']}"
    tables = ("schedules", "schedule_fences", "jobs")

    def rows(conn: psycopg.Connection[Any]) -> list[Any]:
        return [conn.execute(f"SELECT * FROM mig7_upgraded.{t} ORDER BY 1").fetchall()
                for t in tables]

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig7_upgraded")
        conn.execute("SELECT schedule_register('t', 'interval', '1000', 0, 0)")
        conn.execute("SELECT schedule_claim_due('t', 'w', 10, 60000)")
        for run_id in ("held", "sent", "waiting"):
            conn.execute("SELECT job_schedule(%s, 0)", (run_id,))
        conn.execute("SELECT job_lease('h', 10, 60000)")  # held
        conn.execute("SELECT job_lease('h', 10, 60000)")  # sent
        conn.execute("SELECT job_mark_dispatched('sent', 'h', 'bot')")
        before = rows(conn)

    migrate(dsn, "mig7_upgraded", "pgstore_0007")
    assert current_revision(dsn, "mig7_upgraded") == "pgstore_0007"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig7_upgraded")
        schedules, fences, jobs = rows(conn)
        assert [schedules, fences] == before[:2]
        assert jobs == [(*row, 0) for row in before[2]]  # the new column, last, 0
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        # Old callers: no fence, the same answers as before.
        assert conn.execute("SELECT job_renew('held', 'h', 20, 60000)").fetchone() == (True,)
        assert conn.execute("SELECT * FROM job_mark_dispatched('held', 'x', NULL)").fetchone() == (False, False)
        assert conn.execute("SELECT job_release('held', 'h', 0)").fetchone() == (True,)
        # New callers: the next lease is 1 (the stored 0 + 1), and it fences.
        leased = conn.execute("SELECT run_id, lease_sequence FROM job_lease('h', 30, 60000)").fetchall()
        assert leased == [("held", 1)]
        assert conn.execute("SELECT job_renew('held', 'h', 40, 60000, 2)").fetchone() == (False,)
        assert conn.execute("SELECT * FROM job_mark_dispatched('held', 'h', 'bot', 1)").fetchone() == (False, True)
        assert conn.execute("SELECT job_release('waiting', 'h', 0, 1)").fetchone() == (False,)
        claim = conn.execute("SELECT fencing_token FROM schedule_claim_due('t', 'w', 10000000, 1)").fetchone()
        assert claim == (2,)  # timeline 1: the floor is 0, tokens count on as before
        conn.execute("RESET ROLE")
        before = rows(conn)

    downgrade(dsn, "mig7_upgraded", "pgstore_0006")
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The one thing kept for the upgrade back: the highest lease sequence (1).
        assert conn.execute(
            "SELECT * FROM mig7_upgraded.downgrade_marks").fetchall() == [("jobs.lease_sequence", 1)]
        downgraded = catalog(conn, "mig7_upgraded")
        assert downgraded != catalog(conn, "mig7_reference")
        assert without_marks(downgraded) == catalog(conn, "mig7_reference")
        assert conn.execute("SELECT mig7_upgraded.schema_revision()").fetchone() == ("pgstore_0006",)
        schedules, fences, jobs = rows(conn)
        assert [schedules, fences] == before[:2] and jobs == [row[:-1] for row in before[2]]
        conn.execute("SET search_path = mig7_upgraded")
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        assert conn.execute("SELECT job_release('waiting', 'h', 0)").fetchone() == (False,)
        assert conn.execute("SELECT * FROM job_mark_dispatched('sent', 'h', 'bot')").fetchone() == (False, True)


def _lease_three_times(dsn: str, schema: str) -> None:
    with PgJobStore(dsn, schema=schema) as jobs:
        jobs.schedule("thrice", 0)
        jobs.schedule("never", 4_102_444_800_000)
        for expected in (1, 2, 3):
            lease = jobs.lease("w", None, 60_000)
            assert lease is not None and lease.lease_sequence == expected
            assert jobs.release("thrice", "w", 0, lease_sequence=expected)


@pytest.mark.parametrize("target", ["pgstore_0006", "pgstore_0002"])
def test_a_round_trip_below_0007_never_hands_out_a_lower_lease_sequence(
    pgstore_fresh_database: Callable[[], str], target: str
) -> None:
    """Down below the revision that added jobs.lease_sequence (to 0006, or as far as the
    jobs table's own, 0002) and back up: the next lease of a job that had reached 3 is above 3 (a worker
    holding lease 1, 2 or 3 from before is still fenced off), the mark is owner-only
    while kept, and it is gone once used."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "trip7")
    client = f"trip7_client_{conninfo_to_dict(dsn)['dbname']}"
    _lease_three_times(dsn, "trip7")

    downgrade(dsn, "trip7", target)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT * FROM trip7.downgrade_marks").fetchall() == [
            ("jobs.lease_sequence", 3)
        ]
        assert conn.execute(
            "SELECT relacl FROM pg_class WHERE oid = 'trip7.downgrade_marks'::regclass"
        ).fetchone() == (None,)  # the owner's alone
        if target == "pgstore_0006":  # the client role reads nothing of it
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT * FROM trip7.downgrade_marks")
            conn.execute("RESET ROLE")

    migrate(dsn, "trip7")
    with PgJobStore(dsn, schema="trip7") as jobs:
        lease = jobs.lease("w", None, 60_000)
        assert lease is not None and lease.run_id == "thrice"
        assert lease.lease_sequence > 3
        assert not jobs.renew("thrice", "w", None, 60_000, lease_sequence=3)  # the old lease: fenced
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('trip7.downgrade_marks')").fetchone() == (None,)
    downgrade(dsn, "trip7")  # to base: the store and its schema go, nothing is left behind
    assert "trip7" not in _namespaces(dsn)


def test_a_downgrade_trusts_no_marks_table_another_role_owns(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    dsn = pgstore_fresh_database()
    migrate(dsn, "forged", client_role=False)
    _lease_three_times(dsn, "forged")
    other = f"forger_{conninfo_to_dict(dsn)['dbname']}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(other)))
        try:
            conn.execute("CREATE TABLE forged.downgrade_marks (mark text PRIMARY KEY, value bigint)")
            conn.execute(sql.SQL("ALTER TABLE forged.downgrade_marks OWNER TO {}").format(
                sql.Identifier(other)))
            with pytest.raises(Exception, match="downgrade_marks is owned by"):
                downgrade(dsn, "forged", "pgstore_0006", client_role=False)
            assert current_revision(dsn, "forged") == pgstore.HEAD_REVISION  # nothing changed
        finally:
            conn.execute("DROP TABLE IF EXISTS forged.downgrade_marks")
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(other)))


def test_upgrade_from_0008_stamps_finished_jobs_and_purges_them_and_downgrade_back(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0009 adds jobs.finished_at: the jobs already dispatched or cancelled get the
    upgrade's time, the waiting ones NULL; job_purge deletes only the finished ones,
    is not granted to the client role, and the downgrade keeps the rows (without the
    column) and leaves a catalog equal to 0008's."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig9_upgraded", "pgstore_0008")
    migrate(dsn, "mig9_reference", "pgstore_0008")
    client = f"mig9_upgraded_client_{conninfo_to_dict(dsn)['dbname']}"

    def jobs(conn: psycopg.Connection[Any]) -> list[Any]:
        return conn.execute("SELECT * FROM mig9_upgraded.jobs ORDER BY run_id").fetchall()

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig9_upgraded")
        for run_id in ("cancelled", "held", "sent", "waiting"):
            conn.execute("SELECT job_schedule(%s, 0)", (run_id,))
        conn.execute("SELECT job_cancel('cancelled')")
        conn.execute("SELECT job_lease('h', 10, 60000)")  # held
        conn.execute("SELECT job_lease('h', 10, 60000)")  # sent
        conn.execute("SELECT job_mark_dispatched('sent', 'h', 'bot')")
        before = jobs(conn)
        started = conn.execute("SELECT now_ms()").fetchone()

    migrate(dsn, "mig9_upgraded", "pgstore_0009")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig9_upgraded")
        ended = conn.execute("SELECT now_ms()").fetchone()
        assert started is not None and ended is not None
        after = jobs(conn)
        assert [row[:-1] for row in after] == before  # the new column, last
        stamped = {row[0]: row[-1] for row in after}
        assert stamped["held"] is None and stamped["waiting"] is None
        assert all(started[0] <= stamped[r] <= ended[0] for r in ("cancelled", "sent"))
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT job_purge(0, 1)")
        conn.execute("RESET ROLE")
        assert conn.execute("SELECT job_purge(%s, 10)", (started[0],)).fetchone() == (0,)
        assert conn.execute("SELECT job_purge(%s, 10)", (ended[0] + 1,)).fetchone() == (2,)
        assert [row[0] for row in jobs(conn)] == ["held", "waiting"]
        conn.execute("SELECT job_cancel('waiting')")  # finished_at set by the new job_cancel
        remaining = jobs(conn)
        assert [(row[0], row[-1] is None) for row in remaining] == [("held", True), ("waiting", False)]

    downgrade(dsn, "mig9_upgraded", "pgstore_0008")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "mig9_upgraded") == catalog(conn, "mig9_reference")
        assert conn.execute("SELECT mig9_upgraded.schema_revision()").fetchone() == ("pgstore_0008",)
        assert jobs(conn) == [row[:-1] for row in remaining]
    migrate(dsn, "mig9_upgraded", "pgstore_0009")
    assert current_revision(dsn, "mig9_upgraded") == "pgstore_0009"


def test_upgrade_from_0009_counts_attempts_from_zero_and_downgrade_cancels_failed_jobs(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0010 adds jobs.attempts (0 for the jobs already stored), max_attempts (the default,
    25), last_error and failed, and schedules.consecutive_failures (1 where the last run
    was an error). Callers of the old signatures keep working as the client role, which
    may run job_retry too; the downgrade turns a failed job into a cancelled one (so 0009
    never leases it again), keeps every row and leaves a catalog equal to 0009's."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig10_upgraded", "pgstore_0009")
    migrate(dsn, "mig10_reference", "pgstore_0009")
    client = f"mig10_upgraded_client_{conninfo_to_dict(dsn)['dbname']}"

    def rows(conn: psycopg.Connection[Any]) -> tuple[list[Any], list[Any]]:
        return (
            conn.execute("SELECT * FROM mig10_upgraded.schedules ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM mig10_upgraded.jobs ORDER BY run_id").fetchall(),
        )

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig10_upgraded")
        for sid, status in (("bad", "error"), ("good", "ok")):
            conn.execute("SELECT schedule_register(%s, 'interval', '1000', 0, 0)", (sid,))
            conn.execute("SELECT schedule_claim_due(%s, 'w', 10, 1000)", (sid,))
            conn.execute("SELECT schedule_complete(%s, 1, 1000, 10, %s, 20)", (sid, status))
        conn.execute("SELECT schedule_register('new', 'once', '0', 0, 0)")
        for run_id in ("cancelled", "held", "sent", "waiting"):
            conn.execute("SELECT job_schedule(%s, 0)", (run_id,))
        conn.execute("SELECT job_cancel('cancelled')")
        conn.execute("SELECT job_lease('h', 10, 60000)")  # held
        conn.execute("SELECT job_lease('h', 10, 60000)")  # sent
        conn.execute("SELECT job_mark_dispatched('sent', 'h', 'bot')")
        before = rows(conn)

    migrate(dsn, "mig10_upgraded", "pgstore_0010")
    with psycopg.connect(dsn, autocommit=True) as conn:
        schedules, jobs = rows(conn)
        assert [row[:-1] for row in schedules] == before[0]  # the new column, last
        assert {row[0]: row[-1] for row in schedules} == {"bad": 1, "good": 0, "new": 0}
        assert [row[:-4] for row in jobs] == before[1]  # the new columns, last
        assert {tuple(row[-4:]) for row in jobs} == {(0, 25, None, False)}
        conn.execute("SET search_path = mig10_upgraded")
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        # The old signatures, as a caller written for 0009 sends them.
        conn.execute("SELECT job_schedule('flaky', 0)")
        conn.execute("SELECT job_schedule('flaky', 0, 1)")
        assert conn.execute("SELECT run_id, attempts FROM job_lease('h', 20, 60000)").fetchone() == (
            "flaky", 1)
        assert conn.execute("SELECT job_release('flaky', 'h', 0)").fetchone() == (True,)
        assert conn.execute("SELECT run_id, failed FROM job_list('failed', NULL, 5)").fetchall() == [
            ("flaky", True)]
        assert conn.execute("SELECT jobs_failed FROM store_stats(NULL)").fetchone() == (1,)
        assert conn.execute("SELECT job_retry('waiting', NULL)").fetchone() == ("not_failed",)
        conn.execute("SELECT schedule_claim_due('bad', 'w', 2000, 1000)")
        conn.execute("SELECT schedule_complete('bad', 2, 3000, 2000, 'error', 2100)")
        assert conn.execute("SELECT consecutive_failures FROM schedule_get('bad')").fetchone() == (2,)
        conn.execute("RESET ROLE")
        _, jobs = rows(conn)

    downgrade(dsn, "mig10_upgraded", "pgstore_0009")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "mig10_upgraded") == catalog(conn, "mig10_reference")
        assert conn.execute("SELECT mig10_upgraded.schema_revision()").fetchone() == ("pgstore_0009",)
        _, down = rows(conn)
        flaky = [row for row in down if row[0] == "flaky"]
        assert [row[:-4] for row in jobs if row[0] != "flaky"] == [
            row for row in down if row[0] != "flaky"]
        assert flaky[0][6] is True and flaky[0][-1] is not None  # cancelled, finished_at kept
        conn.execute("SET search_path = mig10_upgraded")
        far = "SELECT run_id FROM job_lease('h', 9223372036854775000, 1)"
        leased = [conn.execute(far).fetchall() for _ in range(3)]
        assert leased == [[("held",)], [("waiting",)], []]  # never flaky
    migrate(dsn, "mig10_upgraded", "pgstore_0010")
    assert current_revision(dsn, "mig10_upgraded") == "pgstore_0010"


def test_upgrade_from_0010_keeps_schedules_on_once_and_downgrade_back(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0011 adds schedules.catch_up: every schedule already stored gets once (its rule
    until then) and keeps every other column; the client role may call the new
    schedule_register (and the old 5-argument form still works), and complete with
    skipped; the downgrade keeps the rows (without the column, skipped read as NULL)
    and leaves a catalog equal to 0010's."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig11_upgraded", "pgstore_0010")
    migrate(dsn, "mig11_reference", "pgstore_0010")
    client = f"mig11_upgraded_client_{conninfo_to_dict(dsn)['dbname']}"

    def schedules(conn: psycopg.Connection[Any]) -> list[Any]:
        return conn.execute("SELECT * FROM mig11_upgraded.schedules ORDER BY id").fetchall()

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig11_upgraded")
        conn.execute("SELECT schedule_register('cron', 'cron', '0 * * * *', 3600000, 10)")
        conn.execute("SELECT schedule_register('done', 'once', '5', 100, 10)")
        conn.execute("SELECT schedule_register('held', 'interval', '1000', 100, 10)")
        conn.execute("SELECT schedule_claim_due('done', 'h', 100, 1000)")
        conn.execute("SELECT schedule_complete('done', 1, NULL, 100, 'error', 110)")
        conn.execute("SELECT schedule_claim_due('held', 'h', 100, 60000)")
        conn.execute("SELECT schedule_register('failing', 'interval', '100', 100, 10)")
        conn.execute("SELECT schedule_claim_due('failing', 'h', 100, 1000)")
        conn.execute("SELECT schedule_complete('failing', 1, 200, 100, 'error', 110)")
        before = schedules(conn)

    migrate(dsn, "mig11_upgraded", "pgstore_0011")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig11_upgraded")
        after = schedules(conn)
        assert [row[:-1] for row in after] == before  # the new column, last
        assert [row[-1] for row in after] == ["once", "once", "once", "once"]
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        assert conn.execute("SELECT fencing_token FROM schedule_claim_due('failing', 'h', 200, 1000)").fetchone() == (2,)
        assert conn.execute("SELECT schedule_complete('failing', 2, 300, 200, 'skipped', 210)").fetchone() == (True,)
        assert conn.execute("SELECT schedule_complete('held', 1, 1000, 100, 'skipped', 120)").fetchone() == (True,)
        row = conn.execute("SELECT catch_up FROM schedule_register('held', 'interval', '1000', 5, 130, 'all')").fetchone()
        assert row == ("all",)
        row = conn.execute("SELECT catch_up FROM schedule_register('new', 'interval', '1000', 5, 140)").fetchone()
        assert row == ("once",)
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT schedule_register('new', 'interval', '1000', 5, 150, 'sometimes')")
        conn.execute("RESET ROLE")
        upgraded = schedules(conn)
        # A skipped occurrence neither counts as a failure nor resets the count.
        assert [(r[0], r[5], r[-2], r[-1]) for r in upgraded] == [
            ("cron", None, 0, "once"), ("done", "error", 1, "once"), ("failing", "skipped", 1, "once"),
            ("held", "skipped", 0, "all"), ("new", None, 0, "once"),
        ]

    downgrade(dsn, "mig11_upgraded", "pgstore_0010")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "mig11_upgraded") == catalog(conn, "mig11_reference")
        assert conn.execute("SELECT mig11_upgraded.schema_revision()").fetchone() == ("pgstore_0010",)
        downgraded = schedules(conn)
        assert [(*row[:5], None if row[5] == "skipped" else row[5], *row[6:-1])
                for row in upgraded] == downgraded
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        assert conn.execute("SELECT id FROM mig11_upgraded.schedule_register('x', 'once', '1', 0, 0)").fetchone() == ("x",)
    migrate(dsn, "mig11_upgraded", "pgstore_0011")
    assert current_revision(dsn, "mig11_upgraded") == "pgstore_0011"


def test_upgrade_from_0011_adds_the_batch_calls_over_held_jobs_and_downgrade_back(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0012 adds the batch calls and changes no row: over jobs a single-job lease holds,
    the client role leases, marks and renews the rest in batches with the per-job
    rules (the held job is skipped; a cancelled one is recorded as cancelled); the
    downgrade keeps the rows and leaves a catalog equal to 0011's."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig12_upgraded", "pgstore_0011")
    migrate(dsn, "mig12_reference", "pgstore_0011")
    client = f"mig12_upgraded_client_{conninfo_to_dict(dsn)['dbname']}"

    def jobs(conn: psycopg.Connection[Any]) -> list[Any]:
        return conn.execute("SELECT * FROM mig12_upgraded.jobs ORDER BY run_id").fetchall()

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig12_upgraded")
        for run_id in ("a-held", "b", "c", "d", "e-sent"):
            conn.execute("SELECT job_schedule(%s, 0)", (run_id,))
        conn.execute("SELECT job_lease('old', 10, 600000)")  # a-held
        conn.execute("SELECT job_cancel('c')")
        sent = conn.execute("SELECT * FROM job_lease('old', 10, 1)").fetchone()
        assert sent is not None and sent[0] == "b"
        conn.execute("SELECT job_release('b', 'old', 0)")
        before = jobs(conn)

    migrate(dsn, "mig12_upgraded", "pgstore_0012")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig12_upgraded")
        assert jobs(conn) == before
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        leased = conn.execute(
            "SELECT run_id, lease_sequence FROM job_lease_many('new', 20, 600000, 10)").fetchall()
        assert leased == [("b", 2), ("d", 1), ("e-sent", 1)]  # not the held one, nor c
        marks = conn.execute(
            "SELECT * FROM job_mark_dispatched_many(ARRAY['e-sent', 'c', 'a-held'], 'new',"
            " ARRAY['bot', 'bot', 'bot'])").fetchall()
        assert marks == [("e-sent", False, True), ("c", True, False), ("a-held", False, False)]
        assert conn.execute("SELECT * FROM job_renew_many(ARRAY['b', 'a-held'], 'new', 30,"
                            " 600000, ARRAY[2, NULL])").fetchall() == [("b", True), ("a-held", False)]
        conn.execute("SELECT job_schedule_many(ARRAY['f'], ARRAY[5])")
        conn.execute("RESET ROLE")
        after = jobs(conn)

    downgrade(dsn, "mig12_upgraded", "pgstore_0011")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "mig12_upgraded") == catalog(conn, "mig12_reference")
        assert conn.execute("SELECT mig12_upgraded.schema_revision()").fetchone() == (
            "pgstore_0011",)
        assert jobs(conn) == after
    migrate(dsn, "mig12_upgraded", "pgstore_0012")
    assert current_revision(dsn, "mig12_upgraded") == "pgstore_0012"


def test_upgrade_from_0012_replaces_the_batch_bodies_over_held_jobs_and_downgrade_back(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0013 replaces the bodies of job_lease_many, job_mark_dispatched_many and
    job_renew_many (same signatures) and changes no row: over jobs 0012 leased, marked
    and cancelled, the functions keep their comments and grants, and the client role
    leases, renews and marks in batches with the per-job rules; the downgrade keeps the
    rows and leaves a catalog equal to 0012's, whose bodies answer as before."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig13_upgraded", "pgstore_0012")
    migrate(dsn, "mig13_reference", "pgstore_0012")
    client = f"mig13_upgraded_client_{conninfo_to_dict(dsn)['dbname']}"
    replaced = ("job_lease_many", "job_mark_dispatched_many", "job_renew_many")

    def jobs(conn: psycopg.Connection[Any]) -> list[Any]:
        return conn.execute("SELECT * FROM mig13_upgraded.jobs ORDER BY run_id").fetchall()

    def batch_functions(conn: psycopg.Connection[Any], schema: str) -> list[Any]:
        """The replaced functions' catalog rows, their definitions left out."""
        rows = catalog(conn, schema)["functions"]
        return [(*row[:2], *row[3:]) for row in rows if row[0] in replaced]

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig13_upgraded")
        conn.execute("SELECT job_schedule_many(ARRAY['a-held', 'b', 'c', 'd', 'e'],"
                     " ARRAY[0, 0, 0, 0, 0])")
        leased = conn.execute(
            "SELECT run_id, lease_sequence FROM job_lease_many('old', 10, 600000, 2)").fetchall()
        assert leased == [("a-held", 1), ("b", 1)]
        assert conn.execute("SELECT * FROM job_mark_dispatched_many(ARRAY['b'], 'old',"
                            " ARRAY['bot-b'])").fetchall() == [("b", False, True)]
        conn.execute("SELECT job_cancel('c')")
        before = jobs(conn)

    migrate(dsn, "mig13_upgraded", "pgstore_0013")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig13_upgraded")
        assert jobs(conn) == before
        assert batch_functions(conn, "mig13_upgraded") == batch_functions(conn, "mig13_reference")
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        leased = conn.execute(
            "SELECT run_id, lease_sequence FROM job_lease_many('new', 20, 600000, 10)").fetchall()
        assert leased == [("d", 1), ("e", 1)]  # not the held a, dispatched b, cancelled c
        renewed = conn.execute(
            "SELECT * FROM job_renew_many(ARRAY['e', 'a-held', 'd', 'gone'], 'new', 30, 600000,"
            " ARRAY[1, NULL, 2, NULL])").fetchall()
        assert renewed == [("e", True), ("a-held", False), ("d", False), ("gone", False)]
        assert conn.execute("SELECT job_cancel('d')").fetchone() == ("cancelled",)
        marks = conn.execute(
            "SELECT * FROM job_mark_dispatched_many(ARRAY['e', 'c', 'a-held', 'd', 'gone'], 'new',"
            " ARRAY['bot-e', NULL, 'bot', 'bot-d', 'bot'], ARRAY[NULL, NULL, NULL, 1, NULL])"
        ).fetchall()
        assert marks == [("e", False, True), ("c", True, False), ("a-held", False, False),
                         ("d", True, True), ("gone", False, False)]
        assert conn.execute("SELECT * FROM job_mark_dispatched_many('{}', 'new', '{}')"
                            ).fetchall() == []
        assert conn.execute("SELECT * FROM job_renew_many('{}', 'new', 30, 1)").fetchall() == []
        conn.execute("RESET ROLE")
        after = jobs(conn)
        assert [(r[0], r[5], r[4]) for r in after] == [  # run_id, dispatched, worker_id
            ("a-held", False, None), ("b", True, "bot-b"), ("c", False, None),
            ("d", True, "bot-d"), ("e", True, "bot-e")]

    downgrade(dsn, "mig13_upgraded", "pgstore_0012")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "mig13_upgraded") == catalog(conn, "mig13_reference")
        assert conn.execute("SELECT mig13_upgraded.schema_revision()").fetchone() == (
            "pgstore_0012",)
        assert jobs(conn) == after
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        assert conn.execute("SELECT * FROM mig13_upgraded.job_renew_many(ARRAY['e', 'd'], 'new',"
                            " 40, 600000)").fetchall() == [("e", True), ("d", True)]
    migrate(dsn, "mig13_upgraded", "pgstore_0013")
    assert current_revision(dsn, "mig13_upgraded") == "pgstore_0013"


def test_upgrade_from_0013_fences_the_job_store_over_stored_jobs_and_downgrade_back(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0014 adds job_fences, store_settings.max_lease_ms and check_lease, and replaces
    the bodies of ten functions (same signatures). Over jobs 0013 leased, marked,
    cancelled, failed and purged, it changes no row, keeps every function's grants and
    the comments it does not rewrite; the client role's job_remove then refuses what it
    may not delete, a purge after the upgrade fences a run id that comes back, and a job
    out of attempts is failed by a lease. The downgrade keeps the rows and leaves a
    catalog equal to 0013's."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig14_upgraded", "pgstore_0013")
    migrate(dsn, "mig14_reference", "pgstore_0013")
    client = f"mig14_upgraded_client_{conninfo_to_dict(dsn)['dbname']}"
    rewritten = {"schedule_claim_due", "schedule_renew", "schedule_claim_next", "job_lease",
                 "job_renew", "job_release", "job_remove", "job_purge", "job_lease_many",
                 "job_renew_many", "schema_revision"}

    def jobs(conn: psycopg.Connection[Any]) -> list[Any]:
        return conn.execute("SELECT * FROM mig14_upgraded.jobs ORDER BY run_id").fetchall()

    def functions(conn: psycopg.Connection[Any], schema: str) -> list[Any]:
        """Every function's catalog row but its definition, and but its comment when
        0014 rewrites it."""
        rows = catalog(conn, schema)["functions"]
        return [(r[0], r[1], None if r[0] in rewritten else r[3], *r[4:]) for r in rows]

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig14_upgraded")
        conn.execute("SELECT job_schedule('purged', 0)")
        assert conn.execute("SELECT lease_sequence FROM job_lease('h', 10, 1)").fetchone() == (1,)
        conn.execute("SELECT job_cancel('purged')")
        assert conn.execute("SELECT job_purge(9223372036854775807, 10)").fetchone() == (1,)
        conn.execute("SELECT job_schedule(r, 0) FROM unnest(ARRAY['cancelled', 'held', 'sent']) r")
        conn.execute("SELECT job_schedule('failed', 0, 1)")
        conn.execute("SELECT job_schedule('waiting', 9223372036854775807)")
        conn.execute("SELECT job_cancel('cancelled')")
        leased = conn.execute("SELECT run_id, lease_sequence FROM job_lease_many('h', 10, 1, 4)"
                              ).fetchall()
        assert leased == [("failed", 1), ("held", 1), ("sent", 1)]
        conn.execute("SELECT job_release('failed', 'h', 0)")  # its only attempt: failed
        conn.execute("SELECT job_mark_dispatched('sent', 'h', 'bot')")
        before = jobs(conn)

    migrate(dsn, "mig14_upgraded", "pgstore_0014")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig14_upgraded")
        assert jobs(conn) == before
        upgraded = {r[:2]: r for r in functions(conn, "mig14_upgraded")}
        reference = {r[:2]: r for r in functions(conn, "mig14_reference")}
        assert set(upgraded) - set(reference) == {("check_lease", "p_now bigint, p_param text,"
                                                   " p_lease bigint")}
        assert {k: upgraded[k] for k in reference} == reference  # grants, options, comments
        assert conn.execute("SELECT * FROM job_fences").fetchall() == [(True, 0)]  # none yet
        assert conn.execute("SELECT max_lease_ms FROM store_settings").fetchall() == [(None,)]
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        for run_id, state in [("cancelled", "cancelled"), ("failed", "failed"),
                              ("held", "leased"), ("sent", "dispatched")]:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=f"is {state}"):
                conn.execute("SELECT job_remove(%s)", (run_id,))
        conn.execute("RESET ROLE")
        assert jobs(conn) == before
        # A purge from now on fences the run id: scheduled again, it is leased above 1.
        conn.execute("SELECT job_cancel('held')")
        assert conn.execute("SELECT job_purge(9223372036854775807, 10)").fetchone() == (4,)
        assert conn.execute("SELECT * FROM job_fences").fetchall() == [(True, 1)]
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        conn.execute("SELECT job_schedule('held', 0, 1)")
        assert conn.execute("SELECT lease_sequence FROM job_lease('h', 20, 1)").fetchone() == (2,)
        assert conn.execute("SELECT * FROM job_mark_dispatched('held', 'h', 'old', 1)").fetchone(
            ) == (False, False)
        # Its one attempt expired: the next lease fails it.
        assert conn.execute("SELECT * FROM job_lease('h', 30, 1)").fetchall() == []
        assert conn.execute("SELECT failed FROM job_get('held')").fetchone() == (True,)
        conn.execute("SELECT job_remove('waiting')")
        conn.execute("RESET ROLE")
        after = jobs(conn)
        assert [r[0] for r in after] == ["held"]

    downgrade(dsn, "mig14_upgraded", "pgstore_0013")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "mig14_upgraded") == catalog(conn, "mig14_reference")
        assert conn.execute("SELECT mig14_upgraded.schema_revision()").fetchone() == (
            "pgstore_0013",)
        assert jobs(conn) == after
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        conn.execute("SELECT mig14_upgraded.job_remove('held')")  # 0013: anything goes
        conn.execute("RESET ROLE")
        assert jobs(conn) == []
    migrate(dsn, "mig14_upgraded", "pgstore_0014")
    assert current_revision(dsn, "mig14_upgraded") == "pgstore_0014"
def test_upgrade_to_the_restore_epoch_keeps_the_floor_and_downgrade_back(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0015, the restore epoch, adds store_epoch at epoch 0: over rows 0014 wrote, the
    floor and the next tokens are unchanged, the client role still claims and leases,
    only the owner fences; the downgrade keeps the rows and leaves a catalog equal to
    0014's."""
    before_rev, epoch_rev = "pgstore_0014", "pgstore_0015"
    dsn = pgstore_fresh_database()
    migrate(dsn, "epoch_upgraded", before_rev)
    migrate(dsn, "epoch_reference", before_rev)
    client = f"epoch_upgraded_client_{conninfo_to_dict(dsn)['dbname']}"

    def rows(conn: psycopg.Connection[Any]) -> list[Any]:
        return [conn.execute(f"SELECT * FROM epoch_upgraded.{t} ORDER BY 1").fetchall()
                for t in ("schedules", "schedule_fences", "jobs")]

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = epoch_upgraded")
        conn.execute("SELECT * FROM schedule_register('s', 'interval', '1', 0, 0)")
        conn.execute("SELECT * FROM schedule_register('gone', 'interval', '1', 0, 0)")
        conn.execute("SELECT * FROM schedule_claim_due('gone', 'w', 10, 1000)")
        conn.execute("SELECT schedule_delete('gone')")
        conn.execute("SELECT * FROM schedule_claim_due('s', 'w', 10, 1000)")
        conn.execute("SELECT job_schedule('j', 0)")
        conn.execute("SELECT * FROM job_lease('h', 10, 1000)")
        kept = rows(conn)

    migrate(dsn, "epoch_upgraded", epoch_rev)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = epoch_upgraded")
        assert rows(conn) == kept
        assert conn.execute("SELECT epoch, fenced_at FROM store_epoch").fetchall() == [(0, None)]
        assert conn.execute("SELECT token_floor()").fetchone() == (0,)
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        assert conn.execute("SELECT fencing_token FROM schedule_claim_due('s', 'w', 2000, 1000)"
                            ).fetchone() == (2,)
        assert conn.execute("SELECT lease_sequence FROM job_lease('h', 2000, 1000)"
                            ).fetchone() == (2,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM fence_after_restore()")
        conn.execute("RESET ROLE")
        assert conn.execute("SELECT * FROM fence_after_restore(0)").fetchone() == (0, 2**40)
        assert conn.execute("SELECT fencing_token FROM schedule_claim_due('s', 'w', 4000, 1000)"
                            ).fetchone() == (2**40,)
        after = rows(conn)

    downgrade(dsn, "epoch_upgraded", before_rev)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "epoch_upgraded") == catalog(conn, "epoch_reference")
        assert conn.execute("SELECT epoch_upgraded.schema_revision()").fetchone() == (
            before_rev,)
        assert rows(conn) == after
    migrate(dsn, "epoch_upgraded", epoch_rev)
    assert current_revision(dsn, "epoch_upgraded") == epoch_rev



def test_upgrade_to_the_stats_history_keeps_the_counts_and_job_list_answers_finished_at(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0015 -> 0016 over a history: store_stats() answers the same counts (now without
    scanning it), job_list() answers finished_at, the client role keeps job_list, and
    the downgrade restores 0015's catalog and counts."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig16_upgraded", "pgstore_0015")
    migrate(dsn, "mig16_reference", "pgstore_0015")
    client = f"mig16_upgraded_client_{conninfo_to_dict(dsn)['dbname']}"
    history = "jobs_dispatched, jobs_recalled, jobs_cancelled, jobs_failed"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig16_upgraded")
        conn.execute(
            "INSERT INTO jobs (run_id, dispatch_at, dispatched, cancelled, failed, finished_at)"
            " SELECT 'h-' || i, i, i % 10 <> 3 AND i % 100 <> 7, i % 10 = 3 OR i % 50 = 1,"
            " i % 100 = 7, i FROM generate_series(1, 2000) i")
        conn.execute("SELECT job_schedule('waits', 0)")
        before = conn.execute(f"SELECT {history} FROM store_stats()").fetchone()
        assert before == (1780, 40, 200, 20)

    migrate(dsn, "mig16_upgraded", "pgstore_0016")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig16_upgraded")
        for _ in range(3):  # before job_history moved, and after
            assert conn.execute(f"SELECT {history} FROM store_stats()").fetchone() == before
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        rows = conn.execute("SELECT run_id, finished_at, matching FROM job_list('all', NULL, 2)"
                            ).fetchall()
        assert rows == [("waits", None, 2001), ("h-1", 1, 2001)]
        conn.execute("RESET ROLE")
        assert conn.execute("SELECT job_purge(2, 10)").fetchone() == (1,)  # h-1 alone
        after = conn.execute(f"SELECT {history} FROM store_stats()").fetchone()
        assert after == (1779, 39, 200, 20)  # h-1 was recalled

    downgrade(dsn, "mig16_upgraded", "pgstore_0015")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "mig16_upgraded") == catalog(conn, "mig16_reference")
        assert conn.execute(f"SELECT {history} FROM mig16_upgraded.store_stats()").fetchone(
            ) == after
    migrate(dsn, "mig16_upgraded", "pgstore_0016")
    assert current_revision(dsn, "mig16_upgraded") == "pgstore_0016"

def test_upgrade_to_lanes_carries_every_limit_place_and_downgrade_back(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0025 -> 0026 with leases live in limited queues: every place (a row of each kind at
    0025) keeps what it held, in its lane, the busy places above a lowered limit become
    retired rows, rate_used answers the same and the limits keep holding; the downgrade
    writes the places back as 0025's rows and restores its catalog."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig25_upgraded", "pgstore_0025")
    migrate(dsn, "mig25_reference", "pgstore_0025")
    rows = ("SELECT queue, kind, slot, CASE WHEN kind = 'concurrency' THEN run_id END,"
            " CASE WHEN kind = 'concurrency' THEN lease_sequence END, lease_until,"
            " CASE WHEN kind = 'rate' THEN taken_at END"
            " FROM queue_slots ORDER BY queue, kind, slot")
    used = "SELECT queue, rate_used FROM queue_list(1500) ORDER BY queue"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig25_upgraded")
        for queue in ("b", "c", "r"):
            conn.execute("SELECT job_schedule_many(%s, %s, %s)",
                         ([f"{queue}{i}" for i in range(6)], [0] * 6, queue))
        conn.execute("SELECT queue_set_concurrency('c', 3)")
        conn.execute("SELECT queue_set_rate('r', 4, 1000)")
        conn.execute("SELECT queue_set_concurrency('b', 2)")
        conn.execute("SELECT queue_set_rate('b', 5, 1000)")
        for queue in ("b", "c"):
            conn.execute("SELECT job_lease_many('h', 1000, 600000, 10, %s)", ([queue],))
        conn.execute("SELECT job_lease_many('h', 1000, 600000, 2, ARRAY['r'])")
        conn.execute("SELECT queue_set_concurrency('c', 1)")  # c1 and c2 keep their rows
        before_rows = conn.execute(rows).fetchall()
        before_used = conn.execute(used).fetchall()
        assert [r[:3] for r in before_rows if r[0] == "c"] == [
            ("c", "concurrency", 1), ("c", "concurrency", 2), ("c", "concurrency", 3)]

    migrate(dsn, "mig25_upgraded", "pgstore_0026")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig25_upgraded")
        lanes = conn.execute("SELECT queue, slot, run_ids, lease_sequences, lease_untils,"
                             " taken_ats FROM queue_slots ORDER BY queue, slot").fetchall()
        assert lanes == [
            ("b", 1, ["b0"], [1], [601000], [1000, None, None]),
            ("b", 2, ["b1"], [1], [601000], [1000, None]),
            ("c", -3, ["c2"], [1], [601000], None),
            ("c", -2, ["c1"], [1], [601000], None),
            ("c", 1, ["c0"], [1], [601000], None),
            ("r", 1, None, None, None, [1000]),
            ("r", 2, None, None, None, [1000]),
            ("r", 3, None, None, None, [None]),
            ("r", 4, None, None, None, [None]),
        ]
        assert conn.execute(used).fetchall() == before_used
        assert conn.execute("SELECT count(*) FROM job_lease_many('h', 1500, 1000, 10,"
                            " ARRAY['b', 'c'])").fetchone() == (0,)
        assert conn.execute("SELECT run_id FROM job_lease_many('h', 1500, 1000, 10,"
                            " ARRAY['r'])").fetchall() == [("r2",), ("r3",)]
        assert conn.execute("SELECT renewed FROM job_renew_many(ARRAY['c0', 'c1', 'c2'],"
                            " 'h', 1500, 600000)").fetchall() == [(True,)] * 3
        conn.execute("SELECT job_lease_many('x', 1500, 1000, 10, ARRAY['q'])")
        after_rows = conn.execute(
            "SELECT queue, slot, run_ids, lease_untils, taken_ats FROM queue_slots"
            " ORDER BY queue, slot").fetchall()

    downgrade(dsn, "mig25_upgraded", "pgstore_0025")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "mig25_upgraded") == catalog(conn, "mig25_reference")
        conn.execute("SET search_path = mig25_upgraded")
        back = conn.execute(rows).fetchall()
        # The leases since the upgrade: r2 and r3 in rate rows 3 and 4, the renews'
        # lease_until; every other place as it was.
        expected = [
            (q, k, slot, run_id, seq, 601500 if q == "c" else until,
             1500 if (q, k, slot) in {("r", "rate", 3), ("r", "rate", 4)} else taken)
            for q, k, slot, run_id, seq, until, taken in before_rows]
        assert back == expected, after_rows
    migrate(dsn, "mig25_upgraded", "pgstore_0026")
    assert current_revision(dsn, "mig25_upgraded") == "pgstore_0026"


def test_upgrade_to_stats_counts_counts_the_recalled_and_failed_and_downgrade_back(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0027 -> 0028 over a history job_history has partly counted: the upgrade counts the
    recalled and failed jobs below its upto from the rows, store_stats() answers the same,
    a move of a counted job goes through job_history, and the downgrade restores 0027's
    catalog (the index back) and counts."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "mig28_upgraded", "pgstore_0027")
    migrate(dsn, "mig28_reference", "pgstore_0027")
    history = "jobs_dispatched, jobs_recalled, jobs_cancelled, jobs_failed"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig28_upgraded")
        conn.execute("SET pgstore.stats_lag_ms = 0")
        # 2,000 old finishes (20 recalled, 20 failed), and a cancelled job whose holder
        # has yet to mark it (a recall to come).
        conn.execute(
            "INSERT INTO jobs (run_id, dispatch_at, dispatched, cancelled, failed, finished_at)"
            " SELECT 'h-' || i, i, i % 10 <> 3 AND i % 100 <> 7, i % 10 = 3 OR i % 100 = 1,"
            " i % 100 = 7, i FROM generate_series(1, 2000) i")
        conn.execute("INSERT INTO jobs (run_id, dispatch_at, lease_holder, lease_until,"
                     " lease_sequence, attempts, cancelled, finished_at)"
                     " VALUES ('late', 0, 'h', 9000000000000000, 1, 1, true, 3000)")
        for _ in range(100):  # until job_history counted them
            conn.execute("SELECT FROM store_stats()")
            upto = conn.execute("SELECT upto FROM job_history").fetchone()
            if upto is not None and upto[0] > 3000:
                break
            time.sleep(0.1)
        assert upto is not None and upto[0] > 3000
        # and some finishes job_history has not counted yet
        conn.execute(
            "INSERT INTO jobs (run_id, dispatch_at, dispatched, cancelled, failed, finished_at)"
            " SELECT 'n-' || i, i, i % 2 = 0, i % 3 = 0, i % 2 = 1 AND i % 3 <> 0,"
            " now_ms() + 60000 FROM generate_series(1, 12) i")
        before = conn.execute(f"SELECT {history} FROM store_stats()").fetchone()
        assert before == (1786, 22, 203, 24)

    migrate(dsn, "mig28_upgraded", "pgstore_0028")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = mig28_upgraded")
        assert conn.execute("SELECT finished, dispatched, recalled, failed FROM job_history"
                            ).fetchone() == (2001, 1760, 20, 20)
        assert conn.execute(f"SELECT {history} FROM store_stats()").fetchone() == before
        assert conn.execute("SELECT * FROM job_mark_dispatched('late', 'h', 'w')").fetchone(
            ) == (True, True)
        assert conn.execute("SELECT recalled FROM job_history").fetchone() == (21,)
        after = conn.execute(f"SELECT {history} FROM store_stats()").fetchone()
        assert after == (1787, 23, 202, 24)

    downgrade(dsn, "mig28_upgraded", "pgstore_0027")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert catalog(conn, "mig28_upgraded") == catalog(conn, "mig28_reference")
        assert conn.execute(f"SELECT {history} FROM mig28_upgraded.store_stats()").fetchone(
            ) == after
    migrate(dsn, "mig28_upgraded", "pgstore_0028")
    assert current_revision(dsn, "mig28_upgraded") == "pgstore_0028"
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT recalled, failed FROM mig28_upgraded.job_history"
                            ).fetchone() == (21, 20)


def test_alembic_command_line_chooses_the_schema(pgstore_fresh_database: Callable[[], str]) -> None:
    dsn = pgstore_fresh_database()
    cfg = Config()
    cfg.set_main_option("script_location", str(pgstore.schema.files.migrations_dir()))
    cfg.cmd_opts = type("Opts", (), {"x": ["schema=from_x", f"dsn={dsn}"]})()  # as `-x` does
    command.upgrade(cfg, "head")
    assert current_revision(dsn, "from_x") == pgstore.HEAD_REVISION
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'from_x' AND tablename = 'alembic_version'"
        ).fetchone()
    assert row == (1,)


def test_start_says_what_to_run(pgstore_fresh_database: Callable[[], str]) -> None:
    dsn = pgstore_fresh_database()
    store = PgScheduleStore(dsn, schema="not_yet")
    with pytest.raises(SchemaNotReady, match="pgstore migrate --dsn DSN --schema not_yet"):
        store.start()
    store.close()
    with PgScheduleStore(dsn, schema="not_yet", auto_migrate=True) as store:
        store.start()  # idempotent
        assert store.list() == []
    assert current_revision(dsn, "not_yet") == pgstore.HEAD_REVISION


def test_start_with_a_connection_and_a_pool(pgstore_fresh_database: Callable[[], str]) -> None:
    from psycopg_pool import ConnectionPool

    dsn = pgstore_fresh_database()
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        PgScheduleStore(conn, schema="by_conn", auto_migrate=True).start()
        assert PgScheduleStore(conn, schema="by_conn").list() == []
    with ConnectionPool(dsn, kwargs={"autocommit": True}) as pool:
        store = PgScheduleStore(pool, schema="by_pool", auto_migrate=True)
        store.start()
        assert store.register("t", "once", "1", 0, 0).id == "t"


def test_host_app_branch(pgstore_fresh_database: Callable[[], str]) -> None:
    dsn = pgstore_fresh_database()
    cfg = Config(str(HOST_APP / "alembic.ini"))
    cfg.set_main_option("script_location", str(HOST_APP))
    cfg.set_main_option(
        "version_locations", f"{HOST_APP / 'versions'} {pgstore.versions_dir()}"
    )
    cfg.attributes["host_conninfo"] = dsn
    command.upgrade(cfg, "heads")
    with psycopg.connect(dsn) as conn:
        versions = {r[0] for r in conn.execute("SELECT version_num FROM public.alembic_version")}
        tables = {
            (r[0], r[1])
            for r in conn.execute(
                "SELECT schemaname, tablename FROM pg_tables WHERE schemaname IN ('public', 'hoststore')"
            )
        }
    # host_0001 depends on pgstore_0001; pgstore's later revisions are a second head.
    assert versions == {"host_0001", pgstore.HEAD_REVISION}
    assert {
        ("public", "invoices"), ("hoststore", "schedules"), ("hoststore", "schedule_fences"),
        ("hoststore", "jobs"),
    } <= tables
    with PgScheduleStore(dsn, schema="hoststore") as store:
        assert store.list() == []
    command.downgrade(cfg, "base")
    assert "hoststore" not in _namespaces(dsn)


def test_a_changed_signature_keeps_every_grant_of_the_old_one(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """0007 drops and creates job_renew, job_mark_dispatched and job_release with a new
    argument: whoever could execute the old form (the client role, and a role the DBA
    granted by hand) may execute the new one, and the old one again after a downgrade."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "sig", "pgstore_0006")
    dba_role = f"sig_ops_{conninfo_to_dict(dsn)['dbname']}"
    client = f"sig_client_{conninfo_to_dict(dsn)['dbname']}"
    old, new = "sig.job_renew(text, text, bigint, bigint)", "sig.job_renew(text, text, bigint, bigint, bigint)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(dba_role)))
        conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION sig.job_renew(text, text, bigint, bigint) TO {}").format(sql.Identifier(dba_role)))

        def may(role: str, signature: str) -> bool:
            row = conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, signature)
            ).fetchone()
            return bool(row and row[0])

        try:
            assert may(dba_role, old) and may(client, old)
            migrate(dsn, "sig", "pgstore_0007")
            assert may(dba_role, new) and may(client, new)
            downgrade(dsn, "sig", "pgstore_0006")
            assert may(dba_role, old) and may(client, old)
        finally:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(dba_role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(dba_role)))
