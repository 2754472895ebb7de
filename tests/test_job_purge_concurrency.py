"""``job_purge`` racing leases, renews, marks, releases and cancels on real parallel connections.

What it proves, against a real server, in every one of ``TRIALS`` trials:

* no job is deleted while it waits (neither dispatched nor cancelled) or while its
  lease is live: a BEFORE DELETE trigger, installed for the test only, records
  each deleted row as the server deletes it, and every recorded row was
  finished with no live lease;
* what the purges answer adds up to what was deleted, and nothing else deletes;
* once the racers stop, purging to the end leaves no finished job without a live
  lease behind (skipping locked rows never loses one for good).

Live leases come from leasers on the database clock (``now=None``, an hour
long); leases that are already expired on that clock come from a leaser at
``now=1``, so its dispatched jobs become purgeable while the others race.
Every worker owns an autocommit connection; a barrier releases them together,
and ``Future.result()`` makes any worker's exception fail the test.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgstore import PgJobStore

TRIALS = 20
JOBS = 40
LIVE_TTL = 3_600_000
BATCH = 3
BARRIER_TIMEOUT = 30.0
ROUNDS = 60

#: Records every deleted job as it is deleted: was it finished, was its lease live?
AUDIT = """
CREATE TABLE {s}.purge_audit (
    run_id text, finished boolean, lease_live boolean, dispatched boolean
);
CREATE FUNCTION {s}.purge_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.purge_audit
    VALUES (OLD.run_id, OLD.dispatched OR OLD.cancelled,
            OLD.lease_until IS NOT NULL
            AND OLD.lease_until > (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
            OLD.dispatched);
    RETURN OLD;
END
$$;
CREATE TRIGGER purge_audit BEFORE DELETE ON {s}.jobs
    FOR EACH ROW EXECUTE FUNCTION {s}.purge_audit_row();
"""


@pytest.fixture
def connections(pgstore_database: str, pgstore_schema: str) -> Iterator[list[psycopg.Connection[Any]]]:
    conns: list[psycopg.Connection[Any]] = []
    try:
        for _ in range(7):
            conns.append(psycopg.connect(pgstore_database, autocommit=True))
        conns[0].execute(sql.SQL(AUDIT).format(s=sql.Identifier(pgstore_schema)))
        yield conns
    finally:
        for conn in conns:
            conn.close()


def _rows(conn: psycopg.Connection[Any], schema: str, query: str) -> list[Any]:
    return conn.execute(sql.SQL(query).format(s=sql.Identifier(schema))).fetchall()


def _race(stores: list[PgJobStore], ids: list[str], trial: int) -> int:
    """One trial's race (every job due at 0); what the purges answered in all."""
    barrier = threading.Barrier(6, timeout=BARRIER_TIMEOUT)
    stop = threading.Event()
    purged = [0, 0]

    def leaser(i: int, now: int | None, ttl: int, seed: int) -> None:
        store, rng = stores[1 + i], random.Random(seed)
        barrier.wait()
        for _ in range(ROUNDS):
            job = store.lease(f"h{i}", now, ttl)
            if job is None:
                continue
            step = rng.random()
            if step < 0.5:
                store.mark_dispatched(job.run_id, f"h{i}", "w", job.lease_sequence)
            elif step < 0.7:
                store.release(job.run_id, f"h{i}", 0, job.lease_sequence)
            else:
                store.renew(job.run_id, f"h{i}", now, ttl, job.lease_sequence)

    def canceller(seed: int) -> None:
        rng = random.Random(seed)
        barrier.wait()
        for run_id in rng.sample(ids, JOBS // 2):
            stores[4].cancel(run_id)

    def purger(i: int) -> None:
        barrier.wait()
        while not stop.is_set():
            purged[i] += stores[5 + i].purge(2**63 - 1, BATCH)

    with ThreadPoolExecutor(max_workers=6) as pool:
        racers = [
            pool.submit(leaser, 0, None, LIVE_TTL, trial),
            pool.submit(leaser, 1, None, LIVE_TTL, trial + 1000),
            pool.submit(leaser, 2, 1, 100, trial + 2000),  # expired on the database clock
            pool.submit(canceller, trial + 3000),
        ]
        purgers = [pool.submit(purger, 0), pool.submit(purger, 1)]
        for f in racers:
            f.result(timeout=300)
        stop.set()
        for f in purgers:
            f.result(timeout=300)
    return sum(purged)


def test_purge_never_deletes_a_waiting_or_leased_job(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str
) -> None:
    stores = [PgJobStore(conn, schema=pgstore_schema) for conn in connections]
    setup, conn = stores[0], connections[0]
    deleted = {"dispatched": 0, "cancelled": 0}
    for trial in range(TRIALS):
        ids = [f"t{trial:02d}-{n:02d}" for n in range(JOBS)]
        for run_id in ids:
            setup.schedule(run_id, 0)
        answered = _race(stores, ids, trial)
        while (n := setup.purge(2**63 - 1, BATCH)) > 0:
            answered += n

        audit = _rows(conn, pgstore_schema,
                      "SELECT run_id, finished, lease_live, dispatched FROM {s}.purge_audit")
        bad = [row for row in audit if not row[1] or row[2]]
        assert bad == [], f"trial {trial}: deleted while waiting or leased: {bad}"
        assert answered == len(audit), f"trial {trial}: answered {answered}, deleted {len(audit)}"
        left = _rows(conn, pgstore_schema,
                     "SELECT run_id FROM {s}.jobs WHERE (dispatched OR cancelled)"
                     " AND (lease_until IS NULL OR lease_until <= {s}.now_ms())")
        assert left == [], f"trial {trial}: purgeable jobs left behind: {left}"
        remaining = {r for (r,) in _rows(conn, pgstore_schema, "SELECT run_id FROM {s}.jobs")}
        assert remaining | {row[0] for row in audit} == set(ids), f"trial {trial}: a job vanished"
        for row in audit:
            deleted["dispatched" if row[3] else "cancelled"] += 1
        # The next trial starts from an empty table and an empty audit (no DELETE trigger).
        conn.execute(sql.SQL("TRUNCATE {s}.jobs, {s}.purge_audit").format(
            s=sql.Identifier(pgstore_schema)))
    print(f"\npurge race: {TRIALS} trials of {JOBS} jobs, deleted {deleted}")
    # Both kinds of finished job were purged while the others raced.
    assert deleted["dispatched"] > 0 and deleted["cancelled"] > 0, deleted
