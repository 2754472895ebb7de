"""Loading SQL into a chosen schema, and removing an emptied one.

The SQL files name no schema: they are run with ``search_path`` set to
``<schema>, pg_temp`` and every function pins that path with
``SET search_path FROM CURRENT``.

A schema that a migration creates gets ``CREATED_COMMENT`` as its comment (only the
schema's owner, the migrating role, or a superuser can write it). A downgrade to
``base`` drops only such a schema, once empty, and never ``public``: a schema the
store was put into (``public``, or one the DBA made) outlives the store.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from pgstore.errors import InvalidArgument
from pgstore.schema.files import head_revision

HEAD_REVISION = head_revision()
"""The migration revision that sql/ describes: the newest revision module in
migrations/versions/ (``pgstore.schema.files.head_revision``), the one place it is named.
A fresh load of sql/ (``current_schema_sql``) and ``upgrade head`` make the schema's
``schema_revision()`` return it."""

DEFAULT_SCHEMA = "pgstore"
"""The schema a store uses when none is named."""

VERSION_TABLE = "alembic_version"
"""The alembic version table's name, inside the store's schema (pgstore's own history:
``pgstore.schema.migrations`` and migrations/env.py; ``pgstore.schema.history``)."""


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


#: The comment a migration puts on a schema it creates: the mark that lets a downgrade
#: to ``base`` drop it again.
CREATED_COMMENT = "pgstore: created by a pgstore migration, dropped by its downgrade to base"

#: Never dropped, whatever its comment says.
KEPT_SCHEMAS = frozenset({"public"})


def create(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Create ``schema`` if it does not exist, marked with ``CREATED_COMMENT``; True if
    this call created it. A schema created meanwhile by a concurrent transaction (the
    ``CREATE`` runs in a savepoint) is left as that transaction made it."""
    exists = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = %s)", (schema,)
    ).fetchone()
    if exists is not None and exists[0]:
        return False
    name = sql.Identifier(schema)
    try:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(name))
            conn.execute(
                sql.SQL("COMMENT ON SCHEMA {} IS {}").format(name, sql.Literal(CREATED_COMMENT))
            )
    except (psycopg.errors.DuplicateSchema, psycopg.errors.UniqueViolation):
        return False
    return True


def load(conn: psycopg.Connection[Any], schema: str, script: str) -> None:
    """Create ``schema`` if needed (``create``) and run ``script`` in it, in the caller's
    transaction."""
    create(conn, schema)
    saved = conn.execute("SELECT current_setting('search_path')").fetchone()
    assert saved is not None
    conn.execute(
        "SELECT set_config('search_path', quote_ident(%s) || ', pg_temp', true)", (schema,)
    )
    conn.execute(script.encode())
    conn.execute("SELECT set_config('search_path', %s, true)", (saved[0],))


def drop_if_empty(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Drop ``schema`` when nothing is left in it and a migration created it (its comment
    is ``CREATED_COMMENT`` and the current role owns it); never ``public``. True if it
    was dropped."""
    if schema in KEPT_SCHEMAS:
        return False
    row = conn.execute(
        """
        SELECT n.oid IS NOT NULL
               AND n.nspowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
               AND obj_description(n.oid, 'pg_namespace') IS NOT DISTINCT FROM %s
               AND NOT EXISTS (SELECT FROM pg_class c WHERE c.relnamespace = n.oid)
               AND NOT EXISTS (SELECT FROM pg_proc p WHERE p.pronamespace = n.oid)
               AND NOT EXISTS (SELECT FROM pg_type t WHERE t.typnamespace = n.oid)
          FROM (SELECT NULL) AS one
          LEFT JOIN pg_namespace n ON n.nspname = %s
        """,
        (CREATED_COMMENT, schema),
    ).fetchone()
    if row is None or not row[0]:
        return False
    conn.execute(sql.SQL("DROP SCHEMA {}").format(sql.Identifier(schema)))
    return True
