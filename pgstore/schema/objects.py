"""Loading SQL into a chosen schema, and removing an emptied one.

The SQL files name no schema: they are run with ``search_path`` set to
``<schema>, pg_temp`` and every function pins that path with
``SET search_path FROM CURRENT``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from pgstore.errors import InvalidArgument

#: The migration revision that sql/ describes; sql/00_common.sql's schema_revision() returns it.
HEAD_REVISION = "pgstore_0014"

#: The schema a store uses when none is named.
DEFAULT_SCHEMA = "pgstore"


#: C0 and C1 control characters and DEL: never meaningful in a name (see docs/security.md).
_CONTROL = frozenset(chr(c) for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)])


def check_name(name: object, what: str = "schema") -> str:
    """A schema or role name PostgreSQL keeps as given: a non-empty string of at most 63
    bytes of UTF-8 (longer identifiers are silently truncated by the server), without
    control characters (C0, DEL, C1; NUL included). ``InvalidArgument`` otherwise.

    Every statement quotes names as identifiers, so this check is defence in depth,
    not what keeps a name out of the SQL text."""
    try:
        size = len(name.encode()) if isinstance(name, str) else 0
    except UnicodeEncodeError:
        size = 0
    if not isinstance(name, str) or not 0 < size <= 63:
        raise InvalidArgument(f"{what} must be a non-empty identifier of at most 63 bytes")
    if not _CONTROL.isdisjoint(name):
        raise InvalidArgument(f"{what} name {name!r} contains a control character")
    return name


def check_schema(schema: object) -> str:
    """``check_name`` for a schema."""
    return check_name(schema, "schema")


def identifier_for_params(*names: str) -> sql.SQL:
    """The dotted, quoted identifier ``names`` with every ``%`` doubled, for a statement
    that is also given parameters: psycopg then reads ``%`` as a placeholder mark, even
    inside a quoted identifier."""
    quoted = sql.SQL(".").join(sql.Identifier(name) for name in names).as_string(None)
    return sql.SQL(quoted.replace("%", "%%"))


def load(conn: psycopg.Connection[Any], schema: str, script: str) -> None:
    """Create ``schema`` if needed and run ``script`` in it, in the caller's transaction."""
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    saved = conn.execute("SELECT current_setting('search_path')").fetchone()
    assert saved is not None
    conn.execute(
        "SELECT set_config('search_path', quote_ident(%s) || ', pg_temp', true)", (schema,)
    )
    conn.execute(script.encode())
    conn.execute("SELECT set_config('search_path', %s, true)", (saved[0],))


def drop_if_empty(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Drop ``schema`` when nothing is left in it; True if it was dropped."""
    row = conn.execute(
        """
        SELECT n.oid IS NOT NULL
               AND NOT EXISTS (SELECT FROM pg_class c WHERE c.relnamespace = n.oid)
               AND NOT EXISTS (SELECT FROM pg_proc p WHERE p.pronamespace = n.oid)
               AND NOT EXISTS (SELECT FROM pg_type t WHERE t.typnamespace = n.oid)
          FROM (SELECT NULL) AS one
          LEFT JOIN pg_namespace n ON n.nspname = %s
        """,
        (schema,),
    ).fetchone()
    if row is None or not row[0]:
        return False
    conn.execute(sql.SQL("DROP SCHEMA {}").format(sql.Identifier(schema)))
    return True
