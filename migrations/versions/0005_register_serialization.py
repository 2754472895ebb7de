"""pgstore 0005: a register racing a delete fails as a serialization failure.

Under REPEATABLE READ or SERIALIZABLE, a ``schedule_register`` whose snapshot
predates a concurrent ``schedule_delete`` of the same id saw the deleted row
beside its new one (P0003, "query returned more than one row") and could
not see the delete's fence. It now raises 40001, which callers retry like
any other serialization failure, so no token goes backwards. READ COMMITTED
(what the Python stores use) is unchanged. No table changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0005
Revises: pgstore_0004
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import run_sql_beside

revision = "pgstore_0005"
down_revision = "pgstore_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_beside(__file__, "0005_register_serialization.up.sql")


def downgrade() -> None:
    run_sql_beside(__file__, "0005_register_serialization.down.sql")
