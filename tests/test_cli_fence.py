"""``pgstore fence --after-restore``, ``fence_after_restore()`` and the epoch in the floor.

On one server (no restore here: ``tests/test_restore_fence.py`` runs the restores): what
the fence lifts the floor to, what the next claims and leases hand out, that the epoch
only grows, bad input (nothing changes), the client role refused, usage errors before
any connection, and fences racing claims, leases and each other.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from pgstore import (
    AsyncPgScheduleStore,
    CompletePatch,
    Fence,
    InvalidArgument,
    PgJobStore,
    PgScheduleStore,
)
from pgstore.cli.fence import fence_text
from tests.support.cli_support import Run, clean_environment, in_process

BAND = 2**40
BAD_DSN = "host=127.0.0.1 port=1 user=nobody dbname=nothing connect_timeout=5"
SCHEMA = "cli_fence"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    clean_environment(monkeypatch)
    return in_process(capsys)


@pytest.fixture
def store_dsn(cli: Run, pgstore_fresh_database: Callable[[], str]) -> str:
    """A fresh database with the store migrated into SCHEMA (client role included)."""
    dsn = pgstore_fresh_database()
    assert cli("migrate", "--dsn", dsn, "--schema", SCHEMA)[0] == 0
    return dsn


def _state(conn: psycopg.Connection[Any]) -> list[Any]:
    return [conn.execute(sql.SQL("SELECT * FROM {}.{} ORDER BY 1").format(
        sql.Identifier(SCHEMA), sql.Identifier(t))).fetchall()
        for t in ("schedules", "schedule_fences", "jobs", "store_epoch")]


def _floor(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(f"SELECT {SCHEMA}.token_floor()").fetchone()
    assert row is not None
    return int(row[0])


def test_usage_errors_come_before_any_connection(cli: Run) -> None:
    status, out, _ = cli("fence", "--help")
    assert status == 0 and "--after-restore" in out and "--promotions" in out
    assert cli("fence", "--dsn", BAD_DSN)[0] == 2  # the mode is explicit: required
    for bad in ("-1", "1025", "x", "", "1.5"):
        assert cli("fence", "--after-restore", "--dsn", BAD_DSN, "--promotions", bad)[0] == 2
    status, _, err = cli("fence", "--after-restore", "--dsn", BAD_DSN)
    assert status == 1 and err.startswith("pgstore: error: ")


def test_the_fence_lifts_the_floor_above_every_token_and_lease(
    cli: Run, store_dsn: str
) -> None:
    dsn, where = store_dsn, ["--dsn", store_dsn, "--schema", SCHEMA]
    with PgScheduleStore(dsn, schema=SCHEMA) as schedules, PgJobStore(dsn, schema=SCHEMA) as jobs:
        schedules.register("s", "interval", "1000", 0, 0)
        schedules.register("gone", "interval", "1000", 0, 0)
        for _ in range(3):
            claim = schedules.claim_due("s", "w", None, 60_000)
            assert claim is not None
            assert schedules.complete("s", claim.fencing_token, _patch())
        schedules.delete("gone")
        jobs.schedule("j", 0)
        jobs.schedule("fresh", 10**15)  # never leased before the fence
        job = jobs.lease("h", None, 60_000)
        assert job is not None and job.lease_sequence == 1
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert _floor(conn) == 0
            # As if the copy held a token well inside the first band.
            conn.execute(f"UPDATE {SCHEMA}.schedule_fences SET fencing_token = 7 * 10^9")

        status, out, err = cli("fence", "--after-restore", *where)
        assert status == 0, err
        assert out.splitlines() == fence_text(SCHEMA, Fence(0, 2 * BAND), 1).splitlines()
        assert "token floor before: 0 (0 bands of 2^40)" in out
        assert f"token floor after:  {2 * BAND} (2 bands of 2^40)" in out

        claim = schedules.claim_due("s", "w", None, 60_000)
        assert claim is not None and claim.fencing_token == 2 * BAND
        assert schedules.register("gone", "interval", "1000", 0, 0).fencing_token == 2 * BAND
        assert jobs.release("j", "h", 0, 1)
        leased = jobs.lease("h", None, 60_000)
        assert leased is not None and leased.lease_sequence == 2 * BAND
        jobs.schedule("fresh", 0)
        leased = jobs.lease("h", None, 60_000)
        assert leased is not None and leased.run_id == "fresh"
        assert leased.lease_sequence == 2 * BAND  # a job no lease had touched: the floor too

        # Again, with no promotion allowed for: M = 2^41 (the floor and the tokens), so
        # one more band; the row says when and from where to where.
        status, out, _ = cli("fence", "--after-restore", *where, "--promotions", "0")
        assert status == 0 and f"token floor after:  {3 * BAND} " in out
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(f"SELECT epoch, fenced_at IS NOT NULL, floor_before, floor_after"
                               f" FROM {SCHEMA}.store_epoch").fetchone()
            assert row == (3, True, 2 * BAND, 3 * BAND) and _floor(conn) == 3 * BAND

        # The Python method: one call, the same answer the CLI prints.
        fence = schedules.fence_after_restore(5)
        assert fence == Fence(3 * BAND, 9 * BAND)
        assert jobs.fence_after_restore() == Fence(9 * BAND, 11 * BAND)
        with psycopg.connect(dsn, autocommit=True) as conn:  # the SQL default: 1 too
            assert conn.execute(f"SELECT * FROM {SCHEMA}.fence_after_restore()"
                                ).fetchall() == [(11 * BAND, 13 * BAND)]


def _patch() -> CompletePatch:
    return CompletePatch(0, 0, "ok")


def test_bad_input_changes_nothing(store_dsn: str) -> None:
    with psycopg.connect(store_dsn, autocommit=True) as conn:
        before = _state(conn)
        for bad in ("NULL", "-1", "1025", "2147483647"):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="promotions"):
                conn.execute(f"SELECT * FROM {SCHEMA}.fence_after_restore({bad})")
        assert _state(conn) == before
        store = PgScheduleStore(conn, schema=SCHEMA)
        for value in (-1, 1025, None, True, 1.0, "1"):
            with pytest.raises(InvalidArgument):
                store.fence_after_restore(value)  # type: ignore[arg-type]
        assert _state(conn) == before


def test_the_floor_past_a_bigint_raises_and_changes_nothing(store_dsn: str) -> None:
    """Near the last band the product overflows: 22003, never a wrapped floor."""
    with psycopg.connect(store_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {SCHEMA}.store_epoch SET epoch = 2^23 - 3")
        before = _state(conn)
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            conn.execute(f"SELECT * FROM {SCHEMA}.fence_after_restore(5)")
        assert _state(conn) == before


def test_a_lost_epoch_row_stops_every_claim_and_lease(store_dsn: str) -> None:
    """Fail closed: without store_epoch's row no write hands out a token below the floor."""
    with psycopg.connect(store_dsn, autocommit=True) as conn:
        conn.execute(f"SELECT * FROM {SCHEMA}.schedule_register('s', 'interval', '1', 0, 0)")
        conn.execute(f"SELECT {SCHEMA}.job_schedule('j', 0)")
        conn.execute(f"DELETE FROM {SCHEMA}.store_epoch")
        before = _state(conn)
        for call in ("schedule_claim_due('s', 'w', NULL, 1000)",
                     "schedule_claim_next('w', NULL, 1000, 5)",
                     "job_lease('h', NULL, 1000)", "job_lease_many('h', NULL, 1000, 5)",
                     "schedule_register('t', 'interval', '1', 0, 0)",
                     "fence_after_restore()"):
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="store_epoch"):
                conn.execute(f"SELECT * FROM {SCHEMA}.{call}")
        assert _state(conn) == before


def test_the_client_role_may_not_fence(cli: Run, store_dsn: str) -> None:
    client = f"{SCHEMA}_client_{conninfo_to_dict(store_dsn)['dbname']}"
    with psycopg.connect(store_dsn, autocommit=True) as conn:
        before = _state(conn)
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(client)))
        for call in ("fence_after_restore()", "token_floor()", "token_floor_at(0)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {SCHEMA}.{call}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"SELECT * FROM {SCHEMA}.store_epoch")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # as purge: the owner's
            PgScheduleStore(conn, schema=SCHEMA).fence_after_restore()
        conn.execute("RESET ROLE")
        assert _state(conn) == before
    status, _, err = cli("fence", "--after-restore", "--dsn", store_dsn, "--schema", "nowhere")
    assert status == 1 and "nowhere" in err  # not migrated: says what to run


def test_the_asyncio_store_fences_too(store_dsn: str) -> None:
    async def fence() -> Fence:
        async with AsyncPgScheduleStore(store_dsn, schema=SCHEMA) as store:
            return await store.fence_after_restore(0)

    assert asyncio.run(fence()) == Fence(0, BAND)


#: Rounds of the race (each on a fresh database); PGSTORE_FENCE_TRIALS=50 for a long run.
TRIALS = int(os.environ.get("PGSTORE_FENCE_TRIALS", "5"))


@pytest.mark.parametrize("trial", range(TRIALS))
def test_fences_racing_claims_leases_and_each_other(store_dsn: str, trial: int) -> None:
    """Claimers, leasers and two fencers on their own connections, many rounds: per id the
    tokens and lease sequences handed out only grow, every fence lifts the floor above
    the one before it (they serialize on store_epoch's row), and what is handed out after
    a fence returned is at least the floor it set."""
    ids = [f"s{k}" for k in range(4)]
    with PgScheduleStore(store_dsn, schema=SCHEMA) as schedules, \
            PgJobStore(store_dsn, schema=SCHEMA) as jobs:
        for id_ in ids:
            schedules.register(id_, "interval", "1", 0, 0)
        for k in range(4):
            jobs.schedule(f"j{k}", 0, 10**6)
    stop = threading.Event()
    errors: list[BaseException] = []
    handed: dict[str, list[tuple[int, int]]] = {}  # id -> (token, highest fence seen before)
    fences: list[Fence] = []
    lock = threading.Lock()

    def highest_fence() -> int:
        with lock:
            return max((f.floor_after for f in fences), default=0)

    def claimer(worker: int) -> None:
        try:
            with psycopg.connect(store_dsn, autocommit=True) as conn:
                store = PgScheduleStore(conn, schema=SCHEMA)
                jobs = PgJobStore(conn, schema=SCHEMA)
                while not stop.is_set():
                    seen = highest_fence()
                    for claim in store.claim_next(f"w{worker}", None, 60_000, 2):
                        with lock:
                            handed.setdefault(claim.record.id, []).append(
                                (claim.fencing_token, seen))
                        store.complete(claim.record.id, claim.fencing_token, _patch())
                    seen = highest_fence()
                    job = jobs.lease(f"h{worker}", None, 60_000)
                    if job is not None:
                        assert job.lease_sequence is not None
                        with lock:
                            handed.setdefault(job.run_id, []).append((job.lease_sequence, seen))
                        jobs.release(job.run_id, f"h{worker}", 0, job.lease_sequence)
        except BaseException as exc:
            errors.append(exc)

    def fencer() -> None:
        try:
            with psycopg.connect(store_dsn, autocommit=True) as conn:
                store = PgScheduleStore(conn, schema=SCHEMA)
                for _ in range(8):
                    fence = store.fence_after_restore(0)
                    with lock:
                        fences.append(fence)
                    time.sleep(0.005)  # claims and leases in between
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=claimer, args=(k,)) for k in range(3)]
    fencers = [threading.Thread(target=fencer) for _ in range(2)]
    for thread in workers + fencers:
        thread.start()
    for thread in fencers:
        thread.join(120)
    stop.set()
    for thread in workers:
        thread.join(120)
    assert errors == []
    assert len(fences) == 16
    # Serialized: each fence starts from the floor another set, none from the same one.
    befores = sorted(f.floor_before for f in fences)
    afters = sorted(f.floor_after for f in fences)
    assert befores == [0, *afters[:-1]] and len(set(afters)) == 16
    assert all(f.floor_after > f.floor_before for f in fences)
    assert sum(len(v) for v in handed.values()) > 16
    lifted = sum(t >= BAND for v in handed.values() for t, _ in v)
    print(f"trial {trial}: {sum(len(v) for v in handed.values())} claims and leases, "
          f"{lifted} of them above a fence's floor; floor {afters[-1] // BAND} bands")
    for id_, values in handed.items():
        # One worker's values in its order are not the id's order; sorted by value, the
        # id's values are distinct (each handed out once) ...
        tokens = [t for t, _ in values]
        assert len(set(tokens)) == len(tokens), id_
        # ... and each is at least the floor of every fence that returned before the call.
        assert all(t >= seen for t, seen in values), id_
