"""The Dispatcher's run of one leased job, with one task only while it calls user code.

A run is what the Dispatcher counts as running (``concurrency``) and waits for at a
stop: the future ``JobRun``, which it ends itself. Its steps are the Dispatcher's
(``pgstore.runtime.dispatcher``): the ``Dispatch`` event, the lease kept
(``pgstore.runtime.keep``), ``dispatch(job)`` (``pgstore.runtime.dispatch``), the
worker id checked and the mark (``pgstore.runtime.mark``), and, for any answer but
"recorded, not cancelled", the recall and release (``Marker.settle``); ``dispatch``
raising releases the job (``pgstore.runtime.release``).

``dispatch(job)`` runs in a task of its own, as any asyncio code expects
(``asyncio.current_task()``, ``asyncio.timeout``), and so do ``settle`` and the
retries of a failed mark. Waiting for the mark's answer takes no task: the mark goes
to the batch (``Batcher.put``) with the run's waiter, which the batch's answer calls
at once, in the batcher's task. The common answer ends the run there, with no await:
a burst pays one task a job, not a task, a future and two wake-ups more
(docs/performance.md, "The Dispatcher's client CPU").

``cancel()`` (a stop's grace period over) cancels the task while there is one, which
ends the run cancelled; a run waiting for its mark's answer ends cancelled at once, and
its mark is left out of the batch if it was not sent yet (one sent may still commit,
as a single call would).

While an application records spans (``pgstore.runtime.tracing``), a run opens its span
``pgstore.dispatch`` (``trace``) before its dispatch and closes it with the run's outcome
(``Complete``'s, or ``released``) at its end; its tasks run in the span's context, so
what ``dispatch`` and ``recall`` open are children of it. The runs are the same with or
without spans: one path, one set of steps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from pgstore.models import Job, MarkResult
from pgstore.runtime.base import Host
from pgstore.runtime.dispatch import ProviderCall
from pgstore.runtime.events import Dispatch
from pgstore.runtime.keep import LeaseKeepers
from pgstore.runtime.mark import Answer, Marker
from pgstore.runtime.release import Releaser
from pgstore.runtime.tracing import Opened, open_span

__all__ = ["JobRun", "Parts"]

log = logging.getLogger("pgstore.dispatcher")


class Parts:
    """What the runs of one Dispatcher share: the host, its parts, and ``ended(run)``,
    which the runtime is told each run's end with."""

    __slots__ = ("ended", "host", "marker", "provider", "releaser")

    def __init__(self, host: Host, provider: ProviderCall, marker: Marker,
                 releaser: Releaser, ended: Callable[[JobRun], None]) -> None:
        self.host = host
        self.provider = provider
        self.marker = marker
        self.releaser = releaser
        self.ended = ended


class JobRun(asyncio.Future[Any]):
    """One leased job's run (see the module's doc): done when the run is over,
    cancelled when ``cancel()`` cut it short."""

    __slots__ = ("_give_up_at", "_keepers", "_parts", "_span", "_task", "_worker_id", "job",
                 "leased_at")

    def __init__(self, parts: Parts, job: Job, leased_at: int, keepers: LeaseKeepers,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self._parts = parts
        self.job = job
        #: When the job was leased, by the store's clock (its lateness is from here).
        self.leased_at = leased_at
        self._keepers = keepers
        self._task: asyncio.Task[None] | None = None  # running user code, or a settle
        self._worker_id: str | None = None
        self._give_up_at = 0.0  # when the retries of a failed mark stop (monotonic)
        self._span: Opened | None = None

    def trace(self) -> None:
        """Open the run's span (before ``start``; see the module's doc), when one records."""
        job, owner = self.job, self._parts.host.owner
        self._span = open_span("pgstore.dispatch", {
            "pgstore.owner": owner, "pgstore.run_id": job.run_id,
            "pgstore.lease_sequence": job.lease_sequence,
            "pgstore.dispatch_at": job.dispatch_at,
            "pgstore.lateness_ms": self.leased_at - job.dispatch_at,
        })

    def start(self, direct: bool) -> None:
        """Start the run: its dispatch, in a task of its own. ``direct``: the loop has no
        task factory, so the task is made as ``loop.create_task`` would make it, without
        its checks (one call a job less)."""
        coro = self._dispatch()
        loop = self.get_loop()
        if self._span is not None:
            self._task = self._span.context.run(loop.create_task, coro)
        else:
            self._task = asyncio.Task(coro, loop=loop) if direct else loop.create_task(coro)

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        """A task of the run after its dispatch (a settle), in its span's context."""
        create = self.get_loop().create_task
        span = self._span
        return create(coro) if span is None else span.context.run(create, coro)

    def cancel(self, msg: Any | None = None) -> bool:
        """Cut the run short (see the module's doc); False when it is over already."""
        if self.done():
            return False
        task = self._task
        if task is not None and task.cancel(msg):
            # The task ends the run; one cancelled before its first step never runs it.
            task.add_done_callback(self._task_ended)
            return True
        self._keepers.done(self.job)  # waiting for its mark: its lease no longer kept
        self._end(cancelled=True)
        return True

    # --- the steps ---------------------------------------------------------------

    async def _dispatch(self) -> None:
        """The ``Dispatch`` event, the lease kept, ``dispatch(job)``, then its mark put
        in the batch (or the release of a job whose dispatch raised)."""
        parts, job = self._parts, self.job
        try:
            host = parts.host
            if host.events_active:
                host.emit(Dispatch(runtime="dispatcher", owner=host.owner,
                                   subject=job.run_id, token=job.lease_sequence,
                                   dispatch_at=job.dispatch_at, now=self.leased_at,
                                   lateness_ms=self.leased_at - job.dispatch_at))
            self._keepers.watch(job)
            provider = parts.provider  # ``await provider(job)``, in its parts
            started = time.monotonic()
            try:
                result = await provider.call(job)
            except asyncio.CancelledError:
                provider.abandoned(job, started)
                raise
            except Exception as exc:
                provider.ran(job, "error", started)
                self._keepers.done(job)
                await parts.releaser.retry_later(job, exc)
                self._end(outcome="released")
                return
            if host.events_active:
                provider.ran(job, "ok", started)
            worker_id = None if result is None else str(result)
            marker = parts.marker
            refused = marker.check(worker_id)
            if refused is not None:  # never sent: refused like a mark the SQL refuses
                self._keepers.done(job)
                self._end(outcome=await marker.settle(job, worker_id, (None, 1, refused)))
                return
            self._worker_id = worker_id
            self._give_up_at = time.monotonic() + marker.mark_timeout
            self._task = None  # from here until the answer, no task
            self._keepers.ending(job)
            marker.put(job, worker_id, self)  # its answer: ``set_result``, ``set_exception``
        except BaseException as exc:
            self._failed(exc)
            raise

    # The run is its mark's waiter in the batch (``Batcher.put``): the batch's answer for
    # its job comes as ``set_result`` (or ``set_exception``), called at once in the
    # batcher's task (``done()``: a run cut short is left out of a batch not yet sent).
    # The run's own end goes through ``_end``. Neither raises into the batcher: a
    # failure here is logged and ends the run.

    def set_result(self, mark: MarkResult, /) -> None:
        """The mark's answer: the common one ends the run here; any other is settled
        (recall, release) in a task."""
        if self.done():  # cancelled meanwhile: the answer goes unread
            return
        try:
            self._keepers.done(self.job)
            answer: Answer = (mark, 1, None)
            if self._parts.marker.completed(self.job, self._worker_id, answer):
                self._end(outcome="completed")
                return
            self._task = self._spawn(self._settle(None, answer))
        except Exception as exc:
            self._broken(exc)

    def set_exception(self, exception: type | BaseException, /) -> None:
        """The mark's first attempt failed: retried (and settled) in a task."""
        if self.done():
            return
        try:
            if not isinstance(exception, Exception):  # not a failure of the call: as a cancel
                self.cancel()
                return
            self._task = self._spawn(self._settle(exception, None))
        except Exception as exc:
            self._broken(exc)

    async def _settle(self, failed: Exception | None, answer: Answer | None) -> None:
        """After the first attempt of the mark: its retries when it ``failed`` (the lease
        kept through them), then ``Marker.settle`` on the ``answer``."""
        parts, job, worker_id = self._parts, self.job, self._worker_id
        try:
            if failed is not None:
                answer = await parts.marker.retried(job, worker_id, self._give_up_at, failed)
                self._keepers.done(job)
            assert answer is not None
            self._end(outcome=await parts.marker.settle(job, worker_id, answer))
        except BaseException as exc:
            self._failed(exc)
            raise

    # --- the end -------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> None:
        """A step raised ``exc`` (a cancel, or what a bug raises, which its task keeps):
        the lease is no longer kept, and the run is over."""
        self._keepers.done(self.job)
        self._end(cancelled=isinstance(exc, asyncio.CancelledError), exc=exc)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        if not self.done():
            self._keepers.done(self.job)
            self._end(cancelled=True)

    def _broken(self, exc: Exception) -> None:
        log.error("%s: the run of %s failed after its mark", self._parts.host.owner,
                  self.job.run_id, exc_info=exc)
        self._failed(exc)

    def _end(self, *, cancelled: bool = False, outcome: str | None = None,
             exc: BaseException | None = None) -> None:
        """The run is over: for its span, ``outcome`` (``Complete``'s, or ``released``)
        when it ended with one, else what it raised (``exc``), or nothing (cut short)."""
        if self.done():
            return
        self._task = None
        span = self._span
        if span is not None:
            self._span = None
            span.close(outcome, exc)
        if cancelled:
            super().cancel()
        else:
            super().set_result(None)
        self._parts.ended(self)

