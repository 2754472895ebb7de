"""pgstore 0001: shared helpers and the schedule store.

Frozen: runs 0001_schedules.up.sql / .down.sql beside this file, as written
when this revision was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0001
Revises:
"""

from __future__ import annotations

from pgstore.schema import marks
from pgstore.schema.alembic_steps import drop_schema_if_empty, run_sql, run_sql_beside

revision = "pgstore_0001"
down_revision = None
branch_labels = ("pgstore",)
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS = ("schedules", "schedule_fences")


def upgrade() -> None:
    run_sql_beside(__file__, "0001_schedules.up.sql")


def downgrade() -> None:
    run_sql_beside(__file__, "0001_schedules.down.sql")
    run_sql(marks.DROP)  # what later revisions' downgrades kept for the upgrade back
    drop_schema_if_empty()
