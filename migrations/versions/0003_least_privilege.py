"""pgstore 0003: least privilege.

The functions run as their owner (SECURITY DEFINER) with their pinned
search_path; EXECUTE is revoked from PUBLIC; a NOLOGIN client role
(``<schema>_client_<database>`` unless ``client_role`` says otherwise,
created if missing, an existing one adopted only as docs/security.md says)
may use the schema and execute the API functions below, nothing else.

Frozen: runs the SQL files beside this file, as written when this revision
was made, and grants the functions listed here. Changes to sql/ need a new
revision.

Revision ID: pgstore_0003
Revises: pgstore_0002
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import grant_client_role, revoke_client_role, run_sql_beside
from pgstore.schema.function import Function

revision = "pgstore_0003"
down_revision = "pgstore_0002"
branch_labels = None
depends_on = None

#: What the client role may execute at this revision: name and argument types.
CLIENT_FUNCTIONS = (
    Function("schema_revision", ()),
    Function("now_ms", ()),
    Function("schedule_get", ("text",)),
    Function("schedule_register", ("text", "text", "text", "bigint", "bigint")),
    Function("schedule_claim_due", ("text", "text", "bigint", "bigint")),
    Function("schedule_renew", ("text", "bigint", "bigint")),
    Function("schedule_complete", ("text", "bigint", "bigint", "bigint", "text", "bigint")),
    Function("schedule_delete", ("text",)),
    Function("schedule_list", ()),
    Function("schedule_claim_next", ("text", "bigint", "bigint", "integer", "text[]")),
    Function("job_channel", ()),
    Function("job_schedule", ("text", "bigint")),
    Function("job_lease", ("text", "bigint", "bigint")),
    Function("job_renew", ("text", "text", "bigint", "bigint")),
    Function("job_mark_dispatched", ("text", "text", "text")),
    Function("job_release", ("text", "text", "bigint")),
    Function("job_cancel", ("text",)),
    Function("job_get", ("text",)),
    Function("job_list_dispatched", ()),
    Function("job_remove", ("text",)),
)


def upgrade() -> None:
    run_sql_beside(__file__, "0003_least_privilege.up.sql")
    grant_client_role(CLIENT_FUNCTIONS)


def downgrade() -> None:
    revoke_client_role()
    run_sql_beside(__file__, "0003_least_privilege.down.sql")
