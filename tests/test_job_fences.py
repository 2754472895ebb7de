"""The job store's fences (revision pgstore_0014), against a real server.

* ``job_remove`` is granted to the client role, and as that role it deletes only a
  waiting job with no lease holder: a dispatched, cancelled, failed, leased or
  expired-leased job answers 55000 and its row is unchanged.
* A run id purged or removed and then scheduled again is leased above every lease
  sequence it had: with real parallel connections racing purges and removes,
  schedules of the same run ids and leases, no ``(run_id, lease_sequence)`` is ever
  handed out twice.
* A lease that fails a job out of attempts sets ``finished_at`` from the database
  clock; the mark in ``job_fences`` only ever rises.
"""

from __future__ import annotations

import contextlib
import random
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgstore import Job, JobNotRemovable, PgJobStore
from pgstore.schema.migrations import migrate

SCHEMA = "fenced"
BARRIER_TIMEOUT = 30.0


# --- job_remove as the client role ----------------------------------------------------------


@pytest.fixture
def client_conn(pgstore_fresh_database: Callable[[], str]) -> Iterator[tuple[str, str]]:
    """A migrated schema, and a login role that is a member of its client role: (the
    owner's dsn, the client's dsn)."""
    dsn = pgstore_fresh_database()
    migrate(dsn, SCHEMA)
    client = f"{SCHEMA}_client_{conninfo_to_dict(dsn)['dbname']}"
    login = f"pgstore_t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
        admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(client),
                                                       sql.Identifier(login)))
    try:
        yield dsn, make_conninfo(dsn, user=login)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(login)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(login)))


def _rows(dsn: str) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT * FROM {SCHEMA}.jobs ORDER BY run_id").fetchall()


def test_the_client_role_removes_only_a_waiting_job_with_no_lease_holder(
    client_conn: tuple[str, str],
) -> None:
    owner_dsn, client_dsn = client_conn
    with psycopg.connect(client_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path = {SCHEMA}")
        for run_id in ("cancelled", "dispatched", "failed", "leased", "released"):
            conn.execute("SELECT job_schedule(%s, 0, %s)",
                         (run_id, 1 if run_id == "failed" else None))
        conn.execute("SELECT job_schedule('expired', 5)")
        conn.execute("SELECT job_schedule('waiting', 9223372036854775807)")  # never leased
        conn.execute("SELECT job_cancel('cancelled')")
        # In lease order: dispatched, failed, leased, released, then expired.
        for holder in ("h-d", "h-f", "h-l", "h-r"):
            conn.execute("SELECT job_lease(%s, NULL, 3600000)", (holder,))
        conn.execute("SELECT job_lease('h-e', 10, 1)")  # expired on the database clock at once
        assert conn.execute("SELECT recorded FROM job_mark_dispatched('dispatched', 'h-d', 'bot')"
                            ).fetchone() == (True,)
        assert conn.execute("SELECT job_release('failed', 'h-f', 0)").fetchone() == (True,)
        assert conn.execute("SELECT job_release('released', 'h-r', 9223372036854775807)"
                            ).fetchone() == (True,)
        before = _rows(owner_dsn)
        for run_id, state in [("dispatched", "dispatched"), ("cancelled", "cancelled"),
                              ("failed", "failed"), ("leased", "leased by 'h-l'"),
                              ("expired", "leased by 'h-e'")]:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
                conn.execute("SELECT job_remove(%s)", (run_id,))
            assert refused.value.sqlstate == "55000"
            assert f"job '{run_id}' is {state}" in str(refused.value)
            assert "job_cancel" in (refused.value.diag.message_hint or "")
            assert _rows(owner_dsn) == before, run_id
        conn.execute("SELECT job_remove('waiting')")
        conn.execute("SELECT job_remove('released')")
        conn.execute("SELECT job_remove('never-was')")
        assert [r[0] for r in _rows(owner_dsn)] == [
            "cancelled", "dispatched", "expired", "failed", "leased"]
        assert [r[1:] for r in _rows(owner_dsn)] == [
            r[1:] for r in before if r[0] not in ("released", "waiting")]
        # The mark: released's one lease (sequence 1); the others' rows stay.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM job_fences")
    with psycopg.connect(owner_dsn) as conn:
        assert conn.execute(f"SELECT * FROM {SCHEMA}.job_fences").fetchall() == [(True, 1)]


def test_the_python_stores_raise_job_not_removable_as_the_client_role(
    client_conn: tuple[str, str],
) -> None:
    owner_dsn, client_dsn = client_conn
    with PgJobStore(client_dsn, schema=SCHEMA) as store:
        store.schedule("r", 0)
        leased = store.lease("h", None, 3_600_000)
        assert leased is not None
        before = _rows(owner_dsn)
        with pytest.raises(JobNotRemovable, match="is leased by 'h'") as refused:
            store.remove("r")
        assert refused.value.sqlstate == "55000"
        assert _rows(owner_dsn) == before
        assert store.mark_dispatched("r", "h", "bot", leased.lease_sequence).recorded
        with pytest.raises(JobNotRemovable, match="is dispatched"):
            store.remove("r")
        assert _rows(owner_dsn)[0][5] is True  # still there, dispatched


# --- the mark, and a lease that fails a job ------------------------------------------------


@pytest.fixture
def db(pgstore_database: str, pgstore_schema: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pgstore_schema)))
        yield conn


def _one(conn: psycopg.Connection[Any], query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0] if len(row) == 1 else row


def test_the_mark_only_rises_and_covers_every_run_id(db: psycopg.Connection[Any]) -> None:
    db.execute("SELECT job_schedule(r, 0) FROM unnest(ARRAY['a', 'b']) r")
    for now in (1, 1, 10):
        db.execute("SELECT job_lease('h', %s, 1)", (now,))  # a, 1; b, 1; a, 2
    db.execute("SELECT job_cancel(r) FROM unnest(ARRAY['a', 'b']) r")
    assert _one(db, "SELECT lease_sequence FROM job_fences") == 0
    assert _one(db, "SELECT job_purge(9223372036854775807, 1)") == 1  # a: finished first
    assert _one(db, "SELECT lease_sequence FROM job_fences") == 2
    assert _one(db, "SELECT job_purge(9223372036854775807, 10)") == 1  # b, at 1
    assert _one(db, "SELECT lease_sequence FROM job_fences") == 2
    # A purge of lower sequences, and a remove of a job never leased, lower nothing.
    db.execute("SELECT job_schedule('c', 0)")
    db.execute("SELECT job_remove('c')")
    assert _one(db, "SELECT lease_sequence FROM job_fences") == 2
    # Every lease, of any run id, by job_lease or job_lease_many, starts above it.
    db.execute("SELECT job_schedule(r, 0) FROM unnest(ARRAY['a', 'd', 'e']) r")
    assert _one(db, "SELECT lease_sequence FROM job_lease('h', NULL, 60000)") == 3
    assert db.execute("SELECT run_id, lease_sequence FROM job_lease_many('h', NULL, 60000, 5)"
                      ).fetchall() == [("d", 3), ("e", 3)]


def test_a_lease_that_fails_a_job_sets_finished_at_from_the_database_clock(
    db: psycopg.Connection[Any],
) -> None:
    db.execute("SELECT job_schedule('poison', 0, 1)")
    db.execute("SELECT job_schedule('next', 1)")
    assert _one(db, "SELECT run_id FROM job_lease('h', 5, 10)") == "poison"
    started = _one(db, "SELECT now_ms()")
    assert db.execute("SELECT * FROM job_lease('h2', 20, 10)").fetchall() == []
    ended = _one(db, "SELECT now_ms()")
    failed, finished_at, holder, until, attempts, sequence, error = _one(
        db, "SELECT failed, finished_at, lease_holder, lease_until, attempts, lease_sequence,"
            " last_error FROM jobs WHERE run_id = 'poison'")
    assert (failed, holder, until, attempts, sequence) == (True, None, None, 1, 1)
    assert started <= finished_at <= ended  # the database clock, not p_now
    assert error == ("out of attempts: leased 1 times (max_attempts 1), the last lease expired"
                     " without a release")
    assert _one(db, "SELECT jobs_failed FROM store_stats(NULL)") == 1
    assert _one(db, "SELECT run_id FROM job_lease('h2', 20, 10)") == "next"  # the next call


# --- purges and removes racing schedules and leases of the same run ids --------------------


TRIALS = 150
RACE_TTL = 3_600_000


@pytest.fixture
def connections(pgstore_database: str) -> Iterator[list[psycopg.Connection[Any]]]:
    conns = [psycopg.connect(pgstore_database, autocommit=True) for _ in range(4)]
    try:
        yield conns
    finally:
        for conn in conns:
            conn.close()


def test_no_lease_sequence_is_handed_out_twice_for_a_run_id_that_comes_back(
    connections: list[psycopg.Connection[Any]], pgstore_schema: str,
) -> None:
    """Each trial leases a fresh run id once (sequence s), lets that lease go (cancelled,
    for a purge; released, for a remove), then, released together by a barrier on three
    connections: one deletes it (job_purge or job_remove), one schedules it again and
    leases, one leases (job_lease or job_lease_many). Every lease handed out, in every
    trial, is recorded: no (run_id, lease_sequence) may appear twice."""
    setup, deleter, scheduler, leaser = (PgJobStore(c, schema=pgstore_schema)
                                         for c in connections)
    barrier = threading.Barrier(3, timeout=BARRIER_TIMEOUT)
    handed: list[tuple[str, int]] = []
    lock = threading.Lock()
    rng = random.Random(14)

    def record(jobs: list[Job]) -> None:
        with lock:
            handed.extend((j.run_id, j.lease_sequence) for j in jobs)

    def delete(run_id: str, purge: bool) -> None:
        barrier.wait()
        if purge:
            deleter.purge(2**63 - 1, 1_000)
        else:
            # Refused when the schedule and a lease got there first: then nothing goes.
            with contextlib.suppress(JobNotRemovable):
                deleter.remove(run_id)

    def schedule_and_lease(run_id: str, pause: float) -> None:
        barrier.wait()
        threading.Event().wait(pause)
        scheduler.schedule(run_id, 0, 1_000_000)
        record([j for j in [scheduler.lease("s", None, RACE_TTL)] if j is not None])

    def lease(batch: bool) -> None:
        barrier.wait()
        for _ in range(3):
            if batch:
                record(leaser.lease_many("l", None, RACE_TTL, 5))
            else:
                record([j for j in [leaser.lease("l", None, RACE_TTL)] if j is not None])

    fenced = 0
    with ThreadPoolExecutor(max_workers=3) as pool:
        for trial in range(TRIALS):
            run_id = f"r{trial:03d}"
            purge = trial % 2 == 0
            setup.schedule(run_id, 0, 1_000_000)
            first = setup.lease("old", 1, 1)  # expired at once on the database clock
            assert first is not None and first.run_id == run_id, f"trial {trial}"
            record([first])
            if purge:
                setup.cancel(run_id)
            else:
                # Due again only once scheduled again (dispatch_at 0).
                assert setup.release(run_id, "old", 2**62, first.lease_sequence)
            futures = [
                pool.submit(delete, run_id, purge),
                pool.submit(schedule_and_lease, run_id, rng.choice([0, 0, 0.0005, 0.002])),
                pool.submit(lease, trial % 4 >= 2),
            ]
            for future in futures:
                future.result(timeout=BARRIER_TIMEOUT * 2)
            again = setup.get(run_id)
            if again is not None and again.lease_sequence > first.lease_sequence:
                fenced += 1
    twice = {pair: n for pair, n in Counter(handed).items() if n > 1}
    print(f"\n{len(handed)} leases over {TRIALS} trials; run ids leased again above their"
          f" old lease: {fenced}; handed out twice: {len(twice)}")
    assert twice == {}
    assert fenced > TRIALS // 4  # the race did bring run ids back and lease them
