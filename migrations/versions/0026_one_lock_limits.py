"""pgstore 0026: a queue limit costs a leased job one row lock, whichever limits.

pgstore_0024 kept each limit as rows of queue_slots, one a place (kind, slot), and a
lease of a job in a queue with both a concurrency and a rate limit locked one row of
each kind: two row locks a job. Now a queue's places lie in lanes: with L the smaller of
its limits, lane i (slot i) holds the places i, i + L, ... of each kind in arrays
(run_ids, lease_sequences, lease_untils; taken_ats), so one kind is a single place in
every lane and a lease locks one lane, one row, a leased job. Each place keeps the rules
it had (a concurrency place freed early only by its job's evidence, a rate place usable
a period after its use), and is written only under its lane's lock, so both limits hold
as before. What it gives up: with both limits a lease needs a free place of each kind in
one lane. A change of the limits lays the lanes out again (queue_slots_layout: it locks
the queue's rows, waiting for the leases and renews that hold them, and replaces them);
a concurrency place above a lowered limit whose lease may live is kept as a retired row
(slot = -place) until a later change finds it ended. Renews find a lease's lane through a
GIN index on run_ids. ``make bench --only limits`` gives the cost (docs/performance.md,
"What a queue limit costs").

The upgrade rewrites queue_slots: every place keeps what it held, in its lane. The
downgrade writes the places back as one row each (kind, slot): nothing is lost, but the
catalog loses the array columns, which ``DOWNGRADE_DROPS`` names. Written by ``make
revision NAME=one_lock_limits`` from sql/.

New: ``queue_lane_free(text[], bigint[], bigint[], bigint)``,
``queue_lane_usable(bigint[], bigint, bigint)``, ``queue_slots_layout(text,
integer, integer)``.

Changed (CREATE OR REPLACE: owners and grants kept): ``job_lease_take(text,
bigint, bigint, integer, text[], integer[])``, ``job_renew(text, text, bigint,
bigint, bigint)``, ``job_renew_many(text[], text, bigint, bigint, bigint[])``,
``queue_list(bigint)``, ``queue_set_concurrency(text, integer)``,
``queue_set_rate(text, integer, bigint)``, ``queue_limits_reserve(text[],
integer[], bigint)``, ``queue_limits_fill(jsonb, text[], text[], bigint[],
bigint, bigint)``, ``queue_limits_keep(text[], text[], bigint[], bigint,
bigint)``.

Comments only: ``queue_limit_max()``, ``queue_slot_free(text, bigint, bigint,
bigint)``.

Table changes, written by hand: queue_slots made anew (lanes: run_ids,
lease_sequences, lease_untils, taken_ats arrays; slot negative for a retired place; the
kind, run_id, lease_sequence, lease_until and taken_at columns gone; a GIN index on
run_ids), its rows carried over (see the .up.sql).

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0026
Revises: pgstore_0025
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import run_sql_beside, set_schema_revision

revision = "pgstore_0026"
down_revision = "pgstore_0025"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS: tuple[str, ...] = (
    "queue_slots.lease_sequences", "queue_slots.lease_untils", "queue_slots.run_ids",
    "queue_slots.taken_ats",
)

_NAME = Path(__file__).stem


def upgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.up.sql")
    set_schema_revision(revision)


def downgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.down.sql")
    set_schema_revision(down_revision)
