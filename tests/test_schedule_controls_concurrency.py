"""schedule_trigger racing the claims and an expired holder, on real parallel connections:
never two live holders, and a stale holder never commits (docs/schedule-controls.md).

Each trial leaves the schedule with an expired lease (a stalled holder), due or not,
then releases claimers (``claim_due`` and ``claim_next``, twice each) and triggerers
together through a ``threading.Barrier``. Workers run in a ``ThreadPoolExecutor`` and
their results are read with ``Future.result()``, so an exception in any worker fails
the test.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from pgstore import ClaimResult, CompletePatch, PgScheduleStore

pytestmark = pytest.mark.slow

BARRIER_TIMEOUT = 30.0
LEASE = 60_000
FUTURE = 10**12
CLAIMERS = 8
TRIGGERERS = 4
TRIALS = 150


@pytest.fixture
def connections(pgstore_database: str) -> Iterator[list[psycopg.Connection[Any]]]:
    conns: list[psycopg.Connection[Any]] = []
    try:
        for _ in range(CLAIMERS + TRIGGERERS + 1):
            conns.append(psycopg.connect(pgstore_database, autocommit=True))
        yield conns
    finally:
        for conn in conns:
            conn.close()


def test_a_trigger_racing_claims_never_yields_two_live_holders(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    stores = [PgScheduleStore(conn, schema=pgstore_schema) for conn in connections]
    setup = stores[-1]
    setup.register("race", "interval", "1000", 0, 0)
    barrier = threading.Barrier(CLAIMERS + TRIGGERERS, timeout=BARRIER_TIMEOUT)
    seen = {"triggered_before_claim": 0, "trigger_refused": 0, "no_winner": 0}

    def claim(i: int, now: int) -> list[ClaimResult]:
        barrier.wait()
        store = stores[i]
        won = [c for c in (store.claim_due("race", f"w{i}", now, LEASE),) if c is not None]
        won += store.claim_next(f"w{i}", now, LEASE, 1, ["race"])
        if i % 2:
            won += [c for c in (store.claim_due("race", f"w{i}", now, LEASE),) if c is not None]
        return won

    def trigger(i: int, now: int) -> bool:
        barrier.wait()
        return stores[CLAIMERS + i].trigger("race", now) is not None

    def stalled_holder(trial: int, base: int, due: bool) -> ClaimResult:
        """The schedule at ``base``: a pending trigger run off, then a holder whose
        lease expires at once, due (next_run_at 0) or not (next_run_at in the future)."""
        current = setup.get("race")
        assert current is not None
        if current.triggered_at is not None:
            pending = setup.claim_due("race", "reset", base, 1)
            assert pending is not None
            assert setup.complete("race", pending.fencing_token, CompletePatch(0, base, "ok"),
                                  base)
        setup.register("race", "interval", f"{trial}", 0, base)  # another spec: moved
        stale = setup.claim_due("race", "stalled", base, 1)
        assert stale is not None
        if not due:
            setup.register("race", "interval", f"{trial}-later", FUTURE, base)
        return stale

    with ThreadPoolExecutor(max_workers=CLAIMERS + TRIGGERERS) as pool:
        for trial in range(TRIALS):
            base = 1_000_000 * (trial + 1)  # every lease of the trial before has expired
            due = trial % 2 == 0
            stale = stalled_holder(trial, base, due)
            now = base + 10
            claims = [pool.submit(claim, i, now) for i in range(CLAIMERS)]
            triggers = [pool.submit(trigger, i, now) for i in range(TRIGGERERS)]
            won = [c for f in claims for c in f.result(timeout=BARRIER_TIMEOUT * 2)]
            accepted = [f.result(timeout=BARRIER_TIMEOUT * 2) for f in triggers]
            record = setup.get("race")
            assert record is not None
            assert len(won) <= 1, f"trial {trial}: {len(won)} holders"
            if due:
                assert len(won) == 1, f"trial {trial}: a due schedule went unclaimed"
            else:
                assert any(accepted), f"trial {trial}: nothing held it, yet no trigger"
            if won:
                (winner,) = won
                assert winner.fencing_token > stale.fencing_token
                # No trigger took the lease from under the winner.
                assert (record.lease_owner, record.fencing_token) == (
                    winner.record.lease_owner, winner.fencing_token
                ), f"trial {trial}"
                if winner.record.triggered_at is not None:
                    seen["triggered_before_claim"] += 1
                if not all(accepted):
                    seen["trigger_refused"] += 1
                kept = record.next_run_at
                assert setup.complete("race", winner.fencing_token,
                                      CompletePatch(7, now, "ok"), now)
                after = setup.get("race")
                assert after is not None
                if winner.record.triggered_at is not None:
                    assert after.next_run_at == kept  # a triggered run moves nothing
                else:
                    assert after.next_run_at == 7
            else:
                seen["no_winner"] += 1
                assert record.triggered_at is not None  # asked for, not yet claimed
            # The stalled holder can never commit once anyone claimed or triggered.
            assert not setup.complete("race", stale.fencing_token,
                                      CompletePatch(FUTURE, now, "ok"), now)
            assert not setup.renew("race", stale.fencing_token, now + LEASE)
    # Every interleaving was met: a trigger before a claim, and after one (refused).
    assert seen["triggered_before_claim"] > 0 and seen["trigger_refused"] > 0, seen
