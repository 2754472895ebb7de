"""Loading SQL into a chosen schema, and removing an emptied one.

The SQL files name no schema: they are run with ``search_path`` set to
``<schema>, pg_temp`` and every function pins that path with
``SET search_path FROM CURRENT``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from .errors import InvalidArgument

#: The migration revision that sql/ describes; sql/00_common.sql's schema_revision() returns it.
HEAD_REVISION = "pgstore_0002"

#: The schema a store uses when none is named.
DEFAULT_SCHEMA = "pgstore"


def check_schema(schema: object) -> str:
    """A schema name: a non-empty string PostgreSQL accepts as an identifier."""
    if not isinstance(schema, str) or schema == "" or "\x00" in schema or len(schema) > 63:
        raise InvalidArgument("schema must be a non-empty identifier of at most 63 characters")
    return schema


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
