"""pgstore 0024: concurrency and rate limits per queue.

A queue may hold at most N live leases at once (queue_set_concurrency) and lease at
most N of its jobs in any window of one period (queue_set_rate), across every host:
each limit is N rows of the new table queue_slots, and a lease of a job in a limited
queue locks one usable row of each limit (FOR UPDATE SKIP LOCKED) and writes its lease
into it; renews extend the concurrency row; mark, release and cancel write nothing
(the jobs row frees a row by positive evidence). Queues without limits have no rows and
their leases never read the table (job_lease_take reads the limits of the queues it
walks, one probe of queues each; the default group's fast path reads them in the probe
of queues it made for pauses). queue_list answers the limits. The downgrade drops
queue_slots and the three columns of queues: the limits are lost, the queues rows
stay. Written by ``make revision NAME=queue_limits`` from sql/.

New: ``queue_limit_max()``, ``queue_slot_free(text, bigint, bigint, bigint)``,
``check_queue_limit(text, integer)``, ``queue_set_concurrency(text, integer)``,
``queue_set_rate(text, integer, bigint)``, ``queue_limits_wants(text[],
integer[], text[], bigint, integer)``, ``queue_limits_reserve(text[], integer[],
bigint)``, ``queue_limits_fill(jsonb, text[], text[], bigint[], bigint,
bigint)``, ``queue_limits_keep(text[], text[], bigint[], bigint, bigint)``,
``queue_limits_caps(jsonb, text[])``.

Changed (CREATE OR REPLACE: owners and grants kept): ``job_lease_take(text,
bigint, bigint, integer, text[], integer[])``, ``job_lease(text, bigint, bigint,
text[])``, ``job_renew(text, text, bigint, bigint, bigint)``,
``job_lease_many(text, bigint, bigint, integer, text[])``,
``job_renew_many(text[], text, bigint, bigint, bigint[])``.

Dropped and created again (a new return type or arguments; whoever could execute
the one before may execute the new one, and back): ``queue_list(bigint)``.

Table changes, written by hand: queues.concurrency_limit, rate_limit,
rate_period_ms; the table queue_slots (see the .up.sql).

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0024
Revises: pgstore_0023
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import (
    grant_client_role,
    run_sql_replacing_functions,
    set_schema_revision,
)
from pgstore.schema.function import Function

revision = "pgstore_0024"
down_revision = "pgstore_0023"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS: tuple[str, ...] = (
    "queues.concurrency_limit", "queues.rate_limit", "queues.rate_period_ms", "queue_slots",
)

#: The functions this revision drops and creates again (a new return type or new
#: arguments): whoever could execute one at the revision before may execute it at
#: this one, and back.
BEFORE = (
    Function("queue_list", ("bigint",)),
)
AFTER = (
    Function("queue_list", ("bigint",)),
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
