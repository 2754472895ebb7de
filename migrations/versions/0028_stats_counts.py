"""pgstore 0028: store_stats() costs the same with any history: every count in job_history.

Until now ``store_stats()`` counted the recalled and failed jobs of the whole history
at every call, from the partial index ``jobs_recalled_or_failed`` (11,000 entries at a
million finished jobs with the bench's 1% of recalls): its cost grew with the history.
Now ``job_history`` counts every kind of finished job below its ``upto`` (new columns
``recalled`` and ``failed``, folded in by ``job_history_advance`` as the others are),
and ``store_stats()`` reads that one row and the jobs finished since ``upto``.

A job already counted changes kind only by a rare move, and each tells
``job_history_move`` (which replaces ``job_history_forget``) after its own write:
a recall (``job_mark_dispatched`` or ``job_mark_dispatched_many`` of a cancelled job),
``job_cancel`` of a failed job, ``job_retry``, ``job_purge``. The common write path (a
lease, renew, release, the mark of a job not cancelled, the cancel of a job not failed)
never touches ``job_history``, so concurrent writers do not queue on its row: only the
rare moves lock it, for a moment. A mark needs the job's state before its UPDATE, which
PostgreSQL 15's RETURNING does not give, so the marks' UPDATE leaves out a job already
recalled: a cancelled job it answers was recalled by that very call. A second UPDATE,
run only when the first recorded nothing, records the worker of a recalled job marked
again by its holder, so every answer and row is as before.

``store_stats``' statement moves to ``store_stats_read(bigint)``, an internal helper
planned once a session (``plan_cache_mode = force_generic_plan``): planning it cost
several times what running it costs, at every call, and a session whose first plans
counted a history that ``job_history`` had not passed yet turned to a generic plan that
walked the whole history at every call (190 ms at a million on PostgreSQL 15; the
range of finished jobs now has an upper end, so that generic plan walks the index).

The upgrade locks the jobs table (ACCESS EXCLUSIVE, which dropping the index needs),
counts the recalled and failed jobs below ``upto`` from the index, then drops it. A
mark or cancel that began in the old function body and waited on that lock runs the
old body after the upgrade commits: should it recall a counted job or cancel a counted
failed one (both rare), job_history misses that move. Upgrade while no jobs are being
marked, or accept that. The downgrade builds the index again and drops the two columns
(nothing else is lost: job_history keeps what pgstore_0027 kept).

``store_stats()`` like for like (the same 20 waiting jobs, ``python -m
pgstore.bench.stats_1m``, 2 cores, load 6): at 1,000 and at 1,000,000 finished jobs,
243 and 234 µs on PostgreSQL 15 (0.99x; 320 and 1,765 µs before), 218 and 209 µs on
PostgreSQL 18 (0.97x; 305 and 13,234 µs before, a parallel plan's workers among
them). The write path's server CPU, after / before (``make bench --only stats
--stats-base-sql``): a lease with its mark 0.99x (PostgreSQL 15) and 0.96x (18), a
cancel 0.98x and 0.94x, within the runs' noise. docs/performance.md has the runs.

New: ``job_history_move(bigint[], text[], text[])``,
``store_stats_read(bigint)``.

Changed (CREATE OR REPLACE: owners and grants kept): ``job_mark_dispatched(text,
text, text, bigint)``, ``job_retry(text, bigint)``, ``job_cancel(text)``,
``job_purge(bigint, integer)``, ``job_mark_dispatched_many(text[], text, text[],
bigint[])``, ``job_history_advance()``, ``store_stats(bigint)``.

Dropped: ``job_history_forget(bigint[], boolean[])``.

Table changes, written by hand: ``job_history.recalled`` and ``job_history.failed``
(counted from the rows by the upgrade), index ``jobs_recalled_or_failed`` dropped.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0028
Revises: pgstore_0027
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import run_sql_beside, set_schema_revision

revision = "pgstore_0028"
down_revision = "pgstore_0027"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS: tuple[str, ...] = ("job_history.failed", "job_history.recalled")

_NAME = Path(__file__).stem


def upgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.up.sql")
    set_schema_revision(revision)


def downgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.down.sql")
    set_schema_revision(down_revision)
