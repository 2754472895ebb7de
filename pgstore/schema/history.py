"""Which alembic history manages a store's schema, and what offline mode can do.

pgstore's own history (``pgstore migrate``, ``pgstore.migrate``) keeps its
version table, ``alembic_version``, inside the store's schema. A host app that
carries pgstore's revisions as a branch of its own history keeps its version
table elsewhere (its own schema, often ``public``), so the store's schema holds
pgstore's objects but no version table. Such a schema belongs to the host's
history: ``pgstore migrate`` or ``downgrade`` running pgstore's history on it
would replay revisions over objects that exist (``function schema_revision
already exists``) or record nothing at all. ``foreign_revision`` recognises it
by the schema's own ``schema_revision()`` function, which every revision
defines and which returns that revision's id.

Offline mode (``alembic upgrade --sql``) only prints SQL, so it cannot create
or inspect the client role; ``check_offline`` refuses it unless the client role
is off.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from pgstore.errors import PgStoreError
from pgstore.schema.objects import VERSION_TABLE, check_schema

__all__ = [
    "OFFLINE_NEEDS_CLIENT_ROLE_OFF",
    "ForeignHistory",
    "check_offline",
    "foreign_revision",
    "managed_elsewhere",
]

#: Why offline mode is refused while the client role is on (alembic prints it as one line).
OFFLINE_NEEDS_CLIENT_ROLE_OFF = (
    "offline mode (--sql) cannot create or grant the client role, which needs an online "
    "migration: run it online, or pass -x client_role=off and grant EXECUTE yourself"
)


class ForeignHistory(PgStoreError):
    """The schema holds a store migrated through another alembic history (a host app's)."""


def foreign_revision(conn: psycopg.Connection[Any], schema: str) -> str | None:
    """The revision ``schema``'s own ``schema_revision()`` returns when the schema has that
    function but no pgstore version table (it is managed by another alembic history);
    None when pgstore's history manages it or there is no store in it."""
    check_schema(schema)
    row = conn.execute(
        "SELECT to_regclass(format('%%I.%%I', %(s)s::text, %(t)s::text)) IS NULL"
        " AND to_regprocedure(format('%%I.schema_revision()', %(s)s::text)) IS NOT NULL",
        {"s": schema, "t": VERSION_TABLE},
    ).fetchone()
    if row is None or not row[0]:
        return None
    found = conn.execute(
        sql.SQL("SELECT {}.schema_revision()").format(sql.Identifier(schema))
    ).fetchone()
    return None if found is None or found[0] is None else str(found[0])


def managed_elsewhere(schema: str, revision: str, command: str) -> ForeignHistory:
    """The one-sentence refusal of ``pgstore <command>`` on a schema another history manages."""
    return ForeignHistory(
        f"schema {schema!r} is at {revision} through another alembic history (no pgstore "
        f"version table in it, e.g. a host app's), so pgstore {command} leaves it alone: "
        "upgrade or downgrade it through the host app's alembic"
    )


def check_offline(client_role: str | bool | None) -> None:
    """Refuse offline mode (``alembic ... --sql``) unless the client role is off (False or
    None), before any SQL is printed (alembic's command line shows a ``CommandError`` as one
    line)."""
    if client_role is not None and client_role is not False:
        from alembic.util import CommandError

        raise CommandError(OFFLINE_NEEDS_CLIENT_ROLE_OFF)
