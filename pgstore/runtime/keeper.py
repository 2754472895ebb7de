"""The lease keeper the Scheduler and the Dispatcher share.

A keeper renews one lease every third of its length while the work runs, and
never dies silently: every failure of a renew (the clock read included) is
logged and retried, and it ends in exactly two ways:

* cancelled by its owner once the work is done (the normal end), or
* lease lost: the store refused a renew (answered False, or raised a permanent
  error: ``InvalidArgument``, never retried), or renews kept failing (raising, or
  hanging) until the local deadline. The deadline is measured with the local
  monotonic clock from the moment before the clock read of the last renew that
  succeeded (or of the claim), at ``1 - MARGIN`` of the lease: the holder
  gives up before the lease can expire on the server and be claimed
  elsewhere. ``on_lost(reason)`` is called once, then the keeper returns.

A renew may be refused because the run's own last call ended the lease: the
Scheduler's complete, the Dispatcher's mark, sent while the keeper still renews
(through their retries). Such a renew was overtaken (``Overtaken``), not
refused to a stale holder: once that call is sent (``ending()``), a refusal ends
the keeper quietly, with no ``Renew``, ``Refused`` or ``LeaseLost``, and that
call's own answer says what happened (a lease lost meanwhile is refused there).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, Literal

from pgstore.runtime.events import Event, Refused, Renew, RuntimeKind
from pgstore.runtime.transient import is_permanent

#: The share of the lease kept as a margin: a keeper whose renews fail declares the
#: lease lost at ``(1 - MARGIN) * lease`` after the last successful renew (or the claim).
MARGIN = 0.2

#: The longest pause between retries of a failed renew (seconds).
RETRY_PAUSE_MAX = 1.0

#: Why a keeper ended a run: the store said no, or the deadline passed without a renew.
LostReason = Literal["refused", "expired"]
REFUSED: Final = "refused"
EXPIRED: Final = "expired"


class Overtaken(Exception):
    """A renew refused after the run's own last call (a complete, a mark) was sent."""


class Ending:
    """Whether the call that ends a lease (a complete, a mark) has been sent: ``sent``
    set once, just before its first attempt."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False

    def __call__(self) -> bool:
        return self.sent


def reported(
    renew: Callable[[], Awaitable[bool]],
    emit: Callable[[Event], None],
    *,
    runtime: RuntimeKind,
    owner: str,
    subject: str,
    token: int,
    ending: Callable[[], bool],
) -> Callable[[], Awaitable[bool]]:
    """``renew`` with each answer reported, as both runtimes report it: ``Renew``
    (``renewed``, ``refused``, or ``error`` with what it raised, then raised again)
    and, for a refusal, ``Refused`` (operation ``renew``). A refusal once the lease's
    last call was sent (``ending()``) raises ``Overtaken`` and reports nothing."""

    async def renew_reported() -> bool:
        try:
            renewed = await renew()
        except Exception as exc:
            emit(Renew(runtime=runtime, owner=owner, subject=subject, token=token,
                       outcome="error", error=f"{type(exc).__name__}: {exc}"))
            raise
        if not renewed and ending():
            raise Overtaken
        emit(Renew(runtime=runtime, owner=owner, subject=subject, token=token,
                   outcome="renewed" if renewed else "refused"))
        if not renewed:
            emit(Refused(runtime=runtime, owner=owner, operation="renew", subject=subject,
                         token=token))
        return renewed

    return renew_reported


async def keep_lease(
    renew: Callable[[], Awaitable[bool]],
    *,
    lease_ms: int,
    anchor: float,
    what: str,
    owner: str,
    log: logging.Logger,
    on_lost: Callable[[LostReason], None],
) -> None:
    """Renew a lease until cancelled; call ``on_lost(REFUSED | EXPIRED)`` if it is lost.

    ``renew()`` reads the clock and renews (True: renewed, False: refused);
    ``anchor`` is ``time.monotonic()`` taken before the clock read of the claim;
    ``what`` names the lease in log lines (``report token 3``, a run id).
    """
    lease = lease_ms / 1000
    every = lease / 3
    retry_pause = min(every / 4, RETRY_PAUSE_MAX)
    last_ok = anchor
    next_at = anchor + every
    failures = 0
    while True:
        deadline = last_ok + lease * (1 - MARGIN)
        await asyncio.sleep(max(0.0, min(next_at, deadline) - time.monotonic()))
        sent = time.monotonic()
        if sent >= deadline:
            log.error("%s: no renew of %s for %.1fs (%d failed attempt(s)): lease lost "
                      "before it can expire", owner, what, sent - last_ok, failures)
            on_lost(EXPIRED)
            return
        try:
            # A renew that hangs (a pool waiting for a connection, a dead network)
            # must not outlast the deadline.
            renewed = await asyncio.wait_for(renew(), timeout=deadline - sent)
        except Overtaken:
            log.debug("%s: renew of %s refused after its last call was sent: that "
                      "call's answer tells", owner, what)
            return
        except Exception as exc:
            if is_permanent(exc):
                # A bad argument (nothing changed) is refused again by every retry.
                log.error("%s: renew of %s refused: %s: %s; lease lost", owner, what,
                          type(exc).__name__, exc)
                on_lost(REFUSED)
                return
            failures += 1
            log.warning("%s: renew of %s failed (attempt %d): %s: %s; retrying", owner, what,
                        failures, type(exc).__name__, exc)
            next_at = time.monotonic() + retry_pause
            continue
        if not renewed:
            log.warning("%s: renew of %s refused: lease lost", owner, what)
            on_lost(REFUSED)
            return
        if failures:
            log.info("%s: renew of %s succeeded after %d failed attempt(s)", owner, what,
                     failures)
        failures = 0
        last_ok = sent
        next_at = sent + every
