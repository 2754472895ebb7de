"""pgstore 0025: the lease probes for a due job outside the default group first.

With 100,000 future-dated priority jobs (or any pending job outside the default
group, queue 'default' at priority 0) beside the due ones, job_lease and
job_lease_many ran job_lease_due's loose scan over the (queue, priority) groups at
every call: about 100 us of server CPU that a table without them never spends, so a
lease at 1,000,000 rows cost 1.33x one at 1,000 (issue 25 asks for 1.1x). The new
index jobs_pending_others_by_dispatch_at holds the same jobs as jobs_pending_by_queue
by dispatch_at alone; one probe of it, from now backwards, tells whether any of them
is due. While none is, both lease functions, every queue or a list, run the default
group's walk alone (or nothing, for a list without 'default'). job_lease_many's walk
of the default group moves into job_lease_default, planned once per session: once
the table held many pending jobs, the generic plan of its LIMIT p_limit never looked
cheaper than a custom one, so it was planned again at every call (about 400 us at
1,000,000 rows). Figures: docs/performance.md, "The lease beside future priority
jobs". Cost: a job outside the default group adds one more index entry when it is
scheduled and when a lease moves it off its page; default-group jobs never touch the
index. The downgrade drops the index (no data) and restores pgstore_0024's
functions. Written by ``make revision NAME=lease_probe`` from sql/.

New: ``job_lease_default(text, bigint, bigint, integer)``.

Changed (CREATE OR REPLACE: owners and grants kept): ``job_lease_due(bigint,
text[])``, ``job_lease(text, bigint, bigint, text[])``, ``job_lease_many(text,
bigint, bigint, integer, text[])``.

Table changes, written by hand: the index jobs_pending_others_by_dispatch_at (see
the .up.sql).

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0025
Revises: pgstore_0024
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import run_sql_beside, set_schema_revision

revision = "pgstore_0025"
down_revision = "pgstore_0024"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS: tuple[str, ...] = ()

_NAME = Path(__file__).stem


def upgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.up.sql")
    set_schema_revision(revision)


def downgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.down.sql")
    set_schema_revision(down_revision)
