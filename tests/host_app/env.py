"""The host app's env.py: an ordinary alembic environment, version table in public."""

from __future__ import annotations

import psycopg
from alembic import context
from sqlalchemy import create_engine, pool

config = context.config
conninfo = config.attributes["host_conninfo"]
engine = create_engine(
    "postgresql+psycopg://", creator=lambda: psycopg.connect(conninfo), poolclass=pool.NullPool
)
with engine.connect() as connection:
    context.configure(connection=connection, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()
