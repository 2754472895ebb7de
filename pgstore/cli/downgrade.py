"""What a downgrade of a store's schema would drop, and the confirmation it needs.

Two of pgstore's revisions create the tables that hold a store's data, so
undoing them drops that data: downgrading below ``pgstore_0002`` drops the
``jobs`` table, and below ``pgstore_0001`` (to ``base``) drops ``schedules`` and
``schedule_fences`` and then the store itself. The other revisions change
functions and grants only. ``pgstore downgrade`` asks before a downgrade that
drops a table (``cli._cmd_downgrade``): on a terminal the operator types the
schema's name; otherwise ``--yes`` must say so up front.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import psycopg
from psycopg import sql

from pgstore.errors import PgStoreError

__all__ = [
    "DATA_REVISIONS",
    "Dropped",
    "NotConfirmed",
    "confirm",
    "dropped_tables",
    "loss_text",
    "revisions_undone",
]

#: The revisions whose downgrade drops tables, and those tables.
DATA_REVISIONS: dict[str, tuple[str, ...]] = {
    "pgstore_0001": ("schedules", "schedule_fences"),
    "pgstore_0002": ("jobs",),
    "pgstore_0006": ("store_settings",),  # the owner's bound on p_now, if one was set
    "pgstore_0015": ("store_epoch",),  # the epoch a fence after a restore set, if any
}


class NotConfirmed(PgStoreError):
    """A downgrade that drops data was not confirmed: nothing was changed."""


@dataclass(frozen=True)
class Dropped:
    """A table a downgrade would drop, and how many rows it holds now."""

    table: str
    rows: int


def revisions_undone(current: str | None, target: str) -> list[str]:
    """The revisions a downgrade from ``current`` to ``target`` undoes, newest first
    (``target`` as alembic takes it: ``base``, a revision id, or relative such as ``-1``).
    An unknown or non-downgrade ``target`` raises alembic's ``CommandError``."""
    if current is None:
        return []
    from alembic.script import ScriptDirectory

    from pgstore.schema.migrations import alembic_config

    script = ScriptDirectory.from_config(alembic_config())
    # The steps alembic's own downgrade command runs (command.downgrade resolves the
    # target with this same call): relative targets count from ``current``, which the
    # public iterate_revisions does not do.
    return [step.revision.revision for step in script._downgrade_revs(target, current)]


def dropped_tables(
    conn: psycopg.Connection[Any], schema: str, revisions: Sequence[str]
) -> list[Dropped]:
    """The tables of ``schema`` that undoing ``revisions`` drops, with their row counts."""
    found = []
    for revision in revisions:
        for table in DATA_REVISIONS.get(revision, ()):
            exists = conn.execute(
                "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL",
                (schema, table),
            ).fetchone()
            if exists is None or not exists[0]:
                continue
            counted = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.{}").format(
                    sql.Identifier(schema), sql.Identifier(table)
                )
            ).fetchone()
            found.append(Dropped(table, int(counted[0]) if counted else 0))
    return found


def loss_text(schema: str, current: str, target: str, dropped: Sequence[Dropped]) -> str:
    """One line: ``downgrading schema 'x' from A to B drops table jobs (12 rows), ...``."""
    tables = ", ".join(
        f"{d.table} ({d.rows} row{'' if d.rows == 1 else 's'})" for d in dropped
    )
    return (
        f"downgrading schema {schema!r} from {current} to {target} drops "
        f"table{'' if len(dropped) == 1 else 's'} {tables} and the data in them"
    )


def confirm(loss: str, schema: str, stdin: TextIO, stderr: TextIO) -> None:
    """Ask on ``stderr`` for the schema's name and read one line of ``stdin`` (a terminal);
    ``NotConfirmed`` unless the line is exactly ``schema``."""
    stderr.write(f"{loss}.\nType the schema name ({schema}) to go ahead; anything else stops: ")
    stderr.flush()
    answer = stdin.readline()
    if not answer.endswith("\n"):
        stderr.write("\n")  # end of input: the error goes on a line of its own
    if answer.rstrip("\r\n") != schema:
        raise NotConfirmed(f"downgrade not confirmed, nothing changed: {loss}")
