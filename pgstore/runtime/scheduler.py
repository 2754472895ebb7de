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
  the event loop (``pgstore.runtime.complete``); one that cannot be computed (before year 1,
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

Schedule controls (docs/schedule-controls.md): ``pause``/``resume`` stop and restart
the claims of a schedule (resumed, the occurrences missed meanwhile meet its catch-up
policy, as after downtime); ``trigger`` asks for one run now, which the next claim takes
(``ctx.triggered``) and whose completion keeps ``next_run_at``; ``jitter=`` on ``cron``
and ``every`` delays each occurrence by a deterministic amount in ``[0, jitter)``, the
handler still seeing the nominal ``scheduled_at`` and skip's lateness counted from the
jittered due time.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, Literal, TypeVar, overload

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.models import (
    CATCH_UPS,
    MAX_JITTER_MS,
    CatchUp,
    ClaimResult,
    ScheduleKind,
    ScheduleRecord,
)
from pgstore.protocols import AsyncScheduleStore, ScheduleStore
from pgstore.runtime import catch_up as _catch_up
from pgstore.runtime import tracing
from pgstore.runtime.base import Clock, Runtime, default_owner, is_async_callable
from pgstore.runtime.complete import Completer
from pgstore.runtime.events import (
    Claim,
    HandlerRun,
    LeaseLost,
    Registered,
    Subscriber,
)
from pgstore.runtime.keeper import Ending, keep_lease, reported
from pgstore.runtime.occurrences import (
    CronSpec,
    cron_spec,
)
from pgstore.runtime.stores import as_async_schedule_store
from pgstore.runtime.tasks import Handler, RunContext, Task, milliseconds

__all__ = ["RunContext", "Scheduler", "Task"]

log = logging.getLogger("pgstore.scheduler")

H = TypeVar("H", bound=Handler)

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
        self._completer = Completer(schedules, self, self.catch_up_limit)
        self._register = schedules.register
        self._claim_next = schedules.claim_next
        self._renew = schedules.renew
        self._schedules = schedules

    # --- declaring tasks -----------------------------------------------------------

    @overload
    def cron(
        self, id: str, expr: str, *, tz: str = ..., catch_up: CatchUp = ...,
        jitter: int | timedelta = ...,
    ) -> Callable[[H], H]: ...
    @overload
    def cron(
        self, id: str, expr: str, handler: H, *, tz: str = ..., catch_up: CatchUp = ...,
        jitter: int | timedelta = ...,
    ) -> H: ...

    def cron(
        self,
        id: str,
        expr: str,
        handler: Handler | None = None,
        *,
        tz: str = "UTC",
        catch_up: CatchUp = "once",
        jitter: int | timedelta = 0,
    ) -> Any:
        """Run ``handler`` at each occurrence of ``expr`` on ``tz``'s wall clock.

        Stored as ``expr``, or ``TZ=<zone> <expr>`` for a zone other than UTC.
        ``catch_up`` (``skip``, ``once`` or ``all``) is what happens to the occurrences
        missed while no scheduler ran (docs/catch-up.md). ``jitter`` (ms, or a
        timedelta; 0 to a day, default 0) delays each occurrence by a deterministic
        amount in ``[0, jitter)`` (docs/schedule-controls.md); keep it below the gap
        between occurrences.
        """
        spec = cron_spec(expr, tz)
        return self._declare(id, "cron", spec.stored(), handler, catch_up, cron=spec,
                             jitter_ms=_jitter_ms(jitter))

    @overload
    def every(
        self, id: str, interval: int | timedelta, *, catch_up: CatchUp = ...,
        jitter: int | timedelta = ...,
    ) -> Callable[[H], H]: ...
    @overload
    def every(
        self, id: str, interval: int | timedelta, handler: H, *, catch_up: CatchUp = ...,
        jitter: int | timedelta = ...,
    ) -> H: ...

    def every(
        self,
        id: str,
        interval: int | timedelta,
        handler: Handler | None = None,
        *,
        catch_up: CatchUp = "once",
        jitter: int | timedelta = 0,
    ) -> Any:
        """Run ``handler`` every ``interval`` (ms, or a timedelta) at a fixed rate; the first
        run is one interval after the task is first registered. ``catch_up`` as for
        ``cron``; ``jitter`` too, and it must be less than ``interval``."""
        period = milliseconds("interval", interval)
        jitter_ms = _jitter_ms(jitter)
        if jitter_ms >= period:
            raise InvalidArgument("jitter must be less than the interval")
        return self._declare(id, "interval", str(period), handler, catch_up, period_ms=period,
                             jitter_ms=jitter_ms)

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
        period = milliseconds("delay", delay)
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
        jitter_ms: int = 0,
    ) -> Any:
        v.name("id", id)
        catch_up = v.one_of("catch_up", catch_up, CATCH_UPS)
        if id in self.tasks:
            raise InvalidArgument(f"task {id!r} is declared twice")

        def declare(fn: H) -> H:
            if not callable(fn):
                raise InvalidArgument(f"handler of task {id!r} must be callable")
            self.tasks[id] = Task(
                id, kind, spec, fn, cron=cron, period_ms=period_ms, catch_up=catch_up,
                jitter_ms=jitter_ms,
            )
            return fn

        return declare if handler is None else declare(handler)

    # --- schedule controls -----------------------------------------------------------

    async def pause(self, id: str) -> ScheduleRecord | None:
        """Pause schedule ``id`` (any scheduler's): no scheduler claims it until ``resume``;
        a run in progress finishes. The record, or None for an unknown id."""
        return await self._schedules.pause(id, await self.now())

    async def resume(self, id: str) -> ScheduleRecord | None:
        """Resume schedule ``id``: the occurrences missed while paused meet its catch-up
        policy, as after downtime (docs/schedule-controls.md). The record, or None."""
        record = await self._schedules.resume(id, await self.now())
        self.wake()
        return record

    async def trigger(self, id: str) -> ScheduleRecord | None:
        """Run schedule ``id`` once now, out of turn, without moving its next occurrence:
        the next claim (this scheduler's, woken, or another's that declares ``id``) runs
        it with a fresh fencing token. The record, or None when refused: unknown, paused,
        or a run in progress (a live lease)."""
        record = await self._schedules.trigger(id, await self.now())
        if record is not None:
            self.wake()
        return record

    # --- the runtime -----------------------------------------------------------------

    async def _prepare(self) -> None:
        await super()._prepare()
        now = await self.now()
        for task in self.tasks.values():
            record = await self._register(
                task.id, task.kind, task.spec, task.first_run_at(now), now, task.catch_up,
                task.jitter_ms,
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
                            due_at=_claimable_since(claim.record),
                            lease_until=claim.record.lease_until))
        return [self._run(claim, now, anchor) for claim in claims]

    async def _run(self, claim: ClaimResult, claimed_at: int, anchor: float) -> None:
        task = self.tasks[claim.record.id]
        record = claim.record
        triggered = record.triggered_at is not None
        # A triggered run's time is when it was asked for; a regular one's, its nominal
        # occurrence (the jitter only delays when it may be claimed).
        scheduled = record.triggered_at if triggered else record.next_run_at
        assert scheduled is not None  # the claims only take due or triggered records
        ctx = RunContext(task.id, claim.fencing_token, scheduled, claimed_at, self.owner,
                         triggered=triggered)
        catch_up = record.catch_up
        # Lateness counts from when the occurrence became due (its jittered time); a
        # triggered run is asked for by hand and always runs.
        due = record.due_at if record.due_at is not None else scheduled
        if not triggered and not _catch_up.runs(catch_up, due, claimed_at,
                                                self.catch_up_grace_ms):
            log.info("%s: %s token %d (scheduled %s) claimed %d ms late: skipped (catch_up "
                     "skip)", self.owner, task.id, ctx.fencing_token, scheduled,
                     claimed_at - scheduled)
            await self._completer.finish(task, ctx, "skipped", catch_up)
            return
        started = time.monotonic()
        # The keeper renews from the claim until the complete has an answer: through the
        # handler and through the next occurrence's computation (seconds, for a backlog
        # of 10,000 under catch-up all), so the lease cannot expire in between.
        keeper: asyncio.Future[None] | None = None
        ending = Ending()  # the complete sent: a renew refused from then on was overtaken
        try:
            with tracing.span("pgstore.schedule.run", {
                "pgstore.owner": self.owner, "pgstore.task_id": task.id,
                "pgstore.fencing_token": ctx.fencing_token, "pgstore.scheduled_at": scheduled,
            }) as span:
                # In the span's context: the handler's own spans are its children.
                work = asyncio.ensure_future(self._call_handler(task, ctx))
                keeper = asyncio.ensure_future(self._keeper(ctx, work, anchor, ending))
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
            await self._completer.finish(task, ctx, status, catch_up, record.next_run_at,
                                         ending)
        finally:
            if keeper is not None:
                keeper.cancel()

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
        self, ctx: RunContext, work: asyncio.Future[None], anchor: float, ending: Ending
    ) -> Coroutine[Any, Any, None]:
        """The shared keeper for one run: on a lost lease, tell the handler; once the
        complete is sent (``ending``), a refused renew was overtaken by it."""

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
                     subject=ctx.task_id, token=ctx.fencing_token, ending=ending),
            lease_ms=self.lease_ms, anchor=anchor,
            what=f"{ctx.task_id} token {ctx.fencing_token}", owner=self.owner, log=log,
            on_lost=lost)


def _claimable_since(record: ScheduleRecord) -> int | None:
    """When a claimed record became claimable: a trigger's time, else its jittered due
    time (the claim's lateness counts from it, not from the nominal occurrence)."""
    if record.triggered_at is not None:
        return record.triggered_at
    return record.due_at if record.due_at is not None else record.next_run_at


def _jitter_ms(jitter: int | timedelta) -> int:
    if isinstance(jitter, timedelta):
        jitter = int(jitter.total_seconds() * 1000)
    if isinstance(jitter, bool) or not isinstance(jitter, int) or not (
        0 <= jitter <= MAX_JITTER_MS
    ):
        raise InvalidArgument(f"jitter must be from 0 to {MAX_JITTER_MS} ms (a day)")
    return jitter


def _takes_context(fn: Handler) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    )
