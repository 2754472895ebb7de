"""What the Scheduler and the Dispatcher share: the loop that drives a store.

A runtime claims work up to its free concurrency, runs each piece as an
asyncio task, keeps its lease alive while it runs, and on ``stop()`` stops
claiming, gives running work a grace period, and abandons the rest (its
claims are left to expire; nothing is committed for work that did not
finish).

Stores may be sync (their calls run in a worker thread) or asyncio (awaited).
User callables may be ``async def`` (run on the loop) or plain functions (run
in a thread pool).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import random
import socket
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.protocols import AsyncJobStore, AsyncScheduleStore, JobStore, ScheduleStore
from pgstore.runtime import signals as _signals
from pgstore.runtime.events import (
    Abandoned,
    Claim,
    ConnectionLost,
    Event,
    EventHub,
    Reconnected,
    RuntimeKind,
    Stopping,
    Subscriber,
)
from pgstore.runtime.transient import is_transient

T = TypeVar("T")

#: A clock in epoch ms; a runtime without one uses the store's clock (``now_ms()``).
Clock = Callable[[], int]

#: Retries of a transient failure in ``start()``: the first after about
#: ``START_RETRY_FIRST`` seconds, doubling up to ``START_RETRY_MAX``, each with jitter.
START_RETRY_FIRST = 0.05
START_RETRY_MAX = 5.0


def default_owner(kind: str) -> str:
    """``<kind>@<host>:<pid>``: unique per process, readable at 3 a.m."""
    return f"{kind}@{socket.gethostname()}:{os.getpid()}"


class StoreCalls(Protocol):
    """What the loop itself calls on a store, awaited (see ``pgstore.runtime.stores``)."""

    async def start(self) -> None: ...

    async def now_ms(self) -> int: ...


class Host(Protocol):
    """What the parts of a runtime (``pgstore.runtime.lease``, ``mark``...) use of the
    runtime that composes them: its name, lease, clock, events and user-call pool."""

    @property
    def owner(self) -> str: ...

    @property
    def lease_ms(self) -> int: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def events_active(self) -> bool: ...

    def emit(self, event: Event) -> None: ...

    async def now(self) -> int: ...

    async def call_user(self, fn: Callable[..., Any], *args: Any) -> Any: ...


def is_async_callable(fn: object) -> bool:
    """True for ``async def`` functions and objects whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def positive_seconds(param: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgument(f"{param} must be a positive number of seconds")
    return float(value)


class Runtime:
    """The claim / run / stop loop; subclasses say how to claim and run one piece."""

    log: logging.Logger
    #: What this runtime's events name it.
    kind: RuntimeKind

    def __init__(
        self,
        store: ScheduleStore | AsyncScheduleStore | JobStore | AsyncJobStore,
        calls: StoreCalls,
        *,
        owner: str,
        lease_ms: int,
        concurrency: int,
        poll_interval: float,
        grace_period: float,
        clock: Clock | None,
        on_event: Subscriber | None = None,
    ) -> None:
        if on_event is not None and not callable(on_event):
            raise InvalidArgument("on_event must be callable")
        #: The store as given; ``_calls`` is the same store with every call awaitable.
        self.store = store
        self._calls = calls
        self.owner = v.name("owner", owner)
        self.lease_ms = v.positive("lease_ms", lease_ms)
        self.concurrency = v.positive("concurrency", concurrency, maximum=10_000)
        self.poll_interval = positive_seconds("poll_interval", poll_interval)
        self.grace_period = positive_seconds("grace_period", grace_period)
        self._clock = clock
        #: What runs now: the tasks of ``_start`` (any future the runtime ends itself).
        self._running: set[asyncio.Future[Any]] = set()
        self._abandoned = False
        self._stopping: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._saturated = False  # idle because running work fills the concurrency
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._events = EventHub(self.log)
        if on_event is not None:
            self._events.subscribe(on_event)

    # --- events (pgstore.runtime.events) ------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Hand every later event of this runtime to ``subscriber`` (on the loop's
        thread; see ``pgstore.runtime.events``); returns the function that stops it."""
        if not callable(subscriber):
            raise InvalidArgument("subscriber must be callable")
        return self._events.subscribe(subscriber)

    def emit(self, event: Event) -> None:
        """Hand ``event`` to the subscribers (a subscriber that raises is only logged)."""
        self._events.emit(event)

    @property
    def events_active(self) -> bool:
        """True when someone listens: per-piece events need not be built otherwise."""
        return self._events.active

    # --- what subclasses provide -------------------------------------------------

    async def _prepare(self) -> None:
        """Start the store and whatever the runtime needs before its first claim."""
        await self._calls.start()

    async def _claim(self, free: int) -> list[Coroutine[Any, Any, None]]:
        """Claim up to ``free`` pieces of work; one coroutine per piece to run."""
        raise NotImplementedError

    async def _idle(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds, or less when woken (``wake()``) or stopped."""
        assert self._stopping is not None and self._wake is not None
        stop = asyncio.ensure_future(self._stopping.wait())
        wake = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({stop, wake}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            wake.cancel()
        self._wake.clear()

    # --- the loop ------------------------------------------------------------------

    async def now(self) -> int:
        """The runtime's clock: the one it was given, else the store's."""
        if self._clock is not None:
            return self._clock()
        return int(await self._calls.now_ms())

    @property
    def running(self) -> int:
        """How many pieces of work are running now."""
        return len(self._running)

    @property
    def abandoned(self) -> bool:
        """True once stop's grace period ran out: unfinished work is never committed."""
        return self._abandoned

    async def start(self) -> None:
        """Bind to the running loop and prepare (idempotent per loop).

        A transient failure (a lost or refused connection, lock_timeout, statement
        timeout, serialization failure, deadlock) is logged and retried with a capped
        backoff until it succeeds or ``stop()`` is called (then ``start()`` returns and
        the runtime claims nothing); any other error (``SchemaNotReady``,
        ``InvalidArgument``...) is raised at once.
        """
        self._bind(asyncio.get_running_loop())
        await self._start_bound()

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to ``loop``: from here on ``stop()`` is heard (a stopped runtime, or one
        of another loop, gets a fresh stop event)."""
        if self._loop is not loop or self.stopping:
            self._loop = loop
            self._stopping = asyncio.Event()
            self._wake = asyncio.Event()
            self._abandoned = False

    async def _start_bound(self) -> None:
        """``start()`` once bound: the thread pool, then the store, retried until it
        starts or ``stop()`` is called."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self.concurrency, thread_name_prefix=f"pgstore-{self.owner}"
            )
        await self._prepare_retrying()

    async def _prepare_retrying(self) -> None:
        assert self._stopping is not None
        attempt = 0
        while True:
            try:
                await self._prepare()
                if attempt:
                    self.emit(Reconnected(runtime=self.kind, owner=self.owner,
                                          component="store"))
                return
            except Exception as exc:
                if not is_transient(exc):
                    raise
                attempt += 1
                self.emit(ConnectionLost(runtime=self.kind, owner=self.owner, component="store",
                                         error=f"{type(exc).__name__}: {exc}"))
                pause = min(START_RETRY_FIRST * 2 ** min(attempt - 1, 32), START_RETRY_MAX)
                pause *= random.uniform(0.5, 1.0)  # runtimes started together do not retry in step
                self.log.warning("%s: start failed (attempt %d): %s: %s; retrying in %.2fs",
                                 self.owner, attempt, type(exc).__name__, exc, pause)
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=pause)
            except asyncio.TimeoutError:
                continue
            self.log.warning("%s: stopped while start was retrying", self.owner)
            return

    async def tick(self) -> int:
        """One round: claim up to the free concurrency and start running; returns how many."""
        free = self.concurrency - len(self._running)
        if free <= 0 or self.stopping:
            return 0
        try:
            pieces = await self._claim(free)
        except Exception as exc:
            self.emit(Claim(runtime=self.kind, owner=self.owner, outcome="error",
                            error=f"{type(exc).__name__}: {exc}"))
            raise
        if not pieces:
            self.emit(Claim(runtime=self.kind, owner=self.owner, outcome="empty"))
        self._start(pieces)
        return len(pieces)

    def _start(self, pieces: list[Any]) -> None:
        """Start what ``_claim`` returned: a task for each coroutine, counted as running
        until it ends. (The Dispatcher starts its runs its own way: each is a future it
        ends itself, ``pgstore.runtime.run``.)"""
        loop, running, ended = asyncio.get_running_loop(), self._running, self._ended
        for piece in pieces:
            task = loop.create_task(piece)
            running.add(task)
            task.add_done_callback(ended)

    def _refill(self) -> int:
        """How many slots must be free for a runtime to claim again: after a claim it
        claims again at once while as many are free, else it waits until the end of
        enough runs frees them (it is woken then, not at the end of its poll)."""
        return 1

    def _ended(self, task: asyncio.Future[Any]) -> None:
        self._running.discard(task)
        if (self._saturated and self._wake is not None
                and self.concurrency - len(self._running) >= self._refill()):
            self._saturated = False
            self._wake.set()

    async def wait_idle(self) -> None:
        """Wait until no work is running (for tests and a graceful stop)."""
        while self._running:
            await asyncio.wait(set(self._running))

    async def run(self, *, handle_signals: bool | None = None) -> None:
        """Claim and run until ``stop()``, SIGTERM or SIGINT; returns after a graceful stop.

        A graceful stop (``stop()``, or either signal): no new claims; running work gets
        ``grace_period`` seconds to finish and be committed; whatever is still running
        then is cancelled and abandoned (nothing is committed for it; its leases expire).

        ``handle_signals``: ``None`` (the default) makes SIGTERM and SIGINT a graceful
        stop when run in the main thread on a loop that supports signal handlers, unless
        the application handles or ignores that signal itself; elsewhere they are left
        alone. ``False`` leaves both signals alone (stop with ``stop()``); ``True``
        takes both, replacing any handler, and raises where the loop cannot. Runtimes
        run together on one loop (``asyncio.gather``) all stop on one signal. The
        handlers are removed when ``run()`` returns.

        ``stop()`` and the signals are heard from ``run()``'s first step on, before the
        store is started (``start()``, which retries a store that cannot be reached
        until it starts or is stopped): stopped while starting, it claims nothing and
        returns.
        """
        loop = asyncio.get_running_loop()
        self._bind(loop)
        taken = _signals.take(loop, self.stop, handle_signals)
        try:
            await self._start_bound()
            while not self.stopping:
                try:
                    claimed = await self.tick()
                except Exception:
                    self.log.exception("%s: claim failed; retrying after the poll interval",
                                       self.owner)
                    claimed = 0
                # It claims again at once while ``_refill()`` slots are free; with fewer
                # (full), the end of enough runs wakes it before the poll interval.
                full = self.concurrency - len(self._running) < self._refill()
                if claimed == 0 or full:
                    self._saturated = full
                    await self._idle(self.poll_interval)
                    self._saturated = False
            await self._shutdown()
        finally:
            _signals.give_back(loop, self.stop, taken)

    def run_sync(self) -> None:
        """``run()`` in a new event loop until SIGTERM / SIGINT (or ``stop()``)."""
        asyncio.run(self.run(handle_signals=threading.current_thread() is threading.main_thread()))

    @property
    def stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def stop(self) -> None:
        """Begin a graceful stop: ``run()`` claims nothing more, gives running work the
        grace period, and returns. Safe from any thread (and from a signal handler);
        a no-op before ``run()`` or ``start()`` binds the runtime to its loop (``run()``
        does so at its first step) and when already stopping."""
        loop, stopping = self._loop, self._stopping
        if loop is None or stopping is None:
            return
        if threading.current_thread() is threading.main_thread() and _in_loop(loop):
            stopping.set()
        else:
            loop.call_soon_threadsafe(stopping.set)

    def wake(self) -> None:
        """Claim now instead of at the end of the poll interval. Safe from any thread."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            loop.call_soon_threadsafe(wake.set)

    async def _shutdown(self) -> None:
        self.log.info("%s: stopping; %d running, grace %.1fs", self.owner,
                      len(self._running), self.grace_period)
        self.emit(Stopping(runtime=self.kind, owner=self.owner, running=len(self._running),
                           grace_period=self.grace_period))
        if self._running:
            await asyncio.wait(set(self._running), timeout=self.grace_period)
        if self._running:
            self._abandoned = True
            self.emit(Abandoned(runtime=self.kind, owner=self.owner, running=len(self._running)))
            self.log.warning("%s: grace period over; abandoning %d run(s), their leases "
                             "will expire", self.owner, len(self._running))
            for task in list(self._running):
                task.cancel()
            if self._running:  # a run that ends itself may be over already
                await asyncio.wait(set(self._running), timeout=1.0)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def call_user(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a user callable: ``async def`` on the loop, anything else in the thread pool."""
        if is_async_callable(fn):
            return await fn(*args)
        assert self._executor is not None, "start() first"
        loop = asyncio.get_running_loop()
        # In the caller's context (contextvars), so a trace span open around the call
        # is the parent of whatever the function opens in its thread.
        context = contextvars.copy_context()
        return await loop.run_in_executor(self._executor, lambda: context.run(fn, *args))


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
