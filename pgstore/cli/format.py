"""How the command line prints instants, durations, leases and tables: the one place that
cuts values to fit a width and formats times (UTC, aligned).

**Times.** One form per table: relative by default (``in 3m00s``, ``12s late``,
``5m00s ago``), judged against the database clock; ``absolute=True`` (``--absolute``)
shows the ISO-8601 UTC instant instead (``2024-05-01T12:00:00.000Z``). Epoch ms appear
only in ``--json``.

**Cutting.** Identifiers (schedule ids, lease holders, owners, worker ids, queues) are cut in
the middle (``dispatcher@ho…:4412``): their start and their end both survive, and the
end is what tells ``dispatcher@host-a:4412`` from ``dispatcher@host-a:4413``. Free
text (a last error) is cut at its end. Run ids are never cut: a cut run id cannot be
pasted into ``pgstore jobs retry``; when the table does not fit with every other
value cut to ``MIN_CUT``, its lines overflow the width (the terminal wraps them).
``width=None`` (``--wide``, a pipe, a file): nothing is cut.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone

from pgstore.models import Job, QueueInfo, ScheduleRecord

#: What a table shows for a NULL.
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
    """``<ms> (<ISO-8601 UTC>)``, or ``-`` for NULL: the database clock in headers and
    progress lines, where both forms are wanted once."""
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
    """``value`` on one line (control characters escaped), cut at its end to ``limit``
    characters ending in ``CUT_MARK`` when it is longer; None: never cut. For free text
    (a last error), whose start says the most."""
    shown = _text(value)
    if limit is None or len(shown) <= limit:
        return shown
    return shown[: max(limit - 1, 0)] + CUT_MARK


def clip_middle(value: str, limit: int | None = None) -> str:
    """``value`` on one line (control characters escaped), cut in the middle to ``limit``
    characters (``dispatcher@ho…:4412``) when it is longer: the start and the end, which
    tells one worker or host from the next, both survive (the end gets the odd one);
    None: never cut. For identifiers."""
    shown = _text(value)
    if limit is None or len(shown) <= limit:
        return shown
    keep = max(limit - 1, 0)
    head = keep // 2
    tail = keep - head
    return shown[:head] + CUT_MARK + (shown[-tail:] if tail else "")


# --- times ----------------------------------------------------------------------


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


def short_duration(ms: int) -> str:
    """A non-negative span of ms in one unit, as listings show it (gh, kubectl):
    ``250ms``, ``42s`` (under 100 s), ``12m`` (under 100 min), ``5h`` (under 48 h),
    ``3d``; truncated."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    if seconds < 100:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 100:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def _ceil_s(ms: int) -> int:
    # A span still to come, rounded up to the second: "in 0s" would read as "now".
    return math.ceil(ms / 1000) * 1000


def _until(ms: int) -> str:
    return format_duration(_ceil_s(ms))


def _ahead(ms: int) -> str:
    return short_duration(_ceil_s(ms))


def relative(ms: int, now_ms: int) -> str:
    """``ms`` against ``now_ms`` (``short_duration``): ``in 3m`` (rounded up: never
    ``in 0s``), ``now``, or ``5m ago``."""
    if ms > now_ms:
        return f"in {_ahead(ms - now_ms)}"
    if ms == now_ms:
        return "now"
    return f"{short_duration(now_ms - ms)} ago"


def when(ms: int | None, now_ms: int, absolute: bool = False) -> str:
    """An instant in the table's one form: ``relative`` (default) or ISO UTC
    (``absolute``); ``-`` for NULL."""
    if ms is None:
        return NULL
    return iso_utc(ms) if absolute else relative(ms, now_ms)


def due_state(job: Job, now_ms: int, absolute: bool = False) -> str:
    """``dispatch_at`` against ``now_ms``. Relative (``short_duration``): ``in 5m``;
    ``12s late`` or ``due now`` for a job still waiting; ``12s ago`` for a finished one
    (dispatched, cancelled or failed). Absolute: the ISO UTC instant."""
    if absolute:
        return iso_utc(job.dispatch_at)
    if job.dispatch_at > now_ms:
        return f"in {_ahead(job.dispatch_at - now_ms)}"
    pending = job.state == "waiting"
    if job.dispatch_at == now_ms:
        return "due now" if pending else "0ms ago"
    late = short_duration(now_ms - job.dispatch_at)
    return f"{late} late" if pending else f"{late} ago"


def finished_state(job: Job, now_ms: int, absolute: bool = False) -> str:
    """When the job finished (``finished_at``, what ``pgstore purge --older-than``
    compares): ``12s ago`` or ISO UTC; ``-`` for a job still waiting."""
    if job.finished_at is None:
        return NULL
    if absolute:
        return iso_utc(job.finished_at)
    return f"{short_duration(max(0, now_ms - job.finished_at))} ago"


def lease_left(lease_until: int | None, now_ms: int, absolute: bool = False) -> str:
    """A lease's end at ``now_ms``: ``25s left`` (live: ``lease_until > now``,
    docs/contract.md) or ``expired 12s ago``; absolute: ``until ISO`` or ``expired ISO``;
    ``-`` without one."""
    if lease_until is None:
        return NULL
    live = lease_until > now_ms
    if absolute:
        return f"{'until' if live else 'expired'} {iso_utc(lease_until)}"
    if live:
        return f"{_ahead(lease_until - now_ms)} left"
    return f"expired {short_duration(now_ms - lease_until)} ago"


def holder_lease_state(
    holder: str | None,
    lease_until: int | None,
    now_ms: int,
    limit: int | None = None,
    absolute: bool = False,
) -> str:
    """``-`` (no lease), ``live: HOLDER, 30s left`` or ``expired: HOLDER, 12s ago`` at
    ``now_ms`` (absolute: ``live: HOLDER until ISO``, ``expired: HOLDER at ISO``);
    HOLDER cut in the middle to ``limit`` characters (``clip_middle``)."""
    if holder is None and lease_until is None:
        return NULL
    who = clip_middle(holder, limit) if holder is not None else "nobody"
    if lease_until is None:
        return f"{who} (no expiry)"
    live = lease_until > now_ms
    if absolute:
        return f"live: {who} until {iso_utc(lease_until)}" if live \
            else f"expired: {who} at {iso_utc(lease_until)}"
    if live:
        return f"live: {who}, {_ahead(lease_until - now_ms)} left"
    return f"expired: {who}, {short_duration(now_ms - lease_until)} ago"


def job_lease_state(
    job: Job, now_ms: int, limit: int | None = None, absolute: bool = False
) -> str:
    """A job's lease at ``now_ms``, as ``holder_lease_state`` shows it."""
    return holder_lease_state(job.lease_holder, job.lease_until, now_ms, limit, absolute)


def lease_state(
    record: ScheduleRecord, now_ms: int, limit: int | None = None, absolute: bool = False
) -> str:
    """``free``, ``held by OWNER, 30s left`` (absolute: ``held by OWNER until ISO``) or
    ``expired (OWNER)``, at ``now_ms``; OWNER cut in the middle to ``limit`` characters.

    A lease is live while ``lease_until > now`` (docs/contract.md: a claim needs
    ``lease_until IS NULL OR lease_until <= now``).
    """
    if record.lease_owner is None and record.lease_until is None:
        return "free"
    owner = (clip_middle(record.lease_owner, limit) if record.lease_owner is not None
             else "nobody")
    if record.lease_until is None:
        return f"held by {owner} (no expiry)"
    if record.lease_until > now_ms:
        if absolute:
            return f"held by {owner} until {iso_utc(record.lease_until)}"
        return f"held by {owner}, {_ahead(record.lease_until - now_ms)} left"
    return f"expired ({owner})"


def job_phase(job: Job, now_ms: int) -> str:
    """The job's state as ``pgstore status`` counts them, at ``now_ms``: ``pending`` (waiting,
    not due, no live lease), ``due`` (waiting, due, no live lease), ``leased`` (waiting,
    live lease), ``dispatched`` (cancelled meanwhile or not), ``cancelled`` (never
    dispatched), ``failed``."""
    state = job.state
    if state != "waiting":
        return state
    if job.lease_until is not None and job.lease_until > now_ms:
        return "leased"
    return "due" if job.dispatch_at <= now_ms else "pending"


# --- tables ---------------------------------------------------------------------


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
    its lines fit; else of ``rows_at(limit)`` with the largest ``limit`` on the values that
    may be cut (ids, owners, holders, worker ids, errors) whose lines fit in ``width``
    characters, at least ``MIN_CUT``: the fixed-format cells (times, states, counts) and
    run ids are never cut, so on a narrow terminal the lines may still overflow."""
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


COLUMNS = (
    "id",
    "kind",
    "spec",
    "next_run",
    "last_run",
    "last_status",
    "failures",
    "catch_up",
    "token",
    "lease",
)


def _next_cell(record: ScheduleRecord, now_ms: int, absolute: bool) -> str:
    """``next``: the nominal next_run_at; ``paused`` or ``triggered`` before it when so."""
    text = when(record.next_run_at, now_ms, absolute)
    if record.triggered_at is not None:
        text = f"triggered, {text}"
    return f"paused, {text}" if record.paused else text


def schedules_table(
    records: Sequence[ScheduleRecord],
    now_ms: int,
    width: int | None = None,
    absolute: bool = False,
) -> str:
    """The records as an aligned text table (header, rule, one line per record); times
    relative to ``now_ms`` (``absolute``: ISO UTC); ids and lease owners cut in the middle
    and specs at their end to fit ``width`` characters (``fitted``)."""

    def rows(limit: int | None) -> list[tuple[str, ...]]:
        return [
            (
                clip_middle(r.id, limit),
                r.kind,
                clip(r.spec, limit),
                _next_cell(r, now_ms, absolute),
                when(r.last_run_at, now_ms, absolute),
                r.last_status or NULL,
                str(r.consecutive_failures),
                r.catch_up,
                str(r.fencing_token),
                lease_state(r, now_ms, limit, absolute),
            )
            for r in records
        ]

    return fitted(COLUMNS, rows, width)


# --- jobs -----------------------------------------------------------------------

#: ``pgstore jobs``' columns; ``--failed`` adds ``last_error``.
JOB_COLUMNS = ("run_id", "queue", "state", "due", "attempts", "lease", "holder")
#: ``pgstore jobs --wide``'s columns: every one, nothing cut.
JOB_COLUMNS_WIDE = (
    *JOB_COLUMNS, "priority", "sequence", "finished", "worker_id", "last_error")


def jobs_table(
    jobs: Sequence[Job],
    now_ms: int,
    width: int | None = None,
    *,
    absolute: bool = False,
    wide: bool = False,
    errors: bool = False,
) -> str:
    """The jobs as an aligned text table (header, rule, one line per job), in the given
    order: ``JOB_COLUMNS`` (with ``errors``, ``last_error`` too), or ``JOB_COLUMNS_WIDE``
    with ``wide``. ``state`` is ``job_phase``; ``due`` is ``due_state``; ``attempts``
    reads ``leases so far/max_attempts``; ``lease`` is ``lease_left``. Times relative to
    ``now_ms`` (``absolute``: ISO UTC). Queues, holders and worker ids are cut in the
    middle and last errors at their end to fit ``width`` characters (``fitted``); run ids
    are never cut."""

    columns = JOB_COLUMNS_WIDE if wide else (
        (*JOB_COLUMNS, "last_error") if errors else JOB_COLUMNS)

    def rows(limit: int | None) -> list[tuple[str, ...]]:
        out = []
        for j in jobs:
            cells = [
                _text(j.run_id),
                clip_middle(j.queue, limit),
                job_phase(j, now_ms),
                due_state(j, now_ms, absolute),
                f"{j.attempts}/{j.max_attempts}",
                lease_left(j.lease_until, now_ms, absolute),
                clip_middle(j.lease_holder, limit) if j.lease_holder is not None else NULL,
            ]
            if wide:
                cells += [
                    str(j.priority),
                    str(j.lease_sequence),
                    finished_state(j, now_ms, absolute),
                    clip_middle(j.worker_id, limit) if j.worker_id is not None else NULL,
                ]
            if wide or errors:
                cells.append(clip(j.last_error, limit) if j.last_error is not None else NULL)
            out.append(tuple(cells))
        return out

    return fitted(columns, rows, width)


# --- instants typed by people -----------------------------------------------------

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def span_ms(text: str) -> int:
    """A span such as ``7d``, ``12h``, ``30m``, ``90s``, ``500ms`` or ``2w`` in ms: a
    positive count (at most 12 digits) and one unit. ``ValueError`` otherwise."""
    import re

    match = re.fullmatch(r"([0-9]{1,12})(ms|s|m|h|d|w)", text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(
            f"not an age: {text!r} (a positive count and a unit: ms, s, m, h, d or w; e.g. 7d)"
        )
    return int(match.group(1)) * _UNITS_MS[match.group(2)]


def parse_when(text: str) -> tuple[int | None, int]:
    """An instant as typed after ``--at``: ``(absolute epoch ms, None)`` or ``(None,
    offset ms from the database clock's now)``, as ``(at, offset)``. Accepted: ``now``;
    ``+5m`` or ``in 5m`` (later), ``-5m`` or ``5m ago`` (earlier), any ``span_ms``;
    an ISO-8601 instant with ``Z`` or an offset (``2024-05-01T12:00:00Z``,
    ``2024-05-01 14:00+02:00``); epoch ms (digits only). ``ValueError`` otherwise,
    naming the forms (an ISO instant without a zone is refused: the database clock
    is UTC, this host's may not be)."""
    shown = text.strip()
    lowered = shown.lower()
    if lowered == "now":
        return None, 0
    for prefix, sign in (("+", 1), ("in ", 1), ("-", -1)):
        if lowered.startswith(prefix):
            return None, sign * span_ms(lowered[len(prefix):])
    if lowered.endswith(" ago"):
        return None, -span_ms(lowered[: -len(" ago")])
    if shown.isascii() and shown.isdigit():
        if len(shown) > 19 or int(shown) > 2**63 - 1:
            raise ValueError(f"not an instant: {text!r} (epoch ms beyond bigint)")
        return int(shown), 0
    try:
        parsed = datetime.fromisoformat(shown.replace("z", "Z"))
    except ValueError:
        raise ValueError(
            f"not an instant: {text!r} (now, +5m, in 2h, 5m ago, an ISO-8601 instant with Z "
            "or an offset, or epoch ms)"
        ) from None
    if parsed.tzinfo is None:
        raise ValueError(
            f"not an instant: {text!r} has no time zone: add Z (UTC) or an offset such as "
            "+02:00"
        )
    delta = parsed - _EPOCH
    return delta // timedelta(milliseconds=1), 0


QUEUE_COLUMNS = ("queue", "waiting", "due", "leased", "paused", "limits")


def queue_limits(q: QueueInfo) -> str:
    """A queue's limits for people: ``5 at once``, ``10/1s (4 used)``, both joined by a
    comma, or ``-`` for none."""
    parts = []
    if q.concurrency_limit is not None:
        parts.append(f"{q.concurrency_limit} at once")
    if q.rate_limit is not None and q.rate_period_ms is not None:
        parts.append(f"{q.rate_limit}/{short_duration(q.rate_period_ms)} ({q.rate_used} used)")
    return ", ".join(parts) or NULL


def parse_rate(text: str) -> tuple[int, int]:
    """A rate limit as typed after ``--rate``: ``N/SPAN`` (``10/1s``, ``600/1m``,
    ``5/250ms``; a span as ``span_ms`` reads it) as ``(N, span in ms)``. ``ValueError``
    otherwise."""
    count, _, span = text.partition("/")
    if not count.strip().isdigit() or not span:
        raise ValueError(f"not a rate: {text!r} (a count, a slash and a span, e.g. 10/1s)")
    return int(count), span_ms(span)


def queues_table(queues: Sequence[QueueInfo], width: int | None = None) -> str:
    """The queues as an aligned text table (header, rule, one line per queue, by name):
    ``waiting`` is the depth (jobs not dispatched, cancelled or failed), ``due`` those
    due and not held, ``leased`` those under a live lease, ``paused`` yes or no,
    ``limits`` as ``queue_limits`` says. Queue names are cut in the middle to fit
    ``width`` characters (``fitted``)."""

    def rows(limit: int | None) -> list[tuple[str, ...]]:
        return [
            (clip_middle(q.queue, limit), str(q.depth), str(q.due), str(q.leased),
             "yes" if q.paused else "no", queue_limits(q))
            for q in queues
        ]

    return fitted(QUEUE_COLUMNS, rows, width)
