"""Where the SQL and the migrations live: inside the wheel, or in the source tree."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent


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


def current_schema_sql() -> str:
    """The whole current schema: every file of sql/ in name order."""
    return "\n".join(p.read_text() for p in sorted(sql_dir().glob("*.sql")))

