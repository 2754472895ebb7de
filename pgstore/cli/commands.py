"""The ``pgstore`` command: migrate a store's schema and look inside it.

::

    pgstore --version
    pgstore migrate   [--dsn DSN] [--schema NAME] [--revision REV] [--client-role NAME|on|off]
                      [--adopt-client-role]
    pgstore downgrade [--dsn DSN] [--schema NAME] [--revision REV] [--client-role NAME|on|off]
                      [--yes]
    pgstore current   [--dsn DSN] [--schema NAME]
    pgstore schedules [--dsn DSN] [--schema NAME]
    pgstore jobs      [--dsn DSN] [--schema NAME] [--dispatched | --due | --failed] [--limit N]
    pgstore retry     [--dsn DSN] [--schema NAME] RUN_ID [--at MS]
    pgstore status    [--dsn DSN] [--schema NAME]
    pgstore purge     [--dsn DSN] [--schema NAME] --older-than AGE [--batch N]
    pgstore fence     [--dsn DSN] [--schema NAME] --after-restore [--promotions N]
    pgstore run       MODULE:OBJECT [--log-level LEVEL]

The database: ``--dsn`` (libpq conninfo or URI), else ``PGSTORE_DSN``, else
the empty conninfo (libpq's ``PG*`` variables). The schema: ``--schema``, else
``PGSTORE_SCHEMA``, else ``pgstore``. Failures print one line on stderr,
``pgstore: error: ...``, and exit with status 1; a schema that is missing or
not at the migration head is such a failure, saying what to run.

``downgrade`` across a revision that added a table or a column drops it and its
data (``pgstore.cli.downgrade``; ``pgstore downgrade --help`` lists them, read from
each revision's ``DOWNGRADE_DROPS``; to ``base`` the whole store): it first names,
per revision, the columns and the tables with their row counts, and goes ahead
only when the operator types the schema's name on a terminal, or with ``--yes``;
otherwise it exits with status 2 and changes nothing. A schema whose store was
migrated through a host app's alembic history (no pgstore version table in it,
``pgstore.schema.history``) is reported by ``current`` from its own
``schema_revision()`` and left alone by ``migrate`` and ``downgrade``.

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
dispatched, cancelled or failed, leased or not (the lease column shows who holds
one). ``--failed``: only the failed jobs (out of attempts, not cancelled), with
their last error. It is one call of ``job_list()``, which sends only the rows it prints and
how many match in all; like every command, it needs only EXECUTE on the store's
functions (the client role), never SELECT on its tables.

``status`` is the on-call view (``pgstore.cli.status``): every schedule's next
run, last run, lease and how long it has been due and unclaimed, then the
number of jobs per state (pending, due, leased, dispatched, cancelled, failed)
and the oldest due job's lag. Its dispatched, cancelled and failed counts scan
the jobs table.

``retry RUN_ID`` (one call of ``job_retry()``) puts a failed job back to
waiting, its attempts reset, due at ``--at`` (epoch ms) or the database clock's
now, and prints it; a job that is not failed (waiting, dispatched, cancelled)
or missing is an error (status 1) and nothing changes.

``purge --older-than AGE`` (``pgstore.cli.purge``) deletes the jobs that
finished (dispatched, or cancelled before their dispatch) more than ``AGE``
(``7d``, ``12h``, ``30m``, ...) before the database clock's now, ``--batch``
at a time (default 1000), one progress line per batch on stderr and the total
on stdout. Unlike the other commands it needs EXECUTE on ``job_purge``, which
the client role does not have: run it as the schema's owner.

``fence --after-restore`` (one call of ``fence_after_restore()``) lifts the
store's token floor above every fencing token and lease sequence the lost server
can have handed out, allowing for ``--promotions`` (default 1) promotions or
fences of it the copy does not show (those after the copy; for a ``pg_dump`` or
logical copy, which do not carry the timeline, also those since which it handed
out nothing); it prints the floor before and after. Run it on a restored copy
(a volume snapshot or base backup started as a primary, a ``pg_dump`` restored,
a logical replica switched to, a second standby promoted onto a dead one's
timeline) before any worker connects. Like ``purge`` it needs what the client
role lacks: run it as the schema's owner. On a standby it fails (status 1) and
changes nothing.

``run MODULE:OBJECT`` (``pgstore.cli.app``) imports ``MODULE`` (the current
directory first on ``sys.path``) and runs its ``pgstore.Scheduler`` or
``pgstore.Dispatcher`` ``OBJECT`` (a dotted attribute path; or a zero-argument
callable returning one) until SIGTERM or SIGINT, logging each event on one line
to stderr. The object carries its store, so ``run`` takes no ``--dsn``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg

from pgstore._validate import BIGINT_MAX
from pgstore.cli.format import (
    CUT_MARK,
    MIN_CUT,
    clip,
    due_state,
    fitted,
    format_duration,
    format_instant,
    holder_lease_state,
    job_lease_state,
    jobs_table,
    lease_state,
    schedules_table,
)
from pgstore.errors import PgStoreError
from pgstore.models import JobFilter
from pgstore.schema.objects import DEFAULT_SCHEMA

if TYPE_CHECKING:
    from pgstore.postgres.jobs import PgJobStore

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
#: How many jobs ``pgstore jobs`` shows unless ``--limit`` says otherwise.
DEFAULT_JOB_LIMIT = 100
#: ``pgstore run --log-level`` choices.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

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
    from pgstore.schema.history import foreign_revision, managed_elsewhere

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
    from pgstore.schema.migrations import current_revision, migrate

    _refuse_foreign(args.dsn, args.schema, "migrate")
    migrate(args.dsn, args.schema, args.revision, args.client_role, args.adopt_client_role)
    revision = current_revision(args.dsn, args.schema)
    print(f"schema {args.schema!r} is at {_revision_text(revision)}")
    return 0


def _cmd_downgrade(args: argparse.Namespace) -> int:
    from pgstore.cli.downgrade import (
        NotConfirmed,
        confirm,
        dropped_objects,
        loss_text,
        revisions_undone,
    )
    from pgstore.schema.migrations import current_revision, downgrade

    _refuse_foreign(args.dsn, args.schema, "downgrade")
    current = current_revision(args.dsn, args.schema)
    undone = revisions_undone(current, args.revision)
    conn: psycopg.Connection[Any]
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        dropped = dropped_objects(conn, args.schema, undone)
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
    from pgstore.schema.history import foreign_revision
    from pgstore.schema.migrations import current_revision

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
    from pgstore.postgres.schedules import PgScheduleStore

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


@contextmanager
def _job_store(args: argparse.Namespace) -> Iterator[PgJobStore]:
    """The schema's job store over one connection of our own (not a pool, which would
    retry a bad DSN for its whole timeout), started: ``SchemaNotReady``, saying what to
    run, when the schema is not at head."""
    from pgstore.postgres.jobs import PgJobStore

    conn: psycopg.Connection[Any]
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        store = PgJobStore(conn, schema=args.schema)
        try:
            store.start()
            yield store
        finally:
            store.close()


def _cmd_jobs(args: argparse.Namespace) -> int:
    limit: int | None = args.limit or None  # 0: no limit
    selected: JobFilter = (
        "dispatched" if args.dispatched else "due" if args.due
        else "failed" if args.failed else "all"
    )
    with _job_store(args) as store:
        now = store.now_ms()
        page = store.list_jobs(selected, now, limit)
    jobs, total = page.jobs, page.matching
    print(f"schema {args.schema!r}, database clock {format_instant(now)}")
    if not jobs:
        which = "" if selected == "all" else f"{selected} "
        print(f"no {which}jobs")
        return 0
    print(jobs_table(jobs, now, output_width()))
    if total > len(jobs):
        print(f"... {total - len(jobs)} more (--limit N shows N, --limit 0 all)")
    return 0


def _cmd_retry(args: argparse.Namespace) -> int:
    from pgstore.models import RetryResult

    with _job_store(args) as store:
        answer = store.retry(args.run_id, args.at)
        job = store.get(args.run_id)
        now = store.now_ms()
    if answer is RetryResult.MISSING or job is None:
        raise PgStoreError(f"no job {args.run_id!r} in schema {args.schema!r}")
    if answer is RetryResult.NOT_FAILED:
        raise PgStoreError(
            f"job {args.run_id!r} is not failed (it is {job.state}): nothing changed"
        )
    print(f"schema {args.schema!r}: job {args.run_id!r} waits again, attempts reset")
    print(jobs_table([job], now, output_width()))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from pgstore.cli.status import status_text
    from pgstore.postgres.schedules import PgScheduleStore

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


def _cmd_purge(args: argparse.Namespace) -> int:
    from pgstore.cli.purge import purge_in_batches

    with _job_store(args) as store:
        before = max(0, store.now_ms() - args.older_than)
        total = purge_in_batches(store.purge, before, args.batch, sys.stderr)
    print(
        f"schema {args.schema!r}: purged {total} jobs finished before {format_instant(before)}"
    )
    return 0


def _cmd_fence(args: argparse.Namespace) -> int:
    from pgstore.cli.fence import fence_text
    from pgstore.postgres.schedules import PgScheduleStore

    conn: psycopg.Connection[Any]
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        store = PgScheduleStore(conn, schema=args.schema)
        try:
            store.start()  # SchemaNotReady, saying what to run, when not at head
            fence = store.fence_after_restore(args.promotions)
        finally:
            store.close()
    print(fence_text(args.schema, fence, args.promotions))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from pgstore.cli.app import MetricsOptions, load_runtime, logging_to_stderr, serve

    metrics = None
    if args.metrics_port is not None:
        metrics = MetricsOptions(args.metrics_port, args.metrics_addr, args.stats_interval)
    with logging_to_stderr(args.log_level):
        runtime = load_runtime(args.target)
        serve(runtime, args.target, metrics)
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


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port (0 to 65535): {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 86400 * 365:
        raise argparse.ArgumentTypeError(f"not a positive number of seconds: {text!r}")
    return value


def _epoch_ms(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= BIGINT_MAX:
        raise argparse.ArgumentTypeError(f"not an instant in epoch ms (0 or more): {text!r}")
    return value


def _age(text: str) -> int:
    from pgstore.cli.purge import age_ms

    try:
        return age_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _batch(text: str) -> int:
    from pgstore.cli.purge import batch_size

    try:
        return batch_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _promotions(text: str) -> int:
    from pgstore.postgres.common_calls import PROMOTIONS_MAX

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= PROMOTIONS_MAX:
        raise argparse.ArgumentTypeError(
            f"not a count of promotions (0 to {PROMOTIONS_MAX}): {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (defaults read from the environment now)."""
    from pgstore.cli.downgrade import drops_help

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
            "Downgrade the schema to --revision. A downgrade across a revision that added "
            f"a table or a column drops it with its data: {drops_help()}. Such a downgrade "
            "first says, per revision, which columns and tables it drops and how many rows "
            "the tables hold; on a terminal it asks you to type the schema name, otherwise "
            "it needs --yes (without it: exit status 2, nothing changed). The other "
            "revisions change functions and grants only."
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
            "the lease (holder, until, live or expired), dispatched, cancelled, failed, "
            "attempts (leases so far/max_attempts), worker_id, last_error. "
            "Times are judged against the database clock. Without a filter: every job."
        ),
    )
    only = jobs.add_mutually_exclusive_group()
    only.add_argument(
        "--dispatched", action="store_true", help="only dispatched jobs"
    )
    only.add_argument(
        "--failed",
        action="store_true",
        help="only failed jobs (out of attempts, not cancelled): what 'pgstore retry' takes back",
    )
    only.add_argument(
        "--due",
        action="store_true",
        help=(
            "only jobs waiting to be leased or sent: due (dispatch_at <= now), "
            "not dispatched, cancelled or failed, whether leased or not"
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

    retry = commands.add_parser(
        "retry",
        parents=[common],
        help="put a failed job back to waiting, its attempts reset",
        description=(
            "Put the failed job RUN_ID (out of attempts: see 'pgstore jobs --failed') back "
            "to waiting, due at --at or now (the database clock), with its attempts reset "
            "to 0; its last_error is kept until a release replaces it. A job that is not "
            "failed (waiting, dispatched or cancelled) or missing: exit status 1, nothing "
            "changed. One call of job_retry(), granted to the client role."
        ),
    )
    retry.add_argument("run_id", metavar="RUN_ID", help="the failed job's run id")
    retry.add_argument(
        "--at",
        type=_epoch_ms,
        default=None,
        metavar="MS",
        help="when it is due again, in epoch ms (default: now, the database clock)",
    )
    retry.set_defaults(run=_cmd_retry)

    status = commands.add_parser(
        "status",
        parents=[common],
        help="the on-call view: schedules due, leased and late; jobs per state",
        description=(
            "Per schedule: next run (relative and ISO UTC), last status and how long ago "
            "it ran, fencing token, lease (holder, live or expired, until), and how long it "
            "has been due and unclaimed. Then the jobs per state: pending (not due yet), "
            "due (leasable now), leased (live lease, not dispatched), dispatched, cancelled "
            "(never dispatched), failed (out of attempts), and the oldest due job's lag. "
            "Times are judged against the database clock. Cost: the waiting states read "
            "only the pending-jobs index; "
            "the dispatched, cancelled and failed counts scan the jobs table (about 0.1 s per "
            "million jobs)."
        ),
    )
    status.set_defaults(run=_cmd_status)

    purge = commands.add_parser(
        "purge",
        parents=[common],
        help="delete jobs that finished longer ago than --older-than, in batches",
        description=(
            "Delete the jobs that finished (dispatched, or cancelled before their dispatch) "
            "more than AGE before the database clock's now, by calls of job_purge of N jobs "
            "each, until one deletes fewer than N. Waiting jobs and jobs whose lease is live "
            "are never deleted; rows held locked at that moment are left for the next run. "
            "One progress line per batch on stderr, the total on stdout. Needs EXECUTE on "
            "job_purge (not granted to the client role): run it as the schema's owner."
        ),
    )
    purge.add_argument(
        "--older-than",
        type=_age,
        required=True,
        metavar="AGE",
        help="how long ago a job must have finished: a count and ms, s, m, h, d or w (e.g. 7d)",
    )
    purge.add_argument(
        "--batch",
        type=_batch,
        default=1000,
        metavar="N",
        help="jobs deleted per call (per transaction; default: 1000)",
    )
    purge.set_defaults(run=_cmd_purge)

    fence = commands.add_parser(
        "fence",
        parents=[common],
        help="after a restore, before any worker connects: lift every future fencing "
        "token and lease sequence above the lost server's",
        description=(
            "Run on a restored copy of the store before any worker connects to it: a "
            "volume snapshot or base backup started as a primary, a pg_dump restored into "
            "a new cluster, a logical replica switched to, or a second standby promoted "
            "onto the timeline of one that died. These keep the timeline, so without a "
            "fence the next claims and leases hand out again the fencing tokens and lease "
            "sequences the lost server acknowledged after the copy was taken. One call of "
            "fence_after_restore(): the token floor becomes 2^40 * (M div 2^40 + 1 + N), "
            "M the highest token, lease sequence or floor in the copy. Prints the floor "
            "before and after. Each run lifts again. Needs EXECUTE on fence_after_restore "
            "(not granted to the client role): run it as the schema's owner. On a standby: "
            "exit status 1, nothing changed."
        ),
    )
    fence.add_argument(
        "--after-restore",
        action="store_true",
        required=True,
        help="the only mode, and a required flag: say that this server holds a restored copy",
    )
    from pgstore.postgres.common_calls import DEFAULT_PROMOTIONS

    fence.add_argument(
        "--promotions",
        type=_promotions,
        default=DEFAULT_PROMOTIONS,
        metavar="N",
        help="promotions (or fences) of the lost server the copy does not show: those after "
        "it, and for a pg_dump or logical copy those since which the lost server handed out "
        "nothing (default: 1); each costs one band of 2^40 tokens",
    )
    fence.set_defaults(run=_cmd_fence)

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
    run.add_argument(
        "--metrics-port",
        type=_port,
        metavar="N",
        help="serve Prometheus metrics at http://ADDR:N/metrics (0: any free port, logged); "
        "needs the metrics extra",
    )
    run.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address the metrics are served on (default: 127.0.0.1, this host only; "
        "0.0.0.0 serves every interface)",
    )
    run.add_argument(
        "--stats-interval",
        type=_seconds,
        metavar="SECONDS",
        help="read the store_stats() gauges every SECONDS (default: 15), on a connection of "
        "their own; a scrape serves the last reading and never reaches the database",
    )
    run.set_defaults(run=_cmd_run)
    from pgstore.cli.web import add_command as add_web  # pgstore web: the console

    add_web(commands, common)
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
    from pgstore.cli.downgrade import NotConfirmed

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
