"""pgstore 0018: schedule controls: pause, resume, trigger and per-schedule jitter.

Issue 25, part 3. A schedule could not be paused through a provider's outage, run
once out of turn, or spread off the top of the hour. Four columns on ``schedules``:
``paused`` (the claims skip a paused schedule), ``jitter_ms`` and ``due_at``
(generated: ``schedule_due_at(id, next_run_at, jitter_ms)``, the nominal
``next_run_at`` plus a deterministic offset in [0, jitter_ms); the claims compare
``due_at`` with now instead of ``next_run_at``, one stored column, so the claim path
reads what it did), and ``triggered_at`` (a run asked for by ``schedule_trigger``,
taken by the next claim; its complete keeps ``next_run_at``). Adding ``due_at``
rewrites the table once. ``schedule_register`` takes ``p_jitter_ms`` (default 0).

Downgrade: the four columns are dropped: pauses, jitters and pending triggers are
lost (a paused schedule runs again); occurrences are kept.

New: ``schedule_due_at(text, bigint, bigint)``, ``schedule_pause(text,
bigint)``, ``schedule_resume(text, bigint)``, ``schedule_trigger(text,
bigint)``.

Changed (CREATE OR REPLACE: owners and grants kept): ``schedule_claim_due(text,
text, bigint, bigint)``, ``schedule_complete(text, bigint, bigint, bigint, text,
bigint)``, ``schedule_claim_next(text, bigint, bigint, integer, text[])``.

Dropped and created again (a new return type or arguments; whoever could execute
the one before may execute the new one, and back): ``schedule_register(text,
text, text, bigint, bigint, text, bigint)``.

Table changes (by hand): the four columns and the jitter_ms check.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0018
Revises: pgstore_0017
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import (
    grant_client_role,
    run_sql_replacing_functions,
    set_schema_revision,
)
from pgstore.schema.function import Function

revision = "pgstore_0018"
down_revision = "pgstore_0017"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS: tuple[str, ...] = (
    "schedules.due_at",
    "schedules.jitter_ms",
    "schedules.paused",
    "schedules.triggered_at",
)

#: The functions this revision drops and creates again (a new return type or new
#: arguments): whoever could execute one at the revision before may execute it at
#: this one, and back.
BEFORE = (
    Function("schedule_register", ("text", "text", "text", "bigint", "bigint", "text")),
)
AFTER = (
    Function("schedule_register", ("text", "text", "text", "bigint", "bigint", "text", "bigint")),
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
