"""Migrating a store's schema with alembic.

Stand-alone: ``migrate(conninfo, schema=...)`` (or ``pgstore migrate``, or
``alembic -x schema=NAME upgrade head`` with ``script_location`` pointing at
``pgstore/migrations``) keeps its version table, ``alembic_version``, inside
the store's schema. As a branch of a host app's history: add
``versions_dir()`` to the host's ``version_locations``, let a host revision
``depends_on = "pgstore_0001"`` (or later), and choose the schema with
``pgstore_schema = NAME`` in the host's alembic.ini or ``-x schema=NAME``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from alembic import command
from alembic.config import Config
from psycopg import sql

from pgstore.errors import InvalidArgument
from pgstore.schema.files import migrations_dir, versions_dir
from pgstore.schema.objects import DEFAULT_SCHEMA, HEAD_REVISION, VERSION_TABLE, check_schema

__all__ = [
    "DEFAULT_SCHEMA",
    "HEAD_REVISION",
    "VERSION_TABLE",
    "alembic_config",
    "current_revision",
    "downgrade",
    "migrate",
    "versions_dir",
]


def alembic_config(
    conninfo: str = "",
    schema: str = DEFAULT_SCHEMA,
    client_role: bool | str = True,
    client_role_adopt: bool = False,
) -> Config:
    """An alembic ``Config`` for pgstore's own history on ``conninfo`` (libpq syntax or URI).

    ``client_role``: True grants the store's functions to a NOLOGIN role
    ``<schema>_client_<database>`` (created if missing; ``InvalidArgument`` when that
    name is longer than 63 bytes), a string names that role, False grants nothing (the
    DBA grants EXECUTE as they see fit).

    An existing role is adopted only if pgstore created it for this schema in this
    database and it cannot log in; otherwise the migration raises ``InvalidArgument``
    naming the role and changes nothing. ``client_role_adopt=True`` adopts any existing
    role (one shared by several databases or schemas, on purpose).
    """
    if not isinstance(client_role, (bool, str)):
        raise InvalidArgument("client_role must be True, False or a role name")
    if not isinstance(client_role_adopt, bool):
        raise InvalidArgument("client_role_adopt must be True or False")
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["pgstore_conninfo"] = conninfo
    cfg.attributes["pgstore_schema"] = check_schema(schema)
    cfg.attributes["pgstore_client_role"] = client_role  # checked by env.py, before connecting
    cfg.attributes["pgstore_client_role_adopt"] = client_role_adopt
    return cfg


def migrate(
    conninfo: str = "",
    schema: str = DEFAULT_SCHEMA,
    revision: str = "head",
    client_role: bool | str = True,
    client_role_adopt: bool = False,
) -> None:
    """Upgrade ``schema`` to ``revision`` (the head by default), in one transaction.

    Concurrent migrations of one schema (several hosts starting with
    ``auto_migrate``) are serialised by a transaction-scoped advisory lock.
    See ``alembic_config`` for ``client_role`` and ``client_role_adopt``.
    """
    command.upgrade(alembic_config(conninfo, schema, client_role, client_role_adopt), revision)


def downgrade(
    conninfo: str = "",
    schema: str = DEFAULT_SCHEMA,
    revision: str = "base",
    client_role: bool | str = True,
) -> None:
    """Downgrade ``schema``; to ``base`` removes every object the store created, and the
    schema itself only if a migration created it (never ``public``). Below
    ``pgstore_0003`` the client role loses its privileges in the schema and is dropped if
    pgstore created it for this schema, no role is a member of it, and no other database
    needs it; a role with members is kept (a warning says so) and recorded in the store's
    owner-only ``downgrade_marks``, so upgrading again adopts it with its memberships (a
    downgrade to ``base`` drops that record with the store: adopt the role explicitly
    then)."""
    command.downgrade(alembic_config(conninfo, schema, client_role), revision)


def current_revision(conninfo: str = "", schema: str = DEFAULT_SCHEMA) -> str | None:
    """The revision recorded in the schema's version table, or None when unmigrated."""
    check_schema(schema)
    conn: psycopg.Connection[Any]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
            (schema, VERSION_TABLE),
        ).fetchone()
        if row is None or not row[0]:
            return None
        found = conn.execute(
            sql.SQL("SELECT version_num FROM {}.{}").format(
                sql.Identifier(schema), sql.Identifier(VERSION_TABLE)
            )
        ).fetchone()
        return None if found is None else str(found[0])
