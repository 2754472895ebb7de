"""pgstore's alembic environment.

The database: the caller's ``pgstore_conninfo`` attribute (``pgstore.migrate``),
else ``-x dsn=...``, else ``sqlalchemy.url`` in alembic.ini, else
``PGSTORE_DSN``, else the libpq ``PG*`` variables. The schema: see
``pgstore._migration.target_schema``. The version table lives in that schema.
"""

from __future__ import annotations

import os

import psycopg
from alembic import context
from psycopg import sql
from sqlalchemy import create_engine, pool

from pgstore.schema import objects as _schema
from pgstore.schema.alembic_steps import (
    client_role,
    client_role_adopt,
    offline_create_schema,
    target_schema,
)
from pgstore.schema.history import check_offline
from pgstore.schema.migrations import VERSION_TABLE

config = context.config
schema = target_schema()
# Checked before any connection: a bad name or option changes nothing.
client_role()
client_role_adopt()


def _conninfo() -> str:
    x_args = context.get_x_argument(as_dictionary=True)
    return str(
        config.attributes.get("pgstore_conninfo")
        or x_args.get("dsn")
        or os.environ.get("PGSTORE_DSN")
        or ""
    )


def run_offline() -> None:
    check_offline(client_role())  # before any SQL is printed
    context.configure(
        url=config.get_main_option("sqlalchemy.url") or "postgresql+psycopg://",
        literal_binds=True,
        # Named binds: with psycopg's pyformat, SQLAlchemy would double every % of the
        # script (format('%s', ...) in function bodies, a % in the schema's name).
        dialect_opts={"paramstyle": "named"},
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        # Before alembic writes its version table into the schema.
        context.execute(offline_create_schema(schema))
        context.run_migrations()


def run_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if url and not config.attributes.get("pgstore_conninfo"):
        engine = create_engine(url, poolclass=pool.NullPool)
    else:
        conninfo = _conninfo()
        engine = create_engine(
            "postgresql+psycopg://",
            creator=lambda: psycopg.connect(conninfo),
            poolclass=pool.NullPool,
        )
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            version_table=VERSION_TABLE,
            version_table_schema=schema,
            transactional_ddl=True,
            transaction_per_migration=False,
        )
        with context.begin_transaction():
            # Every statement naming the schema goes through the psycopg connection,
            # composed with sql.Identifier (or passed as a parameter): SQLAlchemy's
            # text() would read a ``:word`` inside the quoted name as a bind parameter.
            raw = connection.connection.driver_connection
            if not isinstance(raw, psycopg.Connection):
                raise RuntimeError(
                    "pgstore migrations need the psycopg (3) driver: postgresql+psycopg://"
                )
            # Several hosts may migrate one schema at once (auto_migrate):
            # one runs, the others wait and then find it at head.
            raw.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"pgstore.migrate:{schema}",),
            )
            _schema.create(raw, schema)  # marked as pgstore's, for a downgrade to base
            context.run_migrations()
            if not context.get_context().get_current_heads():
                # Downgraded to base: the version table was the last of ours.
                raw.execute(
                    sql.SQL("DROP TABLE IF EXISTS {}.{}").format(
                        sql.Identifier(schema), sql.Identifier(VERSION_TABLE)
                    )
                )
                _schema.drop_if_empty(raw, schema)

if context.is_offline_mode():
    run_offline()
else:
    run_online()
