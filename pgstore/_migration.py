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
