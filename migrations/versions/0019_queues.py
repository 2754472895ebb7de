"""pgstore 0019: queues, priorities and payloads on jobs; a lease flat in the backlog.

A job carried nothing and every dispatcher of a schema leased from one FIFO list
(issue 25). Jobs now have a ``queue`` (``'default'``), a ``priority`` (higher is
leased first; 0) and a ``payload`` (jsonb, at most ``store_settings.max_payload_bytes``
as JSON text, 64 KiB). ``job_schedule`` and ``job_schedule_many`` take them (NULL:
the default for a new job, the job's own for an existing one), ``job_lease`` and
``job_lease_many`` take ``p_queues`` (NULL: every queue) and lease by priority,
then dispatch_at, then run_id; ``job_list`` answers the new columns. Calls written
for pgstore_0018 run unchanged. ``queue_pause`` and ``queue_resume`` stop and start
the leasing of a queue's jobs (a row in the new ``queues`` table; nothing on the
schedule path), ``queue_list`` answers each queue's depth, due, leased and paused.

The waiting jobs are split between two partial indexes, each job in exactly one:
``jobs_pending_by_dispatch_at (dispatch_at, run_id)`` now holds the default group's
(queue ``'default'``, priority 0) and the new ``jobs_pending_by_queue (queue,
priority DESC, dispatch_at, run_id)`` every other. The common case (every waiting
job in the default group, ``p_queues`` NULL) leases with pgstore_0018's statement
over the same index, after one probe that finds ``jobs_pending_by_queue`` empty;
a lease off the heap page adds one pending-index entry, as before. The batched
lease and mark (100 a call) measured 1.04x and 1.06x of pgstore_0018's server CPU
per job, with 30,000 and 300,000 due jobs, side by side (the patch this revision
comes from, with one index of every waiting job by queue and generic plans, took
1.22x, and 8-11x at 300,000). Otherwise: one probe per (queue, priority) group (a
loose index scan, backwards), then the due head of each, so future-dated jobs of a
higher priority are never walked on the way to due ones (``make bench``, the scale
section, has the figures). ``store_stats``, ``job_list('due')`` and ``queue_list``
read both indexes.

Downgrade: the functions go back to pgstore_0018's, and
``jobs_pending_by_dispatch_at`` to every waiting job; the columns, the new index, the
setting and the queues table are dropped, and with them every job's queue, priority
and payload and every pause (a paused queue's jobs are leased again).

New: ``check_payload(text, jsonb)``, ``check_queues(text[])``,
``job_lease_groups(text[])``, ``job_lease_take(text, bigint, bigint, integer,
text[])``, ``queue_pause(text)``, ``queue_resume(text)``,
``queue_list(bigint)``.

Dropped and created again (a new return type or arguments; whoever could execute
the one before may execute the new one, and back): ``job_schedule(text, bigint,
integer, text, integer, jsonb)``, ``job_lease(text, bigint, bigint, text[])``,
``job_schedule_many(text[], bigint[], text, integer, jsonb[])``,
``job_lease_many(text, bigint, bigint, integer, text[])``, ``job_list(text,
bigint, integer)``.

Tables: ``jobs.queue``, ``jobs.priority``, ``jobs.payload``,
``store_settings.max_payload_bytes``, index ``jobs_pending_by_queue``, the
predicate of ``jobs_pending_by_dispatch_at`` (written by hand in the .up.sql and
.down.sql; the upgrade builds both indexes: one read of the jobs table each).
Table ``queues`` (one row per queue ever paused) and the queue controls
``queue_pause``, ``queue_resume`` and ``queue_list``.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0019
Revises: pgstore_0018
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import (
    grant_client_role,
    run_sql_replacing_functions,
    set_schema_revision,
)
from pgstore.schema.function import Function

revision = "pgstore_0019"
down_revision = "pgstore_0018"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS: tuple[str, ...] = (
    "jobs.payload",
    "jobs.priority",
    "jobs.queue",
    "store_settings.max_payload_bytes",
    "queues",
)

#: The functions this revision drops and creates again (a new return type or new
#: arguments): whoever could execute one at the revision before may execute it at
#: this one, and back.
BEFORE = (
    Function("job_schedule", ("text", "bigint", "integer")),
    Function("job_lease", ("text", "bigint", "bigint")),
    Function("job_schedule_many", ("text[]", "bigint[]")),
    Function("job_lease_many", ("text", "bigint", "bigint", "integer")),
    Function("job_list", ("text", "bigint", "integer")),
)
AFTER = (
    Function("job_schedule", ("text", "bigint", "integer", "text", "integer", "jsonb")),
    Function("job_lease", ("text", "bigint", "bigint", "text[]")),
    Function("job_schedule_many", ("text[]", "bigint[]", "text", "integer", "jsonb[]")),
    Function("job_lease_many", ("text", "bigint", "bigint", "integer", "text[]")),
    Function("job_list", ("text", "bigint", "integer")),
)

_NAME = Path(__file__).stem


def upgrade() -> None:
    run_sql_replacing_functions(
        __file__, f"{_NAME}.up.sql", list(zip(BEFORE, AFTER, strict=True))
    )
    grant_client_role()
    set_schema_revision(revision)


def downgrade() -> None:
    run_sql_replacing_functions(
        __file__, f"{_NAME}.down.sql", list(zip(AFTER, BEFORE, strict=True))
    )
    set_schema_revision(down_revision)
