"""pgstore 0020: job_mark_dispatched_many costs less a job, same answers and errors.

The batch mark is half of the Dispatcher's server CPU under a burst. Three parts of
it went: ``check_run_ids``' two passes over the run ids (one a ``count(DISTINCT
...)``, a sort) become one pass over all three arrays with no sort (a repeated run id
is proven absent when every job was recorded, else found after the UPDATE, whose
raise undoes it; any doubt runs the checks one by one, in their order, so each bad
input names the same parameter as before); the clock is read once for the batch (an
InitPlan, by the first row written, not ``now_ms()``'s numeric arithmetic for each
job); and a batch of recorded, uncancelled jobs (the common answer) is answered with
no jsonb object of the recorded jobs and no lookups. The queue floor (PostgreSQL
15, 50,000 jobs in batches of 500, before and after in one process, interleaved, load
2 to 5): the mark's server CPU a job 0.87x-0.89x (9.4-9.8 -> 8.5-8.7 µs), the whole
batch path 0.96x. Same signature, answers, grants and comment.

Downgrade: the pgstore_0019 body back; no data changes.

Changed (CREATE OR REPLACE: owners and grants kept):
``job_mark_dispatched_many(text[], text, text[], bigint[])``.

No table changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0020
Revises: pgstore_0019
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import run_sql_beside, set_schema_revision

revision = "pgstore_0020"
down_revision = "pgstore_0019"
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
