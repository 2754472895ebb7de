"""The ``pgstore`` command: migrate a store's schema and look inside it.

::

    pgstore --version
    pgstore migrate   [--dsn DSN] [--schema NAME] [--revision REV] [--client-role NAME|on|off]
                      [--adopt-client-role]
    pgstore downgrade [--dsn DSN] [--schema NAME] [--revision REV] [--client-role NAME|on|off]
                      [--yes]
    pgstore current   [--dsn DSN] [--schema NAME]
    pgstore schedules [--dsn DSN] [--schema NAME] [--json] [--absolute] [--wide]
    pgstore schedules pause|resume|trigger ID [--dsn DSN] [--schema NAME] [--json]
    pgstore jobs      [--dsn DSN] [--schema NAME] [--dispatched | --due | --leased | --failed]
                      [--queue QUEUE]... [--limit N] [--json] [--absolute] [--wide]
    pgstore jobs cancel     RUN_ID [--dsn DSN] [--schema NAME]
    pgstore jobs schedule   RUN_ID --at WHEN [--max-attempts N] [--dsn DSN] [--schema NAME]
    pgstore jobs reschedule RUN_ID --at WHEN [--dsn DSN] [--schema NAME]
    pgstore jobs retry      RUN_ID... [--at WHEN] [--dsn DSN] [--schema NAME]
    pgstore retry     (the same as pgstore jobs retry)
    pgstore status    [--dsn DSN] [--schema NAME] [--json] [--absolute]
    pgstore purge     [--dsn DSN] [--schema NAME] --older-than AGE [--batch N] [--dry-run]
                      [--include-failed] [--yes]
    pgstore fence     [--dsn DSN] [--schema NAME] --after-restore [--promotions N]
    pgstore run       MODULE:OBJECT... [--log-level LEVEL] [--metrics-port N [--store-gauges]]
    pgstore exporter  [--dsn DSN] [--schema NAME] --metrics-port N
    pgstore completion bash|zsh

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

The tables cut owners, holders, worker ids, schedule ids and queues in the middle and
last errors at their end (``…`` marks the cut) to fit the width: ``COLUMNS``
when set, else the terminal's when stdout is one; a pipe, a file or ``--wide``
gets every value whole. Run ids are never cut (``pgstore.cli.format``).

``schedules`` and ``jobs`` print a table; times are judged against the
database clock (``now_ms()``), not this host's, and shown relative (``in 3m``,
``12s late``, ``5m ago``), or as ISO-8601 UTC with ``--absolute``. ``--json``
prints one JSON document instead (``pgstore.cli.output``). ``jobs`` lists every job, ordered by
``dispatch_at`` then ``run_id``, at most ``--limit`` of them (default 100,
``0``: all; a cut list ends with ``... N more``). ``--dispatched``: only
dispatched jobs. ``--due``: only the jobs a lease
could take now or once their lease expires: due (``dispatch_at <= now``), not
dispatched, cancelled or failed, leased or not (the lease column shows who holds
one). ``--leased``: only the due jobs under a live lease (the ``due`` list, kept
to the leased ones). ``--failed``: only the failed jobs (out of attempts, not
cancelled), with their last error. ``--queue QUEUE`` (repeated: any of them) keeps
to those queues' jobs. It is one call of ``job_list()``, which
sends only the rows it prints and how many match in all; like every command but
``purge``, it needs only EXECUTE on the store's functions (the client role),
never SELECT on its tables.

``status`` is the on-call view (``pgstore.cli.status``): every schedule's next
run, last run, lease and how long it has been due and unclaimed, then the
number of jobs per state (pending, due, leased, dispatched, cancelled, failed)
and the oldest due job's lag. Its dispatched, cancelled and failed counts scan
the jobs table.

``schedules pause ID`` and ``schedules resume ID`` (one ``schedule_pause()`` /
``schedule_resume()`` each) stop and restart the claims of a schedule; ``schedules
trigger ID`` (one ``schedule_trigger()``) asks for one run now, out of turn, which the
next scheduler that declares it runs; a paused schedule, one under a live lease (a
run in progress) and a missing one are refused with exit status 1, nothing changed
(docs/schedule-controls.md).

``jobs retry RUN_ID...`` (and ``retry``; one call of ``job_retry()`` each)
puts failed jobs back to waiting, their attempts reset, due at ``--at`` or the
database clock's now, and prints them; a job that is not failed (waiting,
dispatched, cancelled) or missing is left as it is, named on stderr, and the
exit status is 1. ``jobs cancel`` is one ``job_cancel()``; ``jobs schedule``
adds a job (refusing a run id that exists); ``jobs reschedule`` moves a waiting
job with ``job_reschedule()``, which refuses one under a live lease and a
dispatched, cancelled or failed one (docs/cli.md says why). ``WHEN``: ``now``,
``+5m``, ``in 2h``, ``5m ago``, ISO-8601 with a zone, or epoch ms
(``format.parse_when``).

``purge --older-than AGE`` (``pgstore.cli.purge``) deletes the jobs that were
dispatched or cancelled more than ``AGE`` (``7d``, ``12h``, ``30m``, ...)
before the database clock's now, ``--batch`` at a time (default 1000), one
progress line per batch on stderr and the total on stdout. Failed jobs only
with ``--include-failed`` (otherwise failed jobs older than the cutoff stop it:
status 1, nothing deleted). It counts first; ``--dry-run`` prints the counts;
on a terminal it asks for the schema's name, elsewhere it needs ``--yes``
(status 2 without). Unlike the other commands it needs EXECUTE on
``job_purge``, which the client role does not have, and SELECT on the jobs
table for its counts: run it as the schema's owner.

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

``run MODULE:OBJECT...`` (``pgstore.cli.app``) imports each ``MODULE`` (the
current directory first on ``sys.path``) and runs its ``pgstore.Scheduler`` or
``pgstore.Dispatcher`` ``OBJECT`` (a dotted attribute path; or a zero-argument
callable returning one), several side by side in one process, until SIGTERM or
SIGINT, logging each event on one line to stderr. The object carries its store,
so ``run`` takes no ``--dsn``. ``--store-gauges`` makes this process the one
that reads ``store_stats()`` for the metrics; ``exporter`` serves those gauges
alone. ``completion`` prints a shell completion script
(``pgstore.cli.completion``).
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

from pgstore._validate import BIGINT_MAX, INTEGER_MAX
from pgstore.cli.format import (
    CUT_MARK,
    MIN_CUT,
    clip,
    clip_middle,
    due_state,
    fitted,
    format_duration,
    format_instant,
    holder_lease_state,
    iso_utc,
    job_lease_state,
    job_phase,
    jobs_table,
    lease_state,
    parse_rate,
    parse_when,
    queues_table,
    schedules_table,
)
from pgstore.errors import PgStoreError
from pgstore.models import Job, JobFilter, JobPage, QueueInfo, ScheduleRecord
from pgstore.schema.objects import DEFAULT_SCHEMA

if TYPE_CHECKING:
    from pgstore.postgres.jobs import PgJobStore
    from pgstore.postgres.schedules import PgScheduleStore

__all__ = [
    "CUT_MARK",
    "DEFAULT_JOB_LIMIT",
    "MIN_CUT",
    "clip",
    "clip_middle",
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

#: What ``pgstore queues limit --concurrency`` and ``--rate`` take for "no limit".
NO_LIMIT = "none"

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


def _print_json(document: object) -> None:
    from pgstore.cli.output import dumps

    print(dumps(document))


def _header(schema: str, now: int) -> str:
    return f"schema {schema!r}, database clock {iso_utc(now)}"


def _width(args: argparse.Namespace) -> int | None:
    return None if getattr(args, "wide", False) else output_width()


def _cmd_schedules(args: argparse.Namespace) -> int:
    from pgstore.postgres.schedules import PgScheduleStore

    if args.action is not None:
        status: int = args.action(args)
        return status
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
    if args.json:
        from pgstore.cli.output import schedules_json

        _print_json(schedules_json(args.schema, now, records))
        return 0
    print(_header(args.schema, now))
    if not records:
        print("no schedules")
        return 0
    print(schedules_table(records, now, _width(args), args.absolute))
    return 0


@contextmanager
def _schedule_store(args: argparse.Namespace) -> Iterator[PgScheduleStore]:
    """The schema's schedule store over one connection of our own, started (as
    ``_job_store``)."""
    from pgstore.postgres.schedules import PgScheduleStore

    conn: psycopg.Connection[Any]
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        store = PgScheduleStore(conn, schema=args.schema)
        try:
            store.start()
            yield store
        finally:
            store.close()


def _show_schedule(args: argparse.Namespace, what: str, record: ScheduleRecord,
                   now: int) -> None:
    """After a change: one line saying what happened, then the record (or its JSON)."""
    if getattr(args, "json", False):
        from pgstore.cli.output import instant, schedule_json

        _print_json({"schema": args.schema, **instant("now", now), "result": what,
                     "schedule": schedule_json(record, now)})
        return
    print(f"schema {args.schema!r}: schedule {record.id!r} {what}")
    print(schedules_table([record], now, _width(args), getattr(args, "absolute", False)))


def _cmd_schedule_pause(args: argparse.Namespace) -> int:
    with _schedule_store(args) as store:
        before = store.get(args.id)
        now = store.now_ms()
        record = store.pause(args.id, now)
    if record is None:
        raise PgStoreError(f"no schedule {args.id!r} in schema {args.schema!r}")
    if before is not None and before.paused:
        what = "was already paused: nothing changed"
    elif record.lease_until is not None and record.lease_until > now:
        what = (f"is paused; the run in progress ({record.lease_owner}) finishes, then "
                "nothing claims it until it is resumed")
    else:
        what = "is paused: nothing claims it until it is resumed"
    _show_schedule(args, what, record, now)
    return 0


def _cmd_schedule_resume(args: argparse.Namespace) -> int:
    with _schedule_store(args) as store:
        before = store.get(args.id)
        now = store.now_ms()
        record = store.resume(args.id, now)
    if record is None:
        raise PgStoreError(f"no schedule {args.id!r} in schema {args.schema!r}")
    if before is not None and not before.paused:
        what = "was not paused: nothing changed"
    elif record.next_run_at is not None and record.next_run_at <= now:
        what = (f"is resumed; the occurrences missed meanwhile follow its catch_up "
                f"({record.catch_up}) at the next claim")
    else:
        what = "is resumed"
    _show_schedule(args, what, record, now)
    return 0


def _cmd_schedule_trigger(args: argparse.Namespace) -> int:
    with _schedule_store(args) as store:
        now = store.now_ms()
        record = store.trigger(args.id, now)
        current = store.get(args.id) if record is None else record
    if current is None:
        raise PgStoreError(f"no schedule {args.id!r} in schema {args.schema!r}")
    if record is None:
        if current.paused:
            raise PgStoreError(f"schedule {args.id!r} is paused: nothing changed (resume it "
                               "first)")
        raise PgStoreError(
            f"schedule {args.id!r} is running: leased by {current.lease_owner} until "
            f"{iso_utc(current.lease_until or 0)}: nothing changed (trigger it once that "
            "run is over)")
    _show_schedule(args, "is triggered: the next scheduler that declares it runs it once "
                   "now; its next regular run does not move", record, now)
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


def _selected(args: argparse.Namespace) -> str:
    for name in ("dispatched", "due", "failed", "leased"):
        if getattr(args, name, False):
            return name
    return "all"


def _list_jobs(
    store: PgJobStore, selected: str, now: int, limit: int | None, queues: list[str] | None
) -> JobPage:
    """One ``job_list()`` call, of ``queues`` (None: every queue). ``leased`` has no
    filter of its own there: it reads the ``due`` list (the pending index: waiting jobs
    only, every one of them, since the limit applies after) and keeps the jobs under a
    live lease."""
    if selected != "leased":
        filter_: JobFilter = selected  # type: ignore[assignment]
        return store.list_jobs(filter_, now, limit, queues)
    due = store.list_jobs("due", now, None, queues).jobs
    leased = [j for j in due if j.lease_until is not None and j.lease_until > now]
    return JobPage(leased[:limit] if limit is not None else leased, len(leased))


def _cmd_jobs(args: argparse.Namespace) -> int:
    if args.action is not None:
        status: int = args.action(args)
        return status
    limit: int | None = args.limit or None  # 0: no limit
    selected = _selected(args)
    queues: list[str] | None = args.queue
    with _job_store(args) as store:
        now = store.now_ms()
        page = _list_jobs(store, selected, now, limit, queues)
    jobs, total = page.jobs, page.matching
    if args.json:
        from pgstore.cli.output import jobs_json

        _print_json(jobs_json(args.schema, now, selected, jobs, total, queues))
        return 0
    print(_header(args.schema, now))
    if not jobs:
        which = "" if selected == "all" else f"{selected} "
        where = "" if queues is None else (
            f" in queue{'s' if len(queues) > 1 else ''} {', '.join(map(repr, queues))}")
        print(f"no {which}jobs{where}")
        return 0
    print(jobs_table(jobs, now, _width(args), absolute=args.absolute, wide=args.wide,
                     errors=selected == "failed"))
    if total > len(jobs):
        print(f"... {total - len(jobs)} more (--limit N shows N, --limit 0 all)")
    return 0


def _queues_json(schema: str, now: int, queues: list[QueueInfo]) -> dict[str, Any]:
    from pgstore.cli.output import instant

    return {"schema": schema, **instant("now", now),
            "queues": [{"queue": q.queue, "waiting": q.depth, "due": q.due,
                        "leased": q.leased, "paused": q.paused,
                        "concurrency_limit": q.concurrency_limit, "rate_limit": q.rate_limit,
                        "rate_period_ms": q.rate_period_ms, "rate_used": q.rate_used}
                       for q in queues]}


def _cmd_queues(args: argparse.Namespace) -> int:
    if args.action is not None:
        status: int = args.action(args)
        return status
    with _job_store(args) as store:
        now = store.now_ms()
        queues = store.list_queues(now)
    if args.json:
        _print_json(_queues_json(args.schema, now, queues))
        return 0
    print(_header(args.schema, now))
    if not queues:
        print("no queues (no waiting job, none paused or limited)")
        return 0
    print(queues_table(queues, _width(args)))
    return 0


def _cmd_queue_switch(args: argparse.Namespace) -> int:
    """``pgstore queues pause|resume QUEUE``: one call, then the queue's line."""
    pause = args.queue_action == "pause"
    with _job_store(args) as store:
        changed = store.pause_queue(args.queue) if pause else store.resume_queue(args.queue)
        now = store.now_ms()
        queues = [q for q in store.list_queues(now) if q.queue == args.queue]
    word = "paused" if pause else "resumed"
    what = f"is {word}" if changed else (
        "was already paused: nothing changed" if pause
        else "was not paused: nothing changed")
    if args.json:
        _print_json({**_queues_json(args.schema, now, queues), "result": what})
        return 0
    print(f"schema {args.schema!r}: queue {args.queue!r} {what}")
    if queues:
        print(queues_table(queues, _width(args)))
    return 0


def _concurrency_arg(text: str) -> int | str:
    """``--concurrency``: a count (the store checks its range), or ``none``."""
    if text.strip().lower() == NO_LIMIT:
        return NO_LIMIT
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count of leases, nor none: {text!r}") from None


def _rate_arg(text: str) -> tuple[int, int] | str:
    """``--rate``: ``N/SPAN`` (``parse_rate``), or ``none``."""
    if text.strip().lower() == NO_LIMIT:
        return NO_LIMIT
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_queue_limit(args: argparse.Namespace) -> int:
    """``pgstore queues limit QUEUE [--concurrency N|none] [--rate N/SPAN|none]``: one call
    per limit given, then the queue's line."""
    if args.concurrency is None and args.rate is None:
        print(f"{PROG}: error: queues limit: give --concurrency, --rate or both",
              file=sys.stderr)
        return 2
    said = []
    with _job_store(args) as store:
        if args.concurrency is not None:
            concurrency = None if args.concurrency == NO_LIMIT else args.concurrency
            changed = store.set_queue_concurrency(args.queue, concurrency)
            said.append("concurrency limit " + ("set" if changed else "unchanged"))
        if args.rate is not None:
            limit, period = (None, None) if args.rate == NO_LIMIT else args.rate
            changed = store.set_queue_rate(args.queue, limit, period)
            said.append("rate limit " + ("set" if changed else "unchanged"))
        now = store.now_ms()
        queues = [q for q in store.list_queues(now) if q.queue == args.queue]
    what = ", ".join(said)
    if args.json:
        _print_json({**_queues_json(args.schema, now, queues), "result": what})
        return 0
    print(f"schema {args.schema!r}: queue {args.queue!r}: {what}")
    if queues:
        print(queues_table(queues, _width(args)))
    return 0


def _show_job(args: argparse.Namespace, what: str, job: Job, now: int) -> None:
    """After a change: one line saying what happened, then the job (or its JSON)."""
    if getattr(args, "json", False):
        from pgstore.cli.output import instant, job_json

        _print_json({"schema": args.schema, **instant("now", now), "result": what,
                     "job": job_json(job, now)})
        return
    print(f"schema {args.schema!r}: job {job.run_id!r} {what}")
    print(jobs_table([job], now, _width(args), absolute=getattr(args, "absolute", False),
                     wide=getattr(args, "wide", False), errors=job.last_error is not None))


def _resolve_at(args: argparse.Namespace, now: int) -> int | None:
    if args.at is None:
        return None
    at, offset = args.at
    value: int = at if at is not None else now + offset
    if not 0 <= value <= BIGINT_MAX:
        raise PgStoreError(f"--at is out of range (epoch ms {value})")
    return value


def _cmd_retry(args: argparse.Namespace) -> int:
    from pgstore.models import RetryResult

    failures: list[str] = []
    with _job_store(args) as store:
        now = store.now_ms()
        at = _resolve_at(args, now)
        done: list[Job] = []
        for run_id in args.run_ids:
            answer = store.retry(run_id, at)
            job = store.get(run_id)
            if answer is RetryResult.MISSING or job is None:
                failures.append(f"no job {run_id!r} in schema {args.schema!r}")
            elif answer is RetryResult.NOT_FAILED:
                failures.append(
                    f"job {run_id!r} is not failed (it is {job.state}): "
                    "nothing changed")
            else:
                done.append(job)
    for job in done:
        _show_job(args, "waits again, attempts reset", job, now)
    if failures:
        raise PgStoreError("; ".join(failures))
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    from pgstore.models import CancelResult

    with _job_store(args) as store:
        before = store.get(args.run_id)
        answer = store.cancel(args.run_id)
        job = store.get(args.run_id)
        now = store.now_ms()
    if answer is CancelResult.MISSING or job is None:
        raise PgStoreError(f"no job {args.run_id!r} in schema {args.schema!r}")
    if answer is CancelResult.ALREADY_DISPATCHED:
        raise PgStoreError(
            f"job {args.run_id!r} was already dispatched: nothing changed (recall the bot "
            "instead)")
    if before is not None and before.cancelled:
        what = "was already cancelled: nothing changed"
    elif job.lease_until is not None and job.lease_until > now:
        what = (f"is cancelled; its live lease's holder ({job.lease_holder}) learns it when "
                "it marks the job dispatched")
    else:
        what = "is cancelled"
    _show_job(args, what, job, now)
    return 0


def _cmd_schedule(args: argparse.Namespace) -> int:
    with _job_store(args) as store:
        now = store.now_ms()
        at = _resolve_at(args, now)
        assert at is not None  # --at is required
        if store.get(args.run_id) is not None:
            raise PgStoreError(
                f"job {args.run_id!r} exists in schema {args.schema!r}: nothing changed "
                "(pgstore jobs reschedule moves a waiting job)")
        store.schedule(args.run_id, at, args.max_attempts)
        job = store.get(args.run_id)
    assert job is not None
    _show_job(args, "is scheduled", job, now)
    return 0


def _cmd_reschedule(args: argparse.Namespace) -> int:
    with _job_store(args) as store:
        now = store.now_ms()
        at = _resolve_at(args, now)
        assert at is not None  # --at is required
        moved = store.reschedule(args.run_id, at, now)  # one UPDATE: waiting and unleased
        job = store.get(args.run_id) if moved is None else moved
    if job is None:
        raise PgStoreError(f"no job {args.run_id!r} in schema {args.schema!r}")
    if moved is None:
        raise PgStoreError(_not_movable(args.run_id, job, job_phase(job, now)))
    _show_job(args, "is rescheduled", moved, now)
    return 0


def _not_movable(run_id: str, job: Job, phase: str) -> str:
    if phase == "leased":
        return (f"job {run_id!r} is leased by {job.lease_holder} until "
                f"{iso_utc(job.lease_until or 0)}: its dispatch may be under way: nothing "
                "changed (cancel it, or wait for the lease to end)")
    if phase == "failed":
        return (f"job {run_id!r} is failed: only a waiting job moves, nothing changed "
                "(pgstore jobs retry RUN_ID --at WHEN revives it)")
    return f"job {run_id!r} is {phase}: only a waiting job moves, nothing changed"


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
    if args.json:
        from pgstore.cli.output import status_json

        _print_json(status_json(args.schema, now, records, stats))
        return 0
    print(status_text(args.schema, now, records, stats, _width(args), args.absolute))
    return 0


def _cmd_purge(args: argparse.Namespace) -> int:
    from pgstore.cli.downgrade import NotConfirmed
    from pgstore.cli.purge import (
        confirm_purge,
        jobs_count,
        purge_counts,
        purge_in_batches,
        refusal,
    )

    with _job_store(args) as store:
        now = store.now_ms()
        before = max(0, now - args.older_than)
        conn: psycopg.Connection[Any]
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            counts = purge_counts(conn, args.schema, before, now)
        deletable = counts.deletable(args.include_failed)
        summary = (f"schema {args.schema!r}: jobs finished before {iso_utc(before)}: "
                   f"{counts.text(args.include_failed)}")
        if args.dry_run:
            print(summary)
            print(f"dry run: would delete {jobs_count(deletable)}; nothing deleted")
            return 0
        if counts.failed and not args.include_failed:
            raise PgStoreError(refusal(args.schema, counts, now))
        if deletable == 0:
            print(f"{summary}\nnothing to purge")
            return 0
        what = f"purging deletes {jobs_count(deletable)} of schema {args.schema!r} ({summary})"
        if not args.yes:
            if not sys.stdin.isatty():
                raise NotConfirmed(
                    f"{what}; stdin is not a terminal, so pass --yes to go ahead "
                    "(nothing deleted)")
            confirm_purge(what, args.schema, sys.stdin, sys.stderr)
        total = purge_in_batches(store.purge, before, args.batch, sys.stderr)
    print(f"schema {args.schema!r}: purged {jobs_count(total)} finished before {iso_utc(before)}")
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


def _cmd_completion(args: argparse.Namespace) -> int:
    from pgstore.cli.completion import completion_script

    print(completion_script(build_parser(), args.shell), end="")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from pgstore.cli.app import StopSignals

    # First: from here a SIGTERM or SIGINT is a graceful stop, whenever it comes
    # (while the app's module is imported, the store starts...): pgstore.cli.app.
    signals = StopSignals().install()
    try:
        from pgstore.cli.app import MetricsOptions, load_runtime, logging_to_stderr, serve

        metrics = None
        if args.metrics_port is not None:
            metrics = MetricsOptions(args.metrics_port, args.metrics_addr, args.stats_interval,
                                     args.store_gauges)
        with logging_to_stderr(args.log_level):
            runtimes = [load_runtime(target) for target in args.targets]
            serve(runtimes, " and ".join(args.targets), metrics, signals)
    finally:
        signals.restore()
    return 0


def _cmd_exporter(args: argparse.Namespace) -> int:
    from pgstore.cli.app import MetricsOptions, logging_to_stderr, serve_gauges

    options = MetricsOptions(args.metrics_port, args.metrics_addr, args.stats_interval, True)
    with logging_to_stderr(args.log_level):
        serve_gauges(args.dsn, args.schema, options)
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


#: What ``--at`` takes (``format.parse_when``).
WHEN_HELP = (
    "now, +5m, 'in 2h', '5m ago' (from the database clock), an ISO-8601 instant with Z or "
    "an offset (2024-05-01T12:00:00Z), or epoch ms"
)


def _when(text: str) -> tuple[int | None, int]:
    try:
        return parse_when(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _attempts(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value <= INTEGER_MAX:
        raise argparse.ArgumentTypeError(f"not a count of attempts (1 or more): {text!r}")
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


def _common_options(default: str | None) -> argparse.ArgumentParser:
    """The parent parser of ``--dsn`` and ``--schema``; their defaults read from the
    environment now, unless ``default`` (``argparse.SUPPRESS``: a sub-action keeps what
    its command parsed)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dsn",
        default=os.environ.get(DSN_VARIABLE, "") if default is None else default,
        help=f"libpq conninfo or URI (default: ${DSN_VARIABLE}, else libpq's PG* variables)",
    )
    common.add_argument(
        "--schema",
        default=(os.environ.get(SCHEMA_VARIABLE) or DEFAULT_SCHEMA) if default is None
        else default,
        help=f"the store's schema (default: ${SCHEMA_VARIABLE}, else {DEFAULT_SCHEMA!r})",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (defaults read from the environment now)."""
    from pgstore.cli.downgrade import drops_help

    common = _common_options(None)

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

    def views(sub: argparse.ArgumentParser, wide: bool = True) -> None:
        sub.add_argument(
            "--json", action="store_true",
            help="print one JSON document (stable keys; instants as epoch ms and ISO UTC)")
        sub.add_argument(
            "--absolute", action="store_true",
            help="show instants as ISO-8601 UTC (default: relative to the database clock)")
        if wide:
            sub.add_argument(
                "--wide", action="store_true",
                help="every column, nothing cut (default: cut to the terminal's width)")

    schedules = commands.add_parser(
        "schedules", parents=[common], help="list the schedule records and their leases"
    )
    views(schedules)
    schedules.set_defaults(run=_cmd_schedules, action=None)
    schedule_actions = schedules.add_subparsers(
        dest="schedule_action", metavar="ACTION", required=False)
    schedule_quiet = _common_options(argparse.SUPPRESS)
    for name, helped, described, action in (
        ("pause", "stop claiming a schedule until it is resumed",
         "Pause the schedule ID (one call of schedule_pause()): no scheduler claims it "
         "until it is resumed; a run in progress finishes and completes. Already paused: "
         "nothing changes. A missing schedule: exit status 1.", _cmd_schedule_pause),
        ("resume", "claim a paused schedule again",
         "Resume the schedule ID (one call of schedule_resume()): the occurrences missed "
         "while it was paused follow its catch_up policy (skip, once, all), as after "
         "downtime. Not paused: nothing changes. A missing schedule: exit status 1.",
         _cmd_schedule_resume),
        ("trigger", "run a schedule once now, out of turn",
         "Ask for one run of the schedule ID now (one call of schedule_trigger()): the "
         "next scheduler that declares it claims and runs it with a fresh fencing token; "
         "its next regular run does not move. Refused (exit status 1, nothing changed) "
         "when it is paused, running (a live lease) or missing.", _cmd_schedule_trigger),
    ):
        sub = schedule_actions.add_parser(name, parents=[schedule_quiet], help=helped,
                                          description=described)
        sub.add_argument("id", metavar="ID")
        views(sub)
        sub.set_defaults(action=action)

    queues = commands.add_parser(
        "queues",
        parents=[common],
        help="list the job queues (or pause, resume one)",
        description=(
            "Without an action: one line per queue that holds waiting jobs or was ever "
            "paused, by name (one call of queue_list(), which reads every waiting job): "
            "waiting (not dispatched, cancelled or failed), due (of those, due now and not "
            "held by a live lease), leased (under a live lease) and paused. The actions "
            "take their own --dsn and --schema: pgstore queues pause QUEUE --dsn DSN."),
    )
    views(queues, wide=True)
    queues.set_defaults(run=_cmd_queues, action=None)
    queue_actions = queues.add_subparsers(dest="queue_action", metavar="ACTION", required=False)
    queue_quiet = _common_options(argparse.SUPPRESS)
    for name, text in (
        ("pause", "stop leasing QUEUE's jobs (queue_pause): leases already held run on; "
                  "already paused: nothing changes"),
        ("resume", "lease QUEUE's jobs again (queue_resume) and wake idle dispatchers; "
                   "not paused: nothing changes"),
    ):
        sub = queue_actions.add_parser(name, parents=[queue_quiet], help=text, description=text)
        sub.add_argument("queue", metavar="QUEUE")
        views(sub, wide=True)
        sub.set_defaults(action=_cmd_queue_switch)
    text = ("set or remove QUEUE's limits (queue_set_concurrency, queue_set_rate): at most "
            "N live leases at once, at most N leases in any window of SPAN; across every "
            "dispatcher. A limit given as it is: nothing changes")
    sub = queue_actions.add_parser("limit", parents=[queue_quiet], help=text, description=text)
    sub.add_argument("queue", metavar="QUEUE")
    sub.add_argument("--concurrency", metavar="N|none", type=_concurrency_arg,
                     help="at most N live leases of QUEUE's jobs at once; none: no limit")
    sub.add_argument("--rate", metavar="N/SPAN|none", type=_rate_arg,
                     help="at most N leases in any window of SPAN (10/1s, 600/1m, 5/250ms);"
                          " none: no limit")
    views(sub, wide=True)
    sub.set_defaults(action=_cmd_queue_limit)

    jobs = commands.add_parser(
        "jobs",
        parents=[common],
        help="list the jobs (or cancel, schedule, reschedule, retry one)",
        description=(
            "Without an action: list the jobs of the schema's job store, ordered by "
            "dispatch_at then run_id: run_id (never cut), queue, state (pending, due, leased, "
            "dispatched, cancelled, failed), due (in 3m00s, 12s late, 5m00s ago), attempts "
            "(leases so far/max_attempts), the lease holder and how long its lease has "
            "left; --wide adds priority, lease sequence, finished, worker_id and last_error. "
            "Times are judged against the database clock. Without a filter: every job. The "
            "actions take their own --dsn and --schema: pgstore jobs cancel RUN_ID --dsn DSN."
        ),
    )
    only = jobs.add_mutually_exclusive_group()
    only.add_argument(
        "--dispatched", action="store_true", help="only dispatched jobs"
    )
    only.add_argument(
        "--failed",
        action="store_true",
        help="only failed jobs (out of attempts, not cancelled), with their last error: "
        "what 'pgstore jobs retry' takes back",
    )
    only.add_argument(
        "--due",
        action="store_true",
        help=(
            "only jobs waiting to be leased or sent: due (dispatch_at <= now), "
            "not dispatched, cancelled or failed, whether leased or not"
        ),
    )
    only.add_argument(
        "--leased",
        action="store_true",
        help="only due jobs under a live lease (being dispatched now); reads every due job",
    )
    jobs.add_argument(
        "--queue",
        action="append",
        metavar="QUEUE",
        help="only jobs of QUEUE (repeat it for several: jobs of any of them)",
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
    views(jobs)
    jobs.set_defaults(run=_cmd_jobs, action=None)
    actions = jobs.add_subparsers(dest="job_action", metavar="ACTION", required=False)
    # The actions' --dsn/--schema default to what came before the action (or its default).
    quiet = _common_options(argparse.SUPPRESS)

    cancel = actions.add_parser(
        "cancel", parents=[quiet], help="cancel a job that was not dispatched",
        description=(
            "Cancel RUN_ID (one call of job_cancel()): a waiting or failed job is never "
            "leased again; a job under a live lease is cancelled too, and its dispatcher "
            "learns it when it marks the job dispatched (its bot is then recalled). Already "
            "cancelled: nothing changes. A dispatched or missing job: exit status 1, "
            "nothing changed."),
    )
    cancel.add_argument("run_id", metavar="RUN_ID")
    views(cancel)
    cancel.set_defaults(action=_cmd_cancel)

    schedule = actions.add_parser(
        "schedule", parents=[quiet], help="add a job, due at --at",
        description=(
            "Add the job RUN_ID, due at --at (one call of job_schedule()), with at most "
            "--max-attempts leases (default: the store's default_max_attempts). A job that "
            "exists already: exit status 1, nothing changed (reschedule moves one)."),
    )
    schedule.add_argument("run_id", metavar="RUN_ID")
    schedule.add_argument("--at", type=_when, required=True, metavar="WHEN", help=WHEN_HELP)
    schedule.add_argument("--max-attempts", type=_attempts, metavar="N",
                          help="lease it at most N times (default: the store's default)")
    views(schedule)
    schedule.set_defaults(action=_cmd_schedule)

    reschedule = actions.add_parser(
        "reschedule", parents=[quiet], help="move a waiting job to --at",
        description=(
            "Move the waiting job RUN_ID (pending or due, no live lease) to --at, through "
            "job_reschedule(): one UPDATE that moves dispatch_at only while the job waits "
            "with no live lease (an expired lease is cleared; attempts, lease sequence and "
            "last error are kept). A job under a live lease is refused (its dispatch may be "
            "under way); so are dispatched, cancelled and failed jobs (retry revives a "
            "failed one). Refused or missing: exit status 1, nothing changed."),
    )
    reschedule.add_argument("run_id", metavar="RUN_ID")
    reschedule.add_argument("--at", type=_when, required=True, metavar="WHEN", help=WHEN_HELP)
    views(reschedule)
    reschedule.set_defaults(action=_cmd_reschedule)

    def retry_arguments(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("run_ids", nargs="+", metavar="RUN_ID", help="a failed job's run id")
        sub.add_argument(
            "--at", type=_when, default=None, metavar="WHEN",
            help=f"when it is due again (default: now, the database clock); {WHEN_HELP}")
        views(sub)

    retry_text = (
        "Put each failed job RUN_ID (out of attempts: see 'pgstore jobs --failed') back to "
        "waiting, due at --at or now (the database clock), with its attempts reset to 0; "
        "its last_error is kept until a release replaces it. One call of job_retry() per "
        "job, granted to the client role. A job that is not failed (waiting, dispatched or "
        "cancelled) or missing is left as it is, the others are retried, and the exit "
        "status is 1.")
    job_retry = actions.add_parser(
        "retry", parents=[quiet], help="put failed jobs back to waiting, attempts reset",
        description=retry_text)
    retry_arguments(job_retry)
    job_retry.set_defaults(action=_cmd_retry)

    retry = commands.add_parser(
        "retry", parents=[common], help="the same as 'pgstore jobs retry'",
        description=retry_text)
    retry_arguments(retry)
    retry.set_defaults(run=_cmd_retry)

    status = commands.add_parser(
        "status",
        parents=[common],
        help="the on-call view: schedules due, leased and late; jobs per state",
        description=(
            "Per schedule: next run, last status and how long ago it ran, fencing token, "
            "lease (holder, live or expired, until), and how long it has been due and "
            "unclaimed. Then the jobs per state: pending (not due yet), due (leasable now), "
            "leased (live lease, not dispatched), dispatched, cancelled (never dispatched), "
            "failed (out of attempts), and the oldest due job's lag. Times are judged "
            "against the database clock, relative unless --absolute. Cost: the waiting "
            "states read only the pending-jobs index; "
            "the dispatched, cancelled and failed counts scan the jobs table (about 0.1 s per "
            "million jobs)."
        ),
    )
    views(status)
    status.set_defaults(run=_cmd_status)

    purge = commands.add_parser(
        "purge",
        parents=[common],
        help="delete dispatched and cancelled jobs that finished longer ago than "
        "--older-than (failed ones only with --include-failed)",
        description=(
            "Delete the jobs that were dispatched or cancelled more than AGE before the "
            "database clock's now (their finished_at), by calls of job_purge of N jobs "
            "each, until one deletes fewer than N. Waiting jobs and jobs whose lease is live "
            "are never deleted; rows held locked at that moment are left for the next run. "
            "Failed jobs (out of attempts, not cancelled) are deleted only with "
            "--include-failed: job_purge cannot spare them, so without it a failed job "
            "that finished before the cutoff stops the purge (exit status 1, nothing "
            "deleted). First it counts what it would delete, per state; --dry-run prints "
            "that and deletes nothing. On a terminal it then asks you to type the schema "
            "name; otherwise it needs --yes (without it: exit status 2, nothing deleted). "
            "One progress line per batch on stderr, the total on stdout. Needs EXECUTE on "
            "job_purge and SELECT on the jobs table (for the counts): run it as the "
            "schema's owner."
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
    purge.add_argument(
        "--include-failed", action="store_true",
        help="delete failed jobs (dead letters) that finished before the cutoff too",
    )
    purge.add_argument(
        "--dry-run", action="store_true",
        help="print how many jobs per state it would delete, and delete nothing",
    )
    purge.add_argument(
        "--yes", action="store_true", help="go ahead without asking",
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

    completion = commands.add_parser(
        "completion", help="print a shell completion script (bash or zsh)",
        description=(
            "Print the completion script for SHELL, generated from this command's own "
            "parser: source <(pgstore completion bash) in ~/.bashrc, or "
            "source <(pgstore completion zsh) in ~/.zshrc."),
    )
    from pgstore.cli.completion import SHELLS

    completion.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")
    completion.set_defaults(run=_cmd_completion)

    run = commands.add_parser(
        "run",
        help="run an app's Scheduler and/or Dispatcher until SIGTERM or SIGINT",
        description=(
            "Import MODULE (the current directory first on sys.path, as python -m does) "
            "and run OBJECT, a dotted attribute path naming a pgstore.Scheduler or "
            "pgstore.Dispatcher, or a zero-argument callable (a factory) returning one. "
            "Several MODULE:OBJECT (a Scheduler and a Dispatcher) run side by side in this "
            "one process; one failing stops the others. "
            "SIGTERM or SIGINT stops claiming; running work gets the runtime's grace "
            "period, then the store is closed and the exit status is 0 (a signal before "
            "the runtimes start, even while MODULE is imported: none starts). Claims, runs, "
            "completions, leases, dispatches, recalls, releases and lost leases are logged "
            "to stderr, one line each with a UTC timestamp. The object carries its store: "
            "no --dsn or --schema here."
        ),
    )
    run.add_argument(
        "targets", nargs="+", metavar="MODULE:OBJECT",
        help="e.g. myapp.tasks:scheduler; several (myapp.tasks:scheduler "
        "myapp.tasks:dispatcher) run side by side in this one process")
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
        help="with --store-gauges: read the store_stats() gauges every SECONDS (default: 15), "
        "on a connection of their own; a scrape serves the last reading and never reaches "
        "the database",
    )
    run.add_argument(
        "--store-gauges",
        action="store_true",
        help="also read and serve the store-wide gauges (store_stats(): jobs per state, "
        "oldest due job, ...): give it to ONE process of the fleet, or run "
        "'pgstore exporter' instead, so N processes do not read them N times",
    )
    run.set_defaults(run=_cmd_run)
    from pgstore.cli.web import add_command as add_web  # pgstore web: the console

    add_web(commands, common)

    exporter = commands.add_parser(
        "exporter",
        parents=[common],
        help="serve only the store-wide Prometheus gauges (store_stats()), no runtime",
        description=(
            "Serve the store's gauges (pgstore_jobs{state}, pgstore_schedules{state}, the "
            "oldest due job and schedule, ...) at http://ADDR:N/metrics, read every "
            "--stats-interval seconds on one connection of its own, until SIGTERM or "
            "SIGINT. Run one per store: the runtimes' own metrics (pgstore run "
            "--metrics-port) then carry only their counters. Needs EXECUTE on store_stats "
            "(the client role has it)."),
    )
    exporter.add_argument("--metrics-port", type=_port, required=True, metavar="N",
                          help="serve at http://ADDR:N/metrics (0: any free port, logged)")
    exporter.add_argument("--metrics-addr", default="127.0.0.1", metavar="ADDR",
                          help="the address (default: 127.0.0.1, this host only)")
    exporter.add_argument("--stats-interval", type=_seconds, metavar="SECONDS",
                          help="read store_stats() every SECONDS (default: 15)")
    exporter.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO",
                          help="the least severe level logged (default: INFO)")
    exporter.set_defaults(run=_cmd_exporter)
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
        if getattr(args, "store_gauges", False) and args.metrics_port is None:
            parser.error("run: --store-gauges needs --metrics-port")
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
