"""Hostile NOTIFY payloads on the job channel, sent by a role with no grants at all.

NOTIFY needs no privilege, so any role that can connect can send anything on
``<schema>.jobs``. The Dispatcher's listener must ignore what is not a
dispatch time, stay on the same backend (no reconnect), keep waking for real
jobs during a flood, and turn a burst of notifications into a few wake-ups.
Every check uses a real server, a real LISTEN and NOTIFYs from a separate
connection of that role.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgstore import Job, PgJobStore
from pgstore.postgres import listen as _listen
from pgstore.runtime.dispatcher import Dispatcher

BIGINT_MAX = 2**63 - 1

#: Payloads that are not a dispatch time, one per class of trick.
HOSTILE = [
    "9" * 400,  # huge: crashed the float division in the wake-up at 92fd73e
    "9" * 7_000,  # longer than Python's int() accepts by default
    str(BIGINT_MAX + 1),
    "-5",
    "-0",
    "+5",
    "1.5",
    "1e3",
    "inf",
    "nan",
    "0x10",
    "1_000",
    "",
    " ",
    "abc",
    " 5",
    "5 ",
    "\t5",
    "5\n",
    "\u0661\u0662",  # Arabic-Indic digits: int() accepts them
    "\uff11\uff12",  # fullwidth digits
    "\u00b2",  # superscript two
    "5\u00a0",  # no-break space
]

WAIT = 20.0  # generous: only a broken wake-up path comes anywhere near it


class CountingJobStore(PgJobStore):
    """The real store, counting ``job_lease`` calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.leases = 0

    def lease(
        self, holder: str, now: int | None, ttl_ms: int, queues: Sequence[str] | None = None
    ) -> Job | None:
        with self._lock:
            self.leases += 1
        return super().lease(holder, now, ttl_ms, queues)


@pytest.fixture
def intruder(pgstore_database: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of a fresh login role that was granted nothing."""
    dsn = pgstore_database
    role = f"pgstore_intruder_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        with psycopg.connect(make_conninfo(dsn, user=role), autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")  # a faster flood, as an attacker would
            yield conn
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _channel(dsn: str, schema: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT {}.job_channel()").format(sql.Identifier(schema))
        ).fetchone()
    assert row is not None
    return str(row[0])


def _listener_pids(dsn: str, channel: str) -> list[int]:
    """Backends whose last statement was the dispatcher's LISTEN on ``channel``."""
    listen = sql.SQL("LISTEN {}").format(sql.Identifier(channel)).as_string()
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE query = %s ORDER BY pid", (listen,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def _notify(conn: psycopg.Connection[Any], channel: str, payload: str) -> None:
    conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def _until(check: Any, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Running:
    """A Dispatcher with a 60 s poll, run in a thread of its own until ``stop``."""

    def __init__(self, dsn: str, schema: str, listen: bool | str = True) -> None:
        self.store = CountingJobStore(dsn, schema=schema)
        self.dispatched: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.dispatcher = Dispatcher(self.store, self._dispatch, holder="hostile-test",
                                     poll_interval=60.0, listen=listen)
        self.thread = threading.Thread(target=self.dispatcher.run_sync, daemon=True)

    def _event(self, run_id: str) -> threading.Event:
        with self._lock:
            return self.dispatched.setdefault(run_id, threading.Event())

    def _dispatch(self, job: Job) -> str:
        self._event(job.run_id).set()
        return "w"

    def wait_dispatched(self, run_id: str, timeout: float = WAIT) -> bool:
        return self._event(run_id).wait(timeout)

    def start(self, dsn: str, channel: str) -> int:
        """Start, and return the listening backend's pid once it listens and the
        dispatcher's start-up claims are done."""
        self.thread.start()
        pids: list[int] = []

        def listening() -> bool:
            pids.extend(_listener_pids(dsn, channel))
            return bool(pids)

        assert _until(listening)
        assert len(pids) == 1, pids
        # The first tick and the listener's look on connect: two job_lease calls.
        assert _until(lambda: self.store.leases >= 2)
        return pids[0]

    def stop(self) -> None:
        self.dispatcher.stop()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()
        self.store.close()


@pytest.fixture
def running(pgstore_database: str, pgstore_schema: str) -> Iterator[Running]:
    runner = Running(pgstore_database, pgstore_schema)
    try:
        yield runner
    finally:
        if runner.thread.is_alive():
            runner.stop()


@pytest.fixture
def producer(pgstore_database: str, pgstore_schema: str) -> Iterator[PgJobStore]:
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    store.start()
    yield store
    store.close()


def test_the_intruder_has_no_grants_but_can_notify(
    pgstore_database: str, pgstore_schema: str, intruder: psycopg.Connection[Any]
) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        intruder.execute(
            sql.SQL("SELECT {}.job_channel()").format(sql.Identifier(pgstore_schema))
        )
    _notify(intruder, f"{pgstore_schema}.jobs", "0")  # no privilege needed


def test_the_listener_ignores_every_hostile_payload_on_the_same_backend(
    pgstore_database: str, pgstore_schema: str, intruder: psycopg.Connection[Any],
    running: Running, producer: PgJobStore,
) -> None:
    channel = _channel(pgstore_database, pgstore_schema)
    assert channel == f"{pgstore_schema}.jobs"
    pid = running.start(pgstore_database, channel)
    assert _until(lambda: running.store.leases >= 2)
    time.sleep(0.3)  # idle in its poll wait
    before = running.store.leases

    for payload in HOSTILE:
        _notify(intruder, channel, payload)
    # Delivered in commit order: once the dispatcher has woken for this one, it
    # has seen every hostile payload before it.
    _notify(intruder, channel, "0")
    assert _until(lambda: running.store.leases > before)
    time.sleep(0.5)
    # Only the last, well-formed payload woke it: one job_lease call, no more.
    assert running.store.leases == before + 1

    producer.schedule("real", producer.now_ms())
    assert running.wait_dispatched("real")  # still listening: the poll is 60 s
    assert _listener_pids(pgstore_database, channel) == [pid]  # never reconnected
    running.stop()


def test_a_real_job_is_woken_for_during_a_hostile_flood(
    pgstore_database: str, pgstore_schema: str, intruder: psycopg.Connection[Any],
    running: Running, producer: PgJobStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A listener that fell over would come back only after a minute, and the poll
    # is a minute too: within WAIT only a wake-up can reach the job.
    monkeypatch.setattr(_listen, "RECONNECT_PAUSE", 60.0)
    channel = f"{pgstore_schema}.jobs"
    pid = running.start(pgstore_database, channel)

    cycles = 0
    stop = threading.Event()
    errors: list[BaseException] = []

    def flood() -> None:
        nonlocal cycles
        try:
            while not stop.is_set():
                for payload in HOSTILE:
                    _notify(intruder, channel, payload)
                now = int(time.time() * 1000)
                for payload in ("0", str(now), str(now + 50), str(now + 400),
                                str(now + 3_600_000), str(BIGINT_MAX)):
                    _notify(intruder, channel, payload)
                cycles += 1
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        assert _until(lambda: cycles >= 3)
        for n in range(3):
            started = time.monotonic()
            producer.schedule(f"real-{n}", producer.now_ms())
            assert running.wait_dispatched(f"real-{n}"), f"real-{n} not leased"
            print(f"real-{n} leased after {time.monotonic() - started:.3f} s of flood")
        # A job due shortly: the one pending timer still fires for it.
        producer.schedule("soon", producer.now_ms() + 300)
        assert running.wait_dispatched("soon"), "soon not leased"
    finally:
        stop.set()
        flooder.join(WAIT)
    assert not errors, errors
    print(f"{cycles} flood cycles of {len(HOSTILE) + 6} payloads")
    assert _listener_pids(pgstore_database, channel) == [pid]
    running.stop()


def test_a_burst_of_due_now_payloads_wakes_the_dispatcher_a_few_times(
    pgstore_database: str, pgstore_schema: str, intruder: psycopg.Connection[Any],
    running: Running, producer: PgJobStore,
) -> None:
    channel = f"{pgstore_schema}.jobs"
    running.start(pgstore_database, channel)

    started = time.monotonic()
    for _ in range(2_000):
        _notify(intruder, channel, "0")
    sent = time.monotonic() - started
    # Delivered in commit order: once this is leased, the listener has seen all 2,000.
    producer.schedule("sentinel", producer.now_ms())
    assert running.wait_dispatched("sentinel")
    time.sleep(1.0)  # any deferred wake-up has fired by now
    elapsed = time.monotonic() - started
    # The rate limit's own bound for the time the flood lasted (the sending is slower on
    # a loaded machine): a burst, then one wake-up per WAKE_EVERY, each a lease or two
    # (the sentinel's). Without coalescing, the same flood made 228 to 497 calls.
    bound = _listen.WAKE_BURST + math.ceil(elapsed / _listen.WAKE_EVERY) + 2
    print(f"2,000 payloads sent in {sent:.2f} s; {running.store.leases} job_lease calls "
          f"(bound {bound} for {elapsed:.2f} s)")
    assert running.store.leases <= bound
    running.stop()


def test_a_payload_the_client_encoding_cannot_hold_does_not_end_the_session(
    pgstore_database: str, pgstore_schema: str, intruder: psycopg.Connection[Any],
    producer: PgJobStore,
) -> None:
    # The server ends a session (FATAL) that it cannot convert a notification for;
    # the listener asks for UTF-8, which holds every payload of a UTF-8 database.
    latin1 = make_conninfo(pgstore_database, client_encoding="LATIN1")
    runner = Running(pgstore_database, pgstore_schema, listen=latin1)
    try:
        channel = f"{pgstore_schema}.jobs"
        pid = runner.start(pgstore_database, channel)
        for payload in ("\u0661\u0662", "5\u20ac", "\U0001f600"):
            _notify(intruder, channel, payload)
        producer.schedule("real", producer.now_ms())
        assert runner.wait_dispatched("real")
        assert _listener_pids(pgstore_database, channel) == [pid]  # never reconnected
        runner.stop()
    finally:
        if runner.thread.is_alive():
            runner.stop()


def test_the_payload_parser_accepts_only_a_bigint_in_decimal() -> None:
    from pgstore.postgres.listen import parse_dispatch_at

    for payload in HOSTILE:
        assert parse_dispatch_at(payload) is None, repr(payload)
    assert parse_dispatch_at("0") == 0
    assert parse_dispatch_at("1700000000000") == 1_700_000_000_000
    assert parse_dispatch_at(str(BIGINT_MAX)) == BIGINT_MAX
    assert parse_dispatch_at("007") == 7


def test_wakeups_coalesce_and_keep_one_timer_for_the_earliest_time() -> None:
    from pgstore.postgres.listen import Wakeups

    async def main() -> None:
        woken: list[float] = []
        loop = asyncio.get_running_loop()
        now_ms = [1_000_000]
        wakeups = Wakeups(lambda: woken.append(loop.time()), horizon=60.0,
                          clock_ms=lambda: now_ms[0])

        wakeups.hint(now_ms[0] + 61_000)  # beyond the poll: no timer at all
        assert wakeups._timer is None

        for _ in range(1_000):  # received together: one wake-up, after the drain
            wakeups.hint(0)
        assert woken == []
        await asyncio.sleep(0.05)
        assert len(woken) == 1

        # One timer, for the earliest of many future times; a due-now hint in
        # between does not lose them.
        for delay in range(30_000, 100, -100):
            wakeups.hint(now_ms[0] + delay)
        timers = [wakeups._timer]
        wakeups.hint(now_ms[0])
        timers.append(wakeups._timer)
        await asyncio.sleep(0.05)
        assert len(woken) == 2
        assert wakeups._future[0] == now_ms[0] + 200
        assert len(wakeups._future) <= _listen.MAX_FUTURE
        assert wakeups._timer is not None and wakeups._timer not in timers
        now_ms[0] += 200  # the earliest one falls due before its timer (0.2 s) fires
        await asyncio.sleep(0.4)
        assert len(woken) == 3
        assert wakeups._future[0] == now_ms[0] + 100
        wakeups.cancel()
        assert wakeups._timer is None and not wakeups._future

    asyncio.run(main())


def test_wakeups_are_rate_limited_after_a_burst() -> None:
    from pgstore.postgres.listen import WAKE_BURST, WAKE_EVERY, Wakeups

    async def main() -> None:
        woken: list[float] = []
        loop = asyncio.get_running_loop()
        wakeups = Wakeups(lambda: woken.append(loop.time()), horizon=60.0)
        started = loop.time()
        hints = 0
        while loop.time() - started < 0.8:  # a due-now hint every millisecond or so
            wakeups.hint(0)
            hints += 1
            await asyncio.sleep(0.001)
        await asyncio.sleep(2 * WAKE_EVERY)
        wakeups.cancel()
        # A burst at once, then one per WAKE_EVERY: a bound that holds however slow
        # the machine, since it is counted against the time the last one happened.
        assert WAKE_BURST < len(woken) <= WAKE_BURST + (woken[-1] - started) / WAKE_EVERY + 1
        assert hints > 2 * len(woken)

    asyncio.run(main())
