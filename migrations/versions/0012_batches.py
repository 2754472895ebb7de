"""pgstore 0012: the job store's batch calls, for bursts.

``job_schedule_many(p_run_ids, p_dispatch_at)``, ``job_lease_many(p_holder,
p_now, p_ttl_ms, p_limit)``, ``job_mark_dispatched_many(p_run_ids, p_holder,
p_worker_ids, p_lease_sequences)`` and ``job_renew_many(p_run_ids, p_holder,
p_now, p_ttl_ms, p_lease_sequences)``: one statement over up to
``batch_max()`` (10000) jobs each, with the per-job meaning of the single-job
function. Granted to the client role. No table changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made, and grants the functions listed here. Changes to sql/ need a new
revision.

Revision ID: pgstore_0012
Revises: pgstore_0011
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import grant_client_role, run_sql_beside
from pgstore.schema.function import Function

revision = "pgstore_0012"
down_revision = "pgstore_0011"
branch_labels = None
depends_on = None

#: What this revision adds to the client role's functions.
CLIENT_FUNCTIONS = (
    Function("job_schedule_many", ("text[]", "bigint[]")),
    Function("job_lease_many", ("text", "bigint", "bigint", "integer")),
    Function("job_mark_dispatched_many", ("text[]", "text", "text[]", "bigint[]")),
    Function("job_renew_many", ("text[]", "text", "bigint", "bigint", "bigint[]")),
)


def upgrade() -> None:
    run_sql_beside(__file__, "0012_batches.up.sql")
    grant_client_role(CLIENT_FUNCTIONS)


def downgrade() -> None:
    run_sql_beside(__file__, "0012_batches.down.sql")
