"""The SQL functions called as plain SELECTs, as another language's driver would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql


@pytest.fixture
def db(pgstore_database: str, pgstore_schema: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pgstore_schema)))
        yield conn


def _state(db: psycopg.Connection[Any]) -> list[Any]:
    return [
        db.execute("SELECT * FROM schedules ORDER BY id").fetchall(),
        db.execute("SELECT * FROM schedule_fences ORDER BY id").fetchall(),
    ]


def test_claim_renew_complete_delete_register_cycle(db: psycopg.Connection[Any]) -> None:
    row = db.execute("SELECT * FROM schedule_register('report', 'cron', '0 * * * *', 1000, 500)").fetchone()
    assert row == ("report", "cron", "0 * * * *", 1000, None, None, 0, None, None, 500)
    claim = db.execute("SELECT fencing_token, lease_owner, lease_until FROM schedule_claim_due('report', 'host-a', 1000, 30000)").fetchone()
    assert claim == (1, "host-a", 31000)
    assert db.execute("SELECT schedule_claim_due('report', 'host-b', 1001, 30000)").fetchall() == []
    assert db.execute("SELECT schedule_renew('report', 1, 61000)").fetchone() == (True,)
    assert db.execute("SELECT schedule_complete('report', 1, 3600000, 1000, 'ok', 2000)").fetchone() == (True,)
    assert db.execute("SELECT schedule_complete('report', 1, 3600000, 1000, 'ok', 2000)").fetchone() == (False,)
    db.execute("SELECT schedule_delete('report')")
    assert db.execute("SELECT * FROM schedule_fences").fetchall() == [("report", 1)]
    again = db.execute("SELECT fencing_token FROM schedule_register('report', 'cron', '0 * * * *', 0, 3000)").fetchone()
    assert again == (1,)
    assert len(db.execute("SELECT * FROM schedule_list()").fetchall()) == 1
    assert db.execute("SELECT count(*) FROM schedule_claim_next('w', NULL, 1000, 5, NULL)").fetchone() == (1,)
    assert db.execute("SELECT now_ms() > 1700000000000").fetchone() == (True,)


def test_functions_work_whatever_the_callers_search_path(
    pgstore_database: str, pgstore_schema: str
) -> None:
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute("SET search_path = pg_catalog")
        q = sql.SQL("SELECT fencing_token FROM {}.schedule_register('x', 'once', '1', 0, 0)")
        assert conn.execute(q.format(sql.Identifier(pgstore_schema))).fetchone() == (0,)


NULL_CALLS = [
    ("schedule_get(NULL)", "id"),
    ("schedule_register(NULL, 'once', '1', 0, 0)", "id"),
    ("schedule_register('t', NULL, '1', 0, 0)", "kind"),
    ("schedule_register('t', 'once', NULL, 0, 0)", "spec"),
    ("schedule_claim_due(NULL, 'w', 0, 1)", "id"),
    ("schedule_claim_due('t', NULL, 0, 1)", "owner"),
    ("schedule_claim_due('t', 'w', 0, NULL)", "lease_ms"),
    ("schedule_renew(NULL, 1, 1)", "id"),
    ("schedule_renew('t', NULL, 1)", "fencing_token"),
    ("schedule_renew('t', 1, NULL)", "lease_until"),
    ("schedule_complete(NULL, 1, 1, 1, 'ok', 1)", "id"),
    ("schedule_complete('t', NULL, 1, 1, 'ok', 1)", "fencing_token"),
    ("schedule_complete('t', 1, 1, NULL, 'ok', 1)", "last_run_at"),
    ("schedule_complete('t', 1, 1, 1, NULL, 1)", "last_status"),
    ("schedule_complete('t', 1, 1, 1, 'maybe', 1)", "last_status"),
    ("schedule_delete(NULL)", "id"),
    ("schedule_delete('')", "id"),
    ("schedule_claim_next(NULL, 0, 1, 1)", "owner"),
    ("schedule_claim_next('w', 0, NULL, 1)", "lease_ms"),
    ("schedule_claim_next('w', 0, 1, NULL)", "limit"),
    ("schedule_claim_next('w', 0, 1, -3)", "limit"),
    ("schedule_claim_next('w', 0, 1, 1, ARRAY['t', NULL])", "ids"),
    ("schedule_claim_next('w', 0, 1, 1, ARRAY[''])", "ids"),
]


@pytest.mark.parametrize(("call", "param"), NULL_CALLS)
def test_bad_arguments_raise_22023_naming_the_parameter(
    db: psycopg.Connection[Any], call: str, param: str
) -> None:
    db.execute("SELECT schedule_register('t', 'interval', '1', 0, 0)")
    db.execute("SELECT schedule_claim_due('t', 'w', 0, 100000)")
    before = _state(db)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        db.execute(f"SELECT * FROM {call}")  # type: ignore[arg-type]
    assert raised.value.sqlstate == "22023"
    assert param in (raised.value.diag.message_primary or "")
    assert _state(db) == before


def test_overflow_raises_22003(db: psycopg.Connection[Any]) -> None:
    db.execute("SELECT schedule_register('t', 'interval', '1', 0, 0)")
    before = _state(db)
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        db.execute("SELECT * FROM schedule_claim_due('t', 'w', 9223372036854775000, 1000)")
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        db.execute("SELECT * FROM schedule_claim_due('unknown', 'w', 9223372036854775000, 1000)")
    assert _state(db) == before


def test_every_function_has_a_comment(db: psycopg.Connection[Any], pgstore_schema: str) -> None:
    rows = db.execute(
        "SELECT p.proname, obj_description(p.oid, 'pg_proc'), p.proconfig FROM pg_proc p"
        " WHERE p.pronamespace = %s::regnamespace",
        (pgstore_schema,),
    ).fetchall()
    assert len(rows) >= 14
    for name, comment, config in rows:
        assert comment, f"{name} has no COMMENT ON FUNCTION"
        assert config and any(c.startswith("search_path=") and c.endswith("pg_temp") for c in config), name


def test_claim_renew_complete_are_single_update_statements(pgstore_schema: str) -> None:
    from pgstore._resources import sql_dir

    text = (sql_dir() / "11_schedule_functions.sql").read_text()
    for fn in ("schedule_claim_due", "schedule_renew", "schedule_complete"):
        body = text.split(f"CREATE FUNCTION {fn}(")[1].split("$$")[1]
        assert body.count("UPDATE ") == 1 and "RETURNING" in body, fn
        assert "FOR UPDATE" not in body and "advisory" not in body, fn
