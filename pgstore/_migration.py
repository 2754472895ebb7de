"""What pgstore's alembic env.py and revisions share.

Revisions are frozen: each runs the SQL file that sits beside it, written
when the revision was made. Later changes go to sql/ and a new revision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from alembic import context, op

from . import _schema
from ._schema import DEFAULT_SCHEMA, check_schema


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


def client_role() -> str | None:
    """The client role to grant (SPEC: least privilege): the caller's
    ``pgstore_client_role`` attribute, else ``-x client_role=...``, else
    ``pgstore_client_role`` in alembic.ini; ``on`` (the default) means
    ``<schema>_client``, ``off`` means none, anything else is a role name."""
    cfg = context.config
    raw = cfg.attributes.get("pgstore_client_role")
    if raw is None:
        raw = context.get_x_argument(as_dictionary=True).get("client_role")
    if raw is None:
        raw = cfg.get_main_option("pgstore_client_role", "on")
    if raw is True or raw is False:
        raw = "on" if raw else "off"
    value = str(raw).strip()
    if value.lower() in _OFF:
        return None
    if value.lower() in _ON:
        return _schema.client_role_name(target_schema())
    return check_schema(value)


def grant_client_role_beside(revision_file: str, template_name: str) -> None:
    """Create the client role if needed and run the grants template beside ``revision_file``."""
    role = client_role()
    if role is None:
        return
    if context.is_offline_mode():
        raise RuntimeError("the client role needs an online migration (or client_role=off)")
    template = (Path(revision_file).parent / template_name).read_text()
    _schema.grant_client_role(_driver_connection(), target_schema(), role, template)


def revoke_client_role() -> None:
    """Undo ``grant_client_role_beside`` (dropping the role if pgstore created it)."""
    role = client_role()
    if role is not None and not context.is_offline_mode():
        _schema.revoke_client_role(_driver_connection(), target_schema(), role)


def _driver_connection() -> psycopg.Connection[Any]:
    raw = op.get_bind().connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise RuntimeError("pgstore migrations need the psycopg (3) driver: postgresql+psycopg://")
    return raw


def run_sql_beside(revision_file: str, sql_name: str) -> None:
    """Run ``sql_name`` (a file beside ``revision_file``) in the target schema."""
    script = (Path(revision_file).parent / sql_name).read_text()
    schema = target_schema()
    if context.is_offline_mode():
        quoted = '"' + schema.replace('"', '""') + '"'
        op.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        op.execute(f"SET LOCAL search_path = {quoted}, pg_temp")
        op.execute(script)
        return
    _schema.load(_driver_connection(), schema, script)


def drop_schema_if_empty() -> None:
    """After a downgrade to base: remove the schema when nothing else is left in it."""
    if not context.is_offline_mode():
        _schema.drop_if_empty(_driver_connection(), target_schema())
