"""A Scheduler and a Dispatcher survive a promotion, given a multi-host DSN.

Each trial builds a primary and a streaming standby of its own (``pgstore/testing_ha.py``)
and starts both runtimes on stores built from ``Pair.multi_host_dsn()``
(``host=a,b ... target_session_attrs=read-write``: each store's own pool, and the
Dispatcher's listener, connect to whichever server is writable). The Scheduler
runs two interval tasks; a producer thread schedules a stream of due jobs for the
Dispatcher, whose poll interval is long, so jobs are leased promptly only when a
notification wakes it. Then the primary is stopped with ``-m immediate`` and the
standby promoted, with nothing acknowledged lost (``synchronous``: the standby is
a synchronous one) or with commits lost (``lagging``: the standby is cut off from
the WAL first and the runtimes go on for a while).

Nothing is restarted or told about the failover. What the trial asserts, read from
the new primary and from the handlers' own ledger:

* the runtimes resumed: occurrences claimed after the promotion ran and were
  completed there, and jobs scheduled after it were dispatched there;
* the Dispatcher's listener LISTENs on the new primary (``pg_stat_activity``);
* no (task, fencing token) ran twice; every token a run got after the promotion is
  above every token any run got before it, for each task;
* a job dispatched twice (its first mark in flight or lost at the failover) was
  leased under a higher lease sequence each time; the count is reported.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg_pool import PoolTimeout

from pgstore import (
    Dispatcher,
    Job,
    PgJobStore,
    PgScheduleStore,
    PgStoreError,
    RunContext,
    Scheduler,
)
from pgstore.testing import install_schema
from pgstore.testing_ha import Pair, ha_pair, wait_for

#: One pytest-xdist worker runs every failover rig (``--dist loadgroup``).
pytestmark = pytest.mark.xdist_group("ha")

SCHEMA = "pgstore"
#: Two interval tasks (ms): they come due several times a second.
TASKS = {"tick": 100, "tock": 170}
#: Leases short enough that a lease stranded by the failover expires within the trial.
LEASE_MS = 1_000
#: Long enough that, within a trial, jobs are leased promptly only through notifications.
DISPATCH_POLL_SECONDS = 30.0
#: Seconds of load before the failover (and, when lagging, after the cut).
WARM_SECONDS = 0.8
LOST_SECONDS = 0.8
#: What "resumed" means: this many runs of each task and dispatches after the promotion.
RESUMED_RUNS = 3
RESUMED_JOBS = 5
#: Generous bound on the wait for the runtimes to resume (a noisy 2-core machine).
RESUME_SECONDS = 45.0


@dataclass
class Ledger:
    """What the handlers saw, by phase: ``before`` the primary was stopped, ``failing``
    (between the stop and the end of the promotion: ambiguous, kept out of the
    before/after comparison), ``after`` the promotion."""

    phase: str = "before"
    runs: list[tuple[str, str, int]] = field(default_factory=list)  # phase, task, token
    dispatches: list[tuple[str, str, int]] = field(default_factory=list)  # phase, run_id, seq
    recalls: list[tuple[str, str, int]] = field(default_factory=list)  # phase, run_id, seq
    scheduled: list[tuple[str, str]] = field(default_factory=list)  # phase, run_id
    producer_errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, ctx: RunContext) -> None:
        with self.lock:
            self.runs.append((self.phase, ctx.task_id, ctx.fencing_token))

    def dispatch(self, job: Job) -> str:
        with self.lock:
            self.dispatches.append((self.phase, job.run_id, job.lease_sequence))
        return f"bot-{job.run_id}"

    def recall(self, job: Job, worker_id: str | None) -> None:
        with self.lock:
            self.recalls.append((self.phase, job.run_id, job.lease_sequence))

    def tokens(self, phase: str) -> dict[str, list[int]]:
        found: dict[str, list[int]] = defaultdict(list)
        with self.lock:
            for p, task, token in self.runs:
                if p == phase:
                    found[task].append(token)
        return found


class Producer(threading.Thread):
    """Schedules one due job every 100 ms through a store of its own on the multi-host
    DSN; a call the failover fails is counted, never acknowledged."""

    def __init__(self, dsn: str, ledger: Ledger) -> None:
        super().__init__(name="producer", daemon=True)
        self.store = PgJobStore(dsn, schema=SCHEMA)
        self.ledger = ledger
        self.halt = threading.Event()

    def run(self) -> None:
        made = 0
        while not self.halt.is_set():
            made += 1
            run_id, phase = f"j{made}", self.ledger.phase
            try:
                self.store.schedule(run_id, 0)
            except (psycopg.Error, PgStoreError, PoolTimeout) as exc:  # lost, read-only
                self.ledger.producer_errors[type(exc).__name__] += 1
                time.sleep(0.05)
                continue
            with self.ledger.lock:
                self.ledger.scheduled.append((phase, run_id))
            time.sleep(0.1)

    def finish(self) -> None:
        self.halt.set()
        self.join(60)
        assert not self.is_alive(), "the producer did not stop"
        self.store.close()


class Runtimes:
    """A Scheduler and a Dispatcher on one event loop in a thread of their own."""

    def __init__(self, dsn: str, ledger: Ledger) -> None:
        self.schedules = PgScheduleStore(dsn, schema=SCHEMA)
        self.jobs = PgJobStore(dsn, schema=SCHEMA)
        self.scheduler = Scheduler(self.schedules, owner="sched", lease_ms=LEASE_MS,
                                   poll_interval=0.05, grace_period=5.0)
        for task, period in TASKS.items():
            self.scheduler.every(task, period, ledger.run)
        self.dispatcher = Dispatcher(self.jobs, ledger.dispatch, ledger.recall, holder="disp",
                                     ttl_ms=LEASE_MS, concurrency=4,
                                     poll_interval=DISPATCH_POLL_SECONDS, grace_period=5.0)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="runtimes", daemon=True)

    def _main(self) -> None:
        async def both() -> None:
            await asyncio.gather(self.scheduler.run(handle_signals=False),
                                 self.dispatcher.run(handle_signals=False))

        try:
            asyncio.run(both())
        except BaseException as exc:
            self.error = exc

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        # stop() is a no-op before start(): wait until both loops are bound.
        wait_for(lambda: self.scheduler._stopping is not None
                 and self.dispatcher._stopping is not None, "the runtimes to start")
        self.scheduler.stop()
        self.dispatcher.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the runtimes did not stop"
        self.schedules.close()
        self.jobs.close()
        if self.error is not None:
            raise self.error


def _rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query.encode()).fetchall()


def _listeners(dsn: str) -> int:
    """Sessions LISTENing on the server (the listener's last statement is its LISTEN)."""
    return int(_rows(dsn, (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state = 'idle' AND query ILIKE 'LISTEN %'"
    ))[0][0])


def resumed(ledger: Ledger, new: str, phase: str, state: dict[str, Any]) -> bool:
    """True once, on the primary at ``new``, both tasks ran ``RESUMED_RUNS`` times in
    ``phase`` and one of those runs was completed there, ``RESUMED_JOBS`` jobs were
    scheduled in ``phase`` and all of them dispatched, and the listener LISTENs;
    what was seen is left in ``state``."""
    after = ledger.tokens(phase)
    done = dict(_rows(new, f"SELECT id, fencing_token FROM {SCHEMA}.schedules"
                           " WHERE lease_owner IS NULL AND last_status = 'ok'"))
    with ledger.lock:
        wanted = [r for p, r in ledger.scheduled if p == phase]
    dispatched = {r for (r,) in _rows(new, f"SELECT run_id FROM {SCHEMA}.jobs WHERE dispatched")}
    state.update(
        runs={t: len(after.get(t, [])) for t in TASKS},
        # completed on the new primary under a token handed out after it took over
        completed=[t for t in TASKS if after.get(t) and done.get(t, 0) >= min(after[t])],
        scheduled=len(wanted), undispatched=len(set(wanted) - dispatched),
        listeners=_listeners(new),
    )
    return (
        all(n >= RESUMED_RUNS for n in state["runs"].values())
        and len(state["completed"]) == len(TASKS)
        and len(wanted) >= RESUMED_JOBS and not state["undispatched"]
        and state["listeners"] == 1
    )


@dataclass
class Outcome:
    mode: str
    runs_before: int
    runs_after: int
    tokens_ran_twice: int
    tokens_not_above: int
    dispatches_before: int
    dispatches_after: int
    duplicate_dispatches: int
    duplicates_without_higher_sequence: int
    jobs_lost: int
    producer_errors: int
    seconds_to_resume: float

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in vars(self).items())


def run_trial(pair: Pair, mode: str) -> Outcome:
    install_schema(pair.primary.dsn, SCHEMA)
    if mode == "synchronous":
        pair.set_synchronous("on")
    dsn = pair.multi_host_dsn()
    ledger = Ledger()
    state: dict[str, Any] = {}
    runtimes = Runtimes(dsn, ledger)
    producer = Producer(dsn, ledger)
    runtimes.start()
    producer.start()
    try:
        wait_for(lambda: all(ledger.tokens("before").get(t) for t in TASKS)
                 and bool(ledger.dispatches), "the runtimes to run on the first primary")
        wait_for(lambda: _listeners(pair.primary.dsn) == 1, "the listener on the first primary")
        time.sleep(WARM_SECONDS)
        if mode == "lagging":
            pair.cut_off()
            time.sleep(LOST_SECONDS)  # everything acknowledged from here on is lost
        ledger.phase = "failing"
        pair.fail_over()
        ledger.phase = "after"
        promoted = time.monotonic()
        new = pair.primary.dsn

        wait_for(lambda: resumed(ledger, new, "after", state),
                 "the runtimes to resume on the new primary", RESUME_SECONDS)
        seconds_to_resume = time.monotonic() - promoted
    except AssertionError as exc:
        raise AssertionError(f"{exc}; at the end: {state}") from None
    finally:
        producer.finish()
        runtimes.finish()

    runs = Counter((task, token) for _, task, token in ledger.runs)
    before, after = ledger.tokens("before"), ledger.tokens("after")
    not_above = sum(
        1 for task, tokens in after.items() for t in tokens
        if before.get(task) and t <= max(before[task])
    )
    by_job: dict[str, list[int]] = defaultdict(list)
    for _, run_id, seq in ledger.dispatches:
        by_job[run_id].append(seq)
    duplicates = {run_id: seqs for run_id, seqs in by_job.items() if len(seqs) > 1}
    without_higher = sum(
        1 for seqs in duplicates.values()
        if 0 in seqs or any(b <= a for a, b in itertools.pairwise(seqs))
    )
    survived = {r for (r,) in _rows(pair.primary.dsn, f"SELECT run_id FROM {SCHEMA}.jobs")}
    outcome = Outcome(
        mode=mode,
        runs_before=sum(len(t) for t in before.values()),
        runs_after=sum(len(t) for t in after.values()),
        tokens_ran_twice=sum(n - 1 for n in runs.values() if n > 1),
        tokens_not_above=not_above,
        dispatches_before=sum(1 for d in ledger.dispatches if d[0] == "before"),
        dispatches_after=sum(1 for d in ledger.dispatches if d[0] == "after"),
        duplicate_dispatches=len(duplicates),
        duplicates_without_higher_sequence=without_higher,
        jobs_lost=sum(1 for _, run_id in ledger.scheduled if run_id not in survived),
        producer_errors=sum(ledger.producer_errors.values()),
        seconds_to_resume=round(seconds_to_resume, 2),
    )
    print(f"\nruntime failover trial: {outcome.line()}")
    return outcome


def assert_survived(outcome: Outcome) -> None:
    assert outcome.runs_before > 0 and outcome.dispatches_before > 0, outcome.line()
    assert outcome.tokens_ran_twice == 0, f"a (task, token) ran twice: {outcome.line()}"
    assert outcome.tokens_not_above == 0, f"a token went backwards: {outcome.line()}"
    assert outcome.duplicates_without_higher_sequence == 0, outcome.line()


@pytest.fixture
def pair() -> Iterator[Pair]:
    with ha_pair() as built:
        yield built


def test_runtimes_survive_a_promotion_that_loses_nothing(pair: Pair) -> None:
    outcome = run_trial(pair, "synchronous")
    assert_survived(outcome)
    assert outcome.jobs_lost == 0, f"an acknowledged job was lost: {outcome.line()}"


def test_runtimes_survive_a_promotion_that_loses_commits(pair: Pair) -> None:
    outcome = run_trial(pair, "lagging")
    assert_survived(outcome)
    assert outcome.jobs_lost > 0, f"the trial lost no acknowledged job: {outcome.line()}"
