"""pgstore 0023: job_list takes p_queues, the operator's listing by queue.

``pgstore jobs --queue`` and the console's jobs page list the jobs of some queues
only: ``job_list`` takes ``p_queues text[] DEFAULT NULL`` (NULL: every queue, as
before; else a non-empty array of names, 22023 otherwise, as ``job_lease`` checks it),
so the filter runs in the one statement and ``matching`` counts the jobs of those
queues. Calls with three arguments run unchanged and answer what they answered. The
downgrade restores pgstore_0022's function; nothing is stored, so nothing is lost.

Dropped and created again (a new return type or arguments; whoever could execute
the one before may execute the new one, and back): ``job_list(text, bigint,
integer, text[])``.

No table changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0023
Revises: pgstore_0022
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import run_sql_replacing_functions, set_schema_revision
from pgstore.schema.function import Function

revision = "pgstore_0023"
down_revision = "pgstore_0022"
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
    Function("job_list", ("text", "bigint", "integer")),
)
AFTER = (
    Function("job_list", ("text", "bigint", "integer", "text[]")),
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
