"""The ``pgstore`` command: migrate a store's schema and look inside it.

::

    pgstore migrate   [--dsn DSN] [--schema NAME] [--revision REV]   (default: head)
    pgstore downgrade [--dsn DSN] [--schema NAME] [--revision REV]   (default: base)
    pgstore current   [--dsn DSN] [--schema NAME]
    pgstore schedules [--dsn DSN] [--schema NAME]

The database: ``--dsn`` (libpq conninfo or URI), else ``PGSTORE_DSN``, else
the empty conninfo (libpq's ``PG*`` variables). The schema: ``--schema``, else
``PGSTORE_SCHEMA``, else ``pgstore``. Failures print one line on stderr,
``pgstore: error: ...``, and exit with status 1.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from ._schema import DEFAULT_SCHEMA
from .errors import PgStoreError
from .models import ScheduleRecord

__all__ = ["format_instant", "lease_state", "main", "schedules_table"]

PROG = "pgstore"
DSN_VARIABLE = "PGSTORE_DSN"
SCHEMA_VARIABLE = "PGSTORE_SCHEMA"
NOT_MIGRATED = "none (not migrated)"
NULL = "-"

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def iso_utc(ms: int) -> str:
    """Epoch ms as an ISO-8601 UTC instant, e.g. ``2024-05-01T12:00:00.000Z``."""
    try:
        instant = _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return "out of range"
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_instant(ms: int | None) -> str:
    """``<ms> (<ISO-8601 UTC>)``, or ``-`` for NULL."""
    if ms is None:
        return NULL
    return f"{ms} ({iso_utc(ms)})"


def _text(value: str) -> str:
    # One record, one line: show control characters escaped.
    return value if value.isprintable() else repr(value)


def lease_state(record: ScheduleRecord, now_ms: int) -> str:
    """``free``, ``held by OWNER until ISO (in Ns)`` or ``expired (OWNER)``, at ``now_ms``.

    A lease is live while ``lease_until > now`` (SPEC §4: a claim needs
    ``lease_until IS NULL OR lease_until <= now``).
    """
    if record.lease_owner is None and record.lease_until is None:
        return "free"
    owner = _text(record.lease_owner) if record.lease_owner is not None else "nobody"
    if record.lease_until is None:
        return f"held by {owner} (no expiry)"
    if record.lease_until > now_ms:
        seconds = math.ceil((record.lease_until - now_ms) / 1000)
        return f"held by {owner} until {iso_utc(record.lease_until)} (in {seconds}s)"
    return f"expired ({owner})"


COLUMNS = (
    "id",
    "kind",
    "spec",
    "next_run_at",
    "last_run_at",
    "last_status",
    "fencing_token",
    "lease",
)


def schedules_table(records: Sequence[ScheduleRecord], now_ms: int) -> str:
    """The records as an aligned text table (header, rule, one line per record)."""
    rows = [
        (
            _text(r.id),
            r.kind,
            _text(r.spec),
            format_instant(r.next_run_at),
            format_instant(r.last_run_at),
            r.last_status or NULL,
            str(r.fencing_token),
            lease_state(r, now_ms),
        )
        for r in records
    ]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(COLUMNS)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(COLUMNS), line(["-" * w for w in widths])]
    out.extend(line(row) for row in rows)
    return "\n".join(out)


# --- commands ---------------------------------------------------------------


def _revision_text(revision: str | None) -> str:
    return NOT_MIGRATED if revision is None else revision


def _cmd_migrate(args: argparse.Namespace) -> int:
    from .schema_migrations import current_revision, migrate

    migrate(args.dsn, args.schema, args.revision)
    revision = current_revision(args.dsn, args.schema)
    print(f"schema {args.schema!r} is at {_revision_text(revision)}")
    return 0


def _cmd_downgrade(args: argparse.Namespace) -> int:
    from .schema_migrations import current_revision, downgrade

    downgrade(args.dsn, args.schema, args.revision)
    revision = current_revision(args.dsn, args.schema)
    print(f"schema {args.schema!r} is at {_revision_text(revision)}")
    return 0


def _cmd_current(args: argparse.Namespace) -> int:
    from .schema_migrations import current_revision

    print(_revision_text(current_revision(args.dsn, args.schema)))
    return 0


def _cmd_schedules(args: argparse.Namespace) -> int:
    from .schedules import PgScheduleStore

    # One connection of our own (not the store's pool, which would retry a
    # bad DSN for its whole timeout before failing).
    conn: psycopg.Connection[Any]
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        store = PgScheduleStore(conn, schema=args.schema)
        try:
            store.start()  # SchemaNotReady, saying what to run, when not at head
            records = store.list()
            now = store.now_ms()
        finally:
            store.close()
    print(f"schema {args.schema!r}, database clock {format_instant(now)}")
    if not records:
        print("no schedules")
        return 0
    print(schedules_table(records, now))
    return 0


# --- parsing and errors -----------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (defaults read from the environment now)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dsn",
        default=os.environ.get(DSN_VARIABLE, ""),
        help=f"libpq conninfo or URI (default: ${DSN_VARIABLE}, else libpq's PG* variables)",
    )
    common.add_argument(
        "--schema",
        default=os.environ.get(SCHEMA_VARIABLE) or DEFAULT_SCHEMA,
        help=f"the store's schema (default: ${SCHEMA_VARIABLE}, else {DEFAULT_SCHEMA!r})",
    )

    parser = argparse.ArgumentParser(
        prog=PROG, description="pgstore: a PostgreSQL lease store's schema and records."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    migrate = commands.add_parser(
        "migrate", parents=[common], help="upgrade the schema (to head by default)"
    )
    migrate.add_argument("--revision", default="head", help="target revision (default: head)")
    migrate.set_defaults(run=_cmd_migrate)

    downgrade = commands.add_parser(
        "downgrade",
        parents=[common],
        help="downgrade the schema; to base (the default) drops the store and its data",
    )
    downgrade.add_argument("--revision", default="base", help="target revision (default: base)")
    downgrade.set_defaults(run=_cmd_downgrade)

    current = commands.add_parser(
        "current", parents=[common], help="print the schema's migration revision"
    )
    current.set_defaults(run=_cmd_current)

    schedules = commands.add_parser(
        "schedules", parents=[common], help="list the schedule records and their leases"
    )
    schedules.set_defaults(run=_cmd_schedules)
    return parser


def _one_line(text: str) -> str:
    return " ".join(text.split())


def describe_error(exc: BaseException) -> str:
    """A one-line description of a failure, for ``pgstore: error: ...``."""
    try:
        from sqlalchemy.exc import DBAPIError
    except ImportError:  # pragma: no cover - sqlalchemy comes with alembic
        pass
    else:
        if isinstance(exc, DBAPIError) and exc.orig is not None:
            exc = exc.orig  # the driver's own error, without SQLAlchemy's decoration
    message = _one_line(str(exc))
    if isinstance(exc, OSError) and exc.filename is not None and not message:
        message = str(exc.filename)
    return message or type(exc).__name__


def _expected_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [psycopg.Error, PgStoreError, OSError]
    try:
        from alembic.util.exc import CommandError
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:  # pragma: no cover
        pass
    else:
        errors += [CommandError, SQLAlchemyError]
    return tuple(errors)


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error (already printed)
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    try:
        status: int = args.run(args)
    except _expected_errors() as exc:
        print(f"{PROG}: error: {describe_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
