"""pgstore: the restore epoch, so a restore that keeps the timeline hands out no token twice.

``token_floor()`` was 2^40 * (timeline ID - 1): a promotion starts a new
timeline, so the first claim or lease after it jumps above everything the old
primary can have handed out. Four ways back to an older copy of the store keep
the timeline, and with it the floor: a base backup or volume snapshot started
as a primary, a ``pg_dump`` restored into a new cluster, a logical replica
switched to, and a second standby promoted onto the timeline a standby that
died had already used. Each re-issued the tokens and lease sequences the lost
server had acknowledged after the copy was taken.

Now ``token_floor()`` = 2^40 * (timeline - 1 + ``store_epoch.epoch``), and the
owner runs ``fence_after_restore(p_promotions)`` (``pgstore fence
--after-restore``) on the restored server before any worker connects: with M
the greatest of every ``schedules.fencing_token``,
``schedule_fences.fencing_token``, ``jobs.lease_sequence`` and the current
floor, it sets the epoch so the floor becomes 2^40 * (M div 2^40 + 1 +
p_promotions). The lost server handed out fewer than 2^40 per id in each band
(the timeline rule's own assumption), in M's band and in one more band per
promotion (or fence) it went through after the copy: all of them lie below.

Why a table, read by the statements: the epoch must travel with the data (a
dump, a snapshot and a base backup carry the table's row) and be out of the
clients' reach (no grant: a client cannot lower it, as it could a GUC). The
writes compute the floor inline (``token_floor_at((SELECT e.epoch FROM
store_epoch e))``): one scalar subquery, an InitPlan the executor runs at most
once per statement and only when a row is claimed or leased, so each claim and
lease is still one ``UPDATE``. A lost row raises 55000 (``raise_no_epoch``)
rather than handing out a token below the floor. ``p_promotions`` defaults to
1: one failover the copy did not see costs one more band (2 per fence instead
of 1), out of the 2^23 a bigint holds, 2^13 of them below 2^53 (where
JavaScript's numbers stop being exact).

Cost: about 3 µs of server CPU per claim or lease that hands out a number,
nothing for one that finds nothing (the revision before loaded twice as a
control and this one once, in one database; backend CPU time of claim + complete
and lease + release, one transaction each, medians of per-round differences):

    per iteration                 PostgreSQL 15.20              PostgreSQL 18.6
    claim_due + complete          96.7 us, +3.3 (ctrl -3.3)     66.7 us, +3.3 (ctrl 0.0)
    claim_due, nothing due        20.0 us, +0.0 (ctrl 0.0)      20.0 us, +0.0 (ctrl 0.0)
    job_lease + release           86.7 us, +0.0 (ctrl 0.0)      73.3 us, +3.3 (ctrl 0.0)
    job_lease, nothing due        40.0 us, +0.0 (ctrl 0.0)      33.3 us, +3.3 (ctrl 0.0)

(docs/high-availability.md, "What it costs", has the quartiles.)

The SQL files beside this module are named after it; the revision's id appears
only in ``revision`` below (and ``down_revision``), which also set
``schema_revision()``.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0015
Revises: pgstore_0014
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import run_sql_beside, set_schema_revision

revision = "pgstore_0015"
down_revision = "pgstore_0014"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS = ("store_epoch",)

_NAME = Path(__file__).stem


def upgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.up.sql")
    set_schema_revision(revision)


def downgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.down.sql")
    set_schema_revision(down_revision)
