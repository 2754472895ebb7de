"""The schedule rules (docs/contract.md) under real concurrency: parallel connections racing the claim functions.

Every worker owns its own autocommit psycopg connection (wrapped in a
``PgScheduleStore``); a ``threading.Barrier`` releases them together so the
calls really overlap on the server. Workers run in a ``ThreadPoolExecutor`` and
their results are read with ``Future.result()``, so an exception in any worker
fails the test instead of passing as a lost race.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from pgstore import ClaimResult, CompletePatch, PgScheduleStore

pytestmark = pytest.mark.slow

BARRIER_TIMEOUT = 30.0
LEASE = 60_000


@pytest.fixture
def connections(pgstore_database: str) -> Iterator[list[psycopg.Connection[Any]]]:
    conns: list[psycopg.Connection[Any]] = []
    try:
        for _ in range(16):
            conns.append(psycopg.connect(pgstore_database, autocommit=True))
        yield conns
    finally:
        for conn in conns:
            conn.close()


def test_claim_due_race_has_exactly_one_winner(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    racers = 16
    trials = 100
    stores = [PgScheduleStore(conn, schema=pgstore_schema) for conn in connections[:racers]]
    setup = stores[0]
    setup.register("race", "interval", "1000", 0, 0)
    barrier = threading.Barrier(racers, timeout=BARRIER_TIMEOUT)

    def claim(i: int, now: int) -> ClaimResult | None:
        barrier.wait()
        return stores[i].claim_due("race", f"w{i}", now, LEASE)

    with ThreadPoolExecutor(max_workers=racers) as pool:
        for trial in range(trials):
            now = 1_000 + trial
            before = setup.get("race")
            assert before is not None
            assert before.lease_owner is None
            futures = [pool.submit(claim, i, now) for i in range(racers)]
            results = [f.result(timeout=BARRIER_TIMEOUT * 2) for f in futures]
            winners = [(i, r) for i, r in enumerate(results) if r is not None]
            assert len(winners) == 1, f"trial {trial}: {len(winners)} winners"
            i, won = winners[0]
            assert won.fencing_token == before.fencing_token + 1, f"trial {trial}"
            assert won.record.fencing_token == won.fencing_token
            assert (won.record.lease_owner, won.record.lease_until) == (f"w{i}", now + LEASE)
            assert setup.get("race") == won.record, f"trial {trial}"
            # Make it due again for the next trial: complete it, or now and then
            # delete and re-register (the token carries over as the high-water mark).
            if trial % 10 == 9:
                setup.delete("race")
                again = setup.register("race", "interval", "1000", 0, now)
                assert again.fencing_token == won.fencing_token
            else:
                patch = CompletePatch(next_run_at=0, last_run_at=now, last_status="ok")
                assert setup.complete("race", won.fencing_token, patch, now)
    final = setup.get("race")
    assert final is not None and final.fencing_token == trials


def test_claim_next_workers_claim_every_record_exactly_once(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    workers = 8
    records = 1_000
    limit = 7
    now = 10_000
    stores = [PgScheduleStore(conn, schema=pgstore_schema) for conn in connections[:workers]]
    setup = stores[0]
    with connections[-1].transaction():
        loader = PgScheduleStore(connections[-1], schema=pgstore_schema)
        for n in range(records):
            # Spread next_run_at with many ties, so both order keys matter.
            loader.register(f"r{n:04d}", "interval", "1000", n % 37, 0)
    # Not due (future) and tombstoned records must never be claimed.
    setup.register("future", "interval", "1000", now + 1, 0)
    setup.register("tombstone", "once", "x", None, 0)

    barrier = threading.Barrier(workers, timeout=BARRIER_TIMEOUT)
    lock = threading.Lock()
    total = [0]

    def work(i: int) -> list[list[ClaimResult]]:
        answers: list[list[ClaimResult]] = []
        empties = 0
        barrier.wait()
        while True:
            with lock:
                if total[0] >= records:
                    break
            got = stores[i].claim_next(f"w{i}", now, LEASE, limit)
            assert len(got) <= limit
            if got:
                empties = 0
                answers.append(got)
                with lock:
                    total[0] += len(got)
            else:
                # Empty may only mean the remaining rows are locked by in-flight claims.
                empties += 1
                if empties >= 20:
                    break
                time.sleep(0.001)
        return answers

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(work, i) for i in range(workers)]
        per_worker = [f.result(timeout=120) for f in futures]

    for i, worker in enumerate(per_worker):
        for got in worker:
            keys = [(c.record.next_run_at or 0, c.record.id) for c in got]
            assert keys == sorted(keys)  # each answer in (next_run_at, id) order
            assert all(c.record.lease_owner == f"w{i}" for c in got)
            assert all(c.record.lease_until == now + LEASE for c in got)
    claimed = [c for worker in per_worker for got in worker for c in got]
    ids = [c.record.id for c in claimed]
    assert len(ids) == len(set(ids)), "a record was claimed twice"
    assert set(ids) == {f"r{n:04d}" for n in range(records)}
    assert all(c.fencing_token == 1 == c.record.fencing_token for c in claimed)
    assert sum(1 for worker in per_worker if worker) >= 2  # the work really was shared
    # Everything is leased now: nothing is left to claim, and the store agrees.
    assert setup.claim_next("late", now, LEASE, limit) == []
    state = {r.id: r for r in setup.list()}
    assert all(state[id].lease_owner is not None for id in ids)
    assert state["future"].fencing_token == 0 and state["future"].lease_owner is None
    assert state["tombstone"].fencing_token == 0 and state["tombstone"].lease_owner is None
