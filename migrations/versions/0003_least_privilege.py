"""pgstore 0003: least privilege.

The functions run as their owner (SECURITY DEFINER) with their pinned
search_path; EXECUTE is revoked from PUBLIC; a NOLOGIN client role
(``<schema>_client`` unless ``client_role`` says otherwise, created if
missing) may use the schema and execute the API functions, nothing else.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0003
Revises: pgstore_0002
"""

from __future__ import annotations

from pgstore._migration import grant_client_role_beside, revoke_client_role, run_sql_beside

revision = "pgstore_0003"
down_revision = "pgstore_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_beside(__file__, "0003_least_privilege.up.sql")
    grant_client_role_beside(__file__, "0003_client_role.sql.template")


def downgrade() -> None:
    revoke_client_role()
    run_sql_beside(__file__, "0003_least_privilege.down.sql")
