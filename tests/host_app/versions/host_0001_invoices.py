"""The host app's first revision; it needs pgstore's schedule store.

Revision ID: host_0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "host_0001"
down_revision = None
branch_labels = ("host",)
depends_on = "pgstore_0001"


def upgrade() -> None:
    op.create_table("invoices", sa.Column("id", sa.Integer, primary_key=True))


def downgrade() -> None:
    op.drop_table("invoices")
