"""``Dispatcher``: sends each due job once, over a job store, and never leaves a bot
in a cancelled meeting.

For each leased job the dispatcher calls the user's ``dispatch(job)``, which
sends the bot and returns its worker id (or None). Then ``mark_dispatched``:
when the answer is ``cancelled`` (a cancel arrived meanwhile) or not
``recorded`` (the lease was lost and another holder took the job), the user's
``recall(job, worker_id)`` is called so the bot leaves at once. When
``dispatch`` raises, the job is released, with the error's text, for a retry at
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
expires instead).

The ``Job`` handed to ``dispatch`` carries its ``lease_sequence``, which grows
with every lease of the job and never goes backwards, even across a failover:
``(job.run_id, job.lease_sequence)`` is an idempotency key for the provider
call. The dispatcher fences its renew, mark_dispatched and release with it, so
a lease lost in a failover cannot record a dispatch made under the next one.

Wake-ups: with a PostgreSQL store, an idle dispatcher LISTENs on the store's
``job_channel()``, which ``job_schedule`` notifies at commit, so a job
scheduled due-now is leased within a fraction of a second while the poll
interval stays long. A notification is only a hint: leasing always goes
through ``job_lease``, and polling remains the fallback (a memory store, a
lost listening connection). Payloads that are not a dispatch time are ignored
(anyone who can connect can NOTIFY), and bursts are coalesced into a few
wake-ups; see ``_listen``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.models import ERROR_MAX_CHARS, Job
from pgstore.postgres.listen import JobListener
from pgstore.protocols import AsyncJobStore, JobStore
from pgstore.runtime.base import Clock, Runtime, default_owner, positive_seconds
from pgstore.runtime.keeper import keep_lease
from pgstore.runtime.stores import as_async_job_store

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
    """

    log = log

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
    ) -> None:
        if not callable(dispatch):
            raise InvalidArgument("dispatch must be callable")
        if recall is not None and not callable(recall):
            raise InvalidArgument("recall must be callable")
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
        )
        self.dispatch = dispatch
        self.recall = recall
        self.backoff = backoff or Backoff()
        self.mark_timeout = positive_seconds("mark_timeout", mark_timeout)
        self._lease = jobs.lease
        self._renew = jobs.renew
        self._mark = jobs.mark_dispatched
        self._release = jobs.release
        self._listener: JobListener | None = None
        self._listen = listen

    @property
    def holder(self) -> str:
        return self.owner

    async def _prepare(self) -> None:
        await super()._prepare()
        if self._listen is not False and self._listener is None:
            self._listener = JobListener.for_store(
                self.store, self.wake, self.poll_interval, log, self.holder,
                conninfo=self._listen if isinstance(self._listen, str) else None,
            )
            if self._listener is not None:
                self._listener.start()

    async def _shutdown(self) -> None:
        if self._listener is not None:
            await self._listener.stop()
            self._listener = None
        await super()._shutdown()

    async def _claim(self, free: int) -> list[Any]:
        anchor = time.monotonic()  # every lease below runs from no earlier than this
        now = await self.now()
        pieces = []
        for _ in range(free):
            job: Job | None = await self._lease(self.holder, now, self.lease_ms)
            if job is None:
                break
            log.info("%s: leased %s (due %s) until %s", self.holder, job.run_id,
                     job.dispatch_at, job.lease_until)
            pieces.append(self._run(job, anchor))
        return pieces

    async def _run(self, job: Job, anchor: float) -> None:
        keeper = asyncio.ensure_future(self._keeper(job, anchor))
        try:
            try:
                result = await self.call_user(self.dispatch, job)
            except asyncio.CancelledError:
                log.warning("%s: dispatch of %s abandoned at stop; its lease will expire",
                            self.holder, job.run_id)
                raise
            except Exception as exc:
                keeper.cancel()
                await self._retry_later(job, exc)
                return
            worker_id = None if result is None else str(result)
            mark = await self._mark_dispatched(job, worker_id)
        finally:
            keeper.cancel()
        if mark is None:
            why = f"not recorded within mark_timeout ({self.mark_timeout:g}s)"
        else:
            if mark.recorded and not mark.cancelled:
                log.info("%s: dispatched %s to %s", self.holder, job.run_id, worker_id)
                return
            why = "cancelled meanwhile" if mark.cancelled else "lease taken by another holder"
        log.warning("%s: %s: %s; recalling %s", self.holder, job.run_id, why, worker_id)
        if self.recall is not None:
            try:
                await self.call_user(self.recall, job, worker_id)
            except Exception:
                log.exception("%s: recall of %s (%s) raised", self.holder, job.run_id,
                              worker_id)

    async def _mark_dispatched(self, job: Job, worker_id: str | None) -> Any:
        """The mark's answer, retried while it fails for up to ``mark_timeout`` seconds
        (an attempt in flight is never cut short: it may commit); None past that."""
        give_up_at = time.monotonic() + self.mark_timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._mark(job.run_id, self.holder, worker_id, *_fence(job))
            except Exception as exc:
                left = give_up_at - time.monotonic()
                log.warning("%s: mark_dispatched of %s failed (attempt %d, %.1fs left): "
                            "%s: %s", self.holder, job.run_id, attempt, max(left, 0.0),
                            type(exc).__name__, exc)
                if left <= 0:
                    log.error("%s: %s sent to %s but not recorded after %d attempt(s)",
                              self.holder, job.run_id, worker_id, attempt)
                    return None
                await asyncio.sleep(min(0.1 * 2 ** min(attempt, 8), MARK_RETRY_MAX, left))

    async def _retry_later(self, job: Job, exc: Exception) -> None:
        """Release ``job`` with ``exc``'s text after its dispatch raised: for a retry at the
        backoff of its stored attempts (what the lease counted, this one included), or,
        when this lease was its last, to fail it for good."""
        attempt = max(job.attempts, 1)
        log.exception("%s: dispatch of %s failed (attempt %d of %d)", self.holder,
                      job.run_id, attempt, job.max_attempts)
        error = f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS]
        try:
            retry_at = await self.now() + self.backoff.delay_ms(attempt)
            released = await self._release(
                job.run_id, self.holder, retry_at, _sequence(job), error
            )
        except Exception:
            log.exception("%s: release of %s failed; its lease will expire", self.holder,
                          job.run_id)
            return
        if not released:
            log.warning("%s: release of %s refused: no longer held", self.holder, job.run_id)
        elif job.last_attempt:
            log.error("%s: %s failed for good after %d attempt(s): %s", self.holder,
                      job.run_id, attempt, error)
        else:
            log.info("%s: released %s for a retry at %s", self.holder, job.run_id, retry_at)

    def _keeper(self, job: Job, anchor: float) -> Coroutine[Any, Any, None]:
        """The shared keeper for one job, from its lease until its mark has an answer."""

        async def renew() -> bool:
            now = await self.now()
            return bool(await self._renew(job.run_id, self.holder, now, self.lease_ms,
                                          *_fence(job)))

        def lost(reason: str) -> None:
            log.warning("%s: %s lease lost (%s); mark_dispatched will tell whether to "
                        "recall", self.holder, job.run_id, reason)

        return keep_lease(renew, lease_ms=self.lease_ms, anchor=anchor, what=job.run_id,
                          owner=self.holder, log=log, on_lost=lost)


def _sequence(job: Job) -> int | None:
    """``_fence`` as one argument: the job's lease sequence, or None (no fence)."""
    return job.lease_sequence or None


def _fence(job: Job) -> tuple[int, ...]:
    """The lease sequence to fence renew, mark_dispatched and release with: the one
    ``job``'s lease returned, or nothing for a store whose jobs carry none (0), so such
    stores are called exactly as before."""
    return (job.lease_sequence,) if job.lease_sequence else ()
