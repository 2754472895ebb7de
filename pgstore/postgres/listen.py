"""LISTEN for ``job_schedule``'s notifications, on a connection of its own.

A notification is only a hint that a job may be due: it wakes the dispatcher,
which still leases through ``job_lease``, and polling remains the fallback
(a lost listening connection reconnects after a pause; the poll covers the
gap). NOTIFY needs no privilege, so any role that can connect can send anything
on the channel. Hence:

* the listening session asks for client encoding UTF-8, so that the server
  never has to end it over a payload it cannot convert;
* a payload counts only if it is a decimal integer in bigint range
  (``parse_dispatch_at``); anything else is ignored, never raised, and logged at
  most once per ``IGNORED_LOG_EVERY`` seconds;
* hints are coalesced (``Wakeups``): everything already received is drained
  before one wake-up, at most ``WAKE_BURST`` wake-ups happen at once and then
  one per ``WAKE_EVERY`` seconds, and one pending timer serves the earliest
  future dispatch time (times beyond the poll interval need none).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import re
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

#: Seconds between attempts to re-open a lost listening connection.
RECONNECT_PAUSE = 2.0
#: Wake-ups allowed back to back, and the seconds that earn one more after them.
WAKE_BURST = 4
WAKE_EVERY = 0.2
#: Future dispatch times remembered for a timer; later ones are left to the poll.
MAX_FUTURE = 64
#: Seconds between two log lines about ignored payloads.
IGNORED_LOG_EVERY = 60.0

BIGINT_MAX = 2**63 - 1
_DECIMAL = re.compile(r"[0-9]{1,19}")  # ASCII digits only: no sign, space or '\u0661'


def parse_dispatch_at(payload: str) -> int | None:
    """The dispatch time (epoch ms) in a notification payload, or None when the payload
    is anything but ASCII decimal digits for a value in ``[0, 2**63 - 1]``."""
    if _DECIMAL.fullmatch(payload) is None:
        return None
    value = int(payload)
    return value if value <= BIGINT_MAX else None


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Wakeups:
    """Turns hints ("a job may be due at ``dispatch_at``") into few ``wake()`` calls.

    Runs on the event loop. A hint due now asks for a wake-up at the next turn of
    the loop, so hints received together cost one; a hint due within ``horizon``
    seconds asks for one at its time, through a single timer for the earliest one;
    a later hint is dropped (the poll is sooner). Wake-ups are rate limited: at most
    ``burst`` at once, then one per ``every`` seconds; a hint in between waits for
    the next allowed one and shares it with every hint that arrives meanwhile.
    """

    def __init__(
        self,
        wake: Callable[[], None],
        horizon: float,
        *,
        burst: int = WAKE_BURST,
        every: float = WAKE_EVERY,
        clock_ms: Callable[[], int] = _wall_ms,
    ) -> None:
        self.wake = wake
        self.horizon_ms = horizon * 1000
        self.burst = burst
        self.every = every
        self.clock_ms = clock_ms
        self._due_now = False
        self._future: list[int] = []  # ascending, distinct, at most MAX_FUTURE
        self._timer: asyncio.TimerHandle | None = None
        self._tokens = float(burst)
        self._stamp = 0.0  # loop time of the last token count

    def hint(self, dispatch_at: int) -> None:
        """A job may be due at ``dispatch_at`` (epoch ms)."""
        now_ms = self.clock_ms()
        if dispatch_at <= now_ms:
            self._due_now = True
        elif dispatch_at - now_ms < self.horizon_ms:
            at = bisect.bisect_left(self._future, dispatch_at)
            if at >= MAX_FUTURE or (at < len(self._future) and self._future[at] == dispatch_at):
                return
            self._future.insert(at, dispatch_at)
            del self._future[MAX_FUTURE:]
        else:
            return
        self._arm()

    def cancel(self) -> None:
        """Forget every pending hint."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due_now = False
        self._future.clear()

    def _tokens_at(self, now: float) -> float:
        return min(float(self.burst), self._tokens + (now - self._stamp) / self.every)

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._due_now:
            at = now
        elif self._future:
            at = now + (self._future[0] - self.clock_ms()) / 1000
        else:
            return
        tokens = self._tokens_at(now)
        if tokens < 1:
            at = max(at, now + (1 - tokens) * self.every)
        if self._timer is not None:
            if self._timer.when() <= at:
                return
            self._timer.cancel()
        self._timer = loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now_ms = self.clock_ms()
        cut = bisect.bisect_right(self._future, now_ms)
        if self._due_now or cut:
            self._due_now = False
            del self._future[:cut]
            now = asyncio.get_running_loop().time()
            self._tokens, self._stamp = max(0.0, self._tokens_at(now) - 1), now
            self.wake()
        self._arm()


class JobListener:
    """LISTENs on ``schema``'s ``job_channel()`` and calls ``wake()`` when a job may be
    due: at (re)connect, and for notified dispatch times, coalesced by ``Wakeups``
    with ``horizon`` (seconds, the poll interval) beyond which no timer is set.

    A wake-up is only a hint; the caller still leases through ``job_lease`` and keeps
    polling. Bad payloads are ignored: nothing a notification carries raises out of
    the listener or makes it reconnect. ``on_connection`` hears of the connection:
    ``None`` each time it LISTENs, the error (one line) each time it is lost.
    """

    def __init__(
        self,
        conninfo: str,
        schema: str,
        wake: Callable[[], None],
        horizon: float,
        log: logging.Logger,
        name: str = "dispatcher",
        on_connection: Callable[[str | None], None] | None = None,
    ) -> None:
        self.name = name
        self.on_connection = on_connection
        self.conninfo = conninfo
        self.schema = schema
        self.wakeups = Wakeups(wake, horizon)
        self.log = log
        self.listening = asyncio.Event()
        self.ignored = 0  #: payloads ignored so far
        self._ignored_logged = 0
        self._ignored_log_at = float("-inf")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._listen())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.wakeups.cancel()

    async def _listen(self) -> None:
        while True:
            try:
                await self._listen_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.listening.clear()
                self.log.warning("%s: job listener on %r: %s; polling until it reconnects",
                                 self.name, self.schema, exc)
                self._tell(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(RECONNECT_PAUSE)

    async def _listen_once(self) -> None:
        # The server ends a session it cannot convert a notification for (FATAL), so
        # the listener asks for UTF-8 whatever the conninfo says: in a UTF-8 database,
        # every payload converts. (A SQL_ASCII database can still hold payloads that
        # are not UTF-8; there the listener reconnects after RECONNECT_PAUSE.)
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, client_encoding="UTF8"
        )
        async with conn:
            cur = await conn.execute(
                sql.SQL("SELECT {}.job_channel()").format(sql.Identifier(self.schema))
            )
            row = await cur.fetchone()
            assert row is not None
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(str(row[0]))))
            self.listening.set()
            self._tell(None)
            # Jobs scheduled while the listener was not yet listening: look once.
            self.wakeups.hint(0)
            async for note in conn.notifies():
                self._received(note.payload)

    def _tell(self, error: str | None) -> None:
        if self.on_connection is None:
            return
        try:
            self.on_connection(error)
        except Exception:
            self.log.exception("%s: job listener's on_connection raised", self.name)

    def _received(self, payload: str) -> None:
        dispatch_at = parse_dispatch_at(payload)
        if dispatch_at is None:
            self._ignore(payload)
        else:
            self.wakeups.hint(dispatch_at)

    def _ignore(self, payload: str) -> None:
        self.ignored += 1
        now = time.monotonic()
        if now - self._ignored_log_at >= IGNORED_LOG_EVERY:
            self.log.warning(
                "%s: job listener on %r ignored %d payload(s) that are not a dispatch "
                "time (the latest: %.40r); anyone who can connect can NOTIFY",
                self.name, self.schema, self.ignored - self._ignored_logged, payload)
            self._ignored_logged, self._ignored_log_at = self.ignored, now


class Listens:
    """What both PostgreSQL job stores offer a runtime: the ``WakeupSource`` protocol
    (``pgstore.protocols``), a mixin of the store classes."""

    @property
    def schema(self) -> str:
        raise NotImplementedError

    def conninfo(self) -> str:
        raise NotImplementedError

    def job_wakeups(
        self,
        wake: Callable[[], None],
        horizon: float,
        *,
        log: logging.Logger,
        name: str,
        conninfo: str | None = None,
        on_connection: Callable[[str | None], None] | None = None,
    ) -> JobListener:
        """A ``JobListener`` on ``conninfo``, else this store's database (the
        ``WakeupSource`` protocol, ``pgstore.protocols``): not yet started."""
        return JobListener(conninfo or self.conninfo(), self.schema, wake, horizon, log, name,
                           on_connection)
