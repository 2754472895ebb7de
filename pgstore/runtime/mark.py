"""The Dispatcher's marks: record a dispatch (``mark_dispatched``), and recall the bot
when it may not stay.

When the mark answers ``cancelled`` (a cancel arrived meanwhile) or not
``recorded`` (the lease was lost and another holder took the job), the user's
``recall(job, worker_id)`` is called so the bot leaves at once. The mark is
safe to repeat for the same holder, so a failed one (a lost connection, a
server outage) is retried for up to ``mark_timeout`` seconds; when no attempt
has answered by then, the bot is recalled (it may be sent again once the lease
expires, and must not stay twice). The worker id is checked
(``pgstore._validate.worker_id``, the SQL's rule) before its mark is sent; a
bad one, or any mark refused with ``InvalidArgument``, is never retried: the
bot is recalled (``Recall`` reason ``unrecorded``, ``Complete`` outcome
``failed``) and the job released with the refusal's text
(``pgstore.runtime.release``).

The marks of many jobs go together (``mark_dispatched_many``, through a
``pgstore.runtime.batcher.Batcher``; one alone goes as ``mark_dispatched``). A
batch refused as a whole is split until only the bad job gets the refusal, so
the others are marked once and never recalled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.models import Job, MarkResult
from pgstore.protocols import AsyncJobStore
from pgstore.runtime.base import Host
from pgstore.runtime.batcher import CALLS_IN_FLIGHT, Batcher, Waiter
from pgstore.runtime.events import Complete, Recall, Refused
from pgstore.runtime.lease import fence
from pgstore.runtime.release import Releaser
from pgstore.runtime.transient import is_permanent

__all__ = ["MARK_RETRY_MAX", "Answer", "Marker", "RecallFn"]

log = logging.getLogger("pgstore.dispatcher")

#: ``recall(job, worker_id) -> None``, plain or ``async def``.
RecallFn = Callable[[Job, "str | None"], Any]
#: The longest pause between two attempts of a failing ``mark_dispatched`` (seconds).
MARK_RETRY_MAX = 2.0
#: A mark's answer (None: none within ``mark_timeout``), the attempts it took, and the
#: refusal of a bad argument (then no answer).
Answer = tuple["MarkResult | None", int, "InvalidArgument | None"]
RecallReason = Literal["cancelled", "taken", "unrecorded"]


class Marker:
    """Marks ``host``'s dispatched jobs and recalls the bots that may not stay."""

    def __init__(self, jobs: AsyncJobStore, host: Host, *, recall: RecallFn | None,
                 releaser: Releaser, batch_size: int, mark_timeout: float) -> None:
        self._jobs = jobs
        self._host = host
        self.recall = recall
        self._releaser = releaser
        self.mark_timeout = mark_timeout
        self._log_info = True  # asked again at each mark call (``_mark_many``)
        # A batch refused as a whole for a bad argument (which changed nothing) is split
        # until the bad job alone gets the refusal: one bad job never costs the others.
        self._marks: Batcher[tuple[Job, str | None], MarkResult] = Batcher(
            self._mark_many, max_batch=batch_size, max_in_flight=CALLS_IN_FLIGHT,
            split=is_permanent)

    async def record(self, job: Job, worker_id: str | None) -> Answer:
        """Check ``worker_id``, then mark: the answer, or the refusal of a bad argument.
        The same for a job marked alone or in a batch."""
        refused = self.check(worker_id)
        if refused is not None:
            return None, 1, refused
        # The first attempt inline (one coroutine less a job); ``mark`` retries it.
        give_up_at = time.monotonic() + self.mark_timeout
        try:
            return await self._marks.submit((job, worker_id)), 1, None
        except Exception as exc:
            return await self.retried(job, worker_id, give_up_at, exc)

    def check(self, worker_id: str | None) -> InvalidArgument | None:
        """The refusal of a bad ``worker_id`` (the SQL's rule), None for a good one. It
        is checked before the mark joins a batch: a bad one never reaches a batch call."""
        # A short ASCII string with no NUL passes ``v.worker_id`` as it is: the common
        # case, checked inline.
        if worker_id is not None and not (
                worker_id.__class__ is str and len(worker_id) <= v.NAME_MAX_CHARS
                and worker_id.isascii() and "\x00" not in worker_id):
            try:
                v.worker_id("worker_id", worker_id)
            except InvalidArgument as exc:
                return exc
        return None

    def put(self, job: Job, worker_id: str | None, waiter: Waiter[MarkResult]) -> None:
        """The first attempt of a checked mark, answered to ``waiter`` (no future: the
        Dispatcher's runs, ``pgstore.runtime.run``); a failed one goes on with
        ``retried``."""
        self._marks.put((job, worker_id), waiter)

    async def retried(self, job: Job, worker_id: str | None, give_up_at: float,
                      exc: Exception) -> Answer:
        """``record``'s answer after its first attempt failed with ``exc``: retried until
        ``give_up_at`` (``time.monotonic()``), a permanent refusal at once."""
        try:
            mark, attempts = await self._retry(job, worker_id, give_up_at, exc)
        except InvalidArgument as refused:
            return None, 1, refused
        return mark, attempts, None

    def completed(self, job: Job, worker_id: str | None, answer: Answer) -> bool:
        """``settle`` for the common answer, with no coroutine: the dispatch was recorded
        and no cancel came, so the bot stays (``Complete`` outcome ``completed``); True.
        False for any other answer, which ``settle`` acts on."""
        mark, attempts, refused = answer
        if refused is not None or mark is None or not mark.recorded or mark.cancelled:
            return False
        if self._host.events_active:
            self._completed(job, "completed", attempts, worker_id)
        if self._log_info:
            log.info("%s: dispatched %s to %s", self._host.owner, job.run_id, worker_id)
        return True

    async def settle(self, job: Job, worker_id: str | None, answer: Answer) -> str:
        """Act on ``record``'s answer (recall, release); what happened (``Complete``'s
        outcome, or ``released``)."""
        if self.completed(job, worker_id, answer):
            return "completed"
        mark, attempts, refused = answer
        holder = self._host.owner
        if refused is not None:
            await self._refused(job, worker_id, refused)
            return "released"
        reason: RecallReason
        if mark is None:
            self._completed(job, "failed", attempts, worker_id)
            why = f"not recorded within mark_timeout ({self.mark_timeout:g}s)"
            reason = "unrecorded"
        else:
            if mark.recorded:
                self._completed(job, "cancelled", attempts, worker_id)
            else:
                self._completed(job, "rejected", attempts, worker_id)
                self._host.emit(Refused(runtime="dispatcher", owner=holder,
                                        operation="mark_dispatched", subject=job.run_id,
                                        token=job.lease_sequence))
            why = "cancelled meanwhile" if mark.cancelled else "lease taken by another holder"
            reason = "cancelled" if mark.cancelled else "taken"
        await self._recall(job, worker_id, why, reason)
        return "failed" if mark is None else ("cancelled" if mark.recorded else "rejected")

    async def mark(self, job: Job, worker_id: str | None) -> tuple[MarkResult | None, int]:
        """The mark's answer and how many attempts it took, retried while it fails for up
        to ``mark_timeout`` seconds (an attempt in flight is never cut short: it may
        commit); None for the answer past that. A permanent refusal
        (``InvalidArgument``: a bad argument, nothing changed) is never retried: it is
        raised at once."""
        give_up_at = time.monotonic() + self.mark_timeout
        try:
            return await self._marks.submit((job, worker_id)), 1
        except Exception as exc:
            return await self._retry(job, worker_id, give_up_at, exc)

    async def _retry(self, job: Job, worker_id: str | None, give_up_at: float,
                     exc: Exception) -> tuple[MarkResult | None, int]:
        """``mark`` after its first attempt failed with ``exc``."""
        holder = self._host.owner
        attempt = 1
        while True:
            if is_permanent(exc):
                log.error("%s: mark_dispatched of %s refused: %s: %s", holder,
                          job.run_id, type(exc).__name__, exc)
                if isinstance(exc, InvalidArgument):
                    raise exc
                raise InvalidArgument(str(exc), sqlstate=getattr(exc, "sqlstate", None)
                                      or "22023") from exc
            left = give_up_at - time.monotonic()
            log.warning("%s: mark_dispatched of %s failed (attempt %d, %.1fs left): "
                        "%s: %s", holder, job.run_id, attempt, max(left, 0.0),
                        type(exc).__name__, exc)
            if left <= 0:
                log.error("%s: %s sent to %s but not recorded after %d attempt(s)",
                          holder, job.run_id, worker_id, attempt)
                return None, attempt
            await asyncio.sleep(min(0.1 * 2 ** min(attempt, 8), MARK_RETRY_MAX, left))
            attempt += 1
            try:
                return await self._marks.submit((job, worker_id)), attempt
            except Exception as again:
                exc = again

    async def _refused(self, job: Job, worker_id: str | None, exc: InvalidArgument) -> None:
        """The mark of ``job`` was refused for a bad argument (a worker id over 1024
        characters, or with a NUL): no retry can record it. The bot was sent, so it is
        recalled (``Recall`` reason ``unrecorded``, ``Complete`` outcome ``failed``),
        and the job released with the refusal's text, as when ``dispatch`` raises: for
        a retry at the backoff of its stored attempts, or failed for good when this
        lease was its last. The same for a job marked alone or in a batch."""
        self._completed(job, "failed", 1, worker_id)
        await self._recall(job, worker_id, f"mark_dispatched refused: {exc}", "unrecorded")
        await self._releaser.retry_later(job, exc, "mark_dispatched")

    async def _recall(self, job: Job, worker_id: str | None, why: str,
                      reason: RecallReason) -> None:
        """Call ``recall(job, worker_id)`` (when given) and report it."""
        holder = self._host.owner
        log.warning("%s: %s: %s; recalling %s", holder, job.run_id, why, _short(worker_id))
        recalled: Literal["ok", "error", "none"] = "none"
        if self.recall is not None:
            try:
                await self._host.call_user(self.recall, job, worker_id)
                recalled = "ok"
            except Exception:
                recalled = "error"
                log.exception("%s: recall of %s (%s) raised", holder, job.run_id, worker_id)
        self._host.emit(Recall(runtime="dispatcher", owner=holder, subject=job.run_id,
                               token=job.lease_sequence, worker_id=worker_id, reason=reason,
                               outcome=recalled))

    def _completed(
        self, job: Job, outcome: Literal["completed", "cancelled", "rejected", "failed"],
        attempts: int, worker_id: str | None,
    ) -> None:
        host = self._host
        if host.events_active:
            host.emit(Complete(runtime="dispatcher", owner=host.owner, subject=job.run_id,
                               token=job.lease_sequence, outcome=outcome, attempts=attempts,
                               worker_id=worker_id))

    async def _mark_many(self, marks: list[tuple[Job, str | None]]) -> list[MarkResult]:
        """One ``mark_dispatched_many`` for the marks the runs submitted meanwhile
        (``mark_dispatched`` itself for one)."""
        holder = self._host.owner
        # Whether ``completed`` logs each job: asked once a call, not once a job.
        self._log_info = log.isEnabledFor(logging.INFO)
        if len(marks) == 1:
            job, worker_id = marks[0]
            return [await self._jobs.mark_dispatched(job.run_id, holder, worker_id,
                                                     *fence(job))]
        return await self._jobs.mark_dispatched_many(
            [job.run_id for job, _ in marks], holder, [worker for _, worker in marks],
            [job.lease_sequence or None for job, _ in marks],
        )


def _short(worker_id: str | None) -> str | None:
    """A worker id for a log line: at most 100 characters of it."""
    if worker_id is None or len(worker_id) <= 100:
        return worker_id
    return f"{worker_id[:100]}... ({len(worker_id)} characters)"
