"""pgstore 0008: what an operator reads, as functions.

``store_stats(p_now)`` gives one row of gauges over both stores (schedules due
and unclaimed, leased, done; jobs pending, due, leased, dispatched, recalled,
cancelled; the oldest due schedule and job), from one snapshot;
``job_list(p_filter, p_now, p_limit)`` pages through the jobs for
``pgstore jobs``. The command line, a metrics exporter or a monitoring role
(any role granted EXECUTE on them) reads the same numbers without SELECT on
the tables. Both are granted to the client role. No table changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made, and grants the functions listed here. Changes to sql/ need a new
revision.

Revision ID: pgstore_0008
Revises: pgstore_0007
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import grant_client_role, run_sql_beside
from pgstore.schema.function import Function

revision = "pgstore_0008"
down_revision = "pgstore_0007"
branch_labels = None
depends_on = None

#: What this revision adds to the client role's functions.
CLIENT_FUNCTIONS = (
    Function("store_stats", ("bigint",)),
    Function("job_list", ("text", "bigint", "integer")),
)


def upgrade() -> None:
    run_sql_beside(__file__, "0008_operator_views.up.sql")
    grant_client_role(CLIENT_FUNCTIONS)


def downgrade() -> None:
    run_sql_beside(__file__, "0008_operator_views.down.sql")
