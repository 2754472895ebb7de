"""The queue limits under real concurrency: parallel connections leasing at once.

What it proves, against a real server, trial after trial:

* a concurrency limit of C: 8 leasers, each on its own connection, lease a queue's
  jobs (single ``job_lease``, batches of 1 to 6 with ``job_lease_many``, or both), hold
  each for a moment, then mark it dispatched or release it for a retry. At no moment do
  more than C leases of the queue live: neither in the leasers' own bookkeeping (a
  lease counts from its lease's return until just before its mark or release is sent:
  never longer than it really lives) nor in any snapshot of a monitor connection
  polling the jobs table all along. The limit is reached (C leases at once), and every
  job is dispatched in the end;
* a rate limit of R per period P: the same leasers with the database clock; the
  ``now`` of every lease (its lease_until less the ttl) is logged, and no window of P
  holds more than R of them; a queue with both limits holds both, the concurrency limit
  the smaller (each row one concurrency place, several rate places) or the larger (each
  row several concurrency places);
* both limits changed again and again (lowered, raised, lifted) while the leasers
  lease and renew: no error, and once the changes stop, the last limits hold exactly;
* the concurrency limit lowered and raised again and again while the leasers lease: a
  lease that starts (live at a monitor's poll, not at the one before, no change between)
  finds the live leases within the limit, also while leases over a lowered limit live;
* leases that hold places, renewed again and again while two changers lay the lanes out
  back to back: every renew answers true;
* a leaser in a REPEATABLE READ transaction whose snapshot predates another leaser's
  lease either gets a serialization failure (40001) or leases within the limit, never
  beyond it; a mark it cannot see keeps the row busy.

Without the rule that only the job's positive evidence frees a busy row (had a row
been free whenever no job "holds" it in the leaser's snapshot), the monitor sees C + 1
leases within a trial or two: a leaser re-checks a row another just took with its own,
older snapshot of jobs (EvalPlanQual), in which that lease does not exist yet.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

from pgstore import Job, PgJobStore

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("queue_limit_concurrency")]

WORKERS = 8
BARRIER_TIMEOUT = 30.0
LONG_TTL = 600_000  # the concurrency trials end leases by mark or release only


@pytest.fixture
def connect(pgstore_database: str) -> Iterator[Callable[[], psycopg.Connection[Any]]]:
    conns: list[psycopg.Connection[Any]] = []

    def make() -> psycopg.Connection[Any]:
        conn = psycopg.connect(pgstore_database, autocommit=True)
        conns.append(conn)
        return conn

    try:
        yield make
    finally:
        for conn in conns:
            conn.close()


def _lease(store: PgJobStore, rnd: random.Random, mode: str, holder: str,
           now: int | None, ttl: int, queues: list[str] | None) -> list[Job]:
    single = mode == "single" or (mode == "mixed" and rnd.random() < 0.5)
    if single:
        job = store.lease(holder, now, ttl, queues=queues)
        return [] if job is None else [job]
    return store.lease_many(holder, now, ttl, rnd.randint(1, 6), queues=queues)


class Live:
    """The leases of the limited queue the leasers know they hold, by run_id."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: set[str] = set()
        self.most = 0
        self.over: list[int] = []
        self.lock = threading.Lock()

    def add(self, run_ids: list[str]) -> None:
        with self.lock:
            self.held.update(run_ids)
            self.most = max(self.most, len(self.held))
            if len(self.held) > self.limit:
                self.over.append(len(self.held))

    def drop(self, run_id: str) -> None:
        with self.lock:
            self.held.discard(run_id)


def _monitor(conn: psycopg.Connection[Any], schema: str, limit: int,
             stop: threading.Event) -> tuple[int, int]:
    """Poll the live leases of queue 'lim' until ``stop``: (polls, most seen at once)."""
    query = sql.SQL(
        "SELECT count(*) FROM {}.jobs WHERE queue = 'lim' AND lease_holder IS NOT NULL"
        " AND lease_until > {}.now_ms() AND NOT dispatched AND NOT failed"
    ).format(sql.Identifier(schema), sql.Identifier(schema))
    polls = most = 0
    while not stop.is_set():
        row = conn.execute(query).fetchone()
        assert row is not None
        polls += 1
        most = max(most, row[0])
    return polls, most


@pytest.mark.parametrize("rate", [None, 9])
@pytest.mark.parametrize("mode", ["single", "batch", "mixed"])
@pytest.mark.parametrize("limit", [1, 3])
def test_concurrency_limit_holds_with_many_leasers(
    connect: Callable[[], psycopg.Connection[Any]], pgstore_schema: str, mode: str,
    limit: int, rate: int | None,
) -> None:
    trials, jobs = 4, 150
    stores = [PgJobStore(connect(), schema=pgstore_schema) for _ in range(WORKERS + 1)]
    setup = stores[-1]
    monitor_conn = connect()
    setup.set_queue_concurrency("lim", limit)
    # With a rate limit too (9 a ms, rarely the one that binds): each lane holds one
    # concurrency place and several rate places.
    setup.set_queue_rate("lim", rate, None if rate is None else 1)
    for trial in range(trials):
        ids = [f"t{trial}-lim-{i}" for i in range(jobs)]
        setup.schedule_many(ids, [0] * jobs, queue="lim")
        setup.schedule_many([f"t{trial}-free-{i}" for i in range(jobs)], [0] * jobs,
                            queue="free")
        live = Live(limit)
        barrier = threading.Barrier(WORKERS)
        stop = threading.Event()

        def work(w: int, trial: int = trial, live: Live = live,
                 barrier: threading.Barrier = barrier) -> int:
            rnd = random.Random(trial * 100 + w)
            store = stores[w]
            holder = f"w{w}"
            barrier.wait(BARRIER_TIMEOUT)
            idle = leased = 0
            while idle < 40:
                queues = rnd.choice([None, ["lim"], ["lim", "free"]])
                got = _lease(store, rnd, mode, holder, None, LONG_TTL, queues)
                if not got:
                    idle += 1
                    time.sleep(0.001)
                    continue
                idle = 0
                leased += len(got)
                live.add([j.run_id for j in got if j.queue == "lim"])
                time.sleep(rnd.random() * 0.003)
                for job in got:
                    live.drop(job.run_id)
                    if rnd.random() < 0.8:
                        assert store.mark_dispatched(
                            job.run_id, holder, "bot", job.lease_sequence).recorded
                    else:
                        assert store.release(job.run_id, holder, 0, job.lease_sequence)
            return leased

        with ThreadPoolExecutor(WORKERS + 1) as pool:
            watch = pool.submit(_monitor, monitor_conn, pgstore_schema, limit, stop)
            results = [pool.submit(work, w) for w in range(WORKERS)]
            try:
                leased = sum(f.result() for f in results)
            finally:
                stop.set()
            polls, seen = watch.result()
        assert live.over == [], f"trial {trial}: the leasers held {live.over}"
        assert seen <= limit, f"trial {trial}: the monitor saw {seen} live leases"
        assert live.most == limit, f"trial {trial}: the limit was never reached"
        assert polls > 0 and leased >= 2 * jobs
        for job in setup.lease_many("check", None, LONG_TTL, 10):
            pytest.fail(f"trial {trial}: {job.run_id} was left undispatched")


def _windows_hold(nows: list[int], limit: int, period: int) -> list[tuple[int, int]]:
    """The leases (first, (limit+1)-th) that fall within one window of ``period``."""
    nows = sorted(nows)
    return [(nows[i], nows[i + limit]) for i in range(len(nows) - limit)
            if nows[i + limit] - nows[i] < period]


@pytest.mark.parametrize("concurrency", [None, 2, 8])
@pytest.mark.parametrize("mode", ["single", "batch", "mixed"])
def test_rate_limit_holds_with_many_leasers(
    connect: Callable[[], psycopg.Connection[Any]], pgstore_schema: str, mode: str,
    concurrency: int | None,
) -> None:
    rate, period, ttl, seconds = 4, 120, 60_000, 1.2
    stores = [PgJobStore(connect(), schema=pgstore_schema) for _ in range(WORKERS + 1)]
    setup = stores[-1]
    setup.set_queue_rate("lim", rate, period)
    setup.set_queue_concurrency("lim", concurrency)
    setup.schedule_many([f"lim-{i}" for i in range(400)], [0] * 400, queue="lim")
    barrier = threading.Barrier(WORKERS)
    live = Live(concurrency or 10_000)

    def work(w: int) -> list[int]:
        rnd = random.Random(w)
        store = stores[w]
        nows: list[int] = []
        barrier.wait(BARRIER_TIMEOUT)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            got = _lease(store, rnd, mode, f"w{w}", None, ttl, ["lim"])
            if not got:
                time.sleep(0.002)
                continue
            live.add([j.run_id for j in got])
            nows.extend(j.lease_until - ttl for j in got if j.lease_until is not None)
            time.sleep(rnd.random() * 0.003)
            for job in got:
                live.drop(job.run_id)
                store.mark_dispatched(job.run_id, f"w{w}", None, job.lease_sequence)
        return nows

    with ThreadPoolExecutor(WORKERS) as pool:
        nows = [n for f in [pool.submit(work, w) for w in range(WORKERS)] for n in f.result()]
    assert _windows_hold(nows, rate, period) == []
    assert live.over == []
    # Not starved: at least half the windows the run spans were used to the full.
    assert len(nows) >= rate * (seconds * 1000 // period) // 2, len(nows)


#: What the changer cycles through while the leasers lease: (concurrency, rate a period),
#: lowered, raised, lifted and set again.
CHANGES = [(3, 8), (1, 8), (4, 12), (2, 4), (None, 6), (4, None), (None, None), (1, 3),
           (3, 12)]


@pytest.mark.parametrize("mode", ["single", "batch", "mixed"])
def test_limits_changed_while_leased_keep_holding(
    connect: Callable[[], psycopg.Connection[Any]], pgstore_schema: str, mode: str,
) -> None:
    """Both limits changed again and again (lowered, raised, lifted, set again) while 8
    leasers lease, renew, mark and release: no error (no deadlock between the changes,
    which wait for the rows, and the renews), every job dispatched in the end; and once
    the changes stop and the leases taken before them have ended, the last limits hold
    exactly, whatever the changes left in the rows."""
    period, ttl, final, seconds = 40, 60_000, (2, 5, 100), 1.5
    stores = [PgJobStore(connect(), schema=pgstore_schema) for _ in range(WORKERS + 2)]
    setup, changer = stores[-1], stores[-2]
    setup.set_queue_concurrency("lim", 3)
    setup.set_queue_rate("lim", 8, period)
    jobs = 3000
    setup.schedule_many([f"lim-{i}" for i in range(jobs)], [0] * jobs, queue="lim")

    def work(w: int, until: Callable[[], bool], live: Live, nows: list[int],
             barrier: threading.Barrier) -> int:
        rnd = random.Random(w)
        store, holder = stores[w], f"w{w}"
        leased = 0
        barrier.wait(BARRIER_TIMEOUT)
        while not until():
            got = _lease(store, rnd, mode, holder, None, ttl, ["lim"])
            if not got:
                time.sleep(0.002)
                continue
            leased += len(got)
            live.add([j.run_id for j in got])
            nows.extend(j.lease_until - ttl for j in got if j.lease_until is not None)
            time.sleep(rnd.random() * 0.003)
            for job in got:
                if rnd.random() < 0.3 and not store.renew(
                        job.run_id, holder, None, ttl, job.lease_sequence):
                    live.drop(job.run_id)  # lost (its queue full): it ended
                    continue
                live.drop(job.run_id)
                if rnd.random() < 0.8:
                    store.mark_dispatched(job.run_id, holder, "bot", job.lease_sequence)
                else:
                    store.release(job.run_id, holder, 0, job.lease_sequence)
        return leased

    def change(done: threading.Event) -> None:
        rnd = random.Random(7)
        try:
            for _ in range(2 * len(CHANGES)):
                concurrency, rate = rnd.choice(CHANGES)
                changer.set_queue_concurrency("lim", concurrency)
                changer.set_queue_rate("lim", rate, None if rate is None else period)
                time.sleep(rnd.random() * 0.02)
        finally:
            done.set()

    # The changes, while the leasers lease.
    barrier, changed = threading.Barrier(WORKERS), threading.Event()
    with ThreadPoolExecutor(WORKERS + 1) as pool:
        changes = pool.submit(change, changed)
        results = [pool.submit(work, w, changed.is_set, Live(10_000), [], barrier)
                   for w in range(WORKERS)]
        changes.result()
        assert sum(f.result() for f in results) > 0
    # Every lease taken so far has ended (marked, released, or lost at a renew).
    setup.set_queue_concurrency("lim", final[0])
    setup.set_queue_rate("lim", final[1], final[2])

    # The last limits, exactly.
    live = Live(final[0])
    nows: list[list[int]] = [[] for _ in range(WORKERS)]
    stop = threading.Event()
    barrier = threading.Barrier(WORKERS)
    with ThreadPoolExecutor(WORKERS + 1) as pool:
        watch = pool.submit(_monitor, connect(), pgstore_schema, final[0], stop)
        end = time.monotonic() + seconds
        results = [pool.submit(work, w, lambda: time.monotonic() >= end, live, nows[w],
                               barrier)
                   for w in range(WORKERS)]
        try:
            leased = sum(f.result() for f in results)
        finally:
            stop.set()
        polls, seen = watch.result()
    assert live.over == []
    assert seen <= final[0], f"the monitor saw {seen} live leases"
    assert _windows_hold([n for w in nows for n in w], final[1], final[2]) == []
    # Not starved: a quarter of the windows the run spans used to the full, at least
    # (a shared machine; and a lease needs both kinds of place in one row).
    assert polls > 0 and leased >= final[1] * seconds * 1000 // final[2] // 4, leased

    setup.set_queue_concurrency("lim", None)
    setup.set_queue_rate("lim", None, None)
    while got := setup.lease_many("check", None, LONG_TTL, 500):
        for job in got:
            assert setup.mark_dispatched(job.run_id, "check", "bot", job.lease_sequence).recorded
    assert setup.lease("check", None, LONG_TTL) is None


def test_a_repeatable_read_leaser_never_exceeds_the_limit(
    connect: Callable[[], psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    first = PgJobStore(connect(), schema=pgstore_schema)
    rr_conn = connect()
    rr = PgJobStore(rr_conn, schema=pgstore_schema)
    first.set_queue_concurrency("lim", 1)
    first.schedule_many(["a", "b", "c"], [0, 1, 2], queue="lim")

    def live() -> int:
        return sum(1 for q in first.list_queues() if q.queue == "lim" for _ in range(q.leased))

    # Its snapshot predates the lease that takes the one row: the row it would lock
    # changed since, a serialization failure, never a second lease.
    rr_conn.autocommit = False
    rr_conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    rr_conn.execute("SELECT 1")
    a = first.lease("h1", None, LONG_TTL)
    assert a is not None and a.run_id == "a"
    with pytest.raises(errors.SerializationFailure):
        rr.lease("h2", None, LONG_TTL)
    rr_conn.rollback()
    assert live() == 1

    # Its snapshot predates a mark that frees the row: the row still looks busy to it.
    rr_conn.execute("SELECT 1")
    assert first.mark_dispatched("a", "h1", "bot").recorded
    assert rr.lease("h2", None, LONG_TTL) is None
    rr_conn.commit()
    # A fresh snapshot sees the mark.
    b = rr.lease("h2", None, LONG_TTL)
    rr_conn.commit()
    assert b is not None and b.run_id == "b"
    assert first.lease("h1", None, LONG_TTL) is None
    assert live() == 1


@pytest.mark.parametrize("limits", [(50, None), (None, 50), (50, 50), (2, 50), (50, 2),
                                    (1, 7), (7, 1)])
@pytest.mark.parametrize("batch", [1, 100])
def test_a_limit_costs_one_row_lock_a_leased_job(
    connect: Callable[[], psycopg.Connection[Any]], pgstore_schema: str, batch: int,
    limits: tuple[int | None, int | None],
) -> None:
    """A lease in an open transaction holds one queue_slots row lock per leased job,
    whichever limits its queue has (one, the other, or both, either the larger), however
    many jobs it asked for (a second connection counts the rows it cannot lock), and
    none in a queue without limits. The queue has as many rows as its smaller limit."""
    concurrency, rate = limits
    setup = PgJobStore(connect(), schema=pgstore_schema)
    setup.set_queue_concurrency("lim", concurrency)
    setup.set_queue_rate("lim", rate, None if rate is None else 3_600_000)
    setup.schedule_many([f"lim-{i}" for i in range(3)], [0, 1, 2], queue="lim")
    setup.schedule_many([f"free-{i}" for i in range(3)], [0, 1, 2], queue="free")
    leaser_conn = connect()
    leaser = PgJobStore(leaser_conn, schema=pgstore_schema)
    counter = connect()
    rows = min(x for x in limits if x is not None)
    table = sql.Identifier(pgstore_schema, "queue_slots")
    assert counter.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone() == (rows,)
    locked = sql.SQL(
        "SELECT %s - count(*) FROM (SELECT FROM {} FOR UPDATE SKIP LOCKED) s").format(table)

    leaser_conn.autocommit = False
    got = leaser.lease_many("h", None, LONG_TTL, batch, queues=["lim"])
    assert len(got) == min(batch, 3, rows)
    assert counter.execute(locked, (rows,)).fetchone() == (len(got),)
    leaser_conn.commit()
    counter.execute("SELECT 1")
    got = leaser.lease_many("h", None, LONG_TTL, batch, queues=["free"])
    assert len(got) == min(batch, 3)
    assert counter.execute(locked, (rows,)).fetchone() == (0,)
    leaser_conn.commit()


@pytest.mark.parametrize("rate", [None, 2])
def test_no_lease_starts_over_a_limit_lowered_while_leasers_lease(
    connect: Callable[[], psycopg.Connection[Any]], pgstore_schema: str, rate: int | None,
) -> None:
    """The concurrency limit lowered and raised again and again (never lifted) while 6
    leasers lease, hold, renew, mark and release: a monitor polls the limit (with the
    time it was last changed) and the live leases in one snapshot each, and whenever the
    live leases rose between two polls with no change between them, a lease started
    then, so the count must be within the limit. pgstore_0026 let a lease start in a
    place freed below a lowered limit while the leases over it still lived."""
    ttl, seconds = 60_000, 2.5
    workers = 6
    stores = [PgJobStore(connect(), schema=pgstore_schema) for _ in range(workers + 2)]
    setup, changer = stores[-1], stores[-2]
    setup.set_queue_concurrency("lim", 4)
    # With a rate limit (2 a ms) too, the lanes hold several concurrency places each.
    setup.set_queue_rate("lim", rate, None if rate is None else 1)
    setup.schedule_many([f"lim-{i}" for i in range(4000)], [0] * 4000, queue="lim")
    stop = threading.Event()
    barrier = threading.Barrier(workers + 1)
    refused: list[str] = []

    def work(w: int) -> int:
        rnd = random.Random(w)
        store, holder = stores[w], f"w{w}"
        leased = 0
        barrier.wait(BARRIER_TIMEOUT)
        while not stop.is_set():
            got = _lease(store, rnd, "mixed", holder, None, ttl, ["lim"])
            if not got:
                time.sleep(0.001)
                continue
            leased += len(got)
            time.sleep(rnd.random() * 0.02)
            for job in got:
                # Every lease holds a place (the limit is never lifted, one clock): its
                # renew never fails.
                if rnd.random() < 0.3 and not store.renew(
                        job.run_id, holder, None, ttl, job.lease_sequence):
                    refused.append(job.run_id)
                    continue
                if rnd.random() < 0.8:
                    store.mark_dispatched(job.run_id, holder, "bot", job.lease_sequence)
                else:
                    store.release(job.run_id, holder, 0, job.lease_sequence)
        return leased

    def change() -> int:
        rnd = random.Random(11)
        barrier.wait(BARRIER_TIMEOUT)
        changes = 0
        while not stop.is_set():
            changes += changer.set_queue_concurrency("lim", rnd.choice([1, 2, 3, 4, 6]))
            time.sleep(0.01 + rnd.random() * 0.03)
        return changes

    query = sql.SQL(
        "SELECT q.concurrency_limit, q.updated_at,"
        " ARRAY(SELECT j.run_id || '/' || j.lease_sequence FROM {s}.jobs j"
        "        WHERE j.queue = 'lim' AND j.lease_holder IS NOT NULL"
        "          AND j.lease_until > {s}.now_ms() AND NOT j.dispatched AND NOT j.failed)"
        " FROM {s}.queues q WHERE q.queue = 'lim'").format(s=sql.Identifier(pgstore_schema))
    monitor = connect()
    starts: list[tuple[int, int]] = []
    over: list[tuple[int, int, int]] = []
    with ThreadPoolExecutor(workers + 1) as pool:
        results = [pool.submit(work, w) for w in range(workers)]
        changes = pool.submit(change)
        end = time.monotonic() + seconds
        last: tuple[int, int, list[str]] | None = None
        try:
            while time.monotonic() < end:
                row = monitor.execute(query).fetchone()
                assert row is not None
                # A lease live now and not at the last poll started in between.
                if last is not None and row[1] == last[1] and set(row[2]) - set(last[2]):
                    starts.append((row[0], len(row[2])))
                    if len(row[2]) > row[0]:
                        over.append((len(last[2]), len(row[2]), row[0]))
                last = row
        finally:
            stop.set()
        leased = sum(f.result() for f in results)
        changed = changes.result()
    assert over == [], f"leases started over the limit (before, after, limit): {over}"
    assert refused == []
    # Exercised: changes made, leases taken and seen starting (a loaded machine is slow).
    assert changed > 10 and leased > 20 and len(starts) > 10, (changed, leased, len(starts))


def test_a_renew_keeps_its_place_through_changes_back_to_back(
    connect: Callable[[], psycopg.Connection[Any]], pgstore_schema: str,
) -> None:
    """Leases that hold places are renewed again and again while two changers lay the
    lanes out again back to back (limits raised, lowered, the rate set and lifted, the
    concurrency limit never lifted): every renew answers true, as each lease keeps its
    place (in a lane, or retired). pgstore_0026 looked again only once: a renew that
    waited for one change and then for the next found its place gone twice, answered
    false and cut the lease short, while its place stayed busy in the lanes."""
    ttl, seconds, holders = 60_000, 2.0, 4
    stores = [PgJobStore(connect(), schema=pgstore_schema) for _ in range(holders + 3)]
    setup = stores[-1]
    setup.set_queue_concurrency("lim", holders)
    setup.schedule_many([f"lim-{i}" for i in range(holders)], [0] * holders, queue="lim")
    leases = setup.lease_many("h", None, ttl, holders, queues=["lim"])
    assert len(leases) == holders
    stop = threading.Event()
    barrier = threading.Barrier(holders + 2)

    def renew(w: int) -> list[bool]:
        job, answers = leases[w], list[bool]()
        barrier.wait(BARRIER_TIMEOUT)
        while not stop.is_set():  # job_renew and job_renew_many by turns
            if len(answers) % 2:
                answers.extend(stores[w].renew_many([job.run_id], "h", None, ttl,
                                                    [job.lease_sequence]))
            else:
                answers.append(stores[w].renew(job.run_id, "h", None, ttl,
                                               job.lease_sequence))
        return answers

    def change(c: int) -> int:
        rnd, store, changes = random.Random(c), stores[holders + c], 0
        barrier.wait(BARRIER_TIMEOUT)
        while not stop.is_set():
            if rnd.random() < 0.5:
                changes += store.set_queue_concurrency("lim", rnd.choice([1, 2, 3, 4, 6]))
            else:
                rate = rnd.choice([None, 1, 3, 5])
                changes += store.set_queue_rate("lim", rate, None if rate is None else 60_000)
        return changes

    with ThreadPoolExecutor(holders + 2) as pool:
        renews = [pool.submit(renew, w) for w in range(holders)]
        changers = [pool.submit(change, c) for c in range(2)]
        time.sleep(seconds)
        stop.set()
        answers = [f.result() for f in renews]
        changed = sum(f.result() for f in changers)
    lost = [(leases[w].run_id, a.count(False), len(a)) for w, a in enumerate(answers)
            if not all(a)]
    assert lost == [], f"renews refused (run_id, refused, renews): {lost}"
    assert changed > 20 and all(len(a) > 5 for a in answers), (changed, answers)
