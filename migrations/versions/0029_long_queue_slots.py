"""pgstore 0029: a queue name too long for queue_slots' key is refused with 22023.

``queue_set_concurrency`` and ``queue_set_rate`` turned the btree's refusal of a name
too long to index (incompressible multibyte characters, within the 1024-character rule)
into 22023 for ``queues``' key only. ``queue_slots``' key, ``(queue, slot)``, is a few
bytes wider: a name of 2,689 to 2,692 bytes of UTF-8 fitted the one and not the other,
and the call answered 54000 (``program_limit_exceeded``), which no contract names. The
hostile-input test found it. Both writes are now in the block that answers 22023 (a
subtransaction a call: these are operators' calls). Nothing else changes; the downgrade
puts the two functions back as 0028 had them, and keeps every row. Written by ``make
revision NAME=long_queue_slots`` from sql/.

Changed (CREATE OR REPLACE: owners and grants kept):
``queue_set_concurrency(text, integer)``, ``queue_set_rate(text, integer,
bigint)``.

No table changes.

Frozen: runs the SQL files beside this file, as written when this revision
was made. Changes to sql/ need a new revision.

Revision ID: pgstore_0029
Revises: pgstore_0028
"""

from __future__ import annotations

from pathlib import Path

from pgstore.schema.alembic_steps import run_sql_beside, set_schema_revision

revision = "pgstore_0029"
down_revision = "pgstore_0028"
branch_labels = None
depends_on = None

#: What this revision's downgrade drops, and the data in it: tables, and columns as
#: ``table.column`` (``pgstore downgrade`` names them and asks first; a test checks this
#: against what the downgrade drops from the catalog).
DOWNGRADE_DROPS: tuple[str, ...] = ()

_NAME = Path(__file__).stem


def upgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.up.sql")
    set_schema_revision(revision)


def downgrade() -> None:
    run_sql_beside(__file__, f"{_NAME}.down.sql")
    set_schema_revision(down_revision)
