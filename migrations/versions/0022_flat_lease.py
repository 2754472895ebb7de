"""pgstore 0022: the lease probes its groups with plans made once per session.

From pgstore_0019 a lease that found a pending job outside the default group, or was
given queues, called job_lease_take, which planned its due-head probe and its walk
again at every call (a custom plan: 0.3 to 1.5 ms of server CPU a call, more than the
probes themselves). job_lease_due now finds the groups worth walking, its LIMIT 1
probes under ``plan_cache_mode = force_generic_plan`` (each a descent of one partial
index); when the default group alone is worth walking, job_lease and job_lease_many
run pgstore_0018's statement, and job_lease_take walks the groups it is given. Server
CPU per job_lease with 100,000 future-dated priority jobs beside the due ones: about
1,100 µs before, 520 µs after (docs/performance.md). Same signatures and answers for
the API functions; no table changes.

Downgrade: the pgstore_0021 bodies back (job_lease_take with its old arguments,
job_lease_due dropped); no data changes.

New: ``job_lease_due(bigint, text[])``.

Changed (CREATE OR REPLACE: owners and grants kept): ``job_lease(text, bigint,
bigint, text[])``, ``job_lease_many(text, bigint, bigint, integer, text[])``.

Comments only: ``job_lease_groups(text[])``.

Dropped and created again (a new return type or arguments; whoever could execute
the one before may execute the new one, and back): ``job_lease_take(text,
bigint, bigint, integer, text[], integer[])``.

No table changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0022
Revises: pgstore_0021
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import run_sql_replacing_functions, set_schema_revision
from pgstore.schema.function import Function

revision = "pgstore_0022"
down_revision = "pgstore_0021"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS: tuple[str, ...] = ()

#: The functions this revision drops and creates again (a new return type or new
#: arguments): whoever could execute one at the revision before may execute it at
#: this one, and back.
BEFORE = (
    Function("job_lease_take", ("text", "bigint", "bigint", "integer", "text[]")),
)
AFTER = (
    Function("job_lease_take", ("text", "bigint", "bigint", "integer", "text[]", "integer[]")),
)

_NAME = Path(__file__).stem


def upgrade() -> None:
    run_sql_replacing_functions(
        __file__, f"{_NAME}.up.sql", list(zip(BEFORE, AFTER, strict=True))
    )
    set_schema_revision(revision)


def downgrade() -> None:
    run_sql_replacing_functions(
        __file__, f"{_NAME}.down.sql", list(zip(AFTER, BEFORE, strict=True))
    )
    set_schema_revision(down_revision)
