"""``make revision``: the revision generator (``pgstore.new_revision``), run on a copy.

Each test copies the tree's sql/ and migrations/ into a temporary directory, changes
the copied sql/, runs the generator against that copy, and then migrates real schemas
through what it wrote: up, the result equal to a fresh load of the copied sql/; down,
equal to the head before it, grants included.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from alembic import command
from psycopg.conninfo import conninfo_to_dict

import pgstore
from pgstore.new_revision import NOTHING, TODO, TODO_LEFT, WRITTEN, generate, split_statements
from pgstore.schema import objects as _schema
from pgstore.schema.files import REVOKE_FROM_PUBLIC, migrations_dir, schema_revision_sql, sql_dir
from pgstore.schema.migrations import alembic_config
from tests.support.catalog import catalog

HEAD = pgstore.HEAD_REVISION
NEXT = f"{int(HEAD.rsplit('_', 1)[1]) + 1:04d}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the tree's sql/ and migrations/ (without caches)."""
    shutil.copytree(sql_dir(), tmp_path / "sql")
    shutil.copytree(migrations_dir(), tmp_path / "migrations",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path.name, old)
    path.write_text(text.replace(old, new))


def _migrate(dsn: str, schema: str, tree: Path, revision: str, *, down: bool = False,
             client_role: bool = False) -> None:
    cfg = alembic_config(dsn, schema, client_role=client_role)
    cfg.set_main_option("script_location", str(tree / "migrations"))
    (command.downgrade if down else command.upgrade)(cfg, revision)


def _fresh_load(dsn: str, schema: str, tree: Path, revision: str) -> None:
    files = [p.read_text() for p in sorted((tree / "sql").glob("*.sql"))]
    with psycopg.connect(dsn) as conn:
        _schema.load(
            conn, schema, "\n".join([*files, REVOKE_FROM_PUBLIC, schema_revision_sql(revision)])
        )


def _catalog(dsn: str, schema: str) -> dict[str, list[tuple[object, ...]]]:
    with psycopg.connect(dsn) as conn:
        return catalog(conn, schema)


def _executes(dsn: str, role: str, signature: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, signature)
        ).fetchone()
    return bool(row and row[0])


NEW_FUNCTION = """
CREATE FUNCTION job_count_due(p_now bigint) RETURNS bigint
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    -- a semicolon; in a comment, and 'a quote;' in a string: one statement still
    RETURN (SELECT count(*) FROM jobs j
             WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
               AND j.dispatch_at <= coalesce(p_now, now_ms()));
END
$$;

COMMENT ON FUNCTION job_count_due(bigint) IS
'How many jobs wait and are due at p_now (NULL: now_ms()); it''s the generator test''s.';
"""


def _change_functions(tree: Path) -> None:
    """Every kind of function change the generator scripts, in the copied sql/."""
    jobs = tree / "sql" / "21_job_functions.sql"
    # new, SECURITY DEFINER: granted to the client role
    jobs.write_text(jobs.read_text() + NEW_FUNCTION)
    # a body changed in place (an inlined SQL helper)
    _edit(tree / "sql" / "22_job_batches.sql", "AS $$ SELECT 10000 $$;", "AS $$ SELECT 5000 $$;")
    # a comment alone
    _edit(tree / "sql" / "00_common.sql", "'The database clock (clock_timestamp()) in epoch",
          "'The database''s clock (clock_timestamp()) in epoch")
    # a new return type: dropped and created, its grants carried over
    _edit(jobs, "CREATE FUNCTION job_channel() RETURNS text",
          "CREATE FUNCTION job_channel() RETURNS varchar")
    # a new signature: the old one dropped, the new one created, grants carried over
    _edit(jobs, "CREATE FUNCTION job_get(p_run_id text) RETURNS SETOF jobs",
          "CREATE FUNCTION job_get(p_run_id text, p_verbose boolean DEFAULT false)"
          " RETURNS SETOF jobs")
    _edit(jobs, "COMMENT ON FUNCTION job_get(text) IS\n'The job p_run_id: zero or one row.';",
          "COMMENT ON FUNCTION job_get(text, boolean) IS\n"
          "'The job p_run_id: zero or one row (p_verbose: no difference yet).';")
    # gone from sql/
    text = jobs.read_text()
    start = text.index("CREATE FUNCTION job_list_dispatched()")
    end = text.index("CREATE FUNCTION job_remove(")
    jobs.write_text(text[:start] + text[end:])


def _module(path: Path) -> dict[str, object]:
    """The revision module's top-level literals."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        if isinstance(target, ast.Name) and isinstance(node, (ast.Assign, ast.AnnAssign)):
            try:
                found[target.id] = ast.literal_eval(node.value) if node.value else None
            except ValueError:
                found[target.id] = ast.unparse(node.value) if node.value else None
    return found


def test_a_generated_revision_migrates_up_to_sql_and_back_down_to_the_head(
    tree: Path, pgstore_fresh_database: Callable[[], str],
) -> None:
    dsn = pgstore_fresh_database()
    _change_functions(tree)
    done = generate("test_change", dsn, tree / "sql", tree / "migrations")
    assert done.status == WRITTEN, done.message
    versions = tree / "migrations" / "versions"
    stem = f"{NEXT}_test_change"
    assert [p.name for p in done.files] == [f"{stem}.py", f"{stem}.up.sql", f"{stem}.down.sql"]
    assert "nothing to generate" not in done.message

    module = _module(versions / f"{stem}.py")
    assert module["revision"] == f"pgstore_{NEXT}" and module["down_revision"] == HEAD
    assert module["DOWNGRADE_DROPS"] == ()
    text = (versions / f"{stem}.py").read_text()
    # grants derived from pg_proc after the SQL, both ways (a function added, one dropped)
    assert text.count("    grant_client_role()\n") == 2
    assert 'AFTER = (\n    Function("job_channel", ()),\n    Function("job_get", ("text", "boolean")),' in text
    assert "Comments only: ``now_ms()``." in text
    assert text.count(TODO) == 2  # the docstring's skeleton, for a person to fill
    assert "run_sql_replacing_functions" in text and "set_schema_revision(revision)" in text
    up = (versions / f"{stem}.up.sql").read_text()
    down = (versions / f"{stem}.down.sql").read_text()
    # sql/'s own text for what it adds and changes, the catalog's for what it restores
    assert NEW_FUNCTION.strip().split("\n\n")[0].strip() in up
    assert "CREATE OR REPLACE FUNCTION batch_max() RETURNS integer" in up
    assert "CREATE OR REPLACE FUNCTION now_ms()" not in up + down  # only its comment changed
    assert "COMMENT ON FUNCTION now_ms() IS\n'The database''s clock" in up
    assert "COMMENT ON FUNCTION now_ms() IS\n'The database clock" in down
    assert "DROP FUNCTION job_channel();\n\nCREATE FUNCTION job_channel() RETURNS varchar" in up
    assert "DROP FUNCTION job_get(text);" in up and "DROP FUNCTION job_list_dispatched();" in up
    assert "REVOKE ALL ON ALL ROUTINES IN SCHEMA" in up  # what a load of sql/ ends with
    assert "DROP FUNCTION job_count_due(bigint);" in down
    assert "CREATE OR REPLACE FUNCTION job_list_dispatched()" in down
    assert "SET search_path FROM CURRENT" in down and "pgstore_revision_" not in up + down
    # the module passes the project's linter as written (ruff reads the tree's config)
    ruff = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--config", str(Path.cwd() / "pyproject.toml"),
         str(versions / f"{stem}.py")], capture_output=True, text=True, timeout=120)
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr

    # Up through it: what a fresh load of the copied sql/ builds, every catalog part.
    _migrate(dsn, "rev_up", tree, "head")
    _fresh_load(dsn, "rev_fresh", tree, f"pgstore_{NEXT}")
    upgraded, fresh = _catalog(dsn, "rev_up"), _catalog(dsn, "rev_fresh")
    for part in fresh:
        assert upgraded[part] == fresh[part], part
    names = {row[0] for row in fresh["functions"]}
    assert "job_count_due" in names and "job_list_dispatched" not in names

    # With the client role: up keeps every grant and grants the new function; down puts
    # the head back exactly, privileges included.
    _migrate(dsn, "rev_cycle", tree, HEAD, client_role=True)
    role = f"rev_cycle_client_{conninfo_to_dict(dsn)['dbname']}"
    before = _catalog(dsn, "rev_cycle")
    _migrate(dsn, "rev_cycle", tree, "head", client_role=True)
    for signature in ("job_count_due(bigint)", "job_get(text, boolean)", "job_channel()",
                      "job_lease(text, bigint, bigint, text[])"):
        assert _executes(dsn, role, f"rev_cycle.{signature}"), signature
    _migrate(dsn, "rev_cycle", tree, "-1", down=True, client_role=True)
    after = _catalog(dsn, "rev_cycle")
    for part in before:
        assert after[part] == before[part], part
    assert _executes(dsn, role, "rev_cycle.job_list_dispatched()")
    assert _executes(dsn, role, "rev_cycle.job_get(text)")


def test_nothing_to_generate_writes_nothing_and_says_so(
    tree: Path, pgstore_fresh_database: Callable[[], str],
) -> None:
    """sql/ unchanged: exit status 1, a message naming the head, no file written."""
    dsn = pgstore_fresh_database()
    versions = tree / "migrations" / "versions"
    listed = sorted(p.name for p in versions.iterdir())
    done = generate("idle", dsn, tree / "sql", tree / "migrations")
    assert (done.status, done.files) == (NOTHING, [])
    assert done.message.startswith(f"nothing to generate: sql/ describes what {HEAD} builds")
    run = subprocess.run(
        [sys.executable, "-m", "pgstore.new_revision", "idle", "--dsn", dsn,
         "--sql", str(tree / "sql"), "--migrations", str(tree / "migrations")],
        capture_output=True, text=True, timeout=300,
    )
    assert (run.returncode, run.stdout) == (NOTHING, "")
    assert run.stderr.startswith("new_revision: nothing to generate:"), run.stderr
    # a name the generator refuses, and one already taken: status 1, nothing written
    for name in ("Bad-Name", "stats_history"):
        run = subprocess.run(
            [sys.executable, "-m", "pgstore.new_revision", name, "--dsn", dsn,
             "--sql", str(tree / "sql"), "--migrations", str(tree / "migrations")],
            capture_output=True, text=True, timeout=300,
        )
        assert run.returncode == NOTHING and run.stderr.startswith("new_revision: error:"), name
    assert sorted(p.name for p in versions.iterdir()) == listed


def test_table_changes_are_left_to_a_person_marked_and_failing(
    tree: Path, pgstore_fresh_database: Callable[[], str],
) -> None:
    """A new column and a new table: the functions part is written, the tables part is a
    TODO that raises if run, DOWNGRADE_DROPS guesses what the downgrade drops; status 3."""
    dsn = pgstore_fresh_database()
    jobs_sql = tree / "sql" / "20_jobs.sql"
    jobs_sql.write_text(
        jobs_sql.read_text()
        + "\nALTER TABLE jobs ADD COLUMN note text;\n"
        + "CREATE TABLE job_notes (run_id text PRIMARY KEY, note text NOT NULL);\n"
    )
    (tree / "sql" / "21_job_functions.sql").write_text(
        (tree / "sql" / "21_job_functions.sql").read_text() + NEW_FUNCTION)
    done = generate("notes", dsn, tree / "sql", tree / "migrations")
    assert done.status == TODO_LEFT, done.message
    assert TODO in done.message
    versions = tree / "migrations" / "versions"
    module = _module(versions / f"{NEXT}_notes.py")
    assert sorted(module["DOWNGRADE_DROPS"]) == ["job_notes", "jobs.note"]  # type: ignore[call-overload]
    up = (versions / f"{NEXT}_notes.up.sql").read_text()
    assert up.index(TODO) < up.index("CREATE FUNCTION job_count_due")
    for line in ("column jobs.note: in sql/, not at the head: text",
                 "relation job_notes: in sql/, not at the head",
                 "index job_notes_pkey: in sql/, not at the head"):
        assert line in up, line
    assert TODO in (versions / f"{NEXT}_notes.down.sql").read_text()
    _migrate(dsn, "rev_todo", tree, HEAD)
    with pytest.raises(psycopg.errors.RaiseException, match=r"TODO\(new_revision\)"):
        _migrate(dsn, "rev_todo", tree, "head")
    with psycopg.connect(dsn) as conn:  # the failed upgrade changed nothing
        row = conn.execute("SELECT rev_todo.schema_revision()").fetchone()
    assert row == (HEAD,)


def test_statements_split_where_sql_ends_them() -> None:
    script = (
        "-- a comment; with a semicolon\n"
        "CREATE FUNCTION f() RETURNS text LANGUAGE sql AS $$ SELECT 'a;b' $$;\n\n"
        "/* block; /* nested; */ still; */ COMMENT ON FUNCTION f() IS 'it''s; one';\n"
        "SELECT $tag$ $$; $tag$, \"quoted;name\", E'back\\'slash;';\n"
        "SELECT $1 + 1; SELECT 2"
    )
    assert split_statements(script) == [
        "CREATE FUNCTION f() RETURNS text LANGUAGE sql AS $$ SELECT 'a;b' $$;",
        "COMMENT ON FUNCTION f() IS 'it''s; one';",
        "SELECT $tag$ $$; $tag$, \"quoted;name\", E'back\\'slash;';",
        "SELECT $1 + 1;",
        "SELECT 2;",
    ]
    # the tree's sql/: one statement per CREATE FUNCTION and COMMENT ON, each from its
    # first word (no comment before it) to its semicolon
    for path in sorted(sql_dir().glob("*.sql")):
        text = path.read_text()
        statements = split_statements(text)
        assert all(s.endswith(";") and s[0].isalpha() for s in statements), path.name
        for opening in ("CREATE FUNCTION", "COMMENT ON FUNCTION", "REVOKE ALL ON FUNCTION"):
            starting = [s for s in statements if s.startswith(opening)]
            assert len(starting) == len(re.findall(rf"^{opening}", text, re.M)), (path, opening)


def test_no_revision_keeps_the_generators_todo() -> None:
    """What ``make revision`` leaves for a person to write is written before a merge."""
    from pgstore.schema.files import versions_dir

    for path in sorted(versions_dir().iterdir()):
        if path.suffix in (".py", ".sql"):
            assert TODO not in path.read_text(), path.name
