"""pgstore 0006: a size limit on a schedule's spec, and an optional bound on p_now.

``schedule_register`` rejects a spec longer than 1024 characters (22023
naming ``spec``, nothing changed); rows already stored keep theirs. A new
owner-only table ``store_settings`` holds ``max_clock_skew_ms``, NULL (off)
by default: when the owner sets it, every function taking ``p_now`` rejects
a ``p_now`` that is given and lies further than that from ``now_ms()``
(22023 naming ``now``, nothing changed). The client role is granted nothing
new; owners and grants are kept.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0006
Revises: pgstore_0005
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import run_sql_beside

revision = "pgstore_0006"
down_revision = "pgstore_0005"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS = ("store_settings",)


def upgrade() -> None:
    run_sql_beside(__file__, "0006_limits.up.sql")


def downgrade() -> None:
    run_sql_beside(__file__, "0006_limits.down.sql")
