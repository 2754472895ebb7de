"""pgstore 0011: a catch-up policy per schedule.

``schedules.catch_up`` says what a scheduler does with the occurrences missed
while none ran: ``skip`` (none is run), ``once`` (one run, then the future:
the rule before this revision, and the default, so existing schedules keep it)
or ``all`` (each missed occurrence, in order, up to the scheduler's cap).
``schedule_register`` takes it as ``p_catch_up`` (default ``once``; a new
signature, granted to whoever could execute the old one), and ``last_status``
may be ``skipped``: a missed occurrence completed without being run (it leaves
``consecutive_failures`` as it was). The downgrade drops the column and turns
``skipped`` into NULL.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0011
Revises: pgstore_0010
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import run_sql_replacing_functions
from pgstore.schema.function import Function

revision = "pgstore_0011"
down_revision = "pgstore_0010"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS = ("schedules.catch_up",)

#: The function whose signature this revision changes (dropped and created again;
#: whoever could execute it at the revision before may execute it at this one, and back).
AFTER = (Function("schedule_register", ("text", "text", "text", "bigint", "bigint", "text")),)
BEFORE = (Function("schedule_register", ("text", "text", "text", "bigint", "bigint")),)


def upgrade() -> None:
    run_sql_replacing_functions(
        __file__, "0011_catch_up.up.sql", list(zip(BEFORE, AFTER, strict=True))
    )


def downgrade() -> None:
    run_sql_replacing_functions(
        __file__, "0011_catch_up.down.sql", list(zip(AFTER, BEFORE, strict=True))
    )
