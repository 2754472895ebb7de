"""The Scheduler's completions: a run's claim completed with its status and the
next occurrence, under the schedule's ``catch_up`` policy.

``complete`` cannot commit twice (a spent claim answers False), so a failed one
(a lost connection) is retried, up to ``COMPLETE_ATTEMPTS`` times, rather than
left to the lease's expiry, which would run the occurrence again. A rejected
complete is logged as a stale claim and never retried; nor is one refused for a
bad argument. Under ``all`` the next occurrence is computed in a worker thread,
not in the event loop (``_upcoming``); one that cannot be computed (before year
1, after 9999) is logged as an error and the schedule goes on by the ``once``
rule. Each completion is reported (``Complete``; a stale claim also as
``Refused``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Literal

from pgstore.errors import InvalidArgument
from pgstore.models import CatchUp, CompletePatch, LastStatus
from pgstore.protocols import AsyncScheduleStore
from pgstore.runtime import catch_up as _catch_up
from pgstore.runtime.base import Host
from pgstore.runtime.events import Complete, Refused
from pgstore.runtime.keeper import Ending
from pgstore.runtime.tasks import RunContext, Task
from pgstore.runtime.transient import is_permanent

__all__ = ["COMPLETE_ATTEMPTS", "Completer"]

log = logging.getLogger("pgstore.scheduler")

#: Tries of a complete that fails (a lost connection) before the lease is left to expire.
COMPLETE_ATTEMPTS = 5


class Completer:
    """Completes ``host``'s runs through ``schedules``; ``catch_up_limit`` bounds the
    missed occurrences a schedule under ``all`` runs."""

    def __init__(self, schedules: AsyncScheduleStore, host: Host, catch_up_limit: int) -> None:
        self._complete = schedules.complete
        self._host = host
        self.catch_up_limit = catch_up_limit
        #: Under catch_up ``all``: what the last completion of each task found due.
        self._backlogs: dict[str, _catch_up.Backlog] = {}

    async def finish(
        self, task: Task, ctx: RunContext, status: LastStatus, catch_up: CatchUp,
        kept: int | None = None, ending: Ending | None = None,
    ) -> None:
        """Complete the claim with ``status`` and the next occurrence under ``catch_up``;
        for a triggered run (``ctx.triggered``), ``kept``, the record's ``next_run_at``,
        which the store keeps whatever it is sent. ``ending``, the run's keeper's, is
        set just before the first attempt is sent."""
        # complete cannot commit twice (a spent claim answers False), so a failed one
        # (a lost connection) is retried rather than left to the lease's expiry, which
        # would run the occurrence again.
        # A refusal for a bad argument is never retried: it would be refused again.
        for attempt in range(1, COMPLETE_ATTEMPTS + 1):
            try:
                now = await self._host.now()
                upcoming = await self._upcoming(task, ctx, now, catch_up, kept)
                patch = CompletePatch(upcoming, ctx.started_at, status)
                if ending is not None:
                    ending.sent = True
                completed = await self._complete(task.id, ctx.fencing_token, patch, now)
                break
            except Exception as exc:
                if is_permanent(exc):
                    log.error("%s: complete of %s token %d refused: %s: %s; not retried, "
                              "the lease will expire", self._host.owner, task.id,
                              ctx.fencing_token, type(exc).__name__, exc)
                    self._completed(ctx, "failed", attempt, status, None)
                    return
                log.exception("%s: complete of %s token %d failed (attempt %d of %d)",
                              self._host.owner, task.id, ctx.fencing_token, attempt,
                              COMPLETE_ATTEMPTS)
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
        else:
            log.error("%s: %s token %d %s but was not completed; the lease will expire "
                      "and it may run again", self._host.owner, task.id, ctx.fencing_token,
                      "was skipped" if status == "skipped" else "ran")
            self._completed(ctx, "failed", COMPLETE_ATTEMPTS, status, None)
            return
        self._completed(ctx, "completed" if completed else "rejected", attempt, status,
                        patch.next_run_at)
        if completed:
            log.info("%s: completed %s token %d %s, next run at %s", self._host.owner, task.id,
                     ctx.fencing_token, status, patch.next_run_at)
        elif attempt > 1:
            log.warning("%s: complete of %s token %d answered False after a failed attempt: "
                        "that attempt committed, or the claim went stale", self._host.owner,
                        task.id, ctx.fencing_token)
        else:
            log.warning("%s: complete of %s token %d rejected: stale claim", self._host.owner,
                        task.id, ctx.fencing_token)
            self._host.emit(Refused(runtime="scheduler", owner=self._host.owner,
                                    operation="complete", subject=task.id,
                                    token=ctx.fencing_token))

    async def _upcoming(
        self, task: Task, ctx: RunContext, now: int, catch_up: CatchUp, kept: int | None
    ) -> int | None:
        """``next_run_at`` after the occurrence ``ctx`` ran (or skipped) at ``now``.

        Under ``all`` it is computed in a worker thread, never in the event loop (a
        backlog of ``catch_up_limit`` 10,000 takes seconds to read the first time, and
        the loop keeps every other lease meanwhile), from the backlog the task's last
        completion found (``pgstore.runtime.catch_up.advance``), kept here for the next.

        An occurrence that cannot be computed (a ``next_run_at`` outside the dates
        cron can express, years 1 to 9999) is an error logged once, never a retry: the
        schedule goes on by the ``once`` rule (the first occurrence after now), and
        when there is none either, ``next_run_at`` is cleared (NULL: the schedule stops
        until it is registered with another spec or its record is changed).
        """
        scheduled = ctx.scheduled_at
        if ctx.triggered:
            # The store keeps next_run_at for a triggered run and ignores this one; the
            # record's is sent so that the patch says what happens.
            return kept
        try:
            if task.kind == "once" or catch_up != "all":
                return task.next_run_at(scheduled, now, catch_up, self.catch_up_limit)
            last = self._backlogs.pop(task.id, None)
            upcoming, backlog = await asyncio.get_running_loop().run_in_executor(
                None, _catch_up.advance, task.occurrences(scheduled), last, scheduled, now,
                self.catch_up_limit)
            self._backlogs[task.id] = backlog
            return upcoming
        except (InvalidArgument, OverflowError, ValueError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        try:
            fallback = task.next_run_at(scheduled, now, "once", self.catch_up_limit)
        except (InvalidArgument, OverflowError, ValueError) as exc:
            log.error("%s: %s token %d (scheduled %s): no next occurrence can be computed "
                      "(%s; then %s: %s): next_run_at cleared", self._host.owner, task.id,
                      ctx.fencing_token, scheduled, problem, type(exc).__name__, exc)
            return None
        log.error("%s: %s token %d (scheduled %s): catch_up %s cannot compute the next "
                  "occurrence (%s); going on by the once rule: next run at %s", self._host.owner,
                  task.id, ctx.fencing_token, scheduled, catch_up, problem, fallback)
        return fallback

    def _completed(
        self, ctx: RunContext, outcome: Literal["completed", "rejected", "failed"],
        attempts: int, status: LastStatus, next_run_at: int | None,
    ) -> None:
        self._host.emit(Complete(runtime="scheduler", owner=self._host.owner, subject=ctx.task_id,
                           token=ctx.fencing_token, outcome=outcome, attempts=attempts,
                           status=status, next_run_at=next_run_at))

