"""How the command line prints instants, durations, leases and tables (UTC, aligned)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone

from pgstore.models import Job, ScheduleRecord

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

    A lease is live while ``lease_until > now`` (docs/contract.md: a claim needs
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
    "failures",
    "catch_up",
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
                str(r.consecutive_failures),
                r.catch_up,
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
    job still waiting (not dispatched, cancelled or failed); ``12s ago`` for the others."""
    if job.dispatch_at > now_ms:
        return f"in {_until(job.dispatch_at - now_ms)}"
    pending = job.state == "waiting"
    if job.dispatch_at == now_ms:
        return "due now" if pending else "0ms ago"
    late = format_duration(now_ms - job.dispatch_at)
    return f"overdue {late}" if pending else f"{late} ago"


def finished_state(job: Job, now_ms: int) -> str:
    """How long ago the job finished (``finished_at``): ``12s ago``, what ``pgstore purge
    --older-than`` compares; ``-`` for a job still waiting."""
    if job.finished_at is None:
        return NULL
    return f"{format_duration(max(0, now_ms - job.finished_at))} ago"


def holder_lease_state(
    holder: str | None, lease_until: int | None, now_ms: int, limit: int | None = None
) -> str:
    """``-`` (no lease), ``live: HOLDER until ISO (in 30s)`` or ``expired: HOLDER until ISO
    (12s ago)``, at ``now_ms``; HOLDER cut to ``limit`` characters (``clip``). A lease is
    live while ``lease_until > now`` (docs/contract.md)."""
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


JOB_COLUMNS = (
    "run_id", "dispatch_at", "due", "lease", "dispatched", "cancelled", "failed", "finished",
    "attempts", "worker_id", "last_error",
)


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def jobs_table(jobs: Sequence[Job], now_ms: int, width: int | None = None) -> str:
    """The jobs as an aligned text table (header, rule, one line per job), in the given order;
    run ids, lease holders, worker ids and last errors cut to fit ``width`` characters
    (``fitted``). ``attempts`` reads ``leases so far/max_attempts``."""

    def rows(limit: int | None) -> list[tuple[str, ...]]:
        return [
            (
                clip(j.run_id, limit),
                format_instant(j.dispatch_at),
                due_state(j, now_ms),
                job_lease_state(j, now_ms, limit),
                _yes_no(j.dispatched),
                _yes_no(j.cancelled),
                _yes_no(j.failed),
                finished_state(j, now_ms),
                f"{j.attempts}/{j.max_attempts}",
                clip(j.worker_id, limit) if j.worker_id is not None else NULL,
                clip(j.last_error, limit) if j.last_error is not None else NULL,
            )
            for j in jobs
        ]

    return fitted(JOB_COLUMNS, rows, width)
