"""${message}

Frozen: runs the SQL files beside this one. Changes to sql/ need a new revision.

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from __future__ import annotations

from pgstore._migration import run_sql_beside

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    run_sql_beside(__file__, "${up_revision}.up.sql")


def downgrade() -> None:
    run_sql_beside(__file__, "${up_revision}.down.sql")
