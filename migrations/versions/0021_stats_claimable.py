"""pgstore 0021: store_stats() counts as due what a claim or a lease would take.

Its schedules_due and oldest due schedule read next_run_at and ignored pauses, so a
paused schedule counted as due and unclaimed (and a lag alert fired for it), and a
jittered one counted as late from its nominal time; they now read what
schedule_claim_due compares (not paused, due_at <= now). A paused queue's waiting jobs
count as pending, not due, and are never the oldest due job: jobs_due is what
job_lease would take. Same signature and columns; no table changes.

Downgrade: the pgstore_0020 body back; no data changes.

Changed (CREATE OR REPLACE: owners and grants kept): ``store_stats(bigint)``.

No table changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0021
Revises: pgstore_0020
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import run_sql_beside, set_schema_revision

revision = "pgstore_0021"
down_revision = "pgstore_0020"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS: tuple[str, ...] = ()

_NAME = Path(__file__).stem


def upgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.up.sql")
    set_schema_revision(revision)


def downgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.down.sql")
    set_schema_revision(down_revision)
