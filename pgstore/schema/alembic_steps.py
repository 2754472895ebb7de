"""What pgstore's alembic env.py and revisions share.

Revisions are frozen: each runs the SQL file that sits beside it, written
when the revision was made. Later changes go to sql/ and a new revision.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from alembic import context, op

from pgstore.errors import InvalidArgument
from pgstore.schema import client_role as _client_role
from pgstore.schema import objects as _schema
from pgstore.schema.files import REVOKE_FROM_PUBLIC, schema_revision_sql
from pgstore.schema.function import Function
from pgstore.schema.objects import DEFAULT_SCHEMA, check_name, check_schema


def target_schema() -> str:
    """The schema being migrated: the caller's ``pgstore_schema`` attribute,
    else ``-x schema=NAME``, else ``pgstore_schema`` in alembic.ini, else ``pgstore``."""
    cfg = context.config
    schema = (
        cfg.attributes.get("pgstore_schema")
        or context.get_x_argument(as_dictionary=True).get("schema")
        or cfg.get_main_option("pgstore_schema")
        or DEFAULT_SCHEMA
    )
    return check_schema(schema)


_OFF = frozenset({"off", "false", "no", "0", "none", ""})
_ON = frozenset({"on", "true", "yes", "1"})


def _setting(attribute: str, x_name: str, ini_name: str, default: str) -> object:
    """The caller's ``attribute``, else ``-x x_name=...``, else ``ini_name`` in alembic.ini."""
    cfg = context.config
    raw = cfg.attributes.get(attribute)
    if raw is None:
        raw = context.get_x_argument(as_dictionary=True).get(x_name)
    if raw is None:
        raw = cfg.get_main_option(ini_name, default)
    return raw


def client_role() -> str | bool:
    """The client role to grant: the caller's ``pgstore_client_role`` attribute, else
    ``-x client_role=...``, else ``pgstore_client_role`` in alembic.ini. ``on`` (the
    default) gives True (the default name, ``<schema>_client_<database>``), ``off`` gives
    False (none), anything else is a role name (checked)."""
    raw = _setting("pgstore_client_role", "client_role", "pgstore_client_role", "on")
    if raw is True or raw is False:
        return raw
    value = str(raw)
    word = value.lower()  # unstripped: " " is a role name, and strip() eats controls
    if word in _OFF:
        return False
    if word in _ON:
        return True
    return check_name(value, "client role")


def client_role_adopt() -> bool:
    """Whether an existing role may be adopted as the client role even when it can log in
    or pgstore did not create it for this schema in this database: the caller's
    ``pgstore_client_role_adopt`` attribute, else ``-x adopt_client_role=...``, else
    ``pgstore_adopt_client_role`` in alembic.ini; off by default."""
    raw = _setting(
        "pgstore_client_role_adopt", "adopt_client_role", "pgstore_adopt_client_role", "off"
    )
    if raw is True or raw is False:
        return raw
    value = str(raw).strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise InvalidArgument(f"adopt_client_role must be on or off, not {raw!r}")


def run_sql_replacing_functions(
    revision_file: str, sql_name: str, replaced: Sequence[tuple[Function, Function]]
) -> None:
    """Run ``sql_name`` (beside ``revision_file``), which drops each ``old`` function of
    ``replaced`` and creates its ``new`` one, and grant EXECUTE on each new function to
    every role that could execute the old one (the client role, whatever its name, and
    any role the DBA granted), so a changed signature keeps its callers. Offline, only
    the script is printed: grants made outside pgstore are not carried over."""
    if context.is_offline_mode():
        run_sql_beside(revision_file, sql_name)
        return
    conn, schema = _driver_connection(), target_schema()
    callers = [(new, _client_role.executors(conn, schema, old)) for old, new in replaced]
    run_sql_beside(revision_file, sql_name)
    for new, roles in callers:
        _client_role.grant_executors(conn, schema, new, roles)


def grant_client_role(functions: Sequence[Function] | None = None) -> None:
    """Create (or adopt) the client role and grant it USAGE on the schema and EXECUTE on
    ``functions``, one statement per grant. Revisions up to ``pgstore_0012`` pass their
    own frozen list; a later revision passes none, and the client functions ``pg_proc``
    has in the schema when it runs are granted (``catalog.client_functions``: every
    SECURITY DEFINER function but the owner's, and ``now_ms``), which its own SQL and
    the revisions before it decide."""
    role = client_role()
    if role is False:
        return
    if context.is_offline_mode():
        raise RuntimeError("the client role needs an online migration (or client_role=off)")
    conn, schema = _driver_connection(), target_schema()
    name = (
        role if isinstance(role, str)
        else _client_role.default_name(schema, _client_role.current_database(conn))
    )
    _client_role.grant(conn, schema, name, functions, adopt=client_role_adopt())


def revoke_from_public() -> None:
    """Revoke what ``PUBLIC`` may do with any function of the schema
    (``files.REVOKE_FROM_PUBLIC``, online or offline): what a revision that creates
    functions runs after its SQL, instead of a ``REVOKE`` per signature."""
    run_sql(REVOKE_FROM_PUBLIC)


def revoke_client_role() -> None:
    """Undo ``grant_client_role``: revoke the role's privileges in the schema and drop the
    role if pgstore created it and nothing needs it (see ``_client_role.revoke``)."""
    role = client_role()
    if role is False or context.is_offline_mode():
        return
    conn, schema = _driver_connection(), target_schema()
    name = role if isinstance(role, str) else _client_role.find_for_downgrade(conn, schema)
    if name is not None:
        _client_role.revoke(conn, schema, name)


def _driver_connection() -> psycopg.Connection[Any]:
    raw = op.get_bind().connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise RuntimeError("pgstore migrations need the psycopg (3) driver: postgresql+psycopg://")
    return raw


def offline_identifier(name: str) -> str:
    """``name`` quoted as an identifier for SQL that alembic writes out in offline mode.

    alembic reads a string statement as SQLAlchemy ``text()``, where ``:word`` is a
    bind parameter: the colons of the quoted name are escaped for it (env.py makes the
    offline dialect use named binds, so a ``%`` is left alone)."""
    return '"' + name.replace('"', '""').replace(":", "\\:") + '"'


def offline_literal(text: str) -> str:
    """``text`` quoted as a string literal for SQL that alembic writes out in offline mode
    (colons escaped as in ``offline_identifier``)."""
    return "'" + text.replace("'", "''").replace(":", "\\:") + "'"


def offline_create_schema(schema: str) -> str:
    """The statement offline mode prints to create ``schema`` if it does not exist, marked
    as a migration's (``objects.CREATED_COMMENT``) when this statement creates it."""
    tag, n = "$create$", 0
    while tag in schema:
        n += 1
        tag = f"$create{n}$"
    quoted = offline_identifier(schema)
    return (
        f"DO {tag} BEGIN "
        f"IF NOT EXISTS (SELECT FROM pg_namespace WHERE nspname = {offline_literal(schema)}) "
        f"THEN CREATE SCHEMA {quoted}; "
        f"COMMENT ON SCHEMA {quoted} IS {offline_literal(_schema.CREATED_COMMENT)}; "
        f"END IF; END {tag}"
    )


def run_sql_beside(revision_file: str, sql_name: str) -> None:
    """Run ``sql_name`` (a file beside ``revision_file``) in the target schema."""
    run_sql((Path(revision_file).parent / sql_name).read_text())


def set_schema_revision(revision_id: str) -> None:
    """Make the target schema's ``schema_revision()`` return ``revision_id`` (CREATE OR
    REPLACE: owner, grants and comment kept). What a revision that names its own id only
    in its module (``revision``, ``down_revision``) runs after its SQL file."""
    run_sql(schema_revision_sql(revision_id))


def run_sql(script: str) -> None:
    """Run ``script`` in the target schema (first on ``search_path``), online or offline."""
    schema = target_schema()
    if context.is_offline_mode():
        quoted = offline_identifier(schema)
        op.execute(offline_create_schema(schema))
        op.execute(f"SET LOCAL search_path = {quoted}, pg_temp")
        op.execute(script)
        return
    _schema.load(_driver_connection(), schema, script)


def drop_schema_if_empty() -> None:
    """After a downgrade to base: remove the schema when nothing else is left in it."""
    if not context.is_offline_mode():
        _schema.drop_if_empty(_driver_connection(), target_schema())
