"""What the Scheduler and the Dispatcher report: one typed event per thing that happened.

A runtime hands every event to its subscribers (``on_event=`` at construction, or
``runtime.subscribe(fn)``), in the event loop's thread, in the order things
happened, right after they happened. A subscriber must be quick and must not
block (it runs on the loop); one that raises is logged and kept, and never
changes what the runtime does. The runtime's log lines are unchanged: events are
for programs (metrics, the demo's trace, tests), logs for people.

Every event names its ``runtime`` (``"scheduler"`` or ``"dispatcher"``) and its
``owner`` (the scheduler's owner, the dispatcher's holder). ``subject`` is a task
id (scheduler) or a job's run id (dispatcher); ``token`` is the claim's fencing
token (scheduler) or the job's lease sequence (dispatcher), the number that
fences the store calls made under that lease. Times named ``*_at`` and ``now``
are epoch ms on the runtime's clock; durations are seconds on the local
monotonic clock.

The events, in the order a piece of work meets them:

* ``Registered``: the scheduler registered a declared task at start.
* ``Claim``: a claim call, per piece claimed (``claimed``), or once per round
  that claimed nothing (``empty``) or raised (``error``).
* ``Dispatch``: the dispatcher is about to call ``dispatch(job)``; ``lateness_ms``
  is ``now - dispatch_at`` at the lease.
* ``HandlerRun``: a task's handler or ``dispatch(job)`` returned, raised, lost
  its lease or was abandoned at stop, and how long it ran.
* ``Renew``: a renew of a lease the runtime holds: ``renewed``, ``refused`` or
  ``error`` (it raised; the keeper retries).
* ``Refused``: the store refused a stale holder (a renew, a complete, a
  ``mark_dispatched`` or a release made under a lease that is no longer its own).
* ``LeaseLost``: the keeper gave a lease up (``refused``, or ``expired``: no renew
  succeeded in time).
* ``Complete``: the scheduler's complete, or the dispatcher's
  ``mark_dispatched``, and its outcome.
* ``Recall``: the dispatcher recalled a bot (why, and whether ``recall`` raised).
* ``Release``: the dispatcher released a job whose dispatch raised, for a retry.
* ``ConnectionLost`` / ``Reconnected``: the dispatcher's listening connection
  (``listener``), or the store while ``start()`` retried (``store``).
* ``Purge``: the dispatcher's retention round (``purge_after``) deleted
  ``deleted`` finished jobs in ``batches`` calls of ``job_purge``, or failed.
* ``Stopping``: a graceful stop began; ``Abandoned``: its grace period ran out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Abandoned",
    "Claim",
    "Complete",
    "ConnectionLost",
    "Dispatch",
    "Event",
    "EventHub",
    "HandlerRun",
    "LeaseLost",
    "Purge",
    "Recall",
    "Reconnected",
    "Refused",
    "Registered",
    "Release",
    "Renew",
    "Stopping",
    "Subscriber",
]

RuntimeKind = Literal["scheduler", "dispatcher"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """What every event carries: which kind of runtime, and which process (its owner)."""

    runtime: RuntimeKind
    owner: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Registered(Event):
    """The scheduler registered ``task_id`` (``kind`` / ``spec`` as stored) at start."""

    task_id: str
    kind: str
    spec: str
    next_run_at: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim(Event):
    """A claim: ``claimed`` (one per piece, with its subject, token, due time and lease
    end), ``empty`` (a round that found nothing due) or ``error`` (the call raised). A
    schedule's due time is when it became claimable: its jittered ``due_at``, or a
    trigger's time."""

    outcome: Literal["claimed", "empty", "error"]
    now: int | None = None
    subject: str | None = None
    token: int | None = None
    due_at: int | None = None
    lease_until: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch(Event):
    """The dispatcher calls ``dispatch(job)`` for ``subject`` (the run id) under lease
    ``token``; ``lateness_ms`` = ``now`` (at the lease) minus ``dispatch_at``."""

    subject: str
    token: int
    dispatch_at: int
    now: int
    lateness_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerRun(Event):
    """A handler (scheduler) or ``dispatch`` (dispatcher) ended after ``duration_s``:
    ``ok``, ``error`` (it raised), ``lease_lost`` (the scheduler's keeper gave the
    lease up while it ran), or ``abandoned`` (cancelled at stop)."""

    subject: str
    token: int
    duration_s: float
    outcome: Literal["ok", "error", "lease_lost", "abandoned"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Renew(Event):
    """One renew of the lease ``token`` on ``subject``."""

    subject: str
    token: int
    outcome: Literal["renewed", "refused", "error"]
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Refused(Event):
    """The store refused a stale holder: ``operation`` was made under lease ``token``,
    which is no longer this runtime's (expired and taken, or superseded)."""

    operation: Literal["renew", "complete", "mark_dispatched", "release"]
    subject: str
    token: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseLost(Event):
    """The keeper gave the lease up: the store ``refused`` a renew, or renews kept
    failing until the local deadline (``expired``)."""

    subject: str
    token: int
    reason: Literal["refused", "expired"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Complete(Event):
    """The scheduler's ``complete`` (``status`` the run's ``ok`` / ``error``, or
    ``skipped``: a missed occurrence completed without running, catch-up ``skip``) or the
    dispatcher's ``mark_dispatched`` (``worker_id`` the bot), after ``attempts`` tries.

    ``completed``: committed. ``cancelled`` (dispatcher): recorded, but a cancel
    arrived meanwhile (the bot is recalled). ``rejected``: a stale claim, nothing
    written. ``failed``: no attempt answered (the lease will expire).
    """

    subject: str
    token: int
    outcome: Literal["completed", "cancelled", "rejected", "failed"]
    attempts: int
    status: str | None = None
    next_run_at: int | None = None
    worker_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Recall(Event):
    """The dispatcher recalled ``worker_id`` from ``subject``: the job was ``cancelled``
    meanwhile, its lease was ``taken``, or the mark went ``unrecorded``; ``outcome``
    ``ok``, ``error`` (``recall`` raised) or ``none`` (no ``recall`` was given)."""

    subject: str
    token: int
    worker_id: str | None
    reason: Literal["cancelled", "taken", "unrecorded"]
    outcome: Literal["ok", "error", "none"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Release(Event):
    """The dispatcher released ``subject`` after failed attempt ``attempt`` of its
    dispatch: for a retry at ``retry_at`` (``released``), or for good, its last attempt
    spent (``failed``, ``retry_at`` None); ``refused`` when no longer held, ``error``
    when the release raised (``retry_at`` None)."""

    subject: str
    token: int
    attempt: int
    retry_at: int | None
    outcome: Literal["released", "failed", "refused", "error"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLost(Event):
    """``component`` lost its connection (``listener``) or could not reach the store
    at start (``store``); the runtime keeps trying."""

    component: Literal["listener", "store"]
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconnected(Event):
    """``component`` is connected again after ``ConnectionLost``."""

    component: Literal["listener", "store"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stopping(Event):
    """A graceful stop began with ``running`` pieces of work and ``grace_period`` s."""

    running: int
    grace_period: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Abandoned(Event):
    """The grace period ran out with ``running`` pieces of work; none is committed."""

    running: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Purge(Event):
    """One retention round: jobs finished before ``before`` deleted (``deleted`` in
    ``batches`` calls), ``ok``, or ``error`` (the round stopped; the next one retries)."""

    before: int | None
    deleted: int
    batches: int
    outcome: Literal["ok", "error"]
    error: str | None = None


#: A subscriber: called with each event, on the loop's thread.
Subscriber = Callable[[Event], object]


class EventHub:
    """A runtime's subscribers, and the one place events are handed to them."""

    def __init__(self, log: logging.Logger) -> None:
        self._subscribers: tuple[Subscriber, ...] = ()
        self._log = log
        #: True when someone listens (events need not be built otherwise): kept with the
        #: subscribers, a plain attribute, since the runtime reads it several times a job.
        self.active = False

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Hand every later event to ``subscriber``; returns the function that stops it."""
        self._subscribers = (*self._subscribers, subscriber)
        self.active = True

        def unsubscribe() -> None:
            self._subscribers = tuple(s for s in self._subscribers if s is not subscriber)
            self.active = bool(self._subscribers)

        return unsubscribe

    def emit(self, event: Event) -> None:
        """Hand ``event`` to every subscriber; one that raises is logged, never raised."""
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception:
                self._log.exception("event subscriber %r raised on %s", subscriber,
                                    type(event).__name__)
