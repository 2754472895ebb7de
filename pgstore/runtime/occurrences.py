"""When a schedule runs next: cron and fixed-interval occurrences, as pure functions.

All instants are epoch milliseconds (``int``, UTC). Nothing here reads a clock,
a database or the network; ``zoneinfo`` reads the tz database the first time a
zone is used, and that is all.

Cron (``next_cron``) works like a careful cron (Vixie cron, systemd):

* The 5-field expression (minute hour day-of-month month day-of-week, or one
  of croniter's aliases ``@hourly`` ``@daily`` ``@midnight`` ``@weekly``
  ``@monthly`` ``@yearly`` ``@annually``) is matched against the zone's local
  wall clock, with croniter's field syntax and Vixie's day rule (when both
  day fields are restricted, a day matching either one matches). Seconds and
  year fields, ``@reboot`` and hashed/random fields (``H``, ``R``) are refused.
* A matching wall time that does not exist (the spring-forward gap) runs at
  the first instant after the gap, which is the transition instant itself
  (``30 2 * * *`` in Europe/Berlin on 2026-03-29 runs at 03:00 CEST,
  2026-03-29T01:00:00Z). Several matching wall times in one gap (and a match
  at the gap's end) are one run.
* A matching wall time that occurs twice (the fall-back fold) runs once, at
  its first occurrence (``fold=0``): ``30 2 * * *`` in Europe/Berlin runs once
  on 2026-10-25, at 02:30 CEST (00:30Z).
* Except "frequent" expressions, whose hour field matches every hour (``*``,
  ``0-23``, ``*/1``...: croniter expands it to all 24 hours). Those follow real
  time: they run at every real instant whose local wall time matches, so both
  folds of a repeated wall time run, and wall times inside a gap never happen
  and are skipped. ``*/30 * * * *`` runs every 30 minutes of real time through
  both changes (46 runs on 2026-03-29 in Berlin, 50 on 2026-10-25).
* The next occurrence is the first one strictly after ``after_ms``; missed
  occurrences are not replayed here (``cron_between`` lists them, for a
  schedule whose catch-up policy runs them: ``pgstore.runtime.catch_up``).

The search assumes a zone's UTC offset changes by at most 3 hours at a time,
true of every DST rule in the tz database (historical day-long jumps, such as
Pacific/Apia skipping 2011-12-30, are out of scope).

Interval (``next_interval``) is fixed-rate on the grid ``scheduled_ms + k *
interval_ms``: no drift from late runs, and no catch-up storm after downtime
(the next grid point strictly after ``now_ms``, never the missed ones).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from pgstore._validate import BIGINT_MAX, BIGINT_MIN, positive, present_int
from pgstore.errors import InvalidArgument

__all__ = [
    "CronSpec",
    "cron_between",
    "cron_spec",
    "interval_between",
    "next_cron",
    "next_interval",
]

#: The largest change of a zone's UTC offset the search allows for.
MAX_OFFSET_SHIFT = timedelta(hours=3)

_ALIASES = frozenset(
    {"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"}
)
_FIELDS = "minute hour day-of-month month day-of-week"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)
# A fixed naive start for validating expressions (never "now": results must not
# depend on when the spec was made).
_PROBE_START = datetime(2000, 1, 1)


@dataclass(frozen=True)
class CronSpec:
    """A validated cron expression and the IANA zone its wall clock is read in.

    Construct with ``cron_spec(expr, tz)`` or ``CronSpec.parse(stored)``;
    the constructor validates too (and collapses runs of whitespace in
    ``expr``), so every instance is usable.
    """

    expr: str
    tz: str = "UTC"

    def __post_init__(self) -> None:
        object.__setattr__(self, "expr", _check_expr(self.expr))
        _zone(self.tz)

    def stored(self) -> str:
        """The form kept in a schedule's ``spec``: ``TZ=<zone> <expr>``, or ``expr`` for UTC."""
        if self.tz == "UTC":
            return self.expr
        return f"TZ={self.tz} {self.expr}"

    @classmethod
    def parse(cls, stored: str) -> CronSpec:
        """The inverse of ``stored()``: ``"TZ=Europe/Berlin 30 2 * * *"`` or ``"30 2 * * *"``."""
        if not isinstance(stored, str):
            raise InvalidArgument(f"cron spec must be a string, not {type(stored).__name__}")
        text = stored.strip()
        if text.startswith("TZ="):
            head, *rest = text.split(None, 1)
            tz = head[len("TZ=") :]
            if not tz:
                raise InvalidArgument(f"cron spec {stored!r} has an empty TZ= zone")
            if not rest:
                raise InvalidArgument(f"cron spec {stored!r} has a TZ= zone but no expression")
            return cls(rest[0], tz)
        return cls(text)


def cron_spec(expr: str, tz: str = "UTC") -> CronSpec:
    """A validated ``CronSpec``; ``InvalidArgument`` names a bad expression or zone."""
    return CronSpec(expr, tz)


def next_cron(spec: CronSpec, after_ms: int) -> int:
    """The first occurrence of ``spec`` strictly after ``after_ms`` (see the module rules)."""
    present_int("after_ms", after_ms)
    zone = _zone(spec.tz)
    frequent = _is_frequent(spec.expr)
    try:
        # Candidates are naive local wall times. One can map to an instant
        # earlier than an earlier candidate's (folds), so start a little before
        # after_ms's wall time and keep the least instant > after_ms, until the
        # candidates are further past it than any offset change could undo.
        start = _wall(after_ms, zone) - MAX_OFFSET_SHIFT - timedelta(minutes=1)
        candidates = croniter(spec.expr, start)
        best: int | None = None
        stop_after = datetime.max
        while True:
            naive = candidates.get_next(datetime)
            if naive > stop_after:
                break
            for instant in _instants(naive, zone, frequent):
                if instant > after_ms and (best is None or instant < best):
                    best = instant
                    stop_after = _wall(best, zone) + MAX_OFFSET_SHIFT
    except (OverflowError, CroniterBadDateError) as exc:
        raise InvalidArgument(
            f"no occurrence of cron expression {spec.expr!r} after after_ms={after_ms} "
            "within the supported dates (years 1-9999)",
            sqlstate="22003",
        ) from exc
    assert best is not None
    if best > BIGINT_MAX:
        raise InvalidArgument("next occurrence is out of the bigint range", sqlstate="22003")
    return best


def cron_between(spec: CronSpec, after_ms: int, until_ms: int) -> list[int]:
    """Every occurrence of ``spec`` in ``(after_ms, until_ms]``, in order: the instants
    ``next_cron`` steps through from ``after_ms``, found in one pass over the wall
    clock (one croniter step per candidate, where each ``next_cron`` call starts a
    search of its own)."""
    present_int("after_ms", after_ms)
    present_int("until_ms", until_ms)
    if until_ms <= after_ms:
        return []
    zone = _zone(spec.tz)
    frequent = _is_frequent(spec.expr)
    try:
        start = _wall(after_ms, zone) - MAX_OFFSET_SHIFT - timedelta(minutes=1)
        last = _wall(until_ms, zone)
    except OverflowError as exc:
        raise InvalidArgument(
            "cron_between is defined within the supported dates (years 1-9999)",
            sqlstate="22003",
        ) from exc
    stop_after = last + MAX_OFFSET_SHIFT if last < datetime.max - MAX_OFFSET_SHIFT else last
    found: set[int] = set()
    candidates = croniter(spec.expr, start)
    while True:
        try:
            naive = candidates.get_next(datetime)
            if naive > stop_after:
                break
            instants = _instants(naive, zone, frequent)
        except (OverflowError, CroniterBadDateError):
            break  # no candidate left before year 10000
        found.update(i for i in instants if after_ms < i <= until_ms)
    return sorted(found)


def interval_between(
    scheduled_ms: int, interval_ms: int, after_ms: int, until_ms: int
) -> list[int]:
    """The grid points ``scheduled_ms + k * interval_ms`` (k >= 1) in ``(after_ms,
    until_ms]``, in order."""
    present_int("scheduled_ms", scheduled_ms)
    positive("interval_ms", interval_ms)
    present_int("after_ms", after_ms)
    present_int("until_ms", until_ms)
    first = next_interval(scheduled_ms, interval_ms, max(after_ms, scheduled_ms))
    return list(range(first, until_ms + 1, interval_ms))


def next_interval(scheduled_ms: int, interval_ms: int, now_ms: int) -> int:
    """The least ``scheduled_ms + k * interval_ms`` (k >= 1) strictly after ``now_ms``."""
    present_int("scheduled_ms", scheduled_ms)
    positive("interval_ms", interval_ms)
    present_int("now_ms", now_ms)
    k = max(1, (now_ms - scheduled_ms) // interval_ms + 1)
    result = scheduled_ms + k * interval_ms
    if not BIGINT_MIN <= result <= BIGINT_MAX:
        raise InvalidArgument(
            "next interval occurrence is out of the bigint range", sqlstate="22003"
        )
    return result


# --- the zone and the expression --------------------------------------------------------------


def _zone(tz: object) -> ZoneInfo:
    if not isinstance(tz, str):
        raise InvalidArgument(f"time zone must be a string, not {type(tz).__name__}")
    return _load_zone(tz)


@functools.lru_cache(maxsize=256)
def _load_zone(tz: str) -> ZoneInfo:
    if tz == "localtime":
        raise InvalidArgument("time zone 'localtime' depends on the host: name an IANA zone")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise InvalidArgument(
            f"unknown time zone {tz!r}: expected an IANA zone name such as 'Europe/Berlin'"
        ) from exc


def _check_expr(expr: object) -> str:
    """The expression with whitespace collapsed, or ``InvalidArgument``."""
    if not isinstance(expr, str):
        raise InvalidArgument(f"cron expression must be a string, not {type(expr).__name__}")
    fields = expr.split()
    if not fields:
        raise InvalidArgument("cron expression must not be empty")
    normal = " ".join(fields)
    if normal.startswith("@"):
        if len(fields) != 1 or normal.lower() not in _ALIASES:
            raise InvalidArgument(
                f"cron expression {expr!r} is not supported: use 5 fields ({_FIELDS}) "
                f"or one of {', '.join(sorted(_ALIASES))}"
            )
    elif len(fields) != 5:
        raise InvalidArgument(
            f"cron expression {expr!r} has {len(fields)} fields; it must have 5 "
            f"({_FIELDS}); seconds and years are not supported"
        )
    if any(item[:1] in ("H", "h", "R", "r") for field in fields for item in field.split(",")):
        raise InvalidArgument(
            f"cron expression {expr!r} uses a hashed (H) or random (R) field, "
            "which is not supported"
        )
    _is_frequent(normal)
    return normal


@functools.lru_cache(maxsize=1024)
def _is_frequent(expr: str) -> bool:
    """Whether the hour field matches all 24 hours; validates ``expr`` with croniter."""
    try:
        probe = croniter(expr, _PROBE_START)
    except (CroniterError, ValueError, TypeError) as exc:
        raise InvalidArgument(f"invalid cron expression {expr!r}: {exc}") from exc
    try:
        probe.get_next(datetime)
    except CroniterBadDateError as exc:
        raise InvalidArgument(f"cron expression {expr!r} never matches a date") from exc
    hours = probe.expanded[1]
    return hours == ["*"] or {str(h) for h in hours} == {str(h) for h in range(24)}


# --- instants and wall times ------------------------------------------------------------------


def _to_ms(moment: datetime) -> int:
    return (moment - _EPOCH) // _ONE_MS


def _wall(instant_ms: int, zone: ZoneInfo) -> datetime:
    """The naive local wall time of an instant."""
    local = (_EPOCH + timedelta(milliseconds=instant_ms)).astimezone(zone)
    return local.replace(tzinfo=None, fold=0)


def _instants(naive: datetime, zone: ZoneInfo, frequent: bool) -> list[int]:
    """The real instants a matching naive wall time runs at, by the module rules."""
    first = naive.replace(tzinfo=zone, fold=0)
    second = naive.replace(tzinfo=zone, fold=1)
    early, late = _to_ms(first), _to_ms(second)
    if _wall(early, zone) != naive:
        # Nonexistent: inside a gap. fold=0 reads it with the offset before the
        # gap, fold=1 with the offset after, so the two instants straddle the
        # transition.
        if frequent:
            return []
        return [_gap_end(naive, zone, min(early, late), max(early, late))]
    if first.utcoffset() != second.utcoffset():
        # Ambiguous: inside a fold; fold=0 is the first, earlier, instant.
        return [early, late] if frequent else [early]
    return [early]


def _gap_end(naive: datetime, zone: ZoneInfo, low: int, high: int) -> int:
    """The transition instant of the gap holding ``naive``: the first instant after it.

    ``low``'s wall time is before the gap (before ``naive``) and ``high``'s is
    after it; bisect to the least millisecond whose wall time is past ``naive``.
    """
    while high - low > 1:
        middle = (low + high) // 2
        if _wall(middle, zone) > naive:
            high = middle
        else:
            low = middle
    return high
