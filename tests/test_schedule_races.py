"""Concurrency with real parallel connections: claims have exactly one winner."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgstore import CompletePatch, PgScheduleStore


@pytest.fixture
def stores(pgstore_database: str, pgstore_schema: str) -> Iterator[list[PgScheduleStore]]:
    conns: list[psycopg.Connection[Any]] = [
        psycopg.connect(pgstore_database, autocommit=True) for _ in range(16)
    ]
    try:
        yield [PgScheduleStore(c, schema=pgstore_schema) for c in conns]
    finally:
        for c in conns:
            c.close()


def _race(workers: list[PgScheduleStore], body: Any) -> list[Any]:
    barrier = threading.Barrier(len(workers))
    results: list[Any] = [None] * len(workers)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = body(i, workers[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_sixteen_claimers_of_one_due_id_have_one_winner(stores: list[PgScheduleStore]) -> None:
    admin = stores[0]
    admin.register("job", "interval", "1000", 0, 0)
    for trial in range(100):
        now = 1_000 * (trial + 1)
        token_before = admin.get("job").fencing_token  # type: ignore[union-attr]
        results = _race(stores, lambda i, s, at=now: s.claim_due("job", f"w{i}", at, 500))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1, f"trial {trial}: {len(winners)} winners"
        assert winners[0].fencing_token == token_before + 1
        assert admin.complete(
            "job", winners[0].fencing_token, CompletePatch(now + 1_000, now, "ok"), now
        )


def test_eight_claim_next_workers_claim_each_record_exactly_once(
    stores: list[PgScheduleStore],
) -> None:
    admin = stores[0]
    for n in range(1_000):
        admin.register(f"r{n:04d}", "interval", "1000", n, 0)

    def drain(i: int, s: PgScheduleStore) -> list[str]:
        mine: list[str] = []
        empties = 0
        while empties < 3:
            got = s.claim_next(f"w{i}", 10_000, 600_000, 7)
            if got:
                empties = 0
                assert all(c.fencing_token == 1 for c in got)
                mine.extend(c.record.id for c in got)
            else:
                empties += 1
        return mine

    results = _race(stores[:8], drain)
    counts = Counter(id for ids in results for id in ids)
    assert len(counts) == 1_000
    assert set(counts.values()) == {1}
    assert sum(1 for ids in results if ids) >= 2  # the work really was shared
