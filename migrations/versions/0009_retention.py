"""pgstore 0009: retention for jobs.

``jobs.finished_at`` records when a job finished: ``job_mark_dispatched`` and
``job_cancel`` (of an undispatched job) set it. The jobs finished before this
revision get the time of the upgrade, since the store never recorded when they
finished. ``job_purge(p_before, p_limit)`` deletes at most ``p_limit`` finished
jobs with ``finished_at < p_before`` (never a waiting job, nor one whose lease
is live; rows locked by concurrent calls are skipped) and returns how many.
It is granted to no client: it deletes history.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0009
Revises: pgstore_0008
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import run_sql_beside

revision = "pgstore_0009"
down_revision = "pgstore_0008"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS = ("jobs.finished_at",)


def upgrade() -> None:
    run_sql_beside(__file__, "0009_retention.up.sql")


def downgrade() -> None:
    run_sql_beside(__file__, "0009_retention.down.sql")
