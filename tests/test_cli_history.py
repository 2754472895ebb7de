"""A schema migrated through a host app's alembic history, and offline mode (``--sql``).

``current`` reports such a schema from its own ``schema_revision()``; ``migrate``
and ``downgrade`` leave it alone with one sentence. Offline mode works with the
client role off and is refused in one line, before any SQL, otherwise.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic import command
from alembic.config import Config

import pgstore
from pgstore import PgScheduleStore
from pgstore.schema.files import migrations_dir
from pgstore.schema.migrations import current_revision, migrate
from tests.support.catalog import catalog
from tests.support.cli_support import (
    Run,
    clean_environment,
    in_process,
    one_error_line,
    process_env,
)

HEAD = pgstore.HEAD_REVISION
HOST_APP = Path(__file__).parent / "host_app"


@pytest.fixture(autouse=True)
def _no_pgstore_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_environment(monkeypatch)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Run:
    return in_process(capsys)


# --- a schema managed by a host app's alembic history ---------------------------


def _host_config(dsn: str) -> Config:
    cfg = Config(str(HOST_APP / "alembic.ini"))
    cfg.set_main_option("script_location", str(HOST_APP))
    cfg.set_main_option("version_locations", f"{HOST_APP / 'versions'} {pgstore.versions_dir()}")
    cfg.attributes["host_conninfo"] = dsn
    return cfg


def _everything(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        versions = sorted(r[0] for r in conn.execute("SELECT version_num FROM alembic_version"))
        tables = sorted(
            conn.execute(
                "SELECT schemaname, tablename FROM pg_tables"
                " WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
            ).fetchall()
        )
        return {"host": versions, "tables": tables, "store": catalog(conn, "hoststore")}


def test_a_schema_migrated_by_a_host_app_is_recognised_and_left_alone(
    cli: Run, pgstore_fresh_database: Callable[[], str]
) -> None:
    dsn = pgstore_fresh_database()
    command.upgrade(_host_config(dsn), "host@head")  # host_0001 and the pgstore_0001 it needs
    where = ["--dsn", dsn, "--schema", "hoststore"]
    before = _everything(dsn)
    assert before["host"] == ["host_0001"]  # pgstore_0001 ran too, as its dependency

    status, out, err = cli("current", *where)
    assert (status, err) == (0, "")
    assert out.startswith("pgstore_0001 (")
    assert "managed by another alembic history" in out and len(out.splitlines()) == 1

    for verb in ("migrate", "downgrade --yes"):
        status, out, err = cli(*verb.split(), *where)
        assert (status, out) == (1, "")
        line = one_error_line(err)
        assert line.startswith(
            "pgstore: error: schema 'hoststore' is at pgstore_0001 through another alembic history"
        )
        assert line.endswith("upgrade or downgrade it through the host app's alembic")
        assert "already exists" not in line
        assert _everything(dsn) == before

    # pgstore's own history is unaffected: another schema migrates and reports as before.
    assert cli("migrate", "--dsn", dsn, "--schema", "own", "--client-role", "off")[0] == 0
    assert cli("current", "--dsn", dsn, "--schema", "own") == (0, f"{HEAD}\n", "")
    # Through the host's history, the schema moves on and `current` follows it.
    command.upgrade(_host_config(dsn), "heads")
    assert cli("current", *where)[1].startswith(f"{HEAD} (")


# --- offline mode (alembic --sql) -----------------------------------------------


def _offline(tmp_path: Path, *x: str) -> subprocess.CompletedProcess[str]:
    ini = tmp_path / "alembic.ini"
    ini.write_text(f"[alembic]\nscript_location = {migrations_dir()}\n")
    args = [a for opt in x for a in ("-x", opt)]
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ini), *args, "upgrade", "head", "--sql"],
        capture_output=True, text=True, env=process_env(), timeout=120, cwd=tmp_path,
    )


def test_offline_mode_with_the_client_role_on_is_one_clear_refusal(tmp_path: Path) -> None:
    done = _offline(tmp_path, "schema=off_s")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    line = one_error_line(done.stdout)  # alembic prints FAILED: on stdout, before any SQL
    assert line.startswith("FAILED: ")
    assert "offline mode (--sql) cannot create or grant the client role" in line
    assert "-x client_role=off" in line


def test_offline_mode_with_the_client_role_off_prints_a_script_that_migrates(
    tmp_path: Path, pgstore_fresh_database: Callable[[], str]
) -> None:
    done = _offline(tmp_path, "schema=off_s", "client_role=off")
    assert (done.returncode, "Traceback" in done.stderr) == (0, False), done.stderr
    script = done.stdout
    assert script.index('CREATE SCHEMA "off_s"') < script.index("alembic_version")

    offline, online = pgstore_fresh_database(), pgstore_fresh_database()
    conn: psycopg.Connection[Any]
    with psycopg.connect(offline, autocommit=True) as conn:
        conn.execute(script.encode())
    migrate(online, "off_s", client_role=False)
    assert current_revision(offline, "off_s") == HEAD
    with psycopg.connect(offline) as a, psycopg.connect(online) as b:
        assert catalog(a, "off_s") == catalog(b, "off_s")
    with PgScheduleStore(offline, schema="off_s") as store:
        assert store.list() == []


