"""``make revision NAME=...``: write the next revision from what sql/ changed.

sql/ is the current schema; a change to it needs a new revision in migrations/versions/
(``NNNN_name.py`` with its ``.up.sql`` and ``.down.sql``). This writes that revision
instead of a person copying function text by hand::

    python -m pgstore.new_revision NAME [--dsn DSN] [--sql DIR] [--migrations DIR]

It loads sql/ into one scratch schema, statement by statement, and migrates another to
the current head with the project's own revisions (alembic, no client role), compares
the two from the catalog, and writes ``NNNN_NAME.py`` (the next number; revision
``pgstore_NNNN``, ``down_revision`` the current head), ``NNNN_NAME.up.sql`` and
``NNNN_NAME.down.sql``:

* a function new in sql/: its statements as sql/ writes them (``CREATE FUNCTION``,
  ``COMMENT ON FUNCTION``, its ``REVOKE``), and ``DROP FUNCTION`` down;
* a function whose definition changed: sql/'s ``CREATE FUNCTION`` as ``CREATE OR
  REPLACE`` (owner, grants and comment kept), with its comment when that changed too;
  down, the head's definition (``pg_get_functiondef``) and comment;
* one whose return type or arguments changed (``CREATE OR REPLACE`` cannot), or whose
  argument types changed (one dropped and one new function of that name): ``DROP`` and
  ``CREATE`` each way, listed in the module's ``BEFORE``/``AFTER`` so
  ``run_sql_replacing_functions`` carries every grant over, as 0011 and 0016 do;
* a comment alone: sql/'s ``COMMENT ON FUNCTION``, the head's back;
* a function gone from sql/: ``DROP FUNCTION``; down, the head's definition again;
* the new ``SECURITY DEFINER`` functions are granted to the client role
  (``client_grants``, the one place that decides it).

Tables, columns, constraints, indexes, triggers, views, sequences and types are compared
too, but never scripted: when they differ it lists each difference in a block marked
``TODO(new_revision)`` at the top of the ``.up.sql`` and the end of the ``.down.sql``,
each followed by a statement that raises until a person writes the change and deletes
the block, guesses ``DOWNGRADE_DROPS`` from the tables and columns sql/ adds, and exits
with status 3. The module's docstring is a skeleton with ``TODO(new_revision)`` marks
for a person to fill (a test refuses a revision that still carries one).

Exit status: 0, a revision written, complete but for its docstring; 3, a revision
written with table changes left to write; 1, nothing written: sql/ describes exactly
what the head builds ("nothing to generate"), or an error (a bad name, a revision of
that number or name already there, sql/ that does not load). The database: ``--dsn``,
else ``PGSTORE_DSN``, else an embedded server under .pgdata/ (as ``make demo``); only
two scratch schemas are made in it, and dropped.

Not part of the library (the wheel leaves it out): it writes pgstore's own
migrations/versions/ in a clone.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgstore.errors import InvalidArgument
from pgstore.schema import objects as _schema
from pgstore.schema.files import REVOKE_FROM_PUBLIC, head_of, migrations_dir, sql_dir
from pgstore.schema.function import Function

__all__ = ["NOTHING", "TODO", "TODO_LEFT", "WRITTEN", "Generated", "generate", "main"]

#: What marks the parts of a generated revision a person must write.
TODO = "TODO(new_revision)"
#: Exit statuses: written; nothing written (no change, or an error); written with a TODO.
WRITTEN, NOTHING, TODO_LEFT = 0, 1, 3

_NAME = re.compile(r"[a-z][a-z0-9_]{0,50}")
_NUMBERED = re.compile(r"(\d{4})_[A-Za-z0-9_]+\.py")
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


# --- sql/ as statements ------------------------------------------------------------------


def _skip_comments(text: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is neither white space
    nor part of a comment."""
    n = len(text)
    while i < n:
        if text[i].isspace():
            i += 1
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif text.startswith("/*", i):
            i = _block_comment_end(text, i)
        else:
            break
    return i


def _block_comment_end(text: str, i: int) -> int:
    depth, i, n = 1, i + 2, len(text)
    while i < n and depth:
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
        else:
            i += 1
    return i


def _quoted_end(text: str, i: int, quote: str, backslash: bool) -> int:
    """The index after the quoted text that starts at ``i`` (``''`` or ``""`` inside it
    stands for one quote; ``backslash``: an E'' string)."""
    i, n = i + 1, len(text)
    while i < n:
        if backslash and text[i] == "\\":
            i += 2
        elif text[i] == quote:
            if text.startswith(quote * 2, i):
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return n


def split_statements(script: str) -> list[str]:
    """The statements of ``script``, each from its first token (the comments and blank
    lines before it left out) through its semicolon; a semicolon inside a string, a
    quoted identifier, a dollar-quoted body or a comment ends nothing."""
    statements: list[str] = []
    n = len(script)
    start = i = _skip_comments(script, 0)
    while i < n:
        c = script[i]
        word_before = i > 0 and (script[i - 1].isalnum() or script[i - 1] in "_$")
        if script.startswith("--", i) or script.startswith("/*", i):
            i = _skip_comments(script, i) if script.startswith("--", i) else (
                _block_comment_end(script, i))
        elif c == "'":
            escaped = i > 0 and script[i - 1] in "eE" and not (
                i > 1 and (script[i - 2].isalnum() or script[i - 2] == "_"))
            i = _quoted_end(script, i, "'", escaped)
        elif c == '"':
            i = _quoted_end(script, i, '"', False)
        elif c == "$" and not word_before and (found := _DOLLAR.match(script, i)):
            end = script.find(found.group(0), found.end())
            i = n if end < 0 else end + len(found.group(0))
        elif c == ";":
            statements.append(script[start : i + 1])
            start = i = _skip_comments(script, i + 1)
        else:
            i += 1
    if script[start:].strip():
        statements.append(script[start:].rstrip() + ";")
    return statements


def _kind(statement: str) -> str:
    words = statement.split(None, 4)
    head = " ".join(w.upper() for w in words[:4])
    if re.match(r"CREATE (OR REPLACE )?FUNCTION", head):
        return "create"
    if head.startswith("COMMENT ON FUNCTION"):
        return "comment"
    if words and words[0].upper() in ("GRANT", "REVOKE"):
        return "acl"
    return "other"


def _or_replace(statement: str) -> str:
    return re.sub(r"^CREATE\s+FUNCTION\b", "CREATE OR REPLACE FUNCTION", statement,
                  count=1, flags=re.IGNORECASE)


# --- the catalog ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fn:
    """A function of a scratch schema, as the catalog describes it."""

    oid: int
    name: str
    quoted: str  # the name as an identifier in SQL text
    types: tuple[str, ...]
    definition: str  # pg_get_functiondef, the schema's name scrubbed
    raw_definition: str  # as the catalog gives it
    comment: str | None
    definer: bool
    result: str
    arguments: str  # pg_get_function_arguments: names, modes and defaults
    acl: tuple[str, ...]

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return (self.name, self.types)

    @property
    def signature(self) -> str:
        return f"{self.quoted}({', '.join(self.types)})"

    @property
    def function(self) -> Function:
        return Function(self.name, self.types)

    @property
    def public_revoked(self) -> bool:
        return not any(entry.startswith("=") for entry in self.acl)


_FUNCTIONS = """
    SELECT p.oid::bigint, p.proname, quote_ident(p.proname),
           ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) t),
           pg_get_functiondef(p.oid), obj_description(p.oid, 'pg_proc'), p.prosecdef,
           pg_get_function_result(p.oid), pg_get_function_arguments(p.oid),
           coalesce(p.proacl, acldefault('f', p.proowner))::text[]
      FROM pg_proc p
     WHERE p.pronamespace = %(schema)s::regnamespace AND p.prokind = 'f'
       AND p.proname <> 'schema_revision'
     ORDER BY p.oid"""

#: The rest of a schema, as (kind, name) -> description; never scripted, only reported.
_OBJECTS = {
    "relation": """
        SELECT c.relname, c.relkind::text || ' ' || coalesce(c.reloptions::text, '')
               || ' comment: ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
               || ' acl: ' || coalesce(c.relacl::text, '-')
          FROM pg_class c
         WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind NOT IN ('i', 'I')""",
    "column": """
        SELECT c.relname || '.' || a.attname,
               format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
               || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
               || coalesce(' COLLATE ' || co.collname, '')
               || ' comment: ' || coalesce(col_description(c.oid, a.attnum), '-')
          FROM pg_class c
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
          LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100
         WHERE c.relnamespace = %(schema)s::regnamespace
           AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')""",
    "constraint": """
        SELECT CASE WHEN conrelid <> 0 THEN conrelid::regclass::text
                    ELSE contypid::regtype::text END || '.' || conname,
               pg_get_constraintdef(oid)
          FROM pg_constraint
         WHERE connamespace = %(schema)s::regnamespace""",
    "index": """
        SELECT i.relname, pg_get_indexdef(i.oid)
               || ' comment: ' || coalesce(obj_description(i.oid, 'pg_class'), '-')
          FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
         WHERE i.relnamespace = %(schema)s::regnamespace""",
    "trigger": """
        SELECT t.tgrelid::regclass::text || '.' || t.tgname, pg_get_triggerdef(t.oid)
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = %(schema)s::regnamespace AND NOT t.tgisinternal""",
    "type": """
        SELECT t.typname, t.typtype::text || ' ' || ARRAY(
                   SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = t.oid
                    ORDER BY e.enumsortorder)::text
          FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
         WHERE t.typnamespace = %(schema)s::regnamespace AND t.typcategory <> 'A'
           AND (t.typrelid = 0 OR c.relkind = 'c')""",
    "other function": """
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
               p.prokind::text
          FROM pg_proc p
         WHERE p.pronamespace = %(schema)s::regnamespace AND p.prokind <> 'f'""",
}

#: pgstore's bookkeeping, not the store's: alembic's version table, the downgrades' marks.
_BOOKKEEPING = re.compile(r"^(alembic_version|downgrade_marks)(_pkc?|\.|$)")


@dataclass
class Schema:
    """What a scratch schema holds."""

    name: str
    functions: dict[tuple[str, tuple[str, ...]], Fn]
    objects: dict[tuple[str, str], str]
    relkinds: dict[str, str]


def _scrub(text: str, schema: str) -> str:
    return text.replace(f'"{schema}"', "<schema>").replace(schema, "<schema>")


def read_schema(conn: psycopg.Connection[Any], schema: str) -> Schema:
    """The functions and the other objects of ``schema`` (types printed as its own
    ``search_path`` sees them: unqualified)."""
    conn.execute(
        "SELECT set_config('search_path', quote_ident(%s) || ', pg_temp', true)", (schema,)
    )
    functions = {}
    for row in conn.execute(_FUNCTIONS, {"schema": schema}):
        oid, name, quoted, types, definition, comment, definer, result, arguments, acl = row
        fn = Fn(int(oid), name, quoted, tuple(types), _scrub(definition, schema), definition,
                comment, bool(definer), _scrub(result, schema), _scrub(arguments, schema),
                tuple(sorted(acl)))
        functions[fn.key] = fn
    objects = {}
    for kind, query in _OBJECTS.items():
        for key, value in conn.execute(query, {"schema": schema}):
            key = _scrub(str(key), schema).removeprefix("<schema>.")
            if not _BOOKKEEPING.match(key):
                objects[(kind, key)] = _scrub(str(value), schema)
    relkinds = {
        name: kind for name, kind in conn.execute(
            "SELECT relname, relkind::text FROM pg_class"
            " WHERE relnamespace = %s::regnamespace", (schema,))
    }
    conn.execute("RESET search_path")
    return Schema(schema, functions, objects, relkinds)


def _snapshot(conn: psycopg.Connection[Any], schema: str) -> dict[int, tuple[str, str | None]]:
    rows = conn.execute(
        "SELECT p.oid::bigint, p.ctid::text, d.ctid::text FROM pg_proc p"
        "  LEFT JOIN pg_description d ON d.objoid = p.oid"
        "   AND d.classoid = 'pg_proc'::regclass AND d.objsubid = 0"
        " WHERE p.pronamespace = %s::regnamespace",
        (schema,),
    ).fetchall()
    return {int(oid): (proc, comment) for oid, proc, comment in rows}


def load_statements(
    conn: psycopg.Connection[Any], schema: str, files: Sequence[Path]
) -> dict[int, list[tuple[int, str, str]]]:
    """Load ``files`` into ``schema`` one statement at a time (as ``objects.load`` loads
    them: in the caller's transaction, ``search_path`` the schema then pg_temp), and
    answer, per function oid, the statements that wrote it (its ``pg_proc`` row or its
    comment): (order, kind, text)."""
    _schema.create(conn, schema)
    written: dict[int, list[tuple[int, str, str]]] = {}
    order = 0
    # The PUBLIC revoke a load of sql/ ends with (files.current_schema_sql), as one more
    # statement: a new function's .up.sql carries it, and the head compares equal.
    texts = [(path.name, path.read_text()) for path in files]
    texts.append(("REVOKE_FROM_PUBLIC", REVOKE_FROM_PUBLIC))
    for name, text in texts:
        for statement in split_statements(text):
            conn.execute(
                "SELECT set_config('search_path', quote_ident(%s) || ', pg_temp', true)",
                (schema,),
            )
            before = _snapshot(conn, schema)
            try:
                conn.execute(statement.encode())
            except psycopg.Error as exc:
                raise InvalidArgument(f"{name}: {exc}".rstrip()) from exc
            after = _snapshot(conn, schema)
            for oid, state in after.items():
                if before.get(oid) != state:
                    written.setdefault(oid, []).append((order, _kind(statement), statement))
            order += 1
    conn.execute("RESET search_path")
    return written


# --- the comparison ----------------------------------------------------------------------


@dataclass
class Changes:
    """What sql/ (``new``) changes against the head (``old``)."""

    added: list[Fn] = field(default_factory=list)
    removed: list[Fn] = field(default_factory=list)
    in_place: list[tuple[Fn, Fn]] = field(default_factory=list)  # (old, new)
    replaced: list[tuple[Fn, Fn]] = field(default_factory=list)  # (old, new)
    objects: list[str] = field(default_factory=list)  # what is not scripted
    drops: list[str] = field(default_factory=list)  # tables and columns sql/ adds

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.in_place or self.replaced
                    or self.objects)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def compare(old: Schema, new: Schema) -> Changes:
    """The differences between the head (``old``) and sql/ (``new``)."""
    changes = Changes()
    added = [f for k, f in new.functions.items() if k not in old.functions]
    removed = [f for k, f in old.functions.items() if k not in new.functions]
    for fn in list(added):  # one signature for another: a function of that name replaced
        twins = [r for r in removed if r.name == fn.name]
        if len(twins) == 1 and len([a for a in added if a.name == fn.name]) == 1:
            changes.replaced.append((twins[0], fn))
            added.remove(fn)
            removed.remove(twins[0])
    changes.added, changes.removed = added, removed
    for key, fn in new.functions.items():
        was = old.functions.get(key)
        if was is None or (was.definition, was.comment, was.acl) == (
            fn.definition, fn.comment, fn.acl
        ):
            continue
        if (was.result, was.arguments) != (fn.result, fn.arguments):
            changes.replaced.append((was, fn))
            continue
        changes.in_place.append((was, fn))
        if was.acl != fn.acl:
            changes.objects.append(
                f"privileges of function {fn.signature}: changed: head {list(was.acl)}; "
                f"sql/ {list(fn.acl)}"
            )
    changes.replaced.sort(key=lambda pair: pair[1].oid)
    for thing in sorted(set(old.objects) | set(new.objects)):
        kind, name = thing
        before, after = old.objects.get(thing), new.objects.get(thing)
        if before == after:
            continue
        if before is None:
            changes.objects.append(
                f"{kind} {name}: in sql/, not at the head: {_one_line(after or '')}")
            table = name.split(".", 1)[0]
            kept = (new.relkinds.get(name) if kind == "relation"
                    else old.relkinds.get(table) if kind == "column" else None)
            if kept in ("r", "p"):  # a table sql/ adds, or a column of one the head has
                changes.drops.append(name)
        elif after is None:
            changes.objects.append(
                f"{kind} {name}: at the head, gone from sql/: {_one_line(before)}")
        else:
            changes.objects.append(
                f"{kind} {name}: changed: head {_one_line(before)}; sql/ {_one_line(after)}"
            )
    return changes


# --- the files -----------------------------------------------------------------------------


def _literal(text: str | None, width: int = 88) -> str:
    """``text`` as an SQL string literal, cut into adjacent literals on lines of about
    ``width`` (PostgreSQL joins literals separated by a newline); NULL for None."""
    if text is None:
        return "NULL"
    pieces, line = [], ""
    for token in re.findall(r"\S+\s*|\s+", text) or [""]:
        if line and len(line) + len(token) > width - 4:
            pieces.append(line)
            line = ""
        line += token
    pieces.append(line)
    return "\n".join("'" + piece.replace("'", "''") + "'" for piece in pieces)


def _portable(fn: Fn, schema: str) -> str:
    """``fn``'s definition from the catalog, runnable in any schema: the function's name
    unqualified and its pinned path ``SET search_path FROM CURRENT`` again."""
    text = re.sub(
        rf'^(CREATE OR REPLACE (?:FUNCTION|PROCEDURE) )"?{re.escape(schema)}"?\.', r"\1",
        fn.raw_definition, count=1,
    )
    text = text.replace(f" SET search_path TO '{schema}', 'pg_temp'",
                        " SET search_path FROM CURRENT")
    if schema in text:
        raise InvalidArgument(f"{fn.signature}: its definition names the schema itself")
    return text.rstrip() + ";"


def _comment(fn: Fn, text: str | None) -> str:
    return f"COMMENT ON FUNCTION {fn.signature} IS\n{_literal(text)};"


def _revoke(fn: Fn) -> str:
    return f"REVOKE ALL ON FUNCTION {fn.signature} FROM PUBLIC;"


def _statements(written: dict[int, list[tuple[int, str, str]]], fn: Fn,
                kinds: Sequence[str]) -> list[tuple[int, str]]:
    return [(order, text) for order, kind, text in written.get(fn.oid, []) if kind in kinds]


def up_sql(changes: Changes, written: dict[int, list[tuple[int, str, str]]]) -> list[str]:
    """The upgrade's statements, in sql/'s order: what sql/ writes for each new, changed
    or replaced function, a DROP before each replaced one, then the DROP of each
    function gone from sql/."""
    placed: dict[int, str] = {}
    for fn in changes.added:
        placed.update(_statements(written, fn, ("create", "comment", "acl", "other")))
    for old, fn in changes.replaced:
        found = _statements(written, fn, ("create", "comment", "acl", "other"))
        first = min(order for order, _ in found)
        placed.update(found)
        placed[first] = f"DROP FUNCTION {old.signature};\n\n{placed[first]}"
    for old, fn in changes.in_place:
        kinds = ["create", "other"] if old.definition != fn.definition else []
        if old.comment != fn.comment:
            kinds.append("comment")
        if old.acl != fn.acl:
            kinds.append("acl")
        placed.update((order, _or_replace(text)) for order, text in _statements(written, fn, kinds))
    lines = [placed[order] for order in sorted(placed)]
    lines += [f"DROP FUNCTION {fn.signature};" for fn in changes.removed]
    return lines


def down_sql(changes: Changes, head: str) -> list[str]:
    """The downgrade's statements: each changed, replaced or dropped function as the head
    defines it (its definition, comment and PUBLIC revoke), in the head's order, then
    the DROP of each new one."""
    restored: list[tuple[int, str]] = []
    for old, fn in changes.in_place:
        parts = [_portable(old, head)] if old.definition != fn.definition else []
        if old.comment != fn.comment:
            parts.append(_comment(old, old.comment))
        restored.append((old.oid, "\n\n".join(parts)))
    for old, fn in changes.replaced:
        parts = [f"DROP FUNCTION {fn.signature};", _portable(old, head), _comment(old, old.comment)]
        if old.public_revoked:
            parts.append(_revoke(old))
        restored.append((old.oid, "\n\n".join(parts)))
    for old in changes.removed:
        parts = [_portable(old, head), _comment(old, old.comment)]
        if old.public_revoked:
            parts.append(_revoke(old))
        restored.append((old.oid, "\n\n".join(parts)))
    lines = [text for _, text in sorted(restored)]
    lines += [f"DROP FUNCTION {fn.signature};" for fn in reversed(changes.added)]
    return lines


def _quote(text: str) -> str:
    """``text`` as a Python string literal in double quotes, the house style."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tuple(items: Sequence[str]) -> str:
    if len(items) == 1:
        return f"({_quote(items[0])},)"
    return "(" + ", ".join(_quote(item) for item in items) + ")"


def _functions_literal(functions: Sequence[Fn]) -> str:
    def one(fn: Fn) -> str:
        return f"    Function({_quote(fn.name)}, {_tuple(fn.types)}),"

    return "(\n" + "\n".join(one(fn) for fn in functions) + "\n)"


@dataclass
class Grants:
    """What a revision module says about the client role's grants."""

    constants: list[str]
    upgrade: list[str]
    downgrade: list[str]


def client_grants(added: Sequence[Fn], removed: Sequence[Fn]) -> Grants:
    """The one place that decides the client role's grants in a generated revision. New
    ``SECURITY DEFINER`` functions: ``grant_client_role()`` with no list, after the SQL
    (the client role's functions read from ``pg_proc`` by one rule,
    ``catalog.client_functions``: an owner-only one is named in ``catalog.OWNER_ONLY``
    first). Dropped ones are granted back the same way on downgrade. A replaced function
    keeps its grants (``run_sql_replacing_functions``)."""
    grants = Grants([], [], [])
    if any(fn.definer for fn in added):
        grants.upgrade.append("grant_client_role()")
    if any(fn.definer for fn in removed):
        grants.downgrade.append("grant_client_role()")
    return grants


def _names(functions: Sequence[Fn]) -> str:
    return ", ".join(f"``{fn.signature}``" for fn in functions)


def module_text(number: str, name: str, head: str, changes: Changes) -> str:
    """The revision module: a docstring skeleton, the ids, ``DOWNGRADE_DROPS``, the
    replaced functions and the grants, and upgrade/downgrade as 0016 runs them."""
    revision = f"pgstore_{number}"
    said = []
    if changes.added:
        said.append(f"New: {_names(changes.added)}.")
    bodies = [fn for old, fn in changes.in_place if old.definition != fn.definition]
    comments = [fn for old, fn in changes.in_place if old.definition == fn.definition]
    if bodies:
        said.append(
            f"Changed (CREATE OR REPLACE: owners and grants kept): {_names(bodies)}.")
    if comments:
        said.append(f"Comments only: {_names(comments)}.")
    if changes.replaced:
        said.append(
            "Dropped and created again (a new return type or arguments; whoever could "
            f"execute the one before may execute the new one, and back): "
            f"{_names([fn for _, fn in changes.replaced])}."
        )
    if changes.removed:
        said.append(f"Dropped: {_names(changes.removed)}.")
    said.append(
        f"{TODO}: table changes, written by hand: see the .up.sql." if changes.objects
        else "No table changes."
    )
    summary = "\n\n".join(textwrap.fill(s, 80) for s in said)
    grants = client_grants(changes.added, changes.removed)
    steps = ["run_sql_beside", "set_schema_revision"]
    if changes.replaced:
        steps[0] = "run_sql_replacing_functions"
    if grants.upgrade or grants.downgrade:
        steps.append("grant_client_role")
    imports = ", ".join(sorted(steps))
    line = f"from pgstore.schema.alembic_steps import {imports}"
    if len(line) > 100:
        line = "from pgstore.schema.alembic_steps import (\n" + "".join(
            f"    {step},\n" for step in sorted(steps)) + ")"
    if changes.replaced or grants.constants:
        line += "\nfrom pgstore.schema.function import Function"
    drops = _tuple(changes.drops)
    guess = (
        f"#: {TODO}: new_revision's guess from the tables and columns sql/ adds; check it\n"
        "#: against the downgrade you write, then delete this line and the one above.\n"
        if changes.objects else ""
    )
    constants = [
        guess
        + "#: What this revision's downgrade drops, and the data in it: tables, and columns as\n"
        "#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this\n"
        "#: against what the downgrade drops from the catalog).\n"
        f"DOWNGRADE_DROPS: tuple[str, ...] = {drops}"
    ]
    if changes.replaced:
        constants.append(
            "#: The functions this revision drops and creates again (a new return type or new\n"
            "#: arguments): whoever could execute one at the revision before may execute it at\n"
            "#: this one, and back.\n"
            f"BEFORE = {_functions_literal([old for old, _ in changes.replaced])}\n"
            f"AFTER = {_functions_literal([fn for _, fn in changes.replaced])}"
        )
    if grants.constants:
        constants.append("\n".join(grants.constants))
    if changes.replaced:
        up_run = ('run_sql_replacing_functions(\n        __file__, f"{_NAME}.up.sql", '
                  "list(zip(BEFORE, AFTER, strict=True))\n    )")
        down_run = ('run_sql_replacing_functions(\n        __file__, f"{_NAME}.down.sql", '
                    "list(zip(AFTER, BEFORE, strict=True))\n    )")
    else:
        up_run = 'run_sql_beside(__file__, f"{_NAME}.up.sql")'
        down_run = 'run_sql_beside(__file__, f"{_NAME}.down.sql")'
    upgrade = "".join(
        f"    {s}\n" for s in [up_run, *grants.upgrade, "set_schema_revision(revision)"]
    )
    downgrade = "".join(
        f"    {s}\n" for s in [down_run, *grants.downgrade, "set_schema_revision(down_revision)"]
    )
    return f'''"""pgstore {number}: {TODO}: one line, what this revision changes.

{TODO}: why; what it costs or saves (figures from a run, when it is about
cost); what its downgrade keeps and loses. Written by ``make revision
NAME={name}`` from sql/.

{summary}

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: {revision}
Revises: {head}
"""

from __future__ import annotations

from pathlib import Path

{line}

revision = "{revision}"
down_revision = "{head}"
branch_labels = None
depends_on = None

{chr(10).join(f"{c}{chr(10)}" for c in constants)}
_NAME = Path(__file__).stem


def upgrade() -> None:
{upgrade}

def downgrade() -> None:
{downgrade}'''


def _todo_block(stem: str, direction: str, objects: Sequence[str]) -> str:
    where = ("here, before the functions below (they may use it)" if direction == "up"
             else "here, after the functions above")
    listed = "".join(f"--   {line}\n" for line in objects)
    message = f"{TODO}: {stem}.{direction}.sql: the table changes are not written yet"
    return (
        f"-- {TODO}: sql/ changes what new_revision does not script.\n"
        f"-- Write it {where},\n"
        f"-- then delete this block and the statement that ends it:\n{listed}"
        f"DO $todo$ BEGIN RAISE EXCEPTION {_literal(message, 200)}; END $todo$;"
    )


# --- running it ----------------------------------------------------------------------------


@dataclass
class Generated:
    """What ``generate`` did: the files it wrote (none when nothing changed), the exit
    status, and what to say."""

    status: int
    message: str
    files: list[Path] = field(default_factory=list)


@contextmanager
def _head_schema(dsn: str, migrations: Path, schema: str) -> Iterator[None]:
    from alembic import command

    from pgstore.schema.migrations import alembic_config

    cfg = alembic_config(dsn, schema, client_role=False)
    cfg.set_main_option("script_location", str(migrations))
    try:
        command.upgrade(cfg, "head")
        yield
    finally:
        conn: psycopg.Connection[Any]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def next_number(versions: Path) -> str:
    """The number after the highest of the revision modules in ``versions``."""
    numbers = [int(m.group(1)) for p in versions.glob("*.py") if (m := _NUMBERED.fullmatch(p.name))]
    return f"{max(numbers, default=0) + 1:04d}"


def generate(name: str, dsn: str, sql: Path | None = None, migrations: Path | None = None
             ) -> Generated:
    """Write the revision ``name`` for what ``sql`` (default: the tree's sql/) changes
    against the head of ``migrations`` (default: the tree's migrations/), comparing them
    in scratch schemas of the database ``dsn``. Raises ``InvalidArgument`` for a bad
    name, an existing revision of that number or name, or sql/ that does not load."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidArgument(
            f"a revision name is lower-case letters, digits and _ (at most 51), not {name!r}")
    sql_files = sorted((sql or sql_dir()).glob("*.sql"))
    migrations = migrations or migrations_dir()
    versions = migrations / "versions"
    head = head_of(versions)
    number = next_number(versions)
    stem = f"{number}_{name}"
    taken = sorted(p.name for p in versions.glob(f"*_{name}.*")) + sorted(
        p.name for p in versions.glob(f"{number}_*"))
    if taken:
        raise InvalidArgument(f"{versions}: already there: {', '.join(taken)}")
    scratch = uuid.uuid4().hex[:10]
    head_schema, sql_schema = f"pgstore_revision_head_{scratch}", f"pgstore_revision_sql_{scratch}"
    conn: psycopg.Connection[Any]
    with _head_schema(dsn, migrations, head_schema), psycopg.connect(dsn) as conn:
        try:
            written = load_statements(conn, sql_schema, sql_files)
            old, new = read_schema(conn, head_schema), read_schema(conn, sql_schema)
            changes = compare(old, new)
            if not changes:
                return Generated(NOTHING, (
                    f"nothing to generate: sql/ describes what {head} builds (functions, "
                    "comments, tables, indexes, types); no file written"))
            up, down = up_sql(changes, written), down_sql(changes, head_schema)
        finally:
            conn.rollback()  # the sql/ schema goes with the transaction
    # No TODO here: the module's docstring is the one place a person writes what and why.
    heading = (f"-- pgstore {number}, %s: written by make revision from sql/; "
               f"{stem}.py says what and why.\n\n")
    if changes.objects:
        up.insert(0, _todo_block(stem, "up", changes.objects))
        down.append(_todo_block(stem, "down", changes.objects))
    files = [versions / f"{stem}.py", versions / f"{stem}.up.sql", versions / f"{stem}.down.sql"]
    files[0].write_text(module_text(number, name, head, changes))
    files[1].write_text(heading % "upgrade" + "\n\n".join(up) + "\n")
    files[2].write_text(heading % "downgrade" + "\n\n".join(down) + "\n")
    said = (f"wrote {', '.join(p.name for p in files)} in {versions} (revision pgstore_{number},"
            f" revising {head}): fill in its docstring")
    if changes.objects:
        count = len(changes.objects)
        return Generated(TODO_LEFT, (
            f"{said}, and write by hand what it marks {TODO}: {count} "
            f"{'difference' if count == 1 else 'differences'} in tables, columns, indexes or "
            "types, which it does not script"), files)
    return Generated(WRITTEN, said, files)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pgstore.new_revision NAME``: the exit status (see the module)."""
    parser = argparse.ArgumentParser(
        prog="python -m pgstore.new_revision",
        description="Write the next revision in migrations/versions/ from what sql/ changed.",
    )
    parser.add_argument("name", help="the revision's name, e.g. job_reschedule")
    parser.add_argument("--dsn", default=os.environ.get("PGSTORE_DSN", ""),
                        help="a database for two scratch schemas (default: $PGSTORE_DSN, else "
                        "an embedded server under .pgdata/)")
    parser.add_argument("--sql", type=Path, default=None, help="the sql/ to read")
    parser.add_argument("--migrations", type=Path, default=None,
                        help="the migrations/ to add to (its versions/)")
    args = parser.parse_args(argv)
    try:
        if args.dsn:
            done = generate(args.name, args.dsn, args.sql, args.migrations)
        else:
            from pgstore._embedded import local_server

            with local_server("revision") as uri:
                done = generate(args.name, uri, args.sql, args.migrations)
    except (InvalidArgument, RuntimeError, psycopg.Error) as exc:
        print(f"new_revision: error: {exc}", file=sys.stderr)
        return NOTHING
    print(f"new_revision: {done.message}", file=sys.stderr if done.status else sys.stdout)
    return done.status


if __name__ == "__main__":
    sys.exit(main())
