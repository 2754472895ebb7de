"""``Dispatcher``: sends each due job once, over a job store, and never leaves a bot
in a cancelled meeting.

For each leased job the dispatcher calls the user's ``dispatch(job)``, which
sends the bot and returns its worker id (or None). Then ``mark_dispatched``:
when the answer is ``cancelled`` (a cancel arrived meanwhile) or not
``recorded`` (the lease was lost and another holder took the job), the user's
``recall(job, worker_id)`` is called so the bot leaves at once. When
``dispatch`` raises, the job is released, with the error's text (through
``redact_error``, ``pgstore.runtime.redact``), for a retry at
a time given by ``backoff`` for the job's **stored** attempt count (the lease
counted it: a restarted dispatcher continues from it, it does not start over).
The release of a job's last attempt (``attempts >= max_attempts``) fails the job
for good instead; ``retry`` (``pgstore retry RUN_ID``) revives it.

The lease is renewed every third of ``ttl_ms`` (by the keeper the Scheduler
uses too) from the lease until the mark has an answer: through ``dispatch``
and through the retries of a failed ``mark_dispatched``. That call is safe to
repeat for the same holder, so a failed one (a lost connection, a server
outage) is retried for up to ``mark_timeout`` seconds; when no attempt has
answered by then, the bot is recalled (it may be sent again once the lease
expires, and must not stay twice). ``release`` is not retried (the lease
expires instead). A refusal for a bad argument (``InvalidArgument``, 22023) is
never retried: it changed nothing and would be refused again. The worker id
``dispatch`` returned is checked (``pgstore._validate.worker_id``, the SQL's
rule: at most 1024 characters, no NUL) before its mark is sent, alone or in a
batch; a bad one, or any mark refused with ``InvalidArgument``, is handled the
same on both paths: the bot is recalled (``Recall`` reason ``unrecorded``,
``Complete`` outcome ``failed``) and the job released with the refusal's text
like a dispatch that raised (a retry at its backoff, or failed for good on its
last attempt). A batch refused as a whole is split until only the bad job gets
the refusal, so the others are marked once and never recalled.

The ``Job`` handed to ``dispatch`` carries its ``lease_sequence``, which grows
with every lease of the job and never goes backwards, even across a failover:
``(job.run_id, job.lease_sequence)`` is an idempotency key for the provider
call. The dispatcher fences its renew, mark_dispatched and release with it, so
a lease lost in a failover cannot record a dispatch made under the next one.

Retention (off by default): with ``purge_after`` (a ``timedelta``, or ms), the
dispatcher deletes the jobs that finished (dispatched, or cancelled) more than
that long ago, through the store's ``purge`` (``job_purge``): a round at start
and then every ``purge_interval`` seconds, in calls of ``purge_batch`` jobs
(one transaction each) until a call deletes fewer. ``job_purge`` is the schema
owner's alone, so a store connected as the client role fails ``start()`` with
``NotPermitted`` (checked by a purge that can delete nothing). A failed round
is logged and retried at the next interval; it never stops the dispatching.

Wake-ups: with a PostgreSQL store, an idle dispatcher LISTENs on the store's
``job_channel()``, which ``job_schedule`` notifies at commit, so a job
scheduled due-now is leased within a fraction of a second while the poll
interval stays long. A notification is only a hint: leasing always goes
through ``job_lease`` (``job_lease_many``), and polling remains the fallback (a memory store, a
lost listening connection). Payloads that are not a dispatch time are ignored
(anyone who can connect can NOTIFY), and bursts are coalesced into a few
wake-ups; see ``_listen``.

Bursts (every bot of the 10:00 meetings due in the same second): the
dispatcher leases one job per call while idle (``lease``: a wake-up costs what
it always did) and, while every call comes back full, with ``lease_many``
twice as many with each call up to ``batch_size``; the first short answer
brings it back to one. Each leased job runs as its own asyncio task, at most
``concurrency`` at once, and waits for its own mark and renew answers, which
are sent together (``mark_dispatched_many``, ``renew_many``, see
``pgstore.runtime.batcher``; one alone goes as ``mark_dispatched`` or
``renew``): a burst pays one round trip and one commit for many jobs, and
every rule above holds per job as before. A job's keeper starts only when its
dispatch outlasts a third of the lease, so short dispatches cost no renew and
no keeper task.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pgstore import _validate as v
from pgstore.errors import InvalidArgument, NotPermitted
from pgstore.models import Job, MarkResult
from pgstore.postgres.listen import JobListener
from pgstore.protocols import AsyncJobStore, JobStore
from pgstore.runtime import tracing
from pgstore.runtime.base import (
    Clock,
    Runtime,
    default_owner,
    is_async_callable,
    positive_seconds,
)
from pgstore.runtime.batcher import Batcher
from pgstore.runtime.events import (
    Claim,
    Complete,
    ConnectionLost,
    Dispatch,
    HandlerRun,
    LeaseLost,
    Purge,
    Recall,
    Reconnected,
    Refused,
    Release,
    Renew,
    Subscriber,
)
from pgstore.runtime.keeper import LostReason, keep_lease
from pgstore.runtime.redact import RedactError, error_text, redact_secrets
from pgstore.runtime.stores import as_async_job_store
from pgstore.runtime.transient import is_permanent

__all__ = ["Backoff", "Dispatcher"]

log = logging.getLogger("pgstore.dispatcher")

#: ``dispatch(job) -> worker_id | None``, plain or ``async def``.
DispatchFn = Callable[[Job], Any]
#: ``recall(job, worker_id) -> None``, plain or ``async def``.
RecallFn = Callable[[Job, "str | None"], Any]

#: How long (seconds) a failing ``mark_dispatched`` is retried before the bot is recalled.
MARK_TIMEOUT = 300.0
#: The longest pause between two attempts of a failing ``mark_dispatched`` (seconds).
MARK_RETRY_MAX = 2.0
#: Retention defaults: a round every hour, 1000 jobs per ``job_purge`` call.
PURGE_INTERVAL = 3600.0
PURGE_BATCH = 1000
#: The most jobs one lease, mark or renew call carries unless ``batch_size`` says otherwise.
BATCH_SIZE = 500
#: How many mark (and, apart, renew) calls may be out at once; the rest wait and go
#: together in the next. With ``batch_size=1`` this is what bounds the marks: four at a
#: time, each one job, as the single-job path's runs did through a small pool.
CALLS_IN_FLIGHT = 4


@dataclass(frozen=True)
class Backoff:
    """Retry delays: ``base_ms * factor ** (attempt - 1)``, at most ``max_ms``, times a
    random factor in ``[1 - jitter, 1 + jitter]`` so failed jobs do not retry in step."""

    base_ms: int = 1_000
    factor: float = 2.0
    max_ms: int = 300_000
    jitter: float = 0.2
    random: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        v.positive("base_ms", self.base_ms)
        v.positive("max_ms", self.max_ms)
        if not self.factor >= 1:
            raise InvalidArgument("factor must be at least 1")
        if not 0 <= self.jitter < 1:
            raise InvalidArgument("jitter must be in [0, 1)")

    def delay_ms(self, attempt: int) -> int:
        """The delay before retry number ``attempt`` (1 for the first retry: the
        dispatcher passes the job's stored attempts, the failed lease included)."""
        exponent = max(attempt, 1) - 1
        raw = min(float(self.max_ms), self.base_ms * self.factor ** min(exponent, 64))
        spread = 1 + self.jitter * (2 * self.random() - 1)
        return max(1, int(raw * spread))


class Dispatcher(Runtime):
    """Leases due jobs and dispatches them, over any job store.

    ``holder`` names this process in leases (default ``dispatcher@host:pid``).
    ``clock`` (epoch ms) defaults to the store's clock. ``poll_interval`` and
    ``grace_period`` are seconds. ``mark_timeout`` (seconds, default 300) bounds the
    retries of a failing ``mark_dispatched``; past it the bot is recalled.
    ``listen=False`` turns wake-ups off; a conninfo string
    LISTENs there instead of on the store's database (behind PgBouncer in transaction
    mode, give it a direct connection to the server: LISTEN needs a session).
    ``on_event`` is called with each event (``pgstore.runtime.events``; more with
    ``subscribe``). ``purge_after`` (a ``timedelta`` or ms; None, the default: never)
    turns retention on, ``purge_interval`` (seconds, default an hour) and
    ``purge_batch`` (jobs per call, default 1000) shape it; see the module's doc.
    ``batch_size`` (default 500, at most 10000) caps the jobs one lease, mark or renew
    call carries; ``concurrency`` caps the dispatches running at once (for a burst of
    ``async def`` provider calls, hundreds). ``redact_error`` turns the exception a
    dispatch raised into the text the release stores as the job's ``last_error``
    (readable by whoever reads the jobs): by default ``redact_secrets`` (credential-like
    values such as ``api_key=...`` replaced by ``***``), None keeps it verbatim; see
    ``pgstore.runtime.redact``.
    """

    log = log
    kind = "dispatcher"

    def __init__(
        self,
        store: JobStore | AsyncJobStore,
        dispatch: DispatchFn,
        recall: RecallFn | None = None,
        *,
        holder: str | None = None,
        ttl_ms: int = 30_000,
        concurrency: int = 4,
        poll_interval: float = 1.0,
        grace_period: float = 10.0,
        backoff: Backoff | None = None,
        clock: Clock | None = None,
        listen: bool | str = True,
        mark_timeout: float = MARK_TIMEOUT,
        on_event: Subscriber | None = None,
        purge_after: timedelta | int | None = None,
        purge_interval: float = PURGE_INTERVAL,
        purge_batch: int = PURGE_BATCH,
        batch_size: int = BATCH_SIZE,
        redact_error: RedactError | None = redact_secrets,
    ) -> None:
        if not callable(dispatch):
            raise InvalidArgument("dispatch must be callable")
        if recall is not None and not callable(recall):
            raise InvalidArgument("recall must be callable")
        if redact_error is not None and not callable(redact_error):
            raise InvalidArgument("redact_error must be callable or None")
        jobs = as_async_job_store(store)
        super().__init__(
            store,
            jobs,
            owner=holder or default_owner("dispatcher"),
            lease_ms=ttl_ms,
            concurrency=concurrency,
            poll_interval=poll_interval,
            grace_period=grace_period,
            clock=clock,
            on_event=on_event,
        )
        self.dispatch = dispatch
        self.recall = recall
        self._dispatch_is_async = is_async_callable(dispatch)
        self.backoff = backoff or Backoff()
        #: The exception -> ``last_error`` text hook (None: verbatim); see ``redact``.
        self.redact_error = redact_error
        self.mark_timeout = positive_seconds("mark_timeout", mark_timeout)
        #: Retention: jobs finished this many ms ago are purged (None: never).
        self.purge_after_ms = _purge_after_ms(purge_after)
        self.purge_interval = positive_seconds("purge_interval", purge_interval)
        self.purge_batch = v.positive("purge_batch", purge_batch, maximum=v.INTEGER_MAX)
        self._purge = jobs.purge
        self._purger: asyncio.Task[None] | None = None
        self.batch_size = v.positive("batch_size", batch_size, maximum=v.BATCH_MAX)
        self._jobs = jobs
        self._release = jobs.release
        #: How many jobs the next lease call asks for: 1 when idle, doubling up to
        #: ``batch_size`` while the calls come back full.
        self._batch = 1
        # A batch refused as a whole for a bad argument (which changed nothing) is split
        # until the bad job alone gets the refusal: one bad job never costs the others.
        self._marks: Batcher[tuple[Job, str | None], MarkResult] = Batcher(
            self._mark_many, max_batch=self.batch_size, max_in_flight=CALLS_IN_FLIGHT,
            split=is_permanent)
        self._renews: Batcher[Job, bool] = Batcher(
            self._renew_many, max_batch=self.batch_size, max_in_flight=CALLS_IN_FLIGHT,
            split=is_permanent)
        #: Lease calls made (for the bench and the tests).
        self.lease_calls = 0
        self._listener: JobListener | None = None
        self._listen = listen
        self._listener_lost = False

    @property
    def holder(self) -> str:
        return self.owner

    async def _prepare(self) -> None:
        await super()._prepare()
        if self.purge_after_ms is not None and self._purger is None:
            await self._check_purge()
            self._purger = asyncio.get_running_loop().create_task(self._purging())
        if self._listen is not False and self._listener is None:
            self._listener = JobListener.for_store(
                self.store, self.wake, self.poll_interval, log, self.holder,
                conninfo=self._listen if isinstance(self._listen, str) else None,
                on_connection=self._listener_connection,
            )
            if self._listener is not None:
                self._listener.start()

    def _listener_connection(self, error: str | None) -> None:
        """The listener's news: listening (``None``), or its connection lost (why)."""
        if error is not None:
            self._listener_lost = True
            self.emit(ConnectionLost(runtime="dispatcher", owner=self.holder,
                                     component="listener", error=error))
        elif self._listener_lost:
            self._listener_lost = False
            self.emit(Reconnected(runtime="dispatcher", owner=self.holder,
                                  component="listener"))

    async def _check_purge(self) -> None:
        """Fail at start when the store may not purge: a purge of what finished before
        the epoch, which deletes nothing."""
        try:
            await self._purge(0, 1)
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != "42501":
                raise
            raise NotPermitted(
                f"{self.holder}: purge_after needs EXECUTE on job_purge, which only the "
                "schema's owner has (the client role does not): give this Dispatcher a "
                "store connected as the owner, or leave purge_after unset and run "
                f"`pgstore purge` as the owner ({type(exc).__name__}: {exc})"
            ) from None

    async def _purging(self) -> None:
        """A retention round now, then one every ``purge_interval`` s, until cancelled."""
        while True:
            await self.purge_round()
            await asyncio.sleep(self.purge_interval)

    async def purge_round(self) -> int:
        """One retention round: purge, ``purge_batch`` jobs per call, what finished more
        than ``purge_after`` before now, until a call deletes fewer (or stop); returns
        how many went. A failure is logged (and reported), never raised."""
        assert self.purge_after_ms is not None, "purge_after is not set"
        before: int | None = None
        deleted = batches = 0
        try:
            before = max(0, await self.now() - self.purge_after_ms)
            while not self.stopping:
                went = await self._purge(before, self.purge_batch)
                deleted += went
                batches += 1
                if went < self.purge_batch:
                    break
        except Exception as exc:
            log.warning("%s: purge of jobs finished before %s failed after %d deleted: "
                        "%s: %s; retrying in %gs", self.holder, before, deleted,
                        type(exc).__name__, exc, self.purge_interval)
            self.emit(Purge(runtime="dispatcher", owner=self.holder, before=before,
                            deleted=deleted, batches=batches, outcome="error",
                            error=f"{type(exc).__name__}: {exc}"))
            return deleted
        log.info("%s: purged %d jobs finished before %s (%d call(s))", self.holder, deleted,
                 before, batches)
        self.emit(Purge(runtime="dispatcher", owner=self.holder, before=before,
                        deleted=deleted, batches=batches, outcome="ok"))
        return deleted

    async def _shutdown(self) -> None:
        if self._purger is not None:
            self._purger.cancel()
            await asyncio.gather(self._purger, return_exceptions=True)
            self._purger = None
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await super()._shutdown()

    def _refill(self) -> int:
        """Full, it leases again once a batch's worth of slots is free (half of a
        ``concurrency`` smaller than two batches): a burst is leased in batches."""
        return max(1, min(self.batch_size, self.concurrency // 2))

    async def _claim(self, free: int) -> list[Any]:
        """Lease up to ``free`` jobs: calls of ``self._batch`` jobs, doubling while they
        come back full (up to ``batch_size``), until ``free`` are leased or an answer is
        short (then the next round starts again from one job)."""
        anchor = time.monotonic()  # every lease below runs from no earlier than this
        now = await self.now()
        keepers = _Keepers(self._keeper, anchor, self.lease_ms)
        pieces = []
        while free > 0:
            asked = min(free, self._batch)
            self.lease_calls += 1
            leased = await self._lease(now, asked)
            events = self._events.active
            for job in leased:
                log.info("%s: leased %s (due %s) until %s", self.holder, job.run_id,
                         job.dispatch_at, job.lease_until)
                if events:
                    self.emit(Claim(runtime="dispatcher", owner=self.holder,
                                    outcome="claimed", now=now, subject=job.run_id,
                                    token=job.lease_sequence, due_at=job.dispatch_at,
                                    lease_until=job.lease_until))
                pieces.append(self._run(job, now, keepers))
            if len(leased) < asked:
                self._batch = 1
                break
            free -= asked
            self._batch = min(self._batch * 2, self.batch_size)
        return pieces

    async def _lease(self, now: int, limit: int) -> list[Job]:
        """One ``lease_many`` of up to ``limit`` jobs; ``lease`` itself for one job."""
        if limit == 1:
            job = await self._jobs.lease(self.holder, now, self.lease_ms)
            return [] if job is None else [job]
        return await self._jobs.lease_many(self.holder, now, self.lease_ms, limit)

    async def _run(self, job: Job, leased_at: int, keepers: _Keepers) -> None:
        lateness_ms = leased_at - job.dispatch_at
        with tracing.span("pgstore.dispatch", {
            "pgstore.owner": self.holder, "pgstore.run_id": job.run_id,
            "pgstore.lease_sequence": job.lease_sequence,
            "pgstore.dispatch_at": job.dispatch_at, "pgstore.lateness_ms": lateness_ms,
        }) as span:
            if self._events.active:
                self.emit(Dispatch(runtime="dispatcher", owner=self.holder,
                                   subject=job.run_id, token=job.lease_sequence,
                                   dispatch_at=job.dispatch_at, now=leased_at,
                                   lateness_ms=lateness_ms))
            outcome = await self._dispatch_and_mark(job, keepers)
            tracing.finish(span, outcome)

    async def _dispatch_and_mark(self, job: Job, keepers: _Keepers) -> str:
        """Dispatch, mark, and recall when needed; what happened (``Complete``'s outcome,
        or ``released``)."""
        keepers.watch(job)
        started = time.monotonic()
        try:
            try:
                if self._dispatch_is_async:
                    result = await self.dispatch(job)
                else:
                    result = await self.call_user(self.dispatch, job)
            except asyncio.CancelledError:
                log.warning("%s: dispatch of %s abandoned at stop; its lease will expire",
                            self.holder, job.run_id)
                self._ran(job, "abandoned", started)
                raise
            except Exception as exc:
                self._ran(job, "error", started)
                keepers.done(job)
                await self._retry_later(job, exc)
                return "released"
            self._ran(job, "ok", started)
            worker_id = None if result is None else str(result)
            refused: InvalidArgument | None = None
            try:
                # The worker id is checked here, by the rule the SQL applies, before
                # the mark joins a batch: a bad one never reaches a batch call.
                v.worker_id("worker_id", worker_id)
                mark, attempts = await self._mark_dispatched(job, worker_id)
            except InvalidArgument as exc:
                refused, mark, attempts = exc, None, 1
        finally:
            keepers.done(job)
        if refused is not None:
            await self._mark_refused(job, worker_id, refused)
            return "released"
        reason: Literal["cancelled", "taken", "unrecorded"]
        if mark is None:
            self._completed(job, "failed", attempts, worker_id)
            why = f"not recorded within mark_timeout ({self.mark_timeout:g}s)"
            reason = "unrecorded"
        else:
            if mark.recorded and not mark.cancelled:
                self._completed(job, "completed", attempts, worker_id)
                log.info("%s: dispatched %s to %s", self.holder, job.run_id, worker_id)
                return "completed"
            if mark.recorded:
                self._completed(job, "cancelled", attempts, worker_id)
            else:
                self._completed(job, "rejected", attempts, worker_id)
                self.emit(Refused(runtime="dispatcher", owner=self.holder,
                                  operation="mark_dispatched", subject=job.run_id,
                                  token=job.lease_sequence))
            why = "cancelled meanwhile" if mark.cancelled else "lease taken by another holder"
            reason = "cancelled" if mark.cancelled else "taken"
        await self._recall(job, worker_id, why, reason)
        return "failed" if mark is None else ("cancelled" if mark.recorded else "rejected")

    async def _mark_refused(self, job: Job, worker_id: str | None,
                            exc: InvalidArgument) -> None:
        """The mark of ``job`` was refused for a bad argument (a worker id over 1024
        characters, or with a NUL): no retry can record it. The bot was sent, so it is
        recalled (``Recall`` reason ``unrecorded``, ``Complete`` outcome ``failed``),
        and the job released with the refusal's text, as when ``dispatch`` raises: for
        a retry at the backoff of its stored attempts, or failed for good when this
        lease was its last. The same for a job marked alone or in a batch."""
        self._completed(job, "failed", 1, worker_id)
        await self._recall(job, worker_id, f"mark_dispatched refused: {exc}", "unrecorded")
        await self._retry_later(job, exc, "mark_dispatched")

    async def _recall(self, job: Job, worker_id: str | None, why: str,
                      reason: Literal["cancelled", "taken", "unrecorded"]) -> None:
        """Call ``recall(job, worker_id)`` (when given) and report it."""
        log.warning("%s: %s: %s; recalling %s", self.holder, job.run_id, why,
                    _short(worker_id))
        recalled: Literal["ok", "error", "none"] = "none"
        if self.recall is not None:
            try:
                await self.call_user(self.recall, job, worker_id)
                recalled = "ok"
            except Exception:
                recalled = "error"
                log.exception("%s: recall of %s (%s) raised", self.holder, job.run_id,
                              worker_id)
        self.emit(Recall(runtime="dispatcher", owner=self.holder, subject=job.run_id,
                         token=job.lease_sequence, worker_id=worker_id, reason=reason,
                         outcome=recalled))

    def _ran(self, job: Job, outcome: Literal["ok", "error", "abandoned"],
             started: float) -> None:
        if self._events.active:
            self.emit(HandlerRun(runtime="dispatcher", owner=self.holder, subject=job.run_id,
                                 token=job.lease_sequence, outcome=outcome,
                                 duration_s=time.monotonic() - started))

    def _completed(
        self, job: Job, outcome: Literal["completed", "cancelled", "rejected", "failed"],
        attempts: int, worker_id: str | None,
    ) -> None:
        if self._events.active:
                self.emit(Complete(runtime="dispatcher", owner=self.holder, subject=job.run_id,
                               token=job.lease_sequence, outcome=outcome, attempts=attempts,
                               worker_id=worker_id))

    async def _mark_dispatched(
        self, job: Job, worker_id: str | None
    ) -> tuple[MarkResult | None, int]:
        """The mark's answer and how many attempts it took, retried while it fails for up
        to ``mark_timeout`` seconds (an attempt in flight is never cut short: it may
        commit); None for the answer past that. A permanent refusal
        (``InvalidArgument``: a bad argument, nothing changed) is never retried: it is
        raised at once."""
        give_up_at = time.monotonic() + self.mark_timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                answer = await self._marks.submit((job, worker_id))
                return answer, attempt
            except Exception as exc:
                if is_permanent(exc):
                    log.error("%s: mark_dispatched of %s refused: %s: %s", self.holder,
                              job.run_id, type(exc).__name__, exc)
                    if isinstance(exc, InvalidArgument):
                        raise
                    raise InvalidArgument(str(exc), sqlstate=getattr(exc, "sqlstate", None)
                                          or "22023") from exc
                left = give_up_at - time.monotonic()
                log.warning("%s: mark_dispatched of %s failed (attempt %d, %.1fs left): "
                            "%s: %s", self.holder, job.run_id, attempt, max(left, 0.0),
                            type(exc).__name__, exc)
                if left <= 0:
                    log.error("%s: %s sent to %s but not recorded after %d attempt(s)",
                              self.holder, job.run_id, worker_id, attempt)
                    return None, attempt
                await asyncio.sleep(min(0.1 * 2 ** min(attempt, 8), MARK_RETRY_MAX, left))

    async def _retry_later(self, job: Job, exc: Exception, what: str = "dispatch") -> None:
        """Release ``job`` with ``exc``'s text after its ``what`` (dispatch, or a refused
        mark_dispatched) failed: for a retry at the backoff of its stored attempts (what
        the lease counted, this one included), or, when this lease was its last, to fail
        it for good."""
        attempt = max(job.attempts, 1)
        log.error("%s: %s of %s failed (attempt %d of %d)", self.holder, what,
                  job.run_id, attempt, job.max_attempts, exc_info=exc)
        # Through redact_error before it leaves the process (a failing hook falls back
        # to a text without the message: the release is never lost to it).
        error = error_text(exc, self.redact_error)
        retry_at: int | None = None
        try:
            retry_at = await self.now() + self.backoff.delay_ms(attempt)
            released = await self._release(
                job.run_id, self.holder, retry_at, _sequence(job), error
            )
        except Exception:
            log.exception("%s: release of %s failed; its lease will expire", self.holder,
                          job.run_id)
            self._released(job, attempt, None, "error")
            return
        if not released:
            log.warning("%s: release of %s refused: no longer held", self.holder, job.run_id)
            self._released(job, attempt, retry_at, "refused")
            self.emit(Refused(runtime="dispatcher", owner=self.holder, operation="release",
                              subject=job.run_id, token=job.lease_sequence))
        elif job.last_attempt:
            log.error("%s: %s failed for good after %d attempt(s): %s", self.holder,
                      job.run_id, attempt, error)
            self._released(job, attempt, None, "failed")
        else:
            log.info("%s: released %s for a retry at %s", self.holder, job.run_id, retry_at)
            self._released(job, attempt, retry_at, "released")

    def _released(
        self, job: Job, attempt: int, retry_at: int | None,
        outcome: Literal["released", "failed", "refused", "error"],
    ) -> None:
        self.emit(Release(runtime="dispatcher", owner=self.holder, subject=job.run_id,
                          token=job.lease_sequence, attempt=attempt, retry_at=retry_at,
                          outcome=outcome))

    def _keeper(self, job: Job, anchor: float) -> Coroutine[Any, Any, None]:
        """The shared keeper for one job, from its lease until its mark has an answer."""

        async def renew() -> bool:
            try:
                renewed = await self._renews.submit(job)
            except Exception as exc:
                self.emit(Renew(runtime="dispatcher", owner=self.holder, subject=job.run_id,
                                token=job.lease_sequence, outcome="error",
                                error=f"{type(exc).__name__}: {exc}"))
                raise
            self.emit(Renew(runtime="dispatcher", owner=self.holder, subject=job.run_id,
                            token=job.lease_sequence,
                            outcome="renewed" if renewed else "refused"))
            if not renewed:
                self.emit(Refused(runtime="dispatcher", owner=self.holder, operation="renew",
                                  subject=job.run_id, token=job.lease_sequence))
            return renewed

        def lost(reason: LostReason) -> None:
            self.emit(LeaseLost(runtime="dispatcher", owner=self.holder, subject=job.run_id,
                                token=job.lease_sequence, reason=reason))
            log.warning("%s: %s lease lost (%s); mark_dispatched will tell whether to "
                        "recall", self.holder, job.run_id, reason)

        return keep_lease(renew, lease_ms=self.lease_ms, anchor=anchor, what=job.run_id,
                          owner=self.holder, log=log, on_lost=lost)


    async def _mark_many(self, marks: list[tuple[Job, str | None]]) -> list[MarkResult]:
        """One ``mark_dispatched_many`` for the marks the runs submitted meanwhile
        (``mark_dispatched`` itself for one)."""
        if len(marks) == 1:
            job, worker_id = marks[0]
            return [await self._jobs.mark_dispatched(job.run_id, self.holder, worker_id,
                                                     *_fence(job))]
        return await self._jobs.mark_dispatched_many(
            [job.run_id for job, _ in marks], self.holder, [worker for _, worker in marks],
            [job.lease_sequence or None for job, _ in marks],
        )

    async def _renew_many(self, jobs: list[Job]) -> list[bool]:
        """One ``renew_many`` (one clock read) for the renews the keepers asked meanwhile
        (``renew`` itself for one)."""
        now = await self.now()
        if len(jobs) == 1:
            job = jobs[0]
            return [bool(await self._jobs.renew(job.run_id, self.holder, now, self.lease_ms,
                                                *_fence(job)))]
        return await self._jobs.renew_many(
            [job.run_id for job in jobs], self.holder, now, self.lease_ms,
            [job.lease_sequence or None for job in jobs],
        )


class _Keepers:
    """The lease keepers of the jobs one lease call returned.

    Their leases share one anchor, so their first renews are all due a third of the
    lease after it: one timer then starts a keeper (``keeper(job, anchor)``) for each
    job whose dispatch and mark are still running (``watch`` without ``done``). Most
    dispatches end before and cost no keeper and no timer of their own; a run that
    starts after the timer fired (a late start under load) gets its keeper at once.
    """

    def __init__(
        self, keeper: Callable[[Job, float], Coroutine[Any, Any, None]], anchor: float,
        lease_ms: int,
    ) -> None:
        self._keeper = keeper
        self._anchor = anchor
        self._waiting: dict[str, Job] = {}  # by run_id: one lease call's are distinct
        self._kept: dict[str, asyncio.Future[None]] = {}
        self._fired = False
        delay = anchor + lease_ms / 3000 - time.monotonic()
        asyncio.get_running_loop().call_later(max(delay, 0.0), self._fire)

    def watch(self, job: Job) -> None:
        if self._fired:
            self._kept[job.run_id] = self._start(job)
        else:
            self._waiting[job.run_id] = job

    def done(self, job: Job) -> None:
        if self._waiting.pop(job.run_id, None) is None:
            keeper = self._kept.pop(job.run_id, None)
            if keeper is not None:
                keeper.cancel()

    def _start(self, job: Job) -> asyncio.Future[None]:
        return asyncio.ensure_future(self._keeper(job, self._anchor))

    def _fire(self) -> None:
        self._fired = True
        for run_id, job in self._waiting.items():
            self._kept[run_id] = self._start(job)
        self._waiting.clear()


def _purge_after_ms(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise InvalidArgument("purge_after must be a positive age")
        value = value // timedelta(milliseconds=1)
    return v.positive("purge_after", value)


def _short(worker_id: str | None) -> str | None:
    """A worker id for a log line: at most 100 characters of it."""
    if worker_id is None or len(worker_id) <= 100:
        return worker_id
    return f"{worker_id[:100]}... ({len(worker_id)} characters)"


def _sequence(job: Job) -> int | None:
    """``_fence`` as one argument: the job's lease sequence, or None (no fence)."""
    return job.lease_sequence or None


def _fence(job: Job) -> tuple[int, ...]:
    """The lease sequence to fence renew, mark_dispatched and release with: the one
    ``job``'s lease returned, or nothing for a store whose jobs carry none (0), so such
    stores are called exactly as before."""
    return (job.lease_sequence,) if job.lease_sequence else ()
