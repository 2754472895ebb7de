"""Failover trials: a primary dies, its standby is promoted, and no token goes backwards.

Each trial builds a primary and a streaming standby of its own (``pgstore/testing_ha.py``),
installs the store on the primary, and runs writer threads through
``PgScheduleStore`` and ``PgJobStore``: schedule claim_next / claim_due / renew /
complete, job schedule / lease / mark_dispatched / release. Every acknowledged
call is written to a ledger. Then the primary is stopped with ``-m immediate``,
the standby is promoted, and the writers carry on against the new primary until
every schedule has been claimed there and every job that survived is dispatched.

Three ways to lose (or not) what the primary acknowledged:

* ``caught_up``: the load stops, the standby replays everything, then the
  failover: nothing is lost.
* ``lagging``: the standby is cut off from the primary's WAL in the middle of
  the load and the writers go on: everything acknowledged after the cut is
  lost at promotion (the trial checks that some was). Then the old primary is
  rewound with ``pg_rewind`` and rejoins as a standby, and a holder talking to
  it is refused.
* ``synchronous``: ``synchronous_commit = on`` with the standby named in
  ``synchronous_standby_names``, the failover in the middle of the load:
  nothing acknowledged is lost and nothing is dispatched twice.

What every trial asserts, for all acknowledged claims and leases of the trial:

* no (id, fencing token) was handed out twice;
* every token a claim returned after the promotion is greater than every token
  any claim returned before it, for each id; likewise every job's lease sequence;
* a holder whose claim was lost in the failover is refused by renew and
  complete once the id is claimed again on the new primary;
* a job dispatched twice (only possible when acknowledged commits are lost)
  carries a higher lease sequence the second time; the count is bounded by
  the dispatches acknowledged after the cut, and reported.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from pgstore import CompletePatch, PgJobStore, PgScheduleStore, ReadOnlyServer
from pgstore.testing import install_schema
from pgstore.testing_ha import Pair, ha_pair, wait_for

#: One pytest-xdist worker runs every failover rig (``--dist loadgroup``).
pytestmark = pytest.mark.xdist_group("ha")

SCHEMA = "pgstore"
IDS = [f"s{k}" for k in range(6)]
WRITERS = 3
#: Leases short enough that a lease the failover strands expires during the trial.
LEASE_MS = 300
#: Seconds of load: before the cut (or the catch-up), and after the cut.
WARM_SECONDS = 0.5
LOST_SECONDS = 0.6
#: The writers stop on the new primary once everything is claimed and dispatched
#: there (bounded generously: a noisy machine).
AFTER_MIN_SECONDS = 0.4
AFTER_MAX_SECONDS = 30.0
#: Trials per mode (each on a pair of its own); ``PGSTORE_FAILOVER_TRIALS=20`` for a long run.
TRIALS = int(os.environ.get("PGSTORE_FAILOVER_TRIALS", "1"))
SALTS = pytest.mark.parametrize("salt", range(TRIALS))


# --- The ledger of acknowledged calls --------------------------------------------


@dataclass
class Ledger:
    """Every acknowledged call of a trial, by phase: ``before`` the cut, ``window``
    (after the cut, before the failover: lost when the standby was cut off), ``after``."""

    claims: list[tuple[str, str, int, str]] = field(default_factory=list)  # phase, id, token, owner
    leases: list[tuple[str, str, str, int | None]] = field(default_factory=list)  # phase, run_id, holder, seq
    marks: list[tuple[str, str, str, int | None]] = field(default_factory=list)  # recorded ones
    scheduled: list[tuple[str, str]] = field(default_factory=list)  # phase, run_id
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, entry: Any) -> None:
        with self.lock:
            getattr(self, kind).append(entry)

    def tokens(self, phases: tuple[str, ...]) -> dict[str, list[int]]:
        found: dict[str, list[int]] = defaultdict(list)
        for phase, id_, token, _ in self.claims:
            if phase in phases:
                found[id_].append(token)
        return found

    def sequences(self, phases: tuple[str, ...]) -> dict[str, list[int | None]]:
        found: dict[str, list[int | None]] = defaultdict(list)
        for phase, run_id, _, seq in self.leases:
            if phase in phases:
                found[run_id].append(seq)
        return found


class Writer(threading.Thread):
    """One writer: its own autocommit connection, both stores on it, a random mix."""

    def __init__(self, index: int, dsn: str, ledger: Ledger, phase: Callable[[], str],
                 stop: threading.Event, schedule_jobs: bool, salt: int) -> None:
        super().__init__(name=f"writer-{index}", daemon=True)
        self.index = index
        self.dsn = dsn
        self.ledger = ledger
        self.phase = phase
        self.stop = stop
        self.schedule_jobs = schedule_jobs
        self.rng = random.Random(salt)
        self.owner = f"w{index}"  # one name per writer, as a process keeps its holder name
        self.jobs_made = 0

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                schedules = PgScheduleStore(conn, schema=SCHEMA)
                jobs = PgJobStore(conn, schema=SCHEMA)
                while not self.stop.is_set():
                    self.step(schedules, jobs)
        except BaseException as exc:
            self.ledger.add("errors", exc)

    def step(self, schedules: PgScheduleStore, jobs: PgJobStore) -> None:
        rng, phase = self.rng, self.phase()
        r = rng.random()
        if r < 0.55:
            if r < 0.4:
                claims = schedules.claim_next(self.owner, None, LEASE_MS, 2)
            else:
                one = schedules.claim_due(rng.choice(IDS), self.owner, None, LEASE_MS)
                claims = [] if one is None else [one]
            for claim in claims:
                id_, token = claim.record.id, claim.fencing_token
                self.ledger.add("claims", (phase, id_, token, self.owner))
                if rng.random() < 0.5:
                    schedules.renew(id_, token, int(time.time() * 1000) + LEASE_MS)
                if rng.random() < 0.85:  # the rest expire, and are claimed again
                    schedules.complete(id_, token, CompletePatch(0, 1, "ok"))
            return
        if self.schedule_jobs and rng.random() < 0.5:
            self.jobs_made += 1
            run_id = f"j{self.index}-{self.jobs_made}"
            jobs.schedule(run_id, 0)
            self.ledger.add("scheduled", (phase, run_id))
        job = jobs.lease(self.owner, None, LEASE_MS)
        if job is None:
            return
        seq = job.lease_sequence
        self.ledger.add("leases", (phase, job.run_id, self.owner, seq))
        if rng.random() < 0.15:
            jobs.release(job.run_id, self.owner, 0)
            return
        mark = jobs.mark_dispatched(job.run_id, self.owner, f"bot-{self.owner}")
        if mark.recorded:
            self.ledger.add("marks", (phase, job.run_id, self.owner, seq))


@dataclass
class Load:
    """Writer threads against one DSN, in a phase the trial moves on."""

    ledger: Ledger
    phase: str = "before"
    threads: list[Writer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self, dsn: str, schedule_jobs: bool, salt: int) -> None:
        self.stop = threading.Event()
        self.threads = [
            Writer(k, dsn, self.ledger, lambda: self.phase, self.stop, schedule_jobs, salt + k)
            for k in range(WRITERS)
        ]
        for thread in self.threads:
            thread.start()

    def finish(self, allow_errors: bool = False) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive(), f"{thread.name} did not stop"
        for error in self.ledger.errors:
            # A call in flight when the primary died fails; it was never acknowledged.
            if not (allow_errors and isinstance(error, psycopg.OperationalError)):
                raise error
        self.ledger.errors.clear()


# --- A trial ----------------------------------------------------------------------


@dataclass
class Outcome:
    """What a trial counted (printed, and used in the assertions' messages)."""

    mode: str
    claims_before: int
    claims_window: int
    claims_after: int
    claims_lost: int
    marks_lost: int
    tokens_handed_out_twice: int
    tokens_not_above: int
    stale_renews_accepted: int
    stale_completes_accepted: int
    stale_job_calls_accepted: int
    duplicate_dispatches: int
    duplicates_without_higher_sequence: int
    sequences_not_above: int

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in vars(self).items())


def _db(node_dsn: str) -> Callable[[str], list[tuple[Any, ...]]]:
    def query(text: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(node_dsn, autocommit=True) as conn:
            return conn.execute(text.encode()).fetchall()

    return query


def run_trial(pair: Pair, mode: str, salt: int) -> Outcome:
    """Load, lose (or not), fail over, load again; the counts of what went wrong."""
    install_schema(pair.primary.dsn, SCHEMA)
    with psycopg.connect(pair.primary.dsn) as conn:
        store = PgScheduleStore(conn, schema=SCHEMA)
        for id_ in IDS:
            store.register(id_, "interval", "1", 0)
    if mode == "synchronous":
        pair.set_synchronous("on")
    ledger = Ledger()
    load = Load(ledger)
    load.start(pair.primary.dsn, schedule_jobs=True, salt=salt)
    time.sleep(WARM_SECONDS)
    if mode == "lagging":
        pair.cut_off()
        load.phase = "window"
        time.sleep(LOST_SECONDS)
    if mode == "synchronous":
        time.sleep(LOST_SECONDS)
        pair.fail_over()  # in the middle of the load: the calls in flight fail
        load.finish(allow_errors=True)
    else:
        load.finish()
        if mode == "caught_up":
            pair.wait_caught_up()
        pair.fail_over()

    new = _db(pair.primary.dsn)
    survived = dict(new(f"SELECT id, fencing_token FROM {SCHEMA}.schedules"))
    jobs_state = dict(new(f"SELECT run_id, dispatched FROM {SCHEMA}.jobs"))
    claims_lost = sum(
        1 for phase, id_, token, _ in ledger.claims
        if phase != "after" and token > survived[id_]
    )
    # Lost dispatches of jobs that survived (those scheduled after the cut are gone whole):
    # the only ones that can be dispatched twice.
    marks_lost = sum(1 for _, run_id, _, _ in ledger.marks if jobs_state.get(run_id) is False)

    load.phase = "after"
    load.start(pair.primary.dsn, schedule_jobs=False, salt=salt + 100)
    started = time.monotonic()

    def settled() -> bool:
        claimed = {id_ for phase, id_, _, _ in ledger.claims if phase == "after"}
        pending = new(f"SELECT count(*) FROM {SCHEMA}.jobs WHERE NOT dispatched")[0][0]
        return (
            time.monotonic() - started >= AFTER_MIN_SECONDS
            and claimed == set(IDS) and pending == 0
        ) or bool(ledger.errors)

    wait_for(settled, "the new primary to claim every id and dispatch every job",
             AFTER_MAX_SECONDS)
    load.finish()

    # Every holder from before the failover comes back: the id is claimed once more
    # on the new primary (held, not completed), then each old token is tried.
    stale_renews = stale_completes = 0
    with psycopg.connect(pair.primary.dsn, autocommit=True) as conn:
        store = PgScheduleStore(conn, schema=SCHEMA)
        later = store.now_ms() + 10 * LEASE_MS  # every lease of the load has expired by then
        for id_ in IDS:
            claim = store.claim_due(id_, "checker", later, 60_000)
            assert claim is not None, f"{id_} is not claimable after the load"
            ledger.claims.append(("after", id_, claim.fencing_token, "checker"))
            for token in set(ledger.tokens(("before", "window"))[id_]):
                stale_renews += store.renew(id_, token, later + 60_000)
                stale_completes += store.complete(id_, token, CompletePatch(0, 2, "error"), later)

    # Every job lease from before the failover that is not the job's lease now comes
    # back with its number: none may record a dispatch or release the job.
    stale_marks = 0
    current = dict(new(f"SELECT run_id, lease_sequence FROM {SCHEMA}.jobs"))
    with psycopg.connect(pair.primary.dsn, autocommit=True) as conn:
        jobs = PgJobStore(conn, schema=SCHEMA)
        for phase, run_id, holder, seq in ledger.leases:
            if phase != "after" and run_id in current and seq != current[run_id]:
                mark = jobs.mark_dispatched(run_id, holder, "bot-stale", seq)
                stale_marks += mark.recorded
                stale_marks += jobs.release(run_id, holder, 0, seq)

    counts = Counter((id_, token) for _, id_, token, _ in ledger.claims)
    before, after = ledger.tokens(("before", "window")), ledger.tokens(("after",))
    not_above = sum(
        1 for id_, tokens in after.items() for t in tokens if before[id_] and t <= max(before[id_])
    )

    leases_before, leases_after = ledger.sequences(("before", "window")), ledger.sequences(("after",))
    seq_not_above = 0
    for run_id, seqs in leases_after.items():
        if leases_before.get(run_id):
            prior = [s for s in leases_before[run_id] if s is not None]
            known = [s for s in seqs if s is not None]
            if len(prior) < len(leases_before[run_id]) or len(known) < len(seqs):
                seq_not_above += len(seqs)
            else:
                seq_not_above += sum(1 for s in known if s <= max(prior))
    by_job: dict[str, list[int | None]] = defaultdict(list)
    for _, run_id, _, seq in ledger.marks:
        by_job[run_id].append(seq)
    duplicates = {run_id: seqs for run_id, seqs in by_job.items() if len(seqs) > 1}
    without_higher = sum(
        1 for seqs in duplicates.values()
        if any(s is None for s in seqs) or len(set(seqs)) != len(seqs)
    )

    outcome = Outcome(
        mode=mode,
        claims_before=sum(1 for c in ledger.claims if c[0] == "before"),
        claims_window=sum(1 for c in ledger.claims if c[0] == "window"),
        claims_after=sum(1 for c in ledger.claims if c[0] == "after"),
        claims_lost=claims_lost,
        marks_lost=marks_lost,
        tokens_handed_out_twice=sum(n - 1 for n in counts.values() if n > 1),
        tokens_not_above=not_above,
        stale_renews_accepted=stale_renews,
        stale_completes_accepted=stale_completes,
        stale_job_calls_accepted=stale_marks,
        duplicate_dispatches=len(duplicates),
        duplicates_without_higher_sequence=without_higher,
        sequences_not_above=seq_not_above,
    )
    print(f"\nfailover trial: {outcome.line()}")
    return outcome


def assert_fenced(outcome: Outcome) -> None:
    """What must hold whatever was lost."""
    assert outcome.tokens_handed_out_twice == 0, f"tokens handed out twice: {outcome.line()}"
    assert outcome.tokens_not_above == 0, f"tokens not above the old ones: {outcome.line()}"
    assert outcome.stale_renews_accepted == 0, f"a lost claim renewed: {outcome.line()}"
    assert outcome.stale_completes_accepted == 0, f"a lost claim completed: {outcome.line()}"
    assert outcome.sequences_not_above == 0, f"lease sequences went backwards: {outcome.line()}"
    assert outcome.stale_job_calls_accepted == 0, f"a lost lease was honoured: {outcome.line()}"
    assert outcome.duplicates_without_higher_sequence == 0, outcome.line()


@pytest.fixture
def pair() -> Iterator[Pair]:
    with ha_pair() as built:
        yield built


@SALTS
def test_caught_up_standby_loses_nothing(pair: Pair, salt: int) -> None:
    outcome = run_trial(pair, "caught_up", salt=1000 + salt)
    assert outcome.claims_lost == 0 and outcome.marks_lost == 0, outcome.line()
    assert outcome.duplicate_dispatches == 0, outcome.line()
    assert_fenced(outcome)


@SALTS
def test_lagging_standby_never_hands_out_a_token_twice(pair: Pair, salt: int) -> None:
    outcome = run_trial(pair, "lagging", salt=2000 + salt)
    assert outcome.claims_window > 0 and outcome.claims_lost > 0, (
        f"the trial lost no acknowledged claim: {outcome.line()}"
    )
    assert_fenced(outcome)
    # A job is dispatched twice only when its dispatch was acknowledged and lost.
    assert outcome.duplicate_dispatches <= outcome.marks_lost, outcome.line()

    # The old primary comes back: rewound onto the new timeline, it rejoins as a
    # standby and holds the new primary's data (its lost claims are gone).
    old_dsn = pair.standby.dsn
    pair.rejoin_old_primary()
    pair.wait_caught_up()
    assert pair.standby.dsn == old_dsn and pair.standby.in_recovery()
    tokens = f"SELECT id, fencing_token FROM {SCHEMA}.schedules ORDER BY id"
    assert _db(old_dsn)(tokens) == _db(pair.primary.dsn)(tokens)
    # A holder still talking to it is refused.
    with psycopg.connect(old_dsn, autocommit=True) as conn:
        store = PgScheduleStore(conn, schema=SCHEMA)
        with pytest.raises(ReadOnlyServer, match="standby"):
            store.renew(IDS[0], 1, 0)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match="standby"):
            conn.execute(f"SELECT * FROM {SCHEMA}.job_lease('w0', NULL, 1000)")


@SALTS
def test_synchronous_standby_loses_nothing(pair: Pair, salt: int) -> None:
    outcome = run_trial(pair, "synchronous", salt=3000 + salt)
    assert outcome.claims_lost == 0 and outcome.marks_lost == 0, outcome.line()
    assert outcome.duplicate_dispatches == 0, outcome.line()
    assert_fenced(outcome)


