"""store_stats() counts as due what a claim or a lease would take at that moment.

A paused schedule is never claimed, and a jittered one is claimed from its ``due_at``,
not its ``next_run_at`` (docs/schedule-controls.md); a paused queue's jobs are not
leased (docs/queues.md). So the gauges an alert reads (``schedules_due``, the oldest
due schedule, ``jobs_due``, the oldest due job) leave them out: a deliberate pause
raises no lag alert, and a jitter is not lateness. A paused queue's waiting jobs are
counted as pending, so every job is still in exactly one state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

SCHEDULE_GAUGES = "schedules, schedules_due, oldest_due_schedule_id, oldest_due_schedule_since"
JOB_GAUGES = "jobs_pending, jobs_due, jobs_due_expired_lease, jobs_leased, oldest_due_job_id"


@pytest.fixture
def db(pgstore_database: str, pgstore_schema: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pgstore_schema)))
        conn.execute("TRUNCATE jobs, schedules, queues")
        yield conn


def _row(conn: psycopg.Connection[Any], query: str, *args: Any) -> tuple[Any, ...]:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return tuple(row)


def _schedules(conn: psycopg.Connection[Any], now: int) -> tuple[Any, ...]:
    return _row(conn, f"SELECT {SCHEDULE_GAUGES} FROM store_stats(%s)", now)


def _jobs(conn: psycopg.Connection[Any], now: int) -> tuple[Any, ...]:
    return _row(conn, f"SELECT {JOB_GAUGES} FROM store_stats(%s)", now)


def _leasable(conn: psycopg.Connection[Any], now: int) -> int:
    """How many jobs job_lease_many would take at ``now``, in a transaction rolled back."""
    with conn.transaction(force_rollback=True):
        return len(conn.execute(
            "SELECT run_id FROM job_lease_many('probe', %s, 1000, 10000)", (now,)).fetchall())


def test_a_paused_schedule_is_not_due(db: psycopg.Connection[Any]) -> None:
    db.execute("SELECT schedule_register('a', 'interval', '60000', 100, 0)")
    db.execute("SELECT schedule_register('b', 'interval', '60000', 200, 0)")
    assert _schedules(db, 1000) == (2, 2, "a", 100)
    db.execute("SELECT schedule_pause('a', 0)")
    assert _schedules(db, 1000) == (2, 1, "b", 200)
    db.execute("SELECT schedule_pause('b', 0)")
    assert _schedules(db, 1000) == (2, 0, None, None)
    db.execute("SELECT schedule_resume('a', 0)")
    assert _schedules(db, 1000) == (2, 1, "a", 100)


def test_a_jittered_schedule_is_due_from_its_due_at(db: psycopg.Connection[Any]) -> None:
    db.execute("SELECT schedule_register('j', 'interval', '60000', 1000, 0, 'once', 50000)")
    due_at = _row(db, "SELECT due_at FROM schedules WHERE id = 'j'")[0]
    if due_at == 1000:  # a jitter of 0 drawn for this id: make it one that is not
        db.execute("SELECT schedule_register('jj', 'interval', '60000', 1000, 0, 'once', 50000)")
        db.execute("SELECT schedule_delete('j')")
        due_at = _row(db, "SELECT due_at FROM schedules WHERE id = 'jj'")[0]
    assert 1000 < due_at < 51000
    (sid,) = _row(db, "SELECT id FROM schedules")
    # Between the occurrence and its jittered due time a claim takes nothing.
    assert _schedules(db, due_at - 1) == (1, 0, None, None)
    assert db.execute("SELECT * FROM schedule_claim_due(%s, 'o', 1000, %s)",
                      (sid, due_at - 1)).fetchall() == []
    assert _schedules(db, due_at) == (1, 1, sid, due_at)


def test_a_triggered_schedule_is_due_from_its_trigger(db: psycopg.Connection[Any]) -> None:
    db.execute("SELECT schedule_register('t', 'interval', '60000', 100000, 0)")
    assert _schedules(db, 5000) == (1, 0, None, None)
    db.execute("SELECT schedule_trigger('t', 3000)")
    assert _schedules(db, 5000) == (1, 1, "t", 3000)


def test_a_paused_queue_s_jobs_are_pending_not_due(db: psycopg.Connection[Any]) -> None:
    db.execute("SELECT job_schedule('d1', 10)")
    db.execute("SELECT job_schedule('d2', 40)")
    db.execute("SELECT job_schedule('a1', 5, NULL, 'a')")
    db.execute("SELECT job_schedule('b1', 20, NULL, 'b', 3)")
    db.execute("SELECT job_schedule('late', 5000)")
    assert _jobs(db, 100) == (1, 4, 0, 0, "a1")
    assert _leasable(db, 100) == 4

    db.execute("SELECT queue_pause('a')")
    assert _jobs(db, 100) == (2, 3, 0, 0, "d1")
    assert _leasable(db, 100) == 3

    db.execute("SELECT queue_pause('default')")
    assert _jobs(db, 100) == (4, 1, 0, 0, "b1")
    assert _leasable(db, 100) == 1

    db.execute("SELECT queue_pause('b')")
    assert _jobs(db, 100) == (5, 0, 0, 0, None)
    assert _leasable(db, 100) == 0

    db.execute("SELECT queue_resume('a')")
    db.execute("SELECT queue_resume('default')")
    db.execute("SELECT queue_resume('b')")
    assert _jobs(db, 100) == (1, 4, 0, 0, "a1")


def test_a_paused_queue_s_expired_and_live_leases(db: psycopg.Connection[Any]) -> None:
    # A lease held when the queue was paused runs on (leased); once it has expired the
    # job is not leasable while the pause lasts, so it is pending, not due-expired.
    db.execute("SELECT job_schedule('x', 0, NULL, 'q')")
    db.execute("SELECT job_schedule('y', 0, NULL, 'q')")
    assert [r[0] for r in db.execute(
        "SELECT run_id FROM job_lease_many('h', 10, 1000, 1)").fetchall()] == ["x"]
    db.execute("SELECT queue_pause('q')")
    assert _jobs(db, 500) == (1, 0, 0, 1, None)
    assert _jobs(db, 2000) == (2, 0, 0, 0, None)
    db.execute("SELECT queue_resume('q')")
    assert _jobs(db, 2000) == (0, 2, 1, 0, "x")
    assert _leasable(db, 2000) == 2
