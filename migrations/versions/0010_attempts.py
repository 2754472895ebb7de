"""pgstore 0010: stored attempts, failed jobs, and a schedule's failures in a row.

Every ``job_lease`` adds one to the new ``jobs.attempts``; a job may have at
most ``jobs.max_attempts`` leases (``job_schedule``'s new optional
``p_max_attempts``, else ``store_settings.default_max_attempts``, 25 unless the
owner changes it). ``job_release`` takes an optional ``p_error`` (kept as
``last_error``, at most 4096 characters); the release of a job whose attempts
reached its maximum fails it: ``failed``, terminal, never leased again,
purged by ``job_purge`` like the other finished jobs. ``job_retry`` puts a
failed job back to waiting (attempts reset), ``job_list`` lists them (filter
``'failed'``), ``store_stats`` counts them (``jobs_failed``). Schedules count
``consecutive_failures`` beside ``last_status``. The jobs already stored start
at 0 attempts with the default maximum; calls without the new arguments
behave as before.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0010
Revises: pgstore_0009
"""

from __future__ import annotations

from pgstore.schema.alembic_steps import grant_client_role, run_sql_replacing_functions
from pgstore.schema.function import Function

revision = "pgstore_0010"
down_revision = "pgstore_0009"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS = (
    "jobs.attempts",
    "jobs.max_attempts",
    "jobs.last_error",
    "jobs.failed",
    "schedules.consecutive_failures",
    "store_settings.default_max_attempts",
)

#: The functions this revision drops and creates again (a new argument or new result
#: columns): whoever could execute one at the revision before may execute it at this
#: one, and back.
AFTER = (
    Function("job_schedule", ("text", "bigint", "integer")),
    Function("job_release", ("text", "text", "bigint", "bigint", "text")),
    Function("store_stats", ("bigint",)),
    Function("job_list", ("text", "bigint", "integer")),
)
BEFORE = (
    Function("job_schedule", ("text", "bigint")),
    Function("job_release", ("text", "text", "bigint", "bigint")),
    Function("store_stats", ("bigint",)),
    Function("job_list", ("text", "bigint", "integer")),
)

#: What this revision adds to the client role's functions.
CLIENT_FUNCTIONS = (Function("job_retry", ("text", "bigint")),)


def upgrade() -> None:
    run_sql_replacing_functions(
        __file__, "0010_attempts.up.sql", list(zip(BEFORE, AFTER, strict=True))
    )
    grant_client_role(CLIENT_FUNCTIONS)


def downgrade() -> None:
    run_sql_replacing_functions(
        __file__, "0010_attempts.down.sql", list(zip(AFTER, BEFORE, strict=True))
    )
