"""``Batcher``: many concurrent single calls sent as a few batch calls.

The Dispatcher's runs each wait for their own answer (``await submit(item)``),
as they would from a single-job call; the batcher sends what has been
submitted as one batch call (``job_mark_dispatched_many``, ``job_renew_many``)
and hands each run its own answer, or the batch's exception.

No timer: what is submitted in one turn of the event loop goes out together
at the end of that turn, and while ``max_in_flight`` calls are out the rest
waits and goes in the next call, up to ``max_batch`` items each. An idle
dispatcher's one mark is sent at once, alone; under a burst the batches grow
by themselves, as large as the calls in flight are slow.

A submission cancelled before its batch is sent is left out of it (a run
abandoned at stop commits nothing); one cancelled after that may still be
committed by the call in flight, as a single call would be.

One bad item must not cost the others their answers: when the batch call
raises an error that ``split(exc)`` calls permanent (the Dispatcher's:
``InvalidArgument``, which changed nothing), a batch of more than one item is
split in halves and each half sent again, down to single items: the bad item
alone gets the error, the rest their own answers (one bad item in ``n`` costs
about ``2 log2 n`` more calls). Only calls that are safe to repeat after such a
refusal may be given a ``split``: a refused call committed nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar

__all__ = ["CALLS_IN_FLIGHT", "Batcher", "Waiter"]

#: How many calls of one kind (the Dispatcher's marks; apart, its renews) may be out at
#: once; the rest wait and go together in the next. With ``batch_size=1`` this is what
#: bounds the marks: four at a time, each one job, as the single-job path's runs did
#: through a small pool.
CALLS_IN_FLIGHT = 4

I = TypeVar("I")  # noqa: E741
R = TypeVar("R")
R_contra = TypeVar("R_contra", contravariant=True)


class Waiter(Protocol[R_contra]):
    """What waits for one item's answer: a future (``submit``), or any object with the
    same four methods (``put``), which the batcher calls in its own task, at once, when
    the answer comes. ``done()`` True before its batch is sent leaves the item out."""

    def done(self) -> bool: ...

    def set_result(self, result: R_contra, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...

    def cancel(self) -> bool: ...


class Batcher(Generic[I, R]):
    """``await submit(item)`` answers what ``call([..., item, ...])`` answered for it."""

    def __init__(
        self,
        call: Callable[[list[I]], Awaitable[Sequence[R]]],
        *,
        max_batch: int,
        max_in_flight: int = 2,
        split: Callable[[Exception], bool] | None = None,
    ) -> None:
        self._call = call
        self._split = split
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self._pending: list[tuple[I, Waiter[R]]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        self._flush_scheduled = False

    def submit(self, item: I) -> asyncio.Future[R]:
        """The future of ``item``'s answer (await it). A future, not a coroutine: no
        coroutine a call; cancelling it (or the task awaiting it) before its batch is
        sent leaves ``item`` out of the batch."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self.put(item, future)
        return future

    def put(self, item: I, waiter: Waiter[R]) -> None:
        """``submit`` with a waiter of the caller's: no future, and no task wakes up for
        the answer (the Dispatcher's runs, ``pgstore.runtime.run``). The waiter's methods
        are called inside the batcher's task and must not raise."""
        self._pending.append((item, waiter))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        while self._pending and len(self._in_flight) < self.max_in_flight:
            live = [(item, f) for item, f in self._pending if not f.done()]
            batch, self._pending = live[: self.max_batch], live[self.max_batch:]
            if not batch:
                return
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        if self._pending:
            self._flush()

    async def _send(self, batch: list[tuple[I, Waiter[R]]]) -> None:
        try:
            await self._deliver(batch)
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise

    async def _deliver(self, batch: list[tuple[I, Waiter[R]]]) -> None:
        """One call for ``batch``; its halves again when it is refused as a whole for an
        error ``split`` calls permanent."""
        try:
            answers = await self._call([item for item, _ in batch])
            if len(answers) != len(batch):
                raise RuntimeError(
                    f"a batch call answered {len(answers)} items for {len(batch)}")
        except Exception as exc:
            if len(batch) > 1 and self._split is not None and self._split(exc):
                half = len(batch) // 2
                for part in (batch[:half], batch[half:]):
                    live = [(item, f) for item, f in part if not f.done()]
                    if live:
                        await self._deliver(live)
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            if not future.done():
                future.set_result(answer)
