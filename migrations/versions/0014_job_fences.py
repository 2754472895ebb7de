"""pgstore 0014: fences on the job store.

* ``job_remove`` is granted to the client role, so it no longer deletes what an
  application dispatched, nor a job a dispatcher may still be dispatching: it
  deletes only a job that waits (not dispatched, cancelled or failed) and holds
  no lease (``lease_holder IS NULL``; a job whose lease merely expired may be
  mid-dispatch, and its mark must then find the row). Any other job: SQLSTATE
  55000 naming its state, nothing changed (``JobNotRemovable`` in Python).
  Erasing history stays the owner's, with ``job_purge``.
* A run id purged or removed and then scheduled again started over at
  ``lease_sequence`` 1, so ``(run_id, lease_sequence)`` no longer named one
  lease: a fenced mark from a dispatch that outlived its lease was recorded on
  the new job. The new one-row, owner-only ``job_fences`` keeps one store-wide
  high-water mark of the lease sequences deleted, raised by ``job_purge`` and
  ``job_remove`` in the statement that deletes; every lease hands out more than
  it. Not one fence row per purged run id: ``job_purge`` exists to free
  storage, and such a table would grow with every run id ever purged. The
  leasing ``UPDATE`` reads the mark itself: under READ COMMITTED a read in an
  earlier statement could predate a purge that committed before the run id was
  scheduled again. The mark starts at 0 (deletions before this revision left
  none).
* ``store_settings.max_lease_ms`` bounds every lease end a call sets:
  ``lease_ms`` of the schedule claims, ``ttl_ms`` of the job leases and renews,
  and how far past the database clock ``schedule_renew``'s ``lease_until`` may
  lie (the past is still allowed). NULL: one day while ``max_clock_skew_ms`` is
  set (a client kept from passing a far ``now`` must not hold a lease for
  centuries either), else no bound. ``check_lease`` reads both bounds in one
  read of ``store_settings``; the database-clock path of these calls now reads
  it too.
* ``max_attempts`` is one rule: a job is leased at most ``max_attempts`` times.
  ``job_lease`` and ``job_lease_many`` fail a due job whose last lease expired
  without a release (attempts >= max_attempts) instead of leasing it again, in
  the leasing ``UPDATE``, and leave it out of their answer.

Same signatures: CREATE OR REPLACE keeps owners and grants; the changed comments
are set again. No row changes; the downgrade restores 0013's bodies and comments
and drops the new table, column and helper.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0014
Revises: pgstore_0013
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import run_sql_beside

revision = "pgstore_0014"
down_revision = "pgstore_0013"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS = ("job_fences", "store_settings.max_lease_ms")


def upgrade() -> None:
    run_sql_beside(__file__, "0014_job_fences.up.sql")


def downgrade() -> None:
    run_sql_beside(__file__, "0014_job_fences.down.sql")
