"""``pgstore --version``, and downgrades that drop data: they ask first.

A downgrade across a revision that added a column or a table drops it (what each
revision's ``DOWNGRADE_DROPS`` declares; to base the whole store); on a terminal
(a pseudo-terminal here) the operator types the schema's name, otherwise ``--yes``
is needed, and without it nothing changes (exit status 2).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgstore
from pgstore import PgJobStore, PgScheduleStore
from pgstore.schema.migrations import current_revision, downgrade, migrate
from tests.support.cli_support import (
    Run,
    clean_environment,
    in_process,
    one_error_line,
    pgstore_argv,
    process_env,
)

HEAD = pgstore.HEAD_REVISION


@pytest.fixture(autouse=True)
def _no_pgstore_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_environment(monkeypatch)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Run:
    return in_process(capsys)


# --- pgstore --version ----------------------------------------------------------


def test_version_is_the_installed_distributions(cli: Run) -> None:
    expected = f"pgstore {importlib.metadata.version('pgstore')}\n"
    assert cli("--version") == (0, expected, "")
    done = subprocess.run(
        [*pgstore_argv(), "--version"], capture_output=True, text=True, env=process_env(), timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, expected, "")


# --- downgrades that drop data ----------------------------------------------------


def _fill(dsn: str, schema: str) -> None:
    with PgScheduleStore(dsn, schema=schema) as store:
        store.register("nightly", "cron", "0 3 * * *", 1_700_000_000_000)
        store.register("tick", "interval", "60000", 1_700_000_000_000)
    with PgJobStore(dsn, schema=schema) as jobs:
        jobs.schedule("run-1", 1_700_000_000_000)
        jobs.schedule("run-2", 4_102_444_800_000)


def _contents(dsn: str, schema: str) -> dict[str, Any]:
    """The schema's revision, its store's tables and every row in them."""
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s"
                " AND tablename <> 'alembic_version' ORDER BY 1",
                (schema,),
            )
        ]
        rows = {
            t: sorted(map(repr, conn.execute(f'SELECT * FROM "{schema}"."{t}"').fetchall()))
            for t in tables
        }
    return {"revision": current_revision(dsn, schema), "rows": rows}


def _schedules(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    """The schedules' rows in the columns every revision has, ordered by id."""
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL(
            "SELECT id, kind, spec, next_run_at, last_run_at, last_status, fencing_token,"
            " lease_owner, lease_until, updated_at FROM {}.schedules ORDER BY id"
        ).format(sql.Identifier(schema))).fetchall()


@pytest.fixture
def filled(pgstore_fresh_database: Callable[[], str]) -> Iterator[tuple[str, str]]:
    """A database and a schema migrated to head, holding schedules and jobs."""
    dsn = pgstore_fresh_database()
    migrate(dsn, "dg", client_role=False)
    _fill(dsn, "dg")
    yield dsn, "dg"


#: What every downgrade from head to pgstore_0006 or below names first.
ABOVE_0006 = [
    "pgstore_0028: columns job_history.failed, job_history.recalled;",
    "pgstore_0026: columns queue_slots.lease_sequences, queue_slots.lease_untils,"
    " queue_slots.run_ids, queue_slots.taken_ats;",
    "pgstore_0024: columns queues.concurrency_limit, queues.rate_limit,"
    " queues.rate_period_ms and table queue_slots (0 rows);",
    "pgstore_0019: columns jobs.payload, jobs.priority, jobs.queue,"
    " store_settings.max_payload_bytes and table queues (0 rows);",
    "pgstore_0018: columns schedules.due_at, schedules.jitter_ms, schedules.paused,"
    " schedules.triggered_at;",
    "pgstore_0016: table job_history (1 row);",
    "pgstore_0015: table store_epoch (1 row);",
    "pgstore_0014: column store_settings.max_lease_ms and table job_fences (1 row);",
    "pgstore_0011: column schedules.catch_up;",
    "pgstore_0010: columns jobs.attempts, jobs.max_attempts, jobs.last_error, jobs.failed,"
    " schedules.consecutive_failures, store_settings.default_max_attempts;",
    "pgstore_0009: column jobs.finished_at;",
    "pgstore_0007: column jobs.lease_sequence",
]


@pytest.mark.parametrize(
    ("target", "tables"),
    [
        ("base", [*ABOVE_0006, "pgstore_0006: table store_settings (1 row);",
                  "pgstore_0002: table jobs (2 rows);",
                  "pgstore_0001: tables schedules (2 rows), schedule_fences (0 rows);"]),
        ("pgstore_0001", [*ABOVE_0006, "pgstore_0002: table jobs (2 rows);"]),
        # relative to the current revision, as alembic counts: down to pgstore_0001
        (f"-{int(pgstore.HEAD_REVISION.rsplit('_', 1)[1]) - 1}",
         [*ABOVE_0006, "pgstore_0002: table jobs (2 rows);"]),
        # What each of 0028, 0026, 0024, 0019, 0018, 0016, 0015, 0014, 0011, 0010, 0009 and
        # 0007 added.
        ("pgstore_0006", ABOVE_0006),
    ],
)
def test_a_downgrade_dropping_data_without_a_terminal_needs_yes(
    cli: Run, filled: tuple[str, str], monkeypatch: pytest.MonkeyPatch, target: str,
    tables: list[str],
) -> None:
    dsn, schema = filled
    before = _contents(dsn, schema)
    assert set(before["rows"]) >= {"schedules", "jobs"} and before["rows"]["jobs"]
    before_schedules = _schedules(dsn, schema)
    where = ["--dsn", dsn, "--schema", schema, "--client-role", "off", "--revision", target]

    # A typed answer waiting on a stdin that is not a terminal is not a confirmation.
    monkeypatch.setattr(sys, "stdin", _NotATerminal(f"{schema}\n"))
    status, out, err = cli("downgrade", *where)
    assert (status, out) == (2, "")
    line = one_error_line(err)
    assert line.startswith("pgstore: error: ")
    assert f"from {HEAD} to {target} drops, with the data in them, " + ABOVE_0006[0].split(":")[0] + ":" in line
    assert all(t in line + ";" for t in tables), line
    assert "--yes" in line and "nothing changed" in line
    assert _contents(dsn, schema) == before
    assert sys.stdin.read() == f"{schema}\n"  # never read

    if target in ("base", "pgstore_0006"):  # a process, stdin on /dev/null: the same refusal
        done = subprocess.run(
            [*pgstore_argv(), "downgrade", *where],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, env=process_env(), timeout=60,
        )
        assert (done.returncode, done.stdout) == (2, "")
        assert one_error_line(done.stderr) == line
        assert _contents(dsn, schema) == before

    status, out, err = cli("downgrade", *where, "--yes")
    assert (status, err) == (0, "")
    after = _contents(dsn, schema)
    if target == "base":
        assert after == {"revision": None, "rows": {}}
    elif target == "pgstore_0006":
        assert after["revision"] == "pgstore_0006" and len(after["rows"]["jobs"]) == 2
    else:
        assert "jobs" not in after["rows"]
        assert after["revision"] == "pgstore_0001"
        # Every schedule is kept, in the columns pgstore_0001 has (later revisions'
        # columns go with the revisions).
        assert _schedules(dsn, schema) == before_schedules


class _NotATerminal:
    """A stdin that holds a line but is not a terminal."""

    def __init__(self, text: str) -> None:
        self._text = text

    def isatty(self) -> bool:
        return False

    def readline(self) -> str:
        text, self._text = self._text, ""
        return text

    def read(self) -> str:
        return self.readline()


def test_a_downgrade_keeping_the_data_needs_no_confirmation(
    cli: Run, filled: tuple[str, str]
) -> None:
    dsn, schema = filled
    before = _contents(dsn, schema)
    where = ["--dsn", dsn, "--schema", schema, "--client-role", "off"]
    # Down to pgstore_0005 drops store_settings, the lease sequences, ... (confirmed);
    # from there on, no downgrade above pgstore_0002 drops anything.
    assert cli("downgrade", *where, "--revision", "pgstore_0005", "--yes")[0] == 0
    before = _contents(dsn, schema)
    assert before["rows"]["jobs"] and before["rows"]["schedules"]
    assert cli("downgrade", *where, "--revision", "-1") == (
        0, f"schema {schema!r} is at pgstore_0004\n", ""
    )
    assert cli("downgrade", *where, "--revision", "pgstore_0002")[0] == 0
    assert _contents(dsn, schema) == {**before, "revision": "pgstore_0002"}
    # Nothing to drop in a schema that holds no store.
    assert cli("downgrade", "--dsn", dsn, "--schema", "empty") == (
        0, "schema 'empty' is at none (not migrated)\n", ""
    )


def test_downgrade_help_names_the_revisions_that_drop_data(cli: Run) -> None:
    """The help's list is read from each revision's ``DOWNGRADE_DROPS``: every revision
    that drops something is named with what it drops, in order, and no other."""
    from pgstore.cli.downgrade import declared_drops

    status, out, _ = cli("downgrade", "--help")
    text = " ".join(out.split())
    assert status == 0
    assert "below pgstore_0002 the jobs table;" in text
    assert "below pgstore_0016 the job_history table;" in text
    assert "below pgstore_0014 the job_fences table and store_settings.max_lease_ms;" in text
    assert ("below pgstore_0001 (to base, the default) the schedules and schedule_fences "
            "tables and the store.") in text
    assert "--yes" in text and "type the schema name" in text
    named = re.findall(r"below (pgstore_\d{4}) ", text)
    expected = [
        f"pgstore_{number:04d}" for number in range(int(HEAD.rsplit("_", 1)[1]), 0, -1)
        if declared_drops(f"pgstore_{number:04d}") or number == 1
    ]
    assert named == expected
    for revision, following in zip(named, [*named[1:], None], strict=True):
        start = text.index(f"below {revision} ")
        end = text.index(f"below {following} ") if following else text.index(" Such a downgrade")
        segment = text[start:end]
        for name in declared_drops(revision):
            assert re.search(rf"[ ,]{re.escape(name)}[ ,;.]", segment), (revision, name)


def test_the_declared_drops_are_the_modules_own() -> None:
    """``declared_drops`` reads the modules' text (no import); it answers what alembic's
    import of each module finds, for every revision, and nothing for an unknown one."""
    from alembic.script import ScriptDirectory

    from pgstore.cli.downgrade import declared_drops
    from pgstore.schema.migrations import alembic_config

    script = ScriptDirectory.from_config(alembic_config())
    revisions = [s.revision for s in script.walk_revisions()]
    assert len(revisions) == int(HEAD.rsplit("_", 1)[1])
    for revision in revisions:
        module = script.get_revision(revision).module
        assert declared_drops(revision) == tuple(getattr(module, "DOWNGRADE_DROPS", ())), revision
    assert sum(bool(declared_drops(r)) for r in revisions) >= 10
    with pytest.raises(KeyError):
        declared_drops("pgstore_9999")


def test_the_revisions_a_downgrade_undoes_are_alembics_steps() -> None:
    """Relative targets count from the current revision; a target alembic refuses raises
    alembic's ``CommandError`` with its own message, as ``alembic downgrade`` would."""
    from alembic.util import CommandError

    from pgstore.cli.downgrade import revisions_undone

    assert revisions_undone(None, "base") == []
    assert revisions_undone("pgstore_0010", "-2") == ["pgstore_0010", "pgstore_0009"]
    assert revisions_undone("pgstore_0010", "pgstore_0007") == [
        "pgstore_0010", "pgstore_0009", "pgstore_0008"]
    assert revisions_undone("pgstore_0003", "base") == ["pgstore_0003", "pgstore_0002",
                                                        "pgstore_0001"]
    assert revisions_undone("pgstore_0005", "pgstore_0005") == []
    assert revisions_undone(HEAD, "head") == []
    refused = {
        ("pgstore_0010", "pgstore_9999"): "Can't locate revision identified by 'pgstore_9999'",
        ("pgstore_0005", "pgstore_0010"):
            "Destination pgstore_0010 is not a valid downgrade target from current head(s)",
        ("pgstore_0001", "-2"): "Relative revision -2 didn't produce 2 migrations",
        ("pgstore_0010", "+1"): "Relative revision +1 didn't produce 1 migrations",
    }
    for (current, target), message in refused.items():
        with pytest.raises(CommandError) as caught:
            revisions_undone(current, target)
        assert str(caught.value) == message


def _tables_and_columns(conn: psycopg.Connection[Any], schema: str) -> set[str]:
    """Every table of ``schema`` and every column as ``table.column`` (alembic's version
    table and the downgrades' marks left out: pgstore's bookkeeping, not the store's)."""
    rows = conn.execute(
        "SELECT c.relname, a.attname FROM pg_class c"
        "  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
        " WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r'"
        "   AND c.relname NOT IN ('alembic_version', 'downgrade_marks')",
        (schema,),
    ).fetchall()
    return {r[0] for r in rows} | {f"{r[0]}.{r[1]}" for r in rows}


def test_each_revision_declares_what_its_downgrade_drops_from_the_catalog(
    pgstore_fresh_database: Callable[[], str],
) -> None:
    """Down from head one revision at a time: what leaves the catalog (a dropped table
    counted once, not per column) is exactly what the revision declares."""
    from pgstore.cli.downgrade import declared_drops

    dsn = pgstore_fresh_database()
    migrate(dsn, "decl", client_role=False)
    declared_somewhere = set()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for number in range(int(HEAD.rsplit("_", 1)[1]), 0, -1):
            revision = f"pgstore_{number:04d}"
            before = _tables_and_columns(conn, "decl")
            downgrade(dsn, "decl", "-1", client_role=False)
            after = _tables_and_columns(conn, "decl") if number > 1 else set()
            gone = before - after
            tables = {name for name in gone if "." not in name}
            gone -= {name for name in gone if name.split(".", 1)[0] in tables and "." in name}
            assert gone == set(declared_drops(revision)), revision
            declared_somewhere |= gone
    assert declared_somewhere >= {"jobs", "jobs.lease_sequence", "schedules.catch_up"}


def _on_a_terminal(argv: list[str], typed: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``argv`` with stdin on a pseudo-terminal where ``typed`` has been typed."""
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            argv, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        os.close(slave)
        slave = -1
        os.write(master, typed.encode())
        out, err = proc.communicate(timeout=120)
    finally:
        if slave != -1:
            os.close(slave)
        os.close(master)
    return proc.returncode, out, err


def test_a_downgrade_to_base_on_a_terminal_asks_for_the_schema_name(
    filled: tuple[str, str],
) -> None:
    dsn, schema = filled
    before = _contents(dsn, schema)
    argv = [*pgstore_argv(), "downgrade", "--dsn", dsn, "--schema", schema, "--client-role", "off"]

    for answer in ("y\n", "\x04"):  # "y" is not the name; \x04: end of input
        status, out, err = _on_a_terminal(argv, answer, process_env())
        assert (status, out) == (2, ""), err
        # The prompt (stderr), then the refusal; the typed newline echoes on the terminal.
        assert "Traceback" not in err
        loss, question, *rest = err.split("\n")
        assert loss.startswith(
            f"downgrading schema {schema!r} from {HEAD} to base drops, with the data in them,"
        )
        assert "pgstore_0001: tables schedules (2 rows), schedule_fences (0 rows)" in loss
        assert question.startswith(f"Type the schema name ({schema}) to go ahead")
        refusal = "".join(rest) if answer == "\x04" else question.split("stops: ", 1)[1]
        assert refusal.startswith("pgstore: error: downgrade not confirmed, nothing changed")
        assert _contents(dsn, schema) == before

    status, out, err = _on_a_terminal(argv, f"{schema}\n", process_env())
    assert (status, out) == (0, f"schema {schema!r} is at none (not migrated)\n"), err
    assert _contents(dsn, schema) == {"revision": None, "rows": {}}


