"""pgstore 0013: the batch calls cost about the same per job at any batch size.

``job_mark_dispatched_many`` and ``job_renew_many`` joined the ``unnest()`` of
their input arrays to the rows they update. In the generic plan plpgsql caches
after five calls the planner estimates 10 input rows and 1 match, and runs
that join as a nested loop that rescans the whole input for every job
("Rows Removed by Join Filter: 9900" for a mark of 100 jobs, 2.7 ms of its
3.6): quadratic in the batch. They now look each job's worker id and fence up
by run_id in jsonb objects (sorted keys: ``->>`` is a binary search), and
build their answer the same way, in any plan. ``job_lease_many`` reads
``token_floor()`` once per call instead of once per leased row.

Server CPU per job, one connection draining 20,000 jobs, median of three runs
(0012 -> 0013, µs; PostgreSQL 18 embedded, 15 the machine's; 2 cores shared
with other work):

    batch   lease_many + mark_many          renew_many alone
            PostgreSQL 18   PostgreSQL 15   PostgreSQL 18   PostgreSQL 15
    10       83.5 -> 80.5    93.5 -> 84.0    28.5 -> 25.0    29.5 -> 29.0
    100      46.5 -> 25.0    59.5 -> 29.5    28.5 -> 8.5     33.5 -> 10.0
    1000    166.5 -> 19.0   210.0 -> 22.0   144.5 -> 7.0    215.0 -> 10.0

(``token_floor()`` per row cost about 0.3 µs a job, too little to show.)

Same signatures, answers and rules: CREATE OR REPLACE keeps owners, grants
and comments. No table changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0013
Revises: pgstore_0012
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import run_sql_beside

revision = "pgstore_0013"
down_revision = "pgstore_0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_beside(__file__, "0013_linear_batches.up.sql")


def downgrade() -> None:
    run_sql_beside(__file__, "0013_linear_batches.down.sql")
