"""What a downgrade of a store's schema would drop, and the confirmation it needs.

Several of pgstore's revisions add tables or columns that hold a store's data, so
undoing them drops that data, and a downgrade to ``base`` drops the store itself. Each
revision declares what its downgrade drops, once, as ``DOWNGRADE_DROPS`` beside its
upgrade (a test checks each declaration against what the downgrade drops from the
catalog); ``declared_drops`` and ``pgstore downgrade --help`` (``drops_help``) read
those declarations, and nothing else lists them. ``pgstore downgrade`` asks before a
downgrade that drops anything (``cli._cmd_downgrade``): on a terminal the operator types
the schema's name; otherwise ``--yes`` must say so up front.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
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
    "drops_help",
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


def _literal(path: Path, tree: ast.Module, name: str) -> object:
    """The literal value assigned to ``name`` at the top of a revision module (None when
    it assigns none); ``RuntimeError`` for a value that is not a literal."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            try:
                return ast.literal_eval(value)
            except ValueError:
                raise RuntimeError(f"{path}: {name} is not a literal") from None
    return None


@functools.cache
def _declared(directory: Path) -> tuple[tuple[str, str | None, tuple[str, ...]], ...]:
    """Every revision of ``directory``, newest first: its id, the id it revises (None for
    the first) and its ``DOWNGRADE_DROPS``, read from the modules' text (literals: no
    module is imported, so ``pgstore --help`` loads no revision)."""
    found: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    for path in sorted(directory.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        revision, down = _literal(path, tree, "revision"), _literal(path, tree, "down_revision")
        if not isinstance(revision, str):
            continue
        drops = _literal(path, tree, "DOWNGRADE_DROPS") or ()
        if not isinstance(down, (str, type(None))) or not isinstance(drops, tuple) or not all(
            isinstance(d, str) for d in drops
        ):
            raise RuntimeError(f"{path}: down_revision or DOWNGRADE_DROPS is not what it should be")
        found[revision] = (down, drops)
    from pgstore.schema.files import head_of

    chain: list[tuple[str, str | None, tuple[str, ...]]] = []
    current: str | None = head_of(directory)
    while current is not None:
        down, drops = found[current]
        chain.append((current, down, drops))
        current = down
    return tuple(chain)


def _versions() -> Path:
    from pgstore.schema.files import versions_dir

    return versions_dir()


def declared_drops(revision: str) -> tuple[str, ...]:
    """What ``revision``'s downgrade drops, as its module declares (``DOWNGRADE_DROPS``):
    tables, and columns as ``table.column``; empty when it drops neither."""
    for found, _, drops in _declared(_versions()):
        if found == revision:
            return drops
    raise KeyError(revision)


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def drops_help() -> str:
    """What each downgrade that drops data drops, newest revision first, in the words of
    ``pgstore downgrade --help``: ``below pgstore_0014 the job_fences table and
    store_settings.max_lease_ms; ...; below pgstore_0001 (to base, the default) the
    schedules and schedule_fences tables and the store``. Read from each revision's
    ``DOWNGRADE_DROPS``."""
    parts = []
    for revision, down, drops in _declared(_versions()):
        if not drops and down is not None:
            continue
        tables = [d for d in drops if "." not in d]
        columns = [d for d in drops if "." in d]
        named = []
        if tables:
            named.append(f"the {_and(tables)} {'table' if len(tables) == 1 else 'tables'}")
        if columns:
            named.append(_and(columns))
        if down is None:
            named.append("the store")
            parts.append(f"below {revision} (to base, the default) {_and(named)}")
        else:
            parts.append(f"below {revision} {_and(named)}")
    return "; ".join(parts)


def revisions_undone(current: str | None, target: str) -> list[str]:
    """The revisions a downgrade from ``current`` to ``target`` undoes, newest first
    (``target`` as alembic takes it: ``base``, a revision id, or relative such as ``-1``).
    An unknown or non-downgrade ``target`` raises alembic's ``CommandError``, with the
    message alembic's own downgrade command gives."""
    if current is None:
        return []
    from alembic.script.revision import RangeNotAncestorError, ResolutionError, RevisionError
    from alembic.util import CommandError

    # The walk alembic's downgrade command makes (select_for_downgrade: relative targets
    # count from ``current``), and its messages for a target it refuses.
    try:
        return [
            script.revision
            for script in _script().iterate_revisions(current, target, select_for_downgrade=True)
        ]
    except RangeNotAncestorError as exc:
        raise CommandError(
            f"Destination {target} is not a valid downgrade target from current head(s)"
        ) from exc
    except ResolutionError as exc:
        raise CommandError(f"Can't locate revision identified by '{exc.argument}'") from exc
    except RevisionError as exc:
        raise CommandError(exc.args[0]) from exc


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
