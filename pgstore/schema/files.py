"""Where the SQL and the migrations live (inside the wheel, or in the source tree), and
which revision is the head.

The head revision is named in one place: the ``revision = "..."`` line of the newest
revision module in migrations/versions/ (the one no other revision names as its
``down_revision``). ``head_revision()`` reads it from the modules' text, without
importing alembic, and ``current_schema_sql()`` makes a fresh load of sql/ answer it
from ``schema_revision()``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from pgstore.errors import InvalidArgument

_PACKAGE = Path(__file__).resolve().parent.parent

#: A revision module's ``revision = "id"`` or ``down_revision = "id"`` (or ``None``, or a
#: tuple of ids for a merge) line.
_REVISION_LINE = re.compile(r"^(revision|down_revision)\s*(?::[^=]*)?=\s*(.*?)\s*$", re.M)
_QUOTED = re.compile(r"""["']([^"']+)["']""")
#: What ``schema_revision()`` may return: its body quotes it as an SQL literal.
_REVISION_ID = re.compile(r"[A-Za-z0-9_]{1,63}")


def _locate(name: str) -> Path:
    # The wheel ships sql/ and migrations/ inside the package; a source
    # checkout (and an editable install) keeps them beside it.
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"pgstore's {name}/ directory is missing from {_PACKAGE}")


def sql_dir() -> Path:
    """The directory of the current schema's SQL files, loaded in name order."""
    return _locate("sql")


def migrations_dir() -> Path:
    """The alembic script directory (env.py and versions/)."""
    return _locate("migrations")


def versions_dir() -> Path:
    """The revisions, for a host app's ``version_locations``."""
    return migrations_dir() / "versions"


def head_of(directory: Path) -> str:
    """The head of the revision modules in ``directory``: the one revision that no other
    names as its ``down_revision``. ``RuntimeError`` when there is not exactly one."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in sorted(directory.glob("*.py")):
        lines = dict(
            (m.group(1), m.group(2)) for m in _REVISION_LINE.finditer(path.read_text())
        )
        if "revision" not in lines:
            continue
        found = _QUOTED.fullmatch(lines["revision"])
        if found is None:
            raise RuntimeError(f"{path}: revision is not one quoted id: {lines['revision']}")
        revisions.add(found.group(1))
        revised.update(_QUOTED.findall(lines.get("down_revision", "")))
    heads = sorted(revisions - revised)
    if len(heads) != 1:
        raise RuntimeError(f"{directory}: expected one head revision, found {heads}")
    return heads[0]


@functools.cache
def head_revision() -> str:
    """The migration head: the newest revision in ``versions_dir()`` (``head_of``), read
    once per process."""
    return head_of(versions_dir())


def schema_revision_sql(revision_id: str) -> str:
    """The statement that makes ``schema_revision()`` return ``revision_id`` (CREATE OR
    REPLACE: owner, grants and comment kept), run in the target schema."""
    if _REVISION_ID.fullmatch(revision_id) is None:
        raise InvalidArgument(f"not a revision id: {revision_id!r}")
    return (
        "CREATE OR REPLACE FUNCTION schema_revision() RETURNS text\n"
        "LANGUAGE sql IMMUTABLE\n"
        "SECURITY DEFINER\n"
        "SET search_path FROM CURRENT\n"
        f"AS $$ SELECT '{revision_id}'::text $$;\n"
    )


#: Revoke every privilege ``PUBLIC`` holds on any function of the schema being loaded
#: (its ``search_path`` comes first): what a fresh load of sql/ ends with
#: (``current_schema_sql``) and what a revision that creates functions runs after its SQL
#: (``alembic_steps.revoke_from_public``). A new function needs no ``REVOKE`` of its own.
#:
#: Dynamic SQL, for one statement: ``REVOKE ... ON ALL ROUTINES IN SCHEMA`` must name
#: the schema, which the SQL never spells (it runs in whichever schema it is loaded
#: into), so the name is read from ``current_schema()`` and quoted with ``%I``. The
#: static alternative is a ``REVOKE`` per signature: the hand-kept list this replaces.
REVOKE_FROM_PUBLIC = (
    "DO $revoke$ BEGIN\n"
    "    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA %I FROM PUBLIC', current_schema());\n"
    "END $revoke$;\n"
)


def current_schema_sql(directory: Path | None = None) -> str:
    """The whole current schema: every file of sql/ (or ``directory``) in name order, then
    ``REVOKE_FROM_PUBLIC`` and ``schema_revision_sql(head_revision())``: sql/ names no
    revision, so a fresh load answers the head from ``schema_revision()``, as
    ``upgrade head`` does (``CREATE OR REPLACE`` keeps the revoked privileges)."""
    files = [p.read_text() for p in sorted((directory or sql_dir()).glob("*.sql"))]
    return "\n".join([*files, REVOKE_FROM_PUBLIC, schema_revision_sql(head_revision())])
