"""What a downgrade of a store's schema would drop, and the confirmation it needs.

Several of pgstore's revisions add tables or columns that hold a store's data, so
undoing them drops that data: below ``pgstore_0011`` ``schedules.catch_up``, below
``pgstore_0010`` the attempts, the failed state and the last errors, below
``pgstore_0009`` ``jobs.finished_at``, below ``pgstore_0007`` ``jobs.lease_sequence``,
below ``pgstore_0006`` ``store_settings``, below ``pgstore_0002`` the ``jobs`` table,
and below ``pgstore_0001`` (to ``base``) ``schedules`` and ``schedule_fences`` and then
the store itself. Each revision declares what its downgrade drops, once, as
``DOWNGRADE_DROPS`` beside its upgrade (a test checks each declaration against what
the downgrade drops from the catalog). ``pgstore downgrade`` asks before a downgrade
that drops anything (``cli._cmd_downgrade``): on a terminal the operator types the
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
    "Dropped",
    "Loss",
    "NotConfirmed",
    "confirm",
    "declared_drops",
    "dropped_objects",
    "loss_text",
    "revisions_undone",
]


class NotConfirmed(PgStoreError):
    """A downgrade that drops data was not confirmed: nothing was changed."""


@dataclass(frozen=True)
class Dropped:
    """A table a downgrade would drop, and how many rows it holds now."""

    table: str
    rows: int


@dataclass(frozen=True)
class Loss:
    """What undoing one revision drops: its columns (``table.column``) and its tables."""

    revision: str
    columns: tuple[str, ...]
    tables: tuple[Dropped, ...]


def _script() -> Any:
    from alembic.script import ScriptDirectory

    from pgstore.schema.migrations import alembic_config

    return ScriptDirectory.from_config(alembic_config())


def declared_drops(revision: str) -> tuple[str, ...]:
    """What ``revision``'s downgrade drops, as its module declares (``DOWNGRADE_DROPS``):
    tables, and columns as ``table.column``; empty when it drops neither."""
    module = _script().get_revision(revision).module
    return tuple(getattr(module, "DOWNGRADE_DROPS", ()))


def revisions_undone(current: str | None, target: str) -> list[str]:
    """The revisions a downgrade from ``current`` to ``target`` undoes, newest first
    (``target`` as alembic takes it: ``base``, a revision id, or relative such as ``-1``).
    An unknown or non-downgrade ``target`` raises alembic's ``CommandError``."""
    if current is None:
        return []
    # The steps alembic's own downgrade command runs (command.downgrade resolves the
    # target with this same call): relative targets count from ``current``, which the
    # public iterate_revisions does not do.
    return [step.revision.revision for step in _script()._downgrade_revs(target, current)]


def _exists(conn: psycopg.Connection[Any], schema: str, table: str, column: str | None) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_attribute a"
        " WHERE a.attrelid = to_regclass(format('%%I.%%I', %s::text, %s::text))"
        "   AND (%s::text IS NULL OR a.attname = %s) AND NOT a.attisdropped AND a.attnum > 0)",
        (schema, table, column, column),
    ).fetchone()
    return bool(row and row[0])


def dropped_objects(
    conn: psycopg.Connection[Any], schema: str, revisions: Sequence[str]
) -> list[Loss]:
    """Per revision of ``revisions`` whose downgrade drops something that ``schema``
    holds, what it drops: the columns, and the tables with their row counts."""
    losses = []
    for revision in revisions:
        columns: list[str] = []
        tables: list[Dropped] = []
        for name in declared_drops(revision):
            table, _, column = name.partition(".")
            if not _exists(conn, schema, table, column or None):
                continue
            if column:
                columns.append(name)
                continue
            counted = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.{}").format(
                    sql.Identifier(schema), sql.Identifier(table)
                )
            ).fetchone()
            tables.append(Dropped(table, int(counted[0]) if counted else 0))
        if columns or tables:
            losses.append(Loss(revision, tuple(columns), tuple(tables)))
    return losses


def _plural(word: str, count: int) -> str:
    return word if count == 1 else f"{word}s"


def _one_revision(loss: Loss) -> str:
    parts = []
    if loss.columns:
        parts.append(f"{_plural('column', len(loss.columns))} {', '.join(loss.columns)}")
    if loss.tables:
        tables = ", ".join(f"{d.table} ({d.rows} {_plural('row', d.rows)})" for d in loss.tables)
        parts.append(f"{_plural('table', len(loss.tables))} {tables}")
    return f"{loss.revision}: {' and '.join(parts)}"


def loss_text(schema: str, current: str, target: str, losses: Sequence[Loss]) -> str:
    """One line: ``downgrading schema 'x' from A to B drops, with the data in them,
    pgstore_0007: column jobs.lease_sequence; pgstore_0002: table jobs (12 rows)``."""
    return (
        f"downgrading schema {schema!r} from {current} to {target} drops, with the data in "
        f"them, {'; '.join(_one_revision(loss) for loss in losses)}"
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
