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
HEAD_REVISION = "pgstore_0006"

#: The schema a store uses when none is named.
DEFAULT_SCHEMA = "pgstore"


def check_schema(schema: object) -> str:
    """A schema (or role) name PostgreSQL keeps as given: a non-empty string of at most 63
    bytes of UTF-8 (longer identifiers are silently truncated by the server), no NUL."""
    try:
        size = len(schema.encode()) if isinstance(schema, str) else 0
    except UnicodeEncodeError:
        size = 0
    if not isinstance(schema, str) or "\x00" in schema or not 0 < size <= 63:
        raise InvalidArgument("schema must be a non-empty identifier of at most 63 bytes")
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


#: Marks roles pgstore created, so a downgrade drops only its own.
CLIENT_ROLE_COMMENT = "pgstore client role: may call the store's functions in schema {}"


def client_role_name(schema: str) -> str:
    """The default client role of ``schema``: ``<schema>_client``."""
    role = f"{schema}_client"
    if len(role.encode()) > 63:
        raise InvalidArgument(
            f"client role name {role!r} is longer than 63 bytes: name one explicitly"
        )
    return role


def grant_client_role(
    conn: psycopg.Connection[Any], schema: str, role: str, template: str
) -> None:
    """Create the NOLOGIN ``role`` if it is missing and run the grants ``template``
    (``{role}`` and ``{schema}`` replaced by quoted identifiers) in ``schema``."""
    check_schema(role)
    exists = conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    if exists is None:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("COMMENT ON ROLE {} IS {}").format(
                sql.Identifier(role), sql.Literal(CLIENT_ROLE_COMMENT.format(schema))
            )
        )
    grants = sql.SQL(template).format(schema=sql.Identifier(schema), role=sql.Identifier(role))
    load(conn, schema, grants.as_string(conn))


def revoke_client_role(conn: psycopg.Connection[Any], schema: str, role: str) -> None:
    """Take back what ``grant_client_role`` gave, and drop the role if pgstore created it
    for ``schema`` and nothing else (another database's grants) still needs it."""
    found = conn.execute(
        "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = %s", (role,)
    ).fetchone()
    if found is None:
        return
    ident, nsp = sql.Identifier(role), sql.Identifier(schema)
    conn.execute(sql.SQL("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {} FROM {}").format(nsp, ident))
    conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(nsp, ident))
    if found[0] != CLIENT_ROLE_COMMENT.format(schema):
        return
    try:
        with conn.transaction():
            conn.execute(sql.SQL("DROP ROLE {}").format(ident))
    except psycopg.errors.DependentObjectsStillExist:
        pass  # still granted something elsewhere (another database): keep it
