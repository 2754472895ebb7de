"""pgstore 0016: store_stats() no longer scans the history; job_list() answers finished_at.

``store_stats()`` counted the finished jobs (dispatched, recalled, cancelled,
failed) by scanning the jobs table: about 0.1 s a million rows, on every call,
which a metrics scrape made. Its columns and their meanings are unchanged; the
counts stay exact. How:

* recalled (dispatched and cancelled) and failed (not cancelled, not
  dispatched) jobs are counted whole through one new partial index,
  ``jobs_recalled_or_failed``: both states stay small (a recall is a cancel
  racing a dispatch; a failure needs a person, and ``job_retry`` or
  ``job_purge`` takes it away). Leases and renews change none of its
  columns, so they stay HOT; every statement writing the jobs table tests
  its predicate and writes an entry only for a recalled or failed job. One
  index, not one per state: each index is opened and tested by every write;
* every other finished job is counted once into the new one-row table
  ``job_history``: how many jobs have ``finished_at < upto``, and how many of
  them are dispatched and not cancelled. Only a delete or a retry changes
  those two numbers for such a job (a cancel of a failed job and the mark of
  a cancelled one move a job between states that keep both), so ``job_purge``,
  ``job_remove`` and ``job_retry`` call ``job_history_forget`` after their own
  write. ``store_stats`` adds the jobs finished since ``upto`` (a range of the
  finished jobs' index) and reads cancelled as what is left;
* ``store_stats`` (now VOLATILE) first calls ``job_history_advance``, which
  moves ``upto`` forward without ever waiting (it reads the row, and locks it
  ``FOR UPDATE SKIP LOCKED`` only to write; not on a standby, not read-only,
  only under READ COMMITTED). ``finished_at`` is the clock of the finishing
  statement, not of its commit, so a job can become visible with a
  ``finished_at`` below an ``upto`` already taken: once ``upto`` is ten
  seconds behind, a call proposes ``now_ms() - 1 s`` with
  ``pg_current_snapshot()``, and a later call takes it only once every
  transaction running at that snapshot has ended. Those writes are at most
  about one durable commit per ten seconds, whatever the rate of calls.

Why not counters kept by the functions that finish jobs (sharded, per
statement): exact, but every mark, cancel and failing release would write
one more row (and a mark would need the job's state before its UPDATE,
which PostgreSQL 15's RETURNING does not give), on the path a peer
benchmark measures. Why not triggers: a statement trigger with transition
tables cannot be limited to some columns, so every lease and renew would
pay it. This design leaves the write path's functions as they were.

The job's write path (lease, renew, mark, the batch calls, cancel, release)
is unchanged and never touches ``job_history``: its only new cost is the
partial index's predicate. Changed functions: ``store_stats`` (body,
VOLATILE), ``job_list`` (new return type), ``job_retry``, ``job_remove``,
``job_purge`` (each calls ``job_history_forget`` after its write). New:
``job_history`` (table), ``job_history_advance()``, ``job_history_forget(bigint[],
boolean[])`` (internal, granted to no one), index ``jobs_recalled_or_failed``
(built by the upgrade: one read of the jobs table).

``store_stats()`` at 1,000 and 1,000,000 finished jobs (``make bench --only
stats``, PostgreSQL 15, 2 cores, load 6; 1% of the history recalled, 0.1%
failed): 2.2 ms and 134 ms before, 2.1 ms and 5.8 ms after (the million's
11,000 recalled and failed jobs, counted from the index). Server CPU of a
lease with its mark, after / before: 0.99x (0.80-1.11); of a cancel: 1.09x
(0.86-1.51); both within the run's noise. docs/performance.md has the run.

``job_list()`` answered every column of the jobs table but ``finished_at``,
which the documentation lists and an operator needs (when did it finish, what
will a purge take): it now answers the table's columns in its order, then
``matching``.

Downgrade: the 0015 bodies back, the new objects dropped; no job row changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0016
Revises: pgstore_0015
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import run_sql_replacing_functions, set_schema_revision
from pgstore.schema.function import Function

revision = "pgstore_0016"
down_revision = "pgstore_0015"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS = ("job_history",)

#: job_list changes its return type: dropped and created, its grants carried over.
REPLACED = (
    (Function("job_list", ("text", "bigint", "integer")),
     Function("job_list", ("text", "bigint", "integer"))),
)


def upgrade() -> None:
    run_sql_replacing_functions(__file__, "0016_stats_history.up.sql", list(REPLACED))
    set_schema_revision(revision)


def downgrade() -> None:
    run_sql_replacing_functions(__file__, "0016_stats_history.down.sql", list(REPLACED))
    set_schema_revision(down_revision)
