"""pgstore 0007: fencing tokens and lease sequences that survive a failover.

Every claim lifts the fencing token, and every lease the new
``jobs.lease_sequence``, to at least ``token_floor()`` = 2^40 * (timeline ID
- 1), so neither goes backwards when a promoted standby lost commits its old
primary had acknowledged. Every API function that writes fails at once on a
standby (25006, naming the server as a standby). ``job_renew``,
``job_mark_dispatched`` and ``job_release`` take the lease sequence as an
optional fence; calls without it behave as before. Existing jobs get
``lease_sequence = 0``.

The downgrade keeps the highest lease sequence in ``downgrade_marks`` (when a job
was ever leased), and the upgrade back lifts every job to at least it, so a round
trip never hands out a lease sequence a worker may still hold
(``pgstore.schema.marks``); without a mark the upgrade does what it always did.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0007
Revises: pgstore_0006
"""

from __future__ import annotations

from pgstore.schema import marks
from pgstore.schema.alembic_steps import run_sql, run_sql_replacing_functions
from pgstore.schema.function import Function

revision = "pgstore_0007"
down_revision = "pgstore_0006"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS = ("jobs.lease_sequence",)

#: The three functions whose signature this revision changes (dropped and created again;
#: whoever could execute one at the revision before may execute it at this one, and back).
AFTER = (
    Function("job_renew", ("text", "text", "bigint", "bigint", "bigint")),
    Function("job_mark_dispatched", ("text", "text", "text", "bigint")),
    Function("job_release", ("text", "text", "bigint", "bigint")),
)
BEFORE = (
    Function("job_renew", ("text", "text", "bigint", "bigint")),
    Function("job_mark_dispatched", ("text", "text", "text")),
    Function("job_release", ("text", "text", "bigint")),
)


def upgrade() -> None:
    run_sql_replacing_functions(
        __file__, "0007_failover_fencing.up.sql", list(zip(BEFORE, AFTER, strict=True))
    )
    run_sql(marks.LIFT_LEASE_SEQUENCE)


def downgrade() -> None:
    run_sql(marks.KEEP_LEASE_SEQUENCE)
    run_sql_replacing_functions(
        __file__, "0007_failover_fencing.down.sql", list(zip(AFTER, BEFORE, strict=True))
    )
