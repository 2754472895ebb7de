"""``Dispatcher``: sends each due job once, over a job store, and never leaves a bot
in a cancelled meeting.

For each leased job the dispatcher calls the user's ``dispatch(job)``, which
sends the bot and returns its worker id (or None), renewing the lease every
third of ``ttl_ms`` while it runs. Then ``mark_dispatched``: when the answer is
``cancelled`` (a cancel arrived meanwhile) or not ``recorded`` (the lease was
lost and another holder took the job), the user's ``recall(job, worker_id)``
is called so the bot leaves at once. When ``dispatch`` raises, the job is
released for a retry at a time given by ``backoff``.

``mark_dispatched`` is safe to repeat for the same holder, so a failed one is
retried a few times; ``release`` is not retried (the lease expires instead).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _validate as v
from ._listen import JobListener
from ._runtime import Clock, Runtime, awaitable, default_owner
from .errors import InvalidArgument
from .models import Job

__all__ = ["Backoff", "Dispatcher"]

log = logging.getLogger("pgstore.dispatcher")

#: ``dispatch(job) -> worker_id | None``, plain or ``async def``.
DispatchFn = Callable[[Job], Any]
#: ``recall(job, worker_id) -> None``, plain or ``async def``.
RecallFn = Callable[[Job, "str | None"], Any]

MARK_ATTEMPTS = 5


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
        """The delay before retry number ``attempt`` (1 for the first retry)."""
        exponent = max(attempt, 1) - 1
        raw = min(float(self.max_ms), self.base_ms * self.factor ** min(exponent, 64))
        spread = 1 + self.jitter * (2 * self.random() - 1)
        return max(1, int(raw * spread))


class Dispatcher(Runtime):
    """Leases due jobs and dispatches them, over any job store.

    ``holder`` names this process in leases (default ``dispatcher@host:pid``).
    ``clock`` (epoch ms) defaults to the store's clock. ``poll_interval`` and
    ``grace_period`` are seconds. ``listen=False`` turns wake-ups off; a conninfo string
    LISTENs there instead of on the store's database (behind PgBouncer in transaction
    mode, give it a direct connection to the server: LISTEN needs a session).
    """

    log = log

    def __init__(
        self,
        store: object,
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
    ) -> None:
        if not callable(dispatch):
            raise InvalidArgument("dispatch must be callable")
        if recall is not None and not callable(recall):
            raise InvalidArgument("recall must be callable")
        super().__init__(
            store,
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
        self._lease = awaitable(store, "lease")
        self._renew = awaitable(store, "renew")
        self._mark = awaitable(store, "mark_dispatched")
        self._release = awaitable(store, "release")
        self._attempts: dict[str, int] = {}
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
        now = await self.now()
        pieces = []
        for _ in range(free):
            job: Job | None = await self._lease(self.holder, now, self.lease_ms)
            if job is None:
                break
            log.info("%s: leased %s (due %s) until %s", self.holder, job.run_id,
                     job.dispatch_at, job.lease_until)
            pieces.append(self._run(job))
        return pieces

    async def _run(self, job: Job) -> None:
        keeper = asyncio.ensure_future(self._keep_lease(job))
        try:
            result = await self.call_user(self.dispatch, job)
        except asyncio.CancelledError:
            log.warning("%s: dispatch of %s abandoned at stop; its lease will expire",
                        self.holder, job.run_id)
            raise
        except Exception:
            keeper.cancel()
            await self._retry_later(job)
            return
        finally:
            keeper.cancel()
        worker_id = None if result is None else str(result)
        mark = await self._mark_dispatched(job, worker_id)
        if mark is None:
            return
        self._attempts.pop(job.run_id, None)
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
        for attempt in range(1, MARK_ATTEMPTS + 1):
            try:
                return await self._mark(job.run_id, self.holder, worker_id)
            except Exception:
                log.exception("%s: mark_dispatched of %s failed (attempt %d of %d)",
                              self.holder, job.run_id, attempt, MARK_ATTEMPTS)
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
        log.error("%s: %s sent to %s but not recorded; its lease will expire and it may "
                  "be sent again", self.holder, job.run_id, worker_id)
        return None

    async def _retry_later(self, job: Job) -> None:
        attempt = self._attempts.get(job.run_id, 0) + 1
        self._attempts[job.run_id] = attempt
        log.exception("%s: dispatch of %s failed (attempt %d)", self.holder, job.run_id,
                      attempt)
        try:
            retry_at = await self.now() + self.backoff.delay_ms(attempt)
            released = await self._release(job.run_id, self.holder, retry_at)
        except Exception:
            log.exception("%s: release of %s failed; its lease will expire", self.holder,
                          job.run_id)
            return
        if released:
            log.info("%s: released %s for a retry at %s", self.holder, job.run_id, retry_at)
        else:
            log.warning("%s: release of %s refused: no longer held", self.holder, job.run_id)

    async def _keep_lease(self, job: Job) -> None:
        every = self.lease_ms / 3000
        while True:
            await asyncio.sleep(every)
            try:
                now = await self.now()
                renewed = await self._renew(job.run_id, self.holder, now, self.lease_ms)
            except Exception:
                log.exception("%s: renew of %s failed; trying again", self.holder, job.run_id)
                continue
            if not renewed:
                log.warning("%s: renew of %s refused: lease lost; mark_dispatched will tell",
                            self.holder, job.run_id)
                return
