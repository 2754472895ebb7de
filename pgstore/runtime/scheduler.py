"""``Scheduler``: runs declared cron / interval / one-shot tasks over a schedule store.

Start the same scheduler on many hosts: each occurrence runs once, on one
host. The store's claim is the only coordination:

* ``start()`` registers every declared task. A restart with the same
  expression keeps its ``next_run_at``; a changed one takes effect. Records
  of tasks this process does not declare (orphans) are never run or changed.
* The loop claims due occurrences of its own tasks (``claim_next`` with its
  task ids), up to its free concurrency, and runs each handler. While it runs,
  and until its complete has an answer, the lease is renewed every third of
  ``lease_ms``; a renew that raises (or whose clock read raises) is logged and
  retried. When a renew is refused, or
  renews keep failing until 80% of ``lease_ms`` has passed (local monotonic
  clock) since the last successful renew or the claim, the lease is lost
  (another host may be running the occurrence, or soon may): the handler is
  told (asyncio cancellation for ``async def`` handlers, ``ctx.lease_lost``
  for plain ones) and the run is not completed.
* Otherwise the run is completed with ``last_status`` ``ok`` (or ``error`` when
  the handler raised) and the next occurrence. A rejected complete is logged
  as a stale claim and never retried; nor is one refused for a bad argument.
  Under ``all`` the next occurrence is computed in a worker thread, not in
  the event loop (``_upcoming``); one that cannot be computed (before year 1,
  after 9999) is logged as an error and the schedule goes on by the ``once``
  rule: one completion, never a rerun at each lease expiry.

Next occurrences: cron through ``pgstore.runtime.occurrences`` in the task's zone;
intervals at a fixed rate from the first scheduled time (grid points: no drift);
a one-shot task leaves a tombstone (``next_run_at`` NULL). What happens to the
occurrences missed while no scheduler ran is the schedule's ``catch_up`` policy,
read from the claimed record and applied by ``pgstore.runtime.catch_up``: ``skip``
(a missed occurrence, one claimed more than ``catch_up_grace_ms`` late, is
completed as ``skipped`` without running; then the future), ``once`` (the
default: one run, then the future) or ``all`` (each missed occurrence, oldest
first, at most ``catch_up_limit`` of them). A run in progress is never
overlapped: its lease is held, so nothing claims the schedule until it completes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypeVar, overload

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.models import (
    CATCH_UPS,
    CatchUp,
    ClaimResult,
    CompletePatch,
    LastStatus,
    ScheduleKind,
)
from pgstore.protocols import AsyncScheduleStore, ScheduleStore
from pgstore.runtime import catch_up as _catch_up
from pgstore.runtime import tracing
from pgstore.runtime.base import Clock, Runtime, default_owner, is_async_callable
from pgstore.runtime.events import (
    Claim,
    Complete,
    HandlerRun,
    LeaseLost,
    Refused,
    Registered,
    Subscriber,
)
from pgstore.runtime.keeper import keep_lease, reported
from pgstore.runtime.occurrences import (
    CronSpec,
    cron_between,
    cron_spec,
    interval_between,
    next_cron,
    next_interval,
)
from pgstore.runtime.stores import as_async_schedule_store
from pgstore.runtime.transient import is_permanent

__all__ = ["RunContext", "Scheduler", "Task"]

log = logging.getLogger("pgstore.scheduler")

#: Tries of a complete that fails (a lost connection) before the lease is left to expire.
COMPLETE_ATTEMPTS = 5

#: A task handler: ``handler()`` or ``handler(ctx)``, plain or ``async def``.
Handler = Callable[..., Any]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True)
class RunContext:
    """What a handler knows about its run.

    ``lease_lost`` is set when a renew failed: the occurrence may be running
    elsewhere, and this run will not be completed; a plain handler should
    check it and stop early (an ``async def`` handler is cancelled instead).
    """

    task_id: str
    fencing_token: int
    scheduled_at: int
    started_at: int
    owner: str
    lease_lost: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Task:
    """A declared task: its stored kind and spec, and how its occurrences follow."""

    id: str
    kind: ScheduleKind
    spec: str
    handler: Handler
    cron: CronSpec | None = None
    period_ms: int | None = None  # the interval, or the one-shot delay
    catch_up: CatchUp = "once"  # registered with the record; the record's is applied

    def first_run_at(self, now: int) -> int:
        """``next_run_at`` for a new (or changed) record registered at ``now``."""
        if self.cron is not None:
            return next_cron(self.cron, now)
        assert self.period_ms is not None
        return v.add(now, self.period_ms)

    def next_run_at(
        self,
        scheduled_at: int,
        now: int,
        catch_up: CatchUp = "once",
        limit: int = _catch_up.DEFAULT_LIMIT,
    ) -> int | None:
        """The occurrence after the one scheduled at ``scheduled_at``, completed at ``now``
        under the ``catch_up`` policy (``pgstore.runtime.catch_up``)."""
        if self.kind == "once":
            return None
        occurrences = self.occurrences(scheduled_at)
        return _catch_up.next_after(catch_up, occurrences, scheduled_at, now, limit)

    def occurrences(self, scheduled_at: int) -> _catch_up.Occurrences:
        """The occurrences from ``scheduled_at`` on: the cron expression's, or the
        interval's grid through ``scheduled_at``."""
        cron, period = self.cron, self.period_ms
        if cron is not None:
            return _catch_up.Occurrences(
                lambda after: next_cron(cron, after),
                lambda after, until: cron_between(cron, after, until),
            )
        assert period is not None
        return _catch_up.Occurrences(
            lambda after: next_interval(scheduled_at, period, after),
            lambda after, until: interval_between(scheduled_at, period, after, until),
        )


def _milliseconds(param: str, value: object) -> int:
    if isinstance(value, timedelta):
        value = int(value.total_seconds() * 1000)
    return v.positive(param, value)


class Scheduler(Runtime):
    """Runs declared tasks over any schedule store (memory, sync or asyncio PostgreSQL).

    ``owner`` names this process in leases (default ``scheduler@host:pid``).
    ``clock`` (epoch ms) defaults to the store's clock. ``poll_interval`` and
    ``grace_period`` are seconds. ``on_event`` is called with each event
    (``pgstore.runtime.events``; more with ``subscribe``). ``catch_up_limit`` (1 to
    10,000, default 100) is how many missed occurrences a schedule with
    ``catch_up="all"`` runs at most; ``catch_up_grace_ms`` is how late an occurrence
    may be claimed before a schedule with ``catch_up="skip"`` counts it as missed
    (default 60 s, or three poll intervals when that is longer).
    """

    log = log
    kind = "scheduler"

    def __init__(
        self,
        store: ScheduleStore | AsyncScheduleStore,
        *,
        owner: str | None = None,
        lease_ms: int = 30_000,
        concurrency: int = 4,
        poll_interval: float = 1.0,
        grace_period: float = 10.0,
        clock: Clock | None = None,
        on_event: Subscriber | None = None,
        catch_up_limit: int = _catch_up.DEFAULT_LIMIT,
        catch_up_grace_ms: int | None = None,
    ) -> None:
        schedules = as_async_schedule_store(store)
        super().__init__(
            store,
            schedules,
            owner=owner or default_owner("scheduler"),
            lease_ms=lease_ms,
            concurrency=concurrency,
            poll_interval=poll_interval,
            grace_period=grace_period,
            clock=clock,
            on_event=on_event,
        )
        self.catch_up_limit = v.positive(
            "catch_up_limit", catch_up_limit, maximum=_catch_up.MAX_LIMIT
        )
        if catch_up_grace_ms is None:
            catch_up_grace_ms = max(
                _catch_up.DEFAULT_GRACE_MS, int(3_000 * self.poll_interval)
            )
        self.catch_up_grace_ms = v.positive("catch_up_grace_ms", catch_up_grace_ms)
        self.tasks: dict[str, Task] = {}
        #: Under catch_up ``all``: what the last completion of each task found due.
        self._backlogs: dict[str, _catch_up.Backlog] = {}
        self._register = schedules.register
        self._claim_next = schedules.claim_next
        self._renew = schedules.renew
        self._complete = schedules.complete

    # --- declaring tasks -----------------------------------------------------------

    @overload
    def cron(
        self, id: str, expr: str, *, tz: str = ..., catch_up: CatchUp = ...
    ) -> Callable[[H], H]: ...
    @overload
    def cron(
        self, id: str, expr: str, handler: H, *, tz: str = ..., catch_up: CatchUp = ...
    ) -> H: ...

    def cron(
        self,
        id: str,
        expr: str,
        handler: Handler | None = None,
        *,
        tz: str = "UTC",
        catch_up: CatchUp = "once",
    ) -> Any:
        """Run ``handler`` at each occurrence of ``expr`` on ``tz``'s wall clock.

        Stored as ``expr``, or ``TZ=<zone> <expr>`` for a zone other than UTC.
        ``catch_up`` (``skip``, ``once`` or ``all``) is what happens to the occurrences
        missed while no scheduler ran (docs/catch-up.md).
        """
        spec = cron_spec(expr, tz)
        return self._declare(id, "cron", spec.stored(), handler, catch_up, cron=spec)

    @overload
    def every(
        self, id: str, interval: int | timedelta, *, catch_up: CatchUp = ...
    ) -> Callable[[H], H]: ...
    @overload
    def every(
        self, id: str, interval: int | timedelta, handler: H, *, catch_up: CatchUp = ...
    ) -> H: ...

    def every(
        self,
        id: str,
        interval: int | timedelta,
        handler: Handler | None = None,
        *,
        catch_up: CatchUp = "once",
    ) -> Any:
        """Run ``handler`` every ``interval`` (ms, or a timedelta) at a fixed rate; the first
        run is one interval after the task is first registered. ``catch_up`` as for
        ``cron``."""
        period = _milliseconds("interval", interval)
        return self._declare(id, "interval", str(period), handler, catch_up, period_ms=period)

    @overload
    def once(
        self, id: str, delay: int | timedelta, *, catch_up: CatchUp = ...
    ) -> Callable[[H], H]: ...
    @overload
    def once(
        self, id: str, delay: int | timedelta, handler: H, *, catch_up: CatchUp = ...
    ) -> H: ...

    def once(
        self,
        id: str,
        delay: int | timedelta,
        handler: Handler | None = None,
        *,
        catch_up: CatchUp = "once",
    ) -> Any:
        """Run ``handler`` once, ``delay`` (ms, or a timedelta) after the task is first
        registered; afterwards the record is a tombstone and restarts do not run it again.
        ``catch_up="skip"`` leaves the tombstone without running it when it is claimed
        more than ``catch_up_grace_ms`` late; ``all`` is refused (one occurrence: it
        would be ``once``)."""
        period = _milliseconds("delay", delay)
        if catch_up == "all":
            raise InvalidArgument(
                "catch_up of a one-shot task must be skip or once: it has one occurrence"
            )
        return self._declare(id, "once", str(period), handler, catch_up, period_ms=period)

    def _declare(
        self,
        id: str,
        kind: ScheduleKind,
        spec: str,
        handler: Handler | None,
        catch_up: CatchUp,
        *,
        cron: CronSpec | None = None,
        period_ms: int | None = None,
    ) -> Any:
        v.name("id", id)
        catch_up = v.one_of("catch_up", catch_up, CATCH_UPS)
        if id in self.tasks:
            raise InvalidArgument(f"task {id!r} is declared twice")

        def declare(fn: H) -> H:
            if not callable(fn):
                raise InvalidArgument(f"handler of task {id!r} must be callable")
            self.tasks[id] = Task(
                id, kind, spec, fn, cron=cron, period_ms=period_ms, catch_up=catch_up
            )
            return fn

        return declare if handler is None else declare(handler)

    # --- the runtime -----------------------------------------------------------------

    async def _prepare(self) -> None:
        await super()._prepare()
        now = await self.now()
        for task in self.tasks.values():
            record = await self._register(
                task.id, task.kind, task.spec, task.first_run_at(now), now, task.catch_up
            )
            log.info("%s: registered %s (%s %s, catch_up %s), next run at %s", self.owner,
                     task.id, task.kind, task.spec, record.catch_up, record.next_run_at)
            self.emit(Registered(runtime="scheduler", owner=self.owner, task_id=task.id,
                                 kind=task.kind, spec=task.spec,
                                 next_run_at=record.next_run_at))

    async def _claim(self, free: int) -> list[Any]:
        if not self.tasks:
            return []
        anchor = time.monotonic()  # the lease runs from no earlier than this
        now = await self.now()
        claims: list[ClaimResult] = await self._claim_next(
            self.owner, now, self.lease_ms, free, list(self.tasks)
        )
        for claim in claims:
            log.info("%s: claimed %s token %d (scheduled %s)", self.owner, claim.record.id,
                     claim.fencing_token, claim.record.next_run_at)
            self.emit(Claim(runtime="scheduler", owner=self.owner, outcome="claimed", now=now,
                            subject=claim.record.id, token=claim.fencing_token,
                            due_at=claim.record.next_run_at,
                            lease_until=claim.record.lease_until))
        return [self._run(claim, now, anchor) for claim in claims]

    async def _run(self, claim: ClaimResult, claimed_at: int, anchor: float) -> None:
        task = self.tasks[claim.record.id]
        scheduled = claim.record.next_run_at
        assert scheduled is not None  # claim_due only claims due records
        ctx = RunContext(task.id, claim.fencing_token, scheduled, claimed_at, self.owner)
        catch_up = claim.record.catch_up
        if not _catch_up.runs(catch_up, scheduled, claimed_at, self.catch_up_grace_ms):
            log.info("%s: %s token %d (scheduled %s) claimed %d ms late: skipped (catch_up "
                     "skip)", self.owner, task.id, ctx.fencing_token, scheduled,
                     claimed_at - scheduled)
            await self._finish(task, ctx, "skipped", catch_up)
            return
        started = time.monotonic()
        # The keeper renews from the claim until the complete has an answer: through the
        # handler and through the next occurrence's computation (seconds, for a backlog
        # of 10,000 under catch-up all), so the lease cannot expire in between.
        keeper: asyncio.Future[None] | None = None
        try:
            with tracing.span("pgstore.schedule.run", {
                "pgstore.owner": self.owner, "pgstore.task_id": task.id,
                "pgstore.fencing_token": ctx.fencing_token, "pgstore.scheduled_at": scheduled,
            }) as span:
                # In the span's context: the handler's own spans are its children.
                work = asyncio.ensure_future(self._call_handler(task, ctx))
                keeper = asyncio.ensure_future(self._keeper(ctx, work, anchor))
                status = await self._run_handler(task, ctx, work)
                tracing.finish(span, "lease_lost" if ctx.lease_lost.is_set() else status)
            if ctx.lease_lost.is_set():
                log.warning("%s: %s token %d lost its lease; not completing", self.owner,
                            task.id, ctx.fencing_token)
                return
            if self.abandoned:
                log.warning("%s: %s token %d finished after the grace period; not "
                            "completing", self.owner, task.id, ctx.fencing_token)
                return
            log.info("%s: ran %s token %d in %.3fs (%s)", self.owner, task.id,
                     ctx.fencing_token, time.monotonic() - started, status)
            await self._finish(task, ctx, status, catch_up)
        finally:
            if keeper is not None:
                keeper.cancel()

    async def _finish(
        self, task: Task, ctx: RunContext, status: LastStatus, catch_up: CatchUp
    ) -> None:
        """Complete the claim with ``status`` and the next occurrence under ``catch_up``."""
        # complete cannot commit twice (a spent claim answers False), so a failed one
        # (a lost connection) is retried rather than left to the lease's expiry, which
        # would run the occurrence again.
        # A refusal for a bad argument is never retried: it would be refused again.
        for attempt in range(1, COMPLETE_ATTEMPTS + 1):
            try:
                now = await self.now()
                upcoming = await self._upcoming(task, ctx, now, catch_up)
                patch = CompletePatch(upcoming, ctx.started_at, status)
                completed = await self._complete(task.id, ctx.fencing_token, patch, now)
                break
            except Exception as exc:
                if is_permanent(exc):
                    log.error("%s: complete of %s token %d refused: %s: %s; not retried, "
                              "the lease will expire", self.owner, task.id,
                              ctx.fencing_token, type(exc).__name__, exc)
                    self._completed(ctx, "failed", attempt, status, None)
                    return
                log.exception("%s: complete of %s token %d failed (attempt %d of %d)",
                              self.owner, task.id, ctx.fencing_token, attempt,
                              COMPLETE_ATTEMPTS)
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
        else:
            log.error("%s: %s token %d %s but was not completed; the lease will expire "
                      "and it may run again", self.owner, task.id, ctx.fencing_token,
                      "was skipped" if status == "skipped" else "ran")
            self._completed(ctx, "failed", COMPLETE_ATTEMPTS, status, None)
            return
        self._completed(ctx, "completed" if completed else "rejected", attempt, status,
                        patch.next_run_at)
        if completed:
            log.info("%s: completed %s token %d %s, next run at %s", self.owner, task.id,
                     ctx.fencing_token, status, patch.next_run_at)
        elif attempt > 1:
            log.warning("%s: complete of %s token %d answered False after a failed attempt: "
                        "that attempt committed, or the claim went stale", self.owner,
                        task.id, ctx.fencing_token)
        else:
            log.warning("%s: complete of %s token %d rejected: stale claim", self.owner,
                        task.id, ctx.fencing_token)
            self.emit(Refused(runtime="scheduler", owner=self.owner, operation="complete",
                              subject=task.id, token=ctx.fencing_token))

    async def _upcoming(
        self, task: Task, ctx: RunContext, now: int, catch_up: CatchUp
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
                      "(%s; then %s: %s): next_run_at cleared", self.owner, task.id,
                      ctx.fencing_token, scheduled, problem, type(exc).__name__, exc)
            return None
        log.error("%s: %s token %d (scheduled %s): catch_up %s cannot compute the next "
                  "occurrence (%s); going on by the once rule: next run at %s", self.owner,
                  task.id, ctx.fencing_token, scheduled, catch_up, problem, fallback)
        return fallback

    def _completed(
        self, ctx: RunContext, outcome: Literal["completed", "rejected", "failed"],
        attempts: int, status: LastStatus, next_run_at: int | None,
    ) -> None:
        self.emit(Complete(runtime="scheduler", owner=self.owner, subject=ctx.task_id,
                           token=ctx.fencing_token, outcome=outcome, attempts=attempts,
                           status=status, next_run_at=next_run_at))

    async def _run_handler(
        self, task: Task, ctx: RunContext, work: asyncio.Future[None]
    ) -> Literal["ok", "error"]:
        """Wait for the handler (``work``, under its keeper); ``error`` when it raised,
        else ``ok``."""
        status: Literal["ok", "error"] = "ok"
        started = time.monotonic()

        def ran(outcome: Literal["ok", "error", "lease_lost", "abandoned"]) -> None:
            self.emit(HandlerRun(runtime="scheduler", owner=self.owner, subject=task.id,
                                 token=ctx.fencing_token, outcome=outcome,
                                 duration_s=time.monotonic() - started))

        try:
            await work
        except asyncio.CancelledError:
            # The keeper cancels an async handler whose lease was lost; any other
            # cancellation is the runtime abandoning its work: let it through.
            if not (ctx.lease_lost.is_set() and work.cancelled()):
                log.warning("%s: %s token %d abandoned at stop; its lease will expire",
                            self.owner, task.id, ctx.fencing_token)
                ran("abandoned")
                raise
        except Exception:
            status = "error"
            log.exception("%s: %s token %d raised", self.owner, task.id, ctx.fencing_token)
        ran("lease_lost" if ctx.lease_lost.is_set() else status)
        return status

    async def _call_handler(self, task: Task, ctx: RunContext) -> None:
        if _takes_context(task.handler):
            await self.call_user(task.handler, ctx)
        else:
            await self.call_user(task.handler)

    def _keeper(
        self, ctx: RunContext, work: asyncio.Future[None], anchor: float
    ) -> Coroutine[Any, Any, None]:
        """The shared keeper for one run: on a lost lease, tell the handler."""

        async def renew() -> bool:
            now = await self.now()
            return bool(await self._renew(ctx.task_id, ctx.fencing_token, now + self.lease_ms))

        def lost(reason: Literal["refused", "expired"]) -> None:
            self.emit(LeaseLost(runtime="scheduler", owner=self.owner, subject=ctx.task_id,
                                token=ctx.fencing_token, reason=reason))
            ctx.lease_lost.set()
            cancel = is_async_callable(self.tasks[ctx.task_id].handler)
            log.warning("%s: %s token %d lease lost (%s); %s", self.owner, ctx.task_id,
                        ctx.fencing_token, reason,
                        "cancelling the handler" if cancel else "ctx.lease_lost set")
            if cancel:
                work.cancel()

        return keep_lease(
            reported(renew, self.emit, runtime="scheduler", owner=self.owner,
                     subject=ctx.task_id, token=ctx.fencing_token),
            lease_ms=self.lease_ms, anchor=anchor,
            what=f"{ctx.task_id} token {ctx.fencing_token}", owner=self.owner, log=log,
            on_lost=lost)


def _takes_context(fn: Handler) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    )
