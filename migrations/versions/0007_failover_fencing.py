"""pgstore 0007: fencing tokens and lease sequences that survive a failover.

Every claim lifts the fencing token, and every lease the new
``jobs.lease_sequence``, to at least ``token_floor()`` = 2^40 * (timeline ID
- 1), so neither goes backwards when a promoted standby lost commits its old
primary had acknowledged. Every API function that writes fails at once on a
standby (25006, naming the server as a standby). ``job_renew``,
``job_mark_dispatched`` and ``job_release`` take the lease sequence as an
optional fence; calls without it behave as before. Existing jobs get
``lease_sequence = 0``.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0007
Revises: pgstore_0006
"""

from __future__ import annotations

from pgstore._migration import grant_client_role_beside, run_sql_beside

revision = "pgstore_0007"
down_revision = "pgstore_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_beside(__file__, "0007_failover_fencing.up.sql")
    grant_client_role_beside(__file__, "0007_client_role.sql.template")


def downgrade() -> None:
    run_sql_beside(__file__, "0007_failover_fencing.down.sql")
    grant_client_role_beside(__file__, "0007_client_role.down.sql.template")
