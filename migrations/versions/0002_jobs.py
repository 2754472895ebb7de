"""pgstore 0002: the job store.

Frozen: runs 0002_jobs.up.sql / .down.sql beside this file, as written when
this revision was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0002
Revises: pgstore_0001
"""

from __future__ import annotations

from pgstore.schema import marks
from pgstore.schema.alembic_steps import run_sql, run_sql_beside

revision = "pgstore_0002"
down_revision = "pgstore_0001"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS = ("jobs",)


def upgrade() -> None:
    run_sql_beside(__file__, "0002_jobs.up.sql")


def downgrade() -> None:
    run_sql_beside(__file__, "0002_jobs.down.sql")
    run_sql(marks.FORGET_LEASE_SEQUENCE)  # the jobs are gone, and their numbers with them
