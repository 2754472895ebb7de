"""The ``pgstore`` command: migrate a store's schema and look inside it.

::

    pgstore --version
    pgstore migrate   [--dsn DSN] [--schema NAME] [--revision REV] [--client-role NAME|on|off]
                      [--adopt-client-role]
    pgstore downgrade [--dsn DSN] [--schema NAME] [--revision REV] [--client-role NAME|on|off]
                      [--yes]
    pgstore current   [--dsn DSN] [--schema NAME]
    pgstore schedules [--dsn DSN] [--schema NAME]
    pgstore jobs      [--dsn DSN] [--schema NAME] [--dispatched | --due] [--limit N]
    pgstore status    [--dsn DSN] [--schema NAME]
    pgstore run       MODULE:OBJECT [--log-level LEVEL]

The database: ``--dsn`` (libpq conninfo or URI), else ``PGSTORE_DSN``, else
the empty conninfo (libpq's ``PG*`` variables). The schema: ``--schema``, else
``PGSTORE_SCHEMA``, else ``pgstore``. Failures print one line on stderr,
``pgstore: error: ...``, and exit with status 1; a schema that is missing or
not at the migration head is such a failure, saying what to run.

``downgrade`` below ``pgstore_0002`` drops the jobs table, and to ``base``
(below ``pgstore_0001``) the schedules too and the whole store
(``pgstore._downgrade``): it first names the tables and their row counts, and
goes ahead only when the operator types the schema's name on a terminal, or
with ``--yes``; otherwise it exits with status 2 and changes nothing. A schema
whose store was migrated through a host app's alembic history (no pgstore
version table in it, ``pgstore._history``) is reported by ``current`` from its
own ``schema_revision()`` and left alone by ``migrate`` and ``downgrade``.

The tables cut ids, owners, holders and worker ids (``…`` marks the cut) to fit
the width: ``COLUMNS`` when set, else the terminal's when stdout is one; a pipe
or a file gets every value whole.

``schedules`` and ``jobs`` print a table; instants are epoch ms with their
ISO-8601 UTC form, and leases and due times are judged against the database
clock (``now_ms()``), not this host's. ``jobs`` lists every job, ordered by
``dispatch_at`` then ``run_id``, at most ``--limit`` of them (default 100,
``0``: all; a cut list ends with ``... N more``). ``--dispatched``: only
dispatched jobs. ``--due``: only the jobs a lease
could take now or once their lease expires: due (``dispatch_at <= now``), not
dispatched, not cancelled, leased or not (the lease column shows who holds
one). It is one call of ``job_list()``, which sends only the rows it prints and
how many match in all; like every command, it needs only EXECUTE on the store's
functions (the client role), never SELECT on its tables.

``status`` is the on-call view (``pgstore._status``): every schedule's next
run, last run, lease and how long it has been due and unclaimed, then the
number of jobs per state (pending, due, leased, dispatched, cancelled) and the
oldest due job's lag. Its dispatched and cancelled counts scan the jobs table.

``run MODULE:OBJECT`` (``pgstore._app``) imports ``MODULE`` (the current
directory first on ``sys.path``) and runs its ``pgstore.Scheduler`` or
``pgstore.Dispatcher`` ``OBJECT`` (a dotted attribute path; or a zero-argument
callable returning one) until SIGTERM or SIGINT, logging each event on one line
to stderr. The object carries its store, so ``run`` takes no ``--dsn``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from ._schema import DEFAULT_SCHEMA
from .errors import PgStoreError
from .models import Job, JobFilter, ScheduleRecord

__all__ = [
    "CUT_MARK",
    "DEFAULT_JOB_LIMIT",
    "MIN_CUT",
    "clip",
    "due_state",
    "fitted",
    "format_duration",
    "format_instant",
    "holder_lease_state",
    "job_lease_state",
    "jobs_table",
    "lease_state",
    "main",
    "output_width",
    "schedules_table",
]

PROG = "pgstore"
DSN_VARIABLE = "PGSTORE_DSN"
SCHEMA_VARIABLE = "PGSTORE_SCHEMA"
NOT_MIGRATED = "none (not migrated)"
NULL = "-"
#: How many jobs ``pgstore jobs`` shows unless ``--limit`` says otherwise.
DEFAULT_JOB_LIMIT = 100
#: ``pgstore run --log-level`` choices.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

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


#: Marks a value cut to fit the terminal.
CUT_MARK = "\u2026"
#: The fewest characters a value cut to fit keeps, the mark included.
MIN_CUT = 12


def clip(value: str, limit: int | None = None) -> str:
    """``value`` on one line (control characters escaped), cut to ``limit`` characters
    ending in ``CUT_MARK`` when it is longer; None: never cut."""
    shown = _text(value)
    if limit is None or len(shown) <= limit:
        return shown
    return shown[: max(limit - 1, 0)] + CUT_MARK


def lease_state(record: ScheduleRecord, now_ms: int, limit: int | None = None) -> str:
    """``free``, ``held by OWNER until ISO (in Ns)`` or ``expired (OWNER)``, at ``now_ms``;
    OWNER cut to ``limit`` characters (``clip``).

    A lease is live while ``lease_until > now`` (SPEC §4: a claim needs
    ``lease_until IS NULL OR lease_until <= now``).
    """
    if record.lease_owner is None and record.lease_until is None:
        return "free"
    owner = clip(record.lease_owner, limit) if record.lease_owner is not None else "nobody"
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


def schedules_table(
    records: Sequence[ScheduleRecord], now_ms: int, width: int | None = None
) -> str:
    """The records as an aligned text table (header, rule, one line per record); ids, specs
    and lease owners cut to fit ``width`` characters (``fitted``)."""

    def rows(limit: int | None) -> list[tuple[str, ...]]:
        return [
            (
                clip(r.id, limit),
                r.kind,
                clip(r.spec, limit),
                format_instant(r.next_run_at),
                format_instant(r.last_run_at),
                r.last_status or NULL,
                str(r.fencing_token),
                lease_state(r, now_ms, limit),
            )
            for r in records
        ]

    return fitted(COLUMNS, rows, width)


def _aligned(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An aligned text table: header, rule, one line per row; columns two spaces apart."""
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out.extend(line(row) for row in rows)
    return "\n".join(out)


def _widest(text: str) -> int:
    return max(map(len, text.splitlines()), default=0)


def fitted(
    columns: Sequence[str],
    rows_at: Callable[[int | None], Sequence[Sequence[str]]],
    width: int | None,
) -> str:
    """The aligned table of ``rows_at(None)`` (every value whole) when ``width`` is None or
    its lines fit; else of ``rows_at(limit)`` with the largest ``limit`` on the wide values
    (ids, owners, worker ids) whose lines fit in ``width`` characters, at least ``MIN_CUT``:
    the fixed-format cells (instants, states, counts) are never cut, so on a very narrow
    terminal the lines still overflow."""
    table = _aligned(columns, rows_at(None))
    if width is None or _widest(table) <= width:
        return table
    best, low, high = MIN_CUT, MIN_CUT, max(MIN_CUT, width)
    while low <= high:  # the table only widens as the limit grows
        middle = (low + high) // 2
        if _widest(_aligned(columns, rows_at(middle))) <= width:
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return _aligned(columns, rows_at(best))


# --- jobs ---------------------------------------------------------------------


def format_duration(ms: int) -> str:
    """A non-negative span of ms, for people: ``250ms``, ``42s``, ``5m03s``, ``2h05m``, ``3d04h``.

    Whole units are truncated (callers round first when they must not under-state).
    """
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def _until(ms: int) -> str:
    # A span still to come, rounded up to the second: "in 0s" would read as "now".
    return format_duration(math.ceil(ms / 1000) * 1000)


def due_state(job: Job, now_ms: int) -> str:
    """``dispatch_at`` against ``now_ms``: ``in 5m00s``; ``overdue 12s`` or ``due now`` for a
    job still waiting (not dispatched, not cancelled); ``12s ago`` for the others."""
    if job.dispatch_at > now_ms:
        return f"in {_until(job.dispatch_at - now_ms)}"
    pending = not job.dispatched and not job.cancelled
    if job.dispatch_at == now_ms:
        return "due now" if pending else "0ms ago"
    late = format_duration(now_ms - job.dispatch_at)
    return f"overdue {late}" if pending else f"{late} ago"


def holder_lease_state(
    holder: str | None, lease_until: int | None, now_ms: int, limit: int | None = None
) -> str:
    """``-`` (no lease), ``live: HOLDER until ISO (in 30s)`` or ``expired: HOLDER until ISO
    (12s ago)``, at ``now_ms``; HOLDER cut to ``limit`` characters (``clip``). A lease is
    live while ``lease_until > now`` (SPEC §4, §5)."""
    if holder is None and lease_until is None:
        return NULL
    who = clip(holder, limit) if holder is not None else "nobody"
    if lease_until is None:
        return f"{who} (no expiry)"
    until = iso_utc(lease_until)
    if lease_until > now_ms:
        return f"live: {who} until {until} (in {_until(lease_until - now_ms)})"
    return f"expired: {who} until {until} ({format_duration(now_ms - lease_until)} ago)"


def job_lease_state(job: Job, now_ms: int, limit: int | None = None) -> str:
    """A job's lease at ``now_ms``, as ``holder_lease_state`` shows it."""
    return holder_lease_state(job.lease_holder, job.lease_until, now_ms, limit)


JOB_COLUMNS = ("run_id", "dispatch_at", "due", "lease", "dispatched", "cancelled", "worker_id")


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def jobs_table(jobs: Sequence[Job], now_ms: int, width: int | None = None) -> str:
    """The jobs as an aligned text table (header, rule, one line per job), in the given order;
    run ids, lease holders and worker ids cut to fit ``width`` characters (``fitted``)."""

    def rows(limit: int | None) -> list[tuple[str, ...]]:
        return [
            (
                clip(j.run_id, limit),
                format_instant(j.dispatch_at),
                due_state(j, now_ms),
                job_lease_state(j, now_ms, limit),
                _yes_no(j.dispatched),
                _yes_no(j.cancelled),
                clip(j.worker_id, limit) if j.worker_id is not None else NULL,
            )
            for j in jobs
        ]

    return fitted(JOB_COLUMNS, rows, width)


# --- commands ---------------------------------------------------------------


def _revision_text(revision: str | None) -> str:
    return NOT_MIGRATED if revision is None else revision


def output_width() -> int | None:
    """The width tables are cut to fit: ``COLUMNS`` when it is a positive integer, else the
    terminal's when stdout is one; None (every value whole) for a pipe or a file."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _refuse_foreign(conninfo: str, schema: str, command: str) -> None:
    """``ForeignHistory`` when another alembic history (a host app's) manages ``schema``."""
    from ._history import foreign_revision, managed_elsewhere

    conn: psycopg.Connection[Any]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        revision = foreign_revision(conn, schema)
    if revision is not None:
        raise managed_elsewhere(schema, revision, command)


def _client_role(text: str) -> bool | str:
    lowered = text.lower()  # unstripped: " " is a role name, and strip() eats controls
    if lowered in ("on", "true", "yes", "1"):
        return True
    if lowered in ("off", "false", "no", "0", "none"):
        return False
    return text


def _cmd_migrate(args: argparse.Namespace) -> int:
    from .schema_migrations import current_revision, migrate

    _refuse_foreign(args.dsn, args.schema, "migrate")
    migrate(args.dsn, args.schema, args.revision, args.client_role, args.adopt_client_role)
    revision = current_revision(args.dsn, args.schema)
    print(f"schema {args.schema!r} is at {_revision_text(revision)}")
    return 0


def _cmd_downgrade(args: argparse.Namespace) -> int:
    from ._downgrade import NotConfirmed, confirm, dropped_tables, loss_text, revisions_undone
    from .schema_migrations import current_revision, downgrade

    _refuse_foreign(args.dsn, args.schema, "downgrade")
    current = current_revision(args.dsn, args.schema)
    undone = revisions_undone(current, args.revision)
    conn: psycopg.Connection[Any]
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        dropped = dropped_tables(conn, args.schema, undone)
    if dropped and not args.yes:
        assert current is not None  # something to undo
        loss = loss_text(args.schema, current, args.revision, dropped)
        if not sys.stdin.isatty():
            raise NotConfirmed(
                f"{loss}; stdin is not a terminal, so pass --yes to go ahead (nothing changed)"
            )
        confirm(loss, args.schema, sys.stdin, sys.stderr)
    downgrade(args.dsn, args.schema, args.revision, args.client_role)
    revision = current_revision(args.dsn, args.schema)
    print(f"schema {args.schema!r} is at {_revision_text(revision)}")
    return 0


def _cmd_current(args: argparse.Namespace) -> int:
    from ._history import foreign_revision
    from .schema_migrations import current_revision

    revision = current_revision(args.dsn, args.schema)
    if revision is None:
        conn: psycopg.Connection[Any]
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            foreign = foreign_revision(conn, args.schema)
        if foreign is not None:
            print(
                f"{foreign} (from the schema's schema_revision(); managed by another alembic "
                "history, e.g. a host app's: migrate it through that history)"
            )
            return 0
    print(_revision_text(revision))
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
    print(schedules_table(records, now, output_width()))
    return 0


def _cmd_jobs(args: argparse.Namespace) -> int:
    from .jobs import PgJobStore

    limit: int | None = args.limit or None  # 0: no limit
    conn: psycopg.Connection[Any]
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        store = PgJobStore(conn, schema=args.schema)
        try:
            store.start()  # SchemaNotReady, saying what to run, when not at head
            now = store.now_ms()
            selected: JobFilter = "dispatched" if args.dispatched else "due" if args.due else "all"
            page = store.list_jobs(selected, now, limit)
        finally:
            store.close()
    jobs, total = page.jobs, page.matching
    print(f"schema {args.schema!r}, database clock {format_instant(now)}")
    if not jobs:
        which = "dispatched " if args.dispatched else "due " if args.due else ""
        print(f"no {which}jobs")
        return 0
    print(jobs_table(jobs, now, output_width()))
    if total > len(jobs):
        print(f"... {total - len(jobs)} more (--limit N shows N, --limit 0 all)")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from ._status import status_text
    from .schedules import PgScheduleStore

    conn: psycopg.Connection[Any]
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        store = PgScheduleStore(conn, schema=args.schema)
        try:
            store.start()  # SchemaNotReady, saying what to run, when not at head
            now = store.now_ms()
            records = store.list()
            stats = store.stats(now)
        finally:
            store.close()
    print(status_text(args.schema, now, records, stats, output_width()))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from ._app import load_runtime, logging_to_stderr, serve

    with logging_to_stderr(args.log_level):
        runtime = load_runtime(args.target)
        serve(runtime, args.target)
    return 0


# --- parsing and errors -----------------------------------------------------


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a count of jobs (0 or more): {text!r}")
    return value


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
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {_version()}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    migrate = commands.add_parser(
        "migrate", parents=[common], help="upgrade the schema (to head by default)"
    )
    migrate.add_argument("--revision", default="head", help="target revision (default: head)")
    migrate.add_argument(
        "--client-role",
        type=_client_role,
        default=True,
        metavar="NAME|on|off",
        help="the NOLOGIN role granted the store's functions: on (default: "
        "<schema>_client_<database>), a role name, or off (grant nothing)",
    )
    migrate.add_argument(
        "--adopt-client-role",
        action="store_true",
        help="use the client role even if it already exists and can log in, or pgstore did "
        "not create it for this schema in this database (a role shared on purpose)",
    )
    migrate.set_defaults(run=_cmd_migrate)

    downgrade = commands.add_parser(
        "downgrade",
        parents=[common],
        help="downgrade the schema; to base (the default) drops the store and its data",
        description=(
            "Downgrade the schema to --revision. Two revisions hold data: going below "
            "pgstore_0002 (to pgstore_0001) drops the jobs table, and going below pgstore_0001 "
            "(to base, the default) also drops the schedules and schedule_fences tables and "
            "the store. Such a downgrade first says which tables it drops and how many rows "
            "they hold; on a terminal it asks you to type the schema name, otherwise it "
            "needs --yes (without it: exit status 2, nothing changed). The other revisions "
            "change functions and grants only."
        ),
    )
    downgrade.add_argument("--revision", default="base", help="target revision (default: base)")
    downgrade.add_argument(
        "--yes",
        action="store_true",
        help="go ahead without asking, even when the downgrade drops tables and their data",
    )
    downgrade.add_argument(
        "--client-role",
        type=_client_role,
        default=True,
        metavar="NAME|on|off",
        help="the client role migrate granted (its grants are revoked; dropped if pgstore "
        "created it)",
    )
    downgrade.set_defaults(run=_cmd_downgrade)

    current = commands.add_parser(
        "current", parents=[common], help="print the schema's migration revision"
    )
    current.set_defaults(run=_cmd_current)

    schedules = commands.add_parser(
        "schedules", parents=[common], help="list the schedule records and their leases"
    )
    schedules.set_defaults(run=_cmd_schedules)

    jobs = commands.add_parser(
        "jobs",
        parents=[common],
        help="list the jobs and their leases, by dispatch_at",
        description=(
            "List the jobs of the schema's job store, ordered by dispatch_at then run_id: "
            "run_id, dispatch_at (epoch ms and ISO UTC), how overdue or how far ahead, "
            "the lease (holder, until, live or expired), dispatched, cancelled, worker_id. "
            "Times are judged against the database clock. Without a filter: every job."
        ),
    )
    only = jobs.add_mutually_exclusive_group()
    only.add_argument(
        "--dispatched", action="store_true", help="only dispatched jobs"
    )
    only.add_argument(
        "--due",
        action="store_true",
        help=(
            "only jobs waiting to be leased or sent: due (dispatch_at <= now), "
            "not dispatched, not cancelled, whether leased or not"
        ),
    )
    jobs.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_JOB_LIMIT,
        metavar="N",
        help=(
            f"show at most N jobs, the earliest first (default: {DEFAULT_JOB_LIMIT}; 0: all); "
            "a cut list ends with '... M more'"
        ),
    )
    jobs.set_defaults(run=_cmd_jobs)

    status = commands.add_parser(
        "status",
        parents=[common],
        help="the on-call view: schedules due, leased and late; jobs per state",
        description=(
            "Per schedule: next run (relative and ISO UTC), last status and how long ago "
            "it ran, fencing token, lease (holder, live or expired, until), and how long it "
            "has been due and unclaimed. Then the jobs per state: pending (not due yet), "
            "due (leasable now), leased (live lease, not dispatched), dispatched, cancelled "
            "(never dispatched), and the oldest due job's lag. Times are judged against the "
            "database clock. Cost: the waiting states read only the pending-jobs index; "
            "the dispatched and cancelled counts scan the jobs table (about 0.1 s per "
            "million jobs)."
        ),
    )
    status.set_defaults(run=_cmd_status)

    run = commands.add_parser(
        "run",
        help="run an app's Scheduler or Dispatcher until SIGTERM or SIGINT",
        description=(
            "Import MODULE (the current directory first on sys.path, as python -m does) "
            "and run OBJECT, a dotted attribute path naming a pgstore.Scheduler or "
            "pgstore.Dispatcher, or a zero-argument callable (a factory) returning one. "
            "SIGTERM or SIGINT stops claiming; running work gets the runtime's grace "
            "period, then the store is closed and the exit status is 0. Claims, runs, "
            "completions, leases, dispatches, recalls, releases and lost leases are logged "
            "to stderr, one line each with a UTC timestamp. The object carries its store: "
            "no --dsn or --schema here."
        ),
    )
    run.add_argument("target", metavar="MODULE:OBJECT", help="e.g. myapp.tasks:scheduler")
    run.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO",
        help="the least severe level logged (default: INFO)",
    )
    run.set_defaults(run=_cmd_run)
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


def _version() -> str:
    try:
        return importlib.metadata.version("pgstore")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error (already printed)
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    from ._downgrade import NotConfirmed

    try:
        status: int = args.run(args)
    except NotConfirmed as exc:
        print(f"{PROG}: error: {describe_error(exc)}", file=sys.stderr)
        return 2
    except _expected_errors() as exc:
        print(f"{PROG}: error: {describe_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
