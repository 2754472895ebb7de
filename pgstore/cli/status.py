"""``pgstore status``: one view of a store for the on-call engineer.

Every time is judged against one reading of the database clock (``now_ms()``),
taken before the records are read, and shown in one form: relative (``in 42s``,
``3m10s ago``) by default, ISO-8601 UTC with ``absolute`` (``--absolute``).

**Schedules**, by id (``schedule_list()``): when the next run is (``in 42s`` or
``overdue 3m10s``), the last run's status and how long
ago it started (with how many runs in a row failed, from two on), the fencing
token, the lease (holder, live or expired, until when), and how long the record
has been due and unclaimed.

**Jobs**: how many are in each state, and the oldest due job. The states split
the table (each job is in exactly one):

* ``pending``: waiting (not dispatched, not cancelled), not due yet, no live lease;
* ``due``: waiting, due (``dispatch_at <= now``), no live lease: what ``job_lease``
  would take now (an expired lease counts as none);
* ``leased``: waiting, under a live lease (``lease_until > now``), due or not;
* ``dispatched``: dispatched (including the ones cancelled meanwhile, whose bot was
  recalled);
* ``cancelled``: cancelled and never dispatched;
* ``failed``: out of attempts (the release of its last lease failed it), not
  cancelled: never leased again until ``pgstore retry RUN_ID``.

Cost: the counts come from one call of ``store_stats()`` (one snapshot). The
waiting states and the oldest due job read only the partial indexes
``jobs_pending_by_dispatch_at`` and ``jobs_pending_by_queue`` (the jobs still
waiting) and their rows; the
``dispatched``, ``cancelled`` and ``failed`` counts read the whole table (a sequential scan,
since no index holds the history): about 0.1 s per million jobs (measured on
PostgreSQL 15 and 18, warm cache, two parallel workers), while the rest stays
under a millisecond for a thousand waiting jobs. Like every other read, it goes
through the store's functions: the client role (or any role granted EXECUTE on
``store_stats``) may run ``pgstore status``; no role needs SELECT on the tables.

A schedule's "unclaimed for" is how long it has been claimable: since the later
of ``next_run_at`` and the end of an expired lease (a dead holder's record has
been waiting only since its lease ran out).

A schedule whose spec does not parse for its kind (``spec_problem``: a cron
spec as ``CronSpec.parse`` reads it, an interval or a one-shot delay as a
positive integer of ms, as the ``Scheduler`` writes them) gets a line of its
own under the table, ``<id>: spec does not parse: <reason>``, and is counted in
the summary: a scheduler cannot compute its next run.

Given a ``width``, the table's ids and lease holders, and the lines that name a
schedule, are cut in the middle to fit it (``cli.format.fitted``,
``cli.format.clip_middle``); the oldest due job's run id is never cut.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgstore._validate import BIGINT_MAX
from pgstore.cli.format import (
    MIN_CUT,
    NULL,
    _ahead,
    _text,
    clip,
    clip_middle,
    fitted,
    format_duration,
    holder_lease_state,
    iso_utc,
    short_duration,
)
from pgstore.models import ScheduleRecord, StoreStats
from pgstore.runtime.occurrences import CronSpec

__all__ = [
    "SCHEDULE_COLUMNS",
    "last_run_state",
    "next_run_state",
    "schedule_status_table",
    "spec_problem",
    "status_text",
    "unclaimed_for",
]

SCHEDULE_COLUMNS = ("id", "next run", "last run", "token", "lease", "unclaimed for")


def _live(holder_until: int | None, now_ms: int) -> bool:
    return holder_until is not None and holder_until > now_ms


def next_run_state(record: ScheduleRecord, now_ms: int, absolute: bool = False) -> str:
    """``in 42s``; ``overdue 3m10s`` (due, no live lease) or ``due 3m10s ago`` (due and
    running under a live lease); ``none (one-shot ran)`` for a tombstone. Absolute: the
    ISO UTC instant, followed by `` (overdue)`` or `` (due)`` when it has passed. A paused
    schedule reads ``paused, `` first (it is never overdue: nothing may claim it)."""
    if record.paused:
        return "paused, " + _next_run(record, now_ms, absolute, leased=True)
    return _next_run(record, now_ms, absolute, _live(record.lease_until, now_ms))


def _next_run(record: ScheduleRecord, now_ms: int, absolute: bool, leased: bool) -> str:
    at = record.next_run_at
    if at is None:
        return "none (one-shot ran)"
    if absolute:
        if at > now_ms:
            return iso_utc(at)
        return f"{iso_utc(at)} ({'due' if leased else 'overdue'})"
    if at > now_ms:
        return f"in {_ahead(at - now_ms)}"
    late = short_duration(now_ms - at)
    if leased:
        return f"due {late} ago"
    if at == now_ms:
        return "due now"
    return f"overdue {late}"


def last_run_state(record: ScheduleRecord, now_ms: int, absolute: bool = False) -> str:
    """``ok 12s ago`` / ``error 3m00s ago`` / ``error (4 in a row) 10s ago``
    (``last_run_at`` is when the run started; the count from two consecutive failures on);
    absolute: ``ok at ISO``; ``-`` when it never ran."""
    if record.last_status is None and record.last_run_at is None:
        return NULL
    status: str = record.last_status or "?"
    if record.last_status == "error" and record.consecutive_failures >= 2:
        status = f"error ({record.consecutive_failures} in a row)"
    if record.last_run_at is None:
        return status
    if absolute:
        return f"{status} at {iso_utc(record.last_run_at)}"
    if record.last_run_at > now_ms:  # written by a clock ahead of the database's
        return f"{status} in {_ahead(record.last_run_at - now_ms)}"
    return f"{status} {short_duration(now_ms - record.last_run_at)} ago"


def unclaimed_for(record: ScheduleRecord, now_ms: int) -> int | None:
    """How long (ms) the record has been claimable and unclaimed at ``now_ms``: since the
    later of ``due_at`` (``next_run_at`` plus its jitter, or a pending trigger's time) and
    an expired lease's end. None: not due, a tombstone, paused, or under a live lease."""
    at = record.due_at if record.due_at is not None else record.next_run_at
    if record.paused or at is None or at > now_ms or _live(record.lease_until, now_ms):
        return None
    since = at if record.lease_until is None else max(at, record.lease_until)
    return now_ms - since


def schedule_status_table(
    records: Sequence[ScheduleRecord],
    now_ms: int,
    width: int | None = None,
    absolute: bool = False,
) -> str:
    """The records as an aligned table with ``SCHEDULE_COLUMNS``, in the given order; ids and
    lease holders cut in the middle to fit ``width`` characters (``cli.format.fitted``)."""

    def rows(limit: int | None) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        for r in records:
            waiting = unclaimed_for(r, now_ms)
            out.append(
                (
                    clip_middle(r.id, limit),
                    next_run_state(r, now_ms, absolute),
                    last_run_state(r, now_ms, absolute),
                    str(r.fencing_token),
                    holder_lease_state(r.lease_owner, r.lease_until, now_ms, limit, absolute),
                    NULL if waiting is None else format_duration(waiting),
                )
            )
        return out

    return fitted(SCHEDULE_COLUMNS, rows, width)


def spec_problem(record: ScheduleRecord) -> str | None:
    """Why ``record``'s spec does not parse for its kind, or None when it does: ``cron`` as
    ``CronSpec.parse`` reads it (``[TZ=<zone> ]<expression>``), ``interval`` and ``once`` as
    a positive integer of ms (decimal digits, at most the bigint maximum)."""
    if record.kind == "cron":
        try:
            CronSpec.parse(record.spec)
        except ValueError as exc:  # InvalidArgument, naming what is wrong
            return str(exc)
        return None
    if record.kind in ("interval", "once"):
        spec = record.spec
        # The length first: int() refuses digit strings beyond its limit (4300 digits).
        if len(spec) <= 19 and spec.isascii() and spec.isdigit() and 0 < int(spec) <= BIGINT_MAX:
            return None
        what = "an interval" if record.kind == "interval" else "a one-shot delay"
        return f"{what} must be a positive integer of ms, not {spec!r}"
    return f"unknown kind {record.kind!r}"


def _fit_line(before: str, value: str, after: str, width: int | None) -> str:
    # before + value + after, the value cut (to no less than MIN_CUT) to fit ``width``.
    limit = None if width is None else max(MIN_CUT, width - len(before) - len(after))
    return f"{before}{clip(value, limit)}{after}"


def _spec_lines(records: Sequence[ScheduleRecord], width: int | None) -> list[str]:
    lines = []
    for r in records:
        problem = spec_problem(r)
        if problem is not None:
            # The id keeps at most a third of the line; the reason gets the rest.
            head = clip_middle(r.id, None if width is None else max(MIN_CUT, width // 3))
            lines.append(_fit_line(f"{head}: spec does not parse: ", problem, "", width))
    return lines


def _schedule_summary(records: Sequence[ScheduleRecord], now_ms: int) -> str:
    unclaimed = sum(1 for r in records if unclaimed_for(r, now_ms) is not None)
    leased = sum(1 for r in records if _live(r.lease_until, now_ms))
    done = sum(1 for r in records if r.next_run_at is None)
    broken = sum(1 for r in records if spec_problem(r) is not None)
    unparsed = f", {broken} with a spec that does not parse" if broken else ""
    failing = sum(1 for r in records if r.consecutive_failures > 0)
    failed = f", {failing} whose last run failed" if failing else ""
    return (
        f"schedules: {len(records)} ({unclaimed} due and unclaimed, {leased} leased, "
        f"{done} one-shot done{failed}{unparsed})"
    )


# --- jobs -----------------------------------------------------------------------


def _jobs_summary(stats: StoreStats, now_ms: int, absolute: bool = False) -> str:
    expired = stats.jobs_due_expired_lease
    recalled = stats.jobs_recalled
    rows = [
        ("pending", str(stats.jobs_pending), "not due yet"),
        ("due", str(stats.jobs_due),
         "leasable now" + (f" ({expired} after an expired lease)" if expired else "")),
        ("leased", str(stats.jobs_leased), "live lease, not dispatched"),
        ("dispatched", str(stats.jobs_dispatched),
         "sent" + (f" ({recalled} cancelled meanwhile: bot recalled)" if recalled else "")),
        ("cancelled", str(stats.jobs_cancelled), "never dispatched"),
        ("failed", str(stats.jobs_failed), "out of attempts (pgstore jobs retry RUN_ID)"),
    ]
    digits = max(len(n) for _, n, _ in rows)
    lines = [f"jobs: {stats.jobs}"]
    lines += [f"  {state:<10}  {n:>{digits}}  {what}" for state, n, what in rows]
    if stats.oldest_due_job_id is None or stats.oldest_due_job_at is None:
        lines.append("oldest due job: none")
    else:
        # The run id whole, to paste into another command.
        lag = format_duration(max(0, now_ms - stats.oldest_due_job_at))
        at = f" (dispatch_at {iso_utc(stats.oldest_due_job_at)})" if absolute else ""
        lines.append(f"oldest due job: {_text(stats.oldest_due_job_id)}, {lag} late{at}")
    return "\n".join(lines)


def status_text(
    schema: str,
    now_ms: int,
    records: Sequence[ScheduleRecord],
    stats: StoreStats,
    width: int | None = None,
    absolute: bool = False,
) -> str:
    """The whole ``pgstore status`` output (without the final newline); the values that
    name schedules cut to fit ``width`` characters (None: never cut); times relative to
    ``now_ms`` (``absolute``: ISO UTC)."""
    parts = [f"schema {schema!r}, database clock {iso_utc(now_ms)}", ""]
    if records:
        parts += [
            _schedule_summary(records, now_ms),
            schedule_status_table(records, now_ms, width, absolute),
            *_spec_lines(records, width),
        ]
    else:
        parts.append("schedules: none")
    parts += ["", _jobs_summary(stats, now_ms, absolute)]
    return "\n".join(parts)
