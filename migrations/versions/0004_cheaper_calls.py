"""pgstore 0004: cheaper calls, same contracts.

``now_ms()`` and the ``check_*`` helpers become plain SQL functions that
the planner inlines into the API functions (bad input still raises 22023,
through ``raise_invalid``), and ``schedule_claim_next`` with ids probes the
primary key in its cached plan instead of reading every row (20 ms for
1,000 ids over 1,000 rows before, and proportional to the table). No table
changes; owners and grants are kept.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0004
Revises: pgstore_0003
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import run_sql_beside

revision = "pgstore_0004"
down_revision = "pgstore_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_beside(__file__, "0004_cheaper_calls.up.sql")


def downgrade() -> None:
    run_sql_beside(__file__, "0004_cheaper_calls.down.sql")
