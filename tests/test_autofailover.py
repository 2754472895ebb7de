"""The runtimes under a real HA manager: pg_auto_failover fails over twice.

A monitor and two nodes under ``pg_autoctl`` (``tests/support/autofailover.py``), with
pg_auto_failover's own replication settings: with two nodes the primary names the
secondary in ``synchronous_standby_names`` and commits with ``synchronous_commit =
on``. A Scheduler and a Dispatcher (``tests/test_failover_runtime.py``'s, two
interval tasks and a producer scheduling a due job every 100 ms) run on stores
built from the URI ``pg_autoctl show uri --formation default`` prints, and are told
nothing while the formation fails over twice:

1. ``pg_autoctl perform failover``: the monitor drains and demotes the primary,
   promotes the secondary, and the old primary rejoins as its secondary;
2. the new primary is killed (SIGKILL to its ``pg_autoctl`` and every process under
   it, postgres included) and the monitor promotes the other node.

What the trial asserts, from the ledger of the handlers and the last primary:

* after each failover the runtimes resumed on the new primary (both tasks ran and
  were completed there, every job scheduled after it was dispatched, the
  listener LISTENs there);
* no (task, fencing token) ran twice; every token a run got after a failover is
  above every token any run got before that failover began, for each task;
* with pg_auto_failover's synchronous default, nothing acknowledged was lost, and a
  job dispatched twice (the kill between its dispatch and its mark's commit) had its
  first bot recalled;
* with ``replication-quorum false`` on both nodes (asynchronous) and the primary's
  WAL sender stopped (SIGSTOP) for a while before the kill, acknowledged jobs are
  lost, and still no token runs twice or goes backwards, and a job dispatched twice
  carries a higher lease sequence the second time (the trial prints the counts).
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import psycopg
import pytest

from pgstore.testing import install_schema
from pgstore.testing_ha import wait_for
from tests.support.autofailover import Formation, autoctl_binaries, formation
from tests.test_failover_runtime import (
    RESUME_SECONDS,
    SCHEMA,
    TASKS,
    Ledger,
    Producer,
    Runtimes,
    _listeners,
    _rows,
    resumed,
)

pytestmark = pytest.mark.xdist_group("ha")

#: Seconds of load on a primary before it is failed over, and (asynchronous) after
#: its WAL senders are stopped, before it is killed.
WARM_SECONDS = 1.0
LOST_SECONDS = 0.8
#: Phases of the ledger: on a primary (``p0``, ``p1``, ``p2``), failing over (``f1``, ``f2``).
PHASES = ("p0", "f1", "p1", "f2", "p2")
#: Trials (each on a formation of its own); ``PGSTORE_FAILOVER_TRIALS=10`` for a long run.
TRIALS = int(os.environ.get("PGSTORE_FAILOVER_TRIALS", "1"))


@dataclass
class Outcome:
    mode: str
    runs: dict[str, int]
    dispatches: dict[str, int]
    timelines: list[int]
    synchronous_standby_names: list[str]  # on the primary, just before each failover
    tokens_ran_twice: int
    tokens_not_above: int
    duplicate_dispatches: int
    duplicates_without_higher_sequence: int
    duplicates_not_recalled: int  # a job dispatched again whose earlier bot stayed
    jobs_lost: int
    producer_errors: int
    failover_seconds: list[float]
    resume_seconds: list[float]

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in vars(self).items())


def _writable(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(b"SELECT NOT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def _synchronous_standby_names(dsn: str) -> str:
    return str(_rows(dsn, "SHOW synchronous_standby_names")[0][0])


def _timeline(dsn: str) -> int:
    rows = _rows(dsn, "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))"
                      "::bit(32)::int")
    return int(rows[0][0])


def run_trial(af: Formation, mode: str) -> Outcome:
    first = af.primary()
    install_schema(af.node_dsn(first), SCHEMA)
    if mode == "asynchronous":
        af.set_synchronous(False)
    # pg_autoctl's URI names every node and asks for the writable one; we add whom to
    # connect as and a short connect timeout (a dead node must not hold a reconnect).
    dsn = f"{af.uri()}&user={af.superuser}&connect_timeout=3"
    ledger = Ledger(phase="p0")
    state: dict[str, Any] = {}
    failover_seconds: list[float] = []
    resume_seconds: list[float] = []
    timelines = [_timeline(af.node_dsn(first))]
    sync_names: list[str] = []
    runtimes = Runtimes(dsn, ledger)
    producer = Producer(dsn, ledger)
    runtimes.start()
    producer.start()

    def resume(phase: str, node_dsn: str, began: float) -> None:
        ledger.phase = phase
        timelines.append(_timeline(node_dsn))
        wait_for(lambda: resumed(ledger, node_dsn, phase, state),
                 f"the runtimes to resume on the new primary ({phase})", RESUME_SECONDS)
        resume_seconds.append(round(time.monotonic() - began, 2))

    try:
        wait_for(lambda: all(ledger.tokens("p0").get(t) for t in TASKS)
                 and bool(ledger.dispatches), "the runtimes to run on the first primary")
        wait_for(lambda: _listeners(af.node_dsn(first)) == 1, "the listener on the first primary")
        time.sleep(WARM_SECONDS)

        # 1. pg_autoctl perform failover: returns once the old primary is a secondary.
        sync_names.append(_synchronous_standby_names(af.node_dsn(first)))
        ledger.phase = "f1"
        began = time.monotonic()
        af.perform_failover()
        second = af.primary()
        assert second is not first, f"perform failover kept {first.name}: {af.state()}"
        failover_seconds.append(round(time.monotonic() - began, 2))
        resume("p1", af.node_dsn(second), began)
        af.wait_healthy()  # synchronous again: the old primary is the secondary
        time.sleep(WARM_SECONDS)

        # 2. The primary's pg_autoctl and postgres killed; the monitor promotes the other.
        sync_names.append(_synchronous_standby_names(af.node_dsn(second)))
        if mode == "asynchronous":  # what the primary commits from here on is lost
            assert af.stall_replication(second) == 1, af.state()
            time.sleep(LOST_SECONDS)
        ledger.phase = "f2"
        began = time.monotonic()
        af.kill(second)
        survivor = af.nodes["node_a" if second.name == "node_b" else "node_b"]
        wait_for(lambda: _writable(af.node_dsn(survivor)), f"{survivor.name} to be promoted")
        failover_seconds.append(round(time.monotonic() - began, 2))
        resume("p2", af.node_dsn(survivor), began)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; at the end: {state}; monitor: {af.state()}") from None
    finally:
        producer.finish()
        runtimes.finish()

    last = af.node_dsn(survivor)
    runs = Counter((task, token) for _, task, token in ledger.runs)
    not_above = 0
    for failing, after in (("f1", "p1"), ("f2", "p2")):
        earlier = PHASES[: PHASES.index(failing)]  # all recorded before the failover began
        before = {t: [k for p in earlier for k in ledger.tokens(p).get(t, [])] for t in TASKS}
        not_above += sum(1 for task, tokens in ledger.tokens(after).items() for k in tokens
                         if before[task] and k <= max(before[task]))
    by_job: dict[str, list[int]] = defaultdict(list)
    for _, run_id, seq in ledger.dispatches:
        by_job[run_id].append(seq)
    duplicates = [seqs for seqs in by_job.values() if len(seqs) > 1]
    recalled = {(run_id, seq) for _, run_id, seq in ledger.recalls}
    survived = {r for (r,) in _rows(last, f"SELECT run_id FROM {SCHEMA}.jobs")}
    outcome = Outcome(
        mode=mode,
        runs={p: sum(1 for r in ledger.runs if r[0] == p) for p in PHASES},
        dispatches={p: sum(1 for d in ledger.dispatches if d[0] == p) for p in PHASES},
        timelines=timelines,
        synchronous_standby_names=sync_names,
        tokens_ran_twice=sum(n - 1 for n in runs.values() if n > 1),
        tokens_not_above=not_above,
        duplicate_dispatches=len(duplicates),
        duplicates_without_higher_sequence=sum(
            1 for seqs in duplicates if 0 in seqs or any(b <= a for a, b in pairwise(seqs))),
        duplicates_not_recalled=sum(
            1 for run_id, seqs in by_job.items() if len(seqs) > 1
            and any((run_id, seq) not in recalled for seq in sorted(seqs)[:-1])),
        jobs_lost=sum(1 for _, run_id in ledger.scheduled if run_id not in survived),
        producer_errors=sum(ledger.producer_errors.values()),
        failover_seconds=failover_seconds,
        resume_seconds=resume_seconds,
    )
    print(f"\npg_auto_failover trial: {outcome.line()}")
    return outcome


@pytest.fixture
def af() -> Iterator[Formation]:
    if autoctl_binaries() is None:
        pytest.skip("pg_auto_failover is not installed (pg_autoctl and postgresql-NN-auto-failover)")
    with formation() as built:
        yield built


@pytest.mark.parametrize("salt", range(TRIALS))
def test_runtimes_survive_two_failovers_under_synchronous_replication(
    af: Formation, salt: int
) -> None:
    """pg_auto_failover's default with two nodes: nothing acknowledged is lost. A job
    may still be dispatched twice: the kill can land between its dispatch and its mark's
    commit, and its lease (1 s) ends long before the promotion, so it is leased again on
    the new primary. Then its first bot is recalled (the mark, retried there, is refused
    to the older lease), and only one stays."""
    outcome = run_trial(af, "synchronous")
    assert_survived(outcome)
    assert all(names.startswith("ANY 1 (") for names in outcome.synchronous_standby_names), \
        outcome.line()
    assert outcome.jobs_lost == 0, f"an acknowledged job was lost: {outcome.line()}"
    assert outcome.duplicates_not_recalled == 0, \
        f"a job dispatched twice kept its first bot: {outcome.line()}"


@pytest.mark.parametrize("salt", range(TRIALS))
def test_runtimes_survive_two_failovers_under_asynchronous_replication(
    af: Formation, salt: int
) -> None:
    """replication-quorum false on both nodes, and the primary's WAL sender stopped
    for a while before the kill: what it acknowledged meanwhile is lost; the fences
    hold (the counts of what was lost and dispatched again are printed)."""
    outcome = run_trial(af, "asynchronous")
    assert_survived(outcome)
    assert outcome.synchronous_standby_names == ["", ""], outcome.line()
    assert outcome.jobs_lost > 0, f"the trial lost no acknowledged job: {outcome.line()}"


def assert_survived(outcome: Outcome) -> None:
    assert outcome.runs["p0"] > 0 and outcome.dispatches["p0"] > 0, outcome.line()
    assert outcome.timelines == [1, 2, 3], outcome.line()
    assert outcome.tokens_ran_twice == 0, f"a (task, token) ran twice: {outcome.line()}"
    assert outcome.tokens_not_above == 0, f"a token went backwards: {outcome.line()}"
    assert outcome.duplicates_without_higher_sequence == 0, outcome.line()
