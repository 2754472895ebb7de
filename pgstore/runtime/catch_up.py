"""What a scheduler does with the occurrences missed while none ran: the catch-up policies.

A schedule's ``catch_up`` is kept by the store (``schedules.catch_up``) and applied
here, by the scheduler that claimed an occurrence, since only it can compute
occurrences (the store treats a spec as opaque text). The rules, for an occurrence
scheduled at ``scheduled_at`` and claimed at ``now`` (docs/catch-up.md):

* ``skip``: an occurrence claimed more than ``grace_ms`` after its time is missed and
  not run: it is completed with ``last_status`` ``skipped``. Whether run or skipped,
  the next occurrence is the first one after ``now``: nothing missed is run.
* ``once`` (the default, and the only rule before catch-up policies): the claimed
  occurrence runs, however late, and the next one is the first after the later of
  ``now`` and ``scheduled_at``: one catch-up run, then the future.
* ``all``: the claimed occurrence runs, and the next one is the one right after it,
  even when that is already due, so each missed occurrence runs, oldest first. At most
  ``limit`` of them: when more than ``limit`` occurrences fell due after the one just
  run, the next is the oldest of the ``limit`` latest, and the older ones are never
  run. A run that takes long makes more occurrences due; they are caught up the same
  way.

Whatever the policy, a run in progress is never overlapped: its lease is held, so the
store claims nothing for the schedule until the run completes (or its lease expires),
and only the completion moves ``next_run_at``.

The scheduler computes ``all``'s next occurrence with ``advance``, in a worker thread
(never in its event loop: at ``limit`` 10,000 the first pass takes seconds), and keeps
the ``Backlog`` it returns for the schedule's next completion, which then costs only
the occurrences that fell due since (``advance``'s doc).

Everything here is a pure function of its arguments and of a schedule's
``Occurrences``: ``following(t)``, its first occurrence strictly after ``t``
(``next_cron`` or ``next_interval``), and ``between(t, u)``, its occurrences in
``(t, u]`` in order (``cron_between`` or ``interval_between``), both called only with
``t >= scheduled_at``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from pgstore import _validate as v
from pgstore.models import CatchUp

__all__ = [
    "DEFAULT_GRACE_MS",
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "Backlog",
    "Occurrences",
    "advance",
    "backlog",
    "next_after",
    "runs",
]

#: How many missed occurrences ``all`` runs at most, unless the scheduler says otherwise.
DEFAULT_LIMIT = 100
#: The largest ``limit`` a scheduler accepts: it bounds the work of ``backlog``.
MAX_LIMIT = 10_000
#: How late an occurrence may be claimed before ``skip`` counts it as missed.
DEFAULT_GRACE_MS = 60_000


@dataclass(frozen=True)
class Occurrences:
    """A schedule's occurrences, as the policies need them (epoch ms)."""

    #: The first occurrence strictly after an instant.
    following: Callable[[int], int]
    #: The occurrences in ``(after, until]``, in order.
    between: Callable[[int, int], list[int]]


def runs(catch_up: CatchUp, scheduled_at: int, now: int, grace_ms: int) -> bool:
    """Whether the occurrence claimed at ``now`` runs: always, but under ``skip`` when it
    is more than ``grace_ms`` late (missed)."""
    return catch_up != "skip" or now - scheduled_at <= grace_ms


def next_after(
    catch_up: CatchUp, occurrences: Occurrences, scheduled_at: int, now: int, limit: int
) -> int:
    """``next_run_at`` for the completion at ``now`` of the occurrence at ``scheduled_at``
    (run or skipped), by the module's rules."""
    if catch_up != "all":
        return occurrences.following(max(now, scheduled_at))
    due = backlog(occurrences, scheduled_at, now, limit)
    return due[0] if due else occurrences.following(scheduled_at)


def backlog(occurrences: Occurrences, after: int, now: int, limit: int) -> list[int]:
    """The ``limit`` latest occurrences in ``(after, now]`` (all of them when fewer),
    oldest first.

    Reads ever wider windows ending at ``now`` (``limit`` times the first gap, doubled
    until the window holds ``limit`` occurrences or reaches back to ``after``), so the
    work grows with ``limit`` and the density of the occurrences, not with how long
    none ran.
    """
    v.positive("limit", limit, maximum=MAX_LIMIT)
    first = occurrences.following(after)
    if first > now:
        return []
    width = (first - after) * limit
    while True:
        start = max(after, now - width)
        found = occurrences.between(start, now)
        if len(found) >= limit or start == after:
            return found[-limit:]
        width *= 2


@dataclass(frozen=True)
class Backlog:
    """What ``advance`` found due, for the schedule's next completion: ``due``, the
    ``limit`` latest occurrences in ``(completed, until]`` oldest first, where
    ``completed`` is the occurrence just completed; every occurrence from ``due[0]``
    to ``until`` is in it (only older ones are cut)."""

    due: tuple[int, ...]
    until: int


def advance(
    occurrences: Occurrences, last: Backlog | None, scheduled_at: int, now: int, limit: int
) -> tuple[int, Backlog]:
    """``next_after("all", ...)`` and the ``Backlog`` to pass to the next call.

    When ``last`` (this schedule's previous answer) holds ``scheduled_at`` and ends no
    later than ``now``, the occurrences after ``scheduled_at`` in it are reused and
    only those in ``(last.until, now]`` are read (at most ``limit`` of them, as
    ``backlog`` reads them): a catch-up of ``limit`` runs reads its occurrences once,
    not once per run. Otherwise (the first completion, or the record moved on
    elsewhere) it is ``backlog``'s pass. The answer is the same either way.
    """
    v.positive("limit", limit, maximum=MAX_LIMIT)
    due: tuple[int, ...] | None = None
    if last is not None and last.until <= now:
        at = bisect.bisect_left(last.due, scheduled_at)
        if at < len(last.due) and last.due[at] == scheduled_at:
            fresh = backlog(occurrences, last.until, now, limit) if now > last.until else []
            due = (last.due[at + 1:] + tuple(fresh))[-limit:]
    if due is None:
        due = tuple(backlog(occurrences, scheduled_at, now, limit))
    upcoming = due[0] if due else occurrences.following(scheduled_at)
    return upcoming, Backlog(due, now)
