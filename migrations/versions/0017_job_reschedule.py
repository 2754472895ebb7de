"""pgstore 0017: job_reschedule moves a waiting job's dispatch_at, and only such a job.

``job_schedule`` of an existing run_id moves its dispatch_at whatever the job's
state: a dispatched, cancelled or failed job's due time changes and nothing
else, and a job under a live lease is moved under its holder's feet. An
operator who asks "move meeting R's bot to 10:30" needs to know whether it
moved. ``job_reschedule`` moves it only while it waits (not dispatched,
cancelled or failed) with no live lease, clears an expired lease (its holder
can no longer mark or release it), and returns the job as moved, or no row.
One UPDATE; it never waits longer than a concurrent lease or mark holds the
row, and tests the row as they left it.

Downgrade: the function is dropped; no data changes.

New: ``job_reschedule(text, bigint, bigint)``.

No table changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0017
Revises: pgstore_0016
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import grant_client_role, run_sql_beside, set_schema_revision

revision = "pgstore_0017"
down_revision = "pgstore_0016"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS: tuple[str, ...] = ()

_NAME = Path(__file__).stem


def upgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.up.sql")
    grant_client_role()
    set_schema_revision(revision)


def downgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.down.sql")
    set_schema_revision(down_revision)
