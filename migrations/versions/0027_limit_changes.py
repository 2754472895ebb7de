"""pgstore 0027: the queue limits hold through changes of the limits, and batches.

A review of pgstore_0026 found, each with a test that fails on it:

* a renew that waited for ``queue_set_concurrency(q, NULL)`` found no lane place and
  answered false, cutting a live lease short (tests/isolation/specs/
  queue_limit_lease.spec); a lease of a queue with no concurrency limit by then needs no
  place;
* a renew looked for its place again only once: after two changes back to back it found
  it gone twice, answered false and cut the lease while its place stayed busy (every
  holder refused in test_a_renew_keeps_its_place_through_changes_back_to_back); a pass
  now repeats while a row that held a lease in its snapshot was gone or changed once
  locked;
* a lease took a lane place freed below a lowered concurrency limit while the leases
  over it (retired rows) still lived: three live under a limit of 1. Each retired row
  left now holds back one lane: a lease of k jobs locks k + r usable lanes, fills k and
  clears the free place of the r others; a renew without a place takes none while one is
  left; the new ``queue_slots_sweep`` first deletes, under their row lock, the retired
  rows whose lease ended at the leaser's p_now;
* a lowered rate limit kept the uses of its lowest places, not its newest, so a lease
  after the change could make a window hold more than the new limit; it keeps the newest;
* a batch that failed a job of a limited queue (out of attempts) leased one job fewer
  than the single leases that follow would; another round takes the queue's next job.

What it costs: a lease of a limited queue makes two more index probes of queue_slots
(whether the queue has a retired row, before and with its read of the lanes), and no
more row locks unless it has one (not measured: ``make bench --only limits`` would).
The downgrade restores pgstore_0026's bodies and comments; the rows are the same (a
retired row a leaser deleted served a lease that had ended). Written by ``make revision
NAME=limit_changes`` from sql/.

New: ``queue_slots_sweep(text, bigint)``.

Changed (CREATE OR REPLACE: owners and grants kept): ``job_lease_take(text,
bigint, bigint, integer, text[], integer[])``, ``queue_slots_layout(text,
integer, integer)``, ``queue_limits_reserve(text[], integer[], bigint)``,
``queue_limits_fill(jsonb, text[], text[], bigint[], bigint, bigint)``,
``queue_limits_keep(text[], text[], bigint[], bigint, bigint)``.

Table changes, written by hand: the comment of queue_slots.slot.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0027
Revises: pgstore_0026
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import run_sql_beside, set_schema_revision

revision = "pgstore_0027"
down_revision = "pgstore_0026"
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
