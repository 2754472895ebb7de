"""store_stats()' history counts: exact, from job_history plus the jobs finished since.

Each test compares store_stats() with the counts read the slow way (a scan of the
jobs table: what store_stats answered until pgstore_0014), after every kind of
move a finished job can make: finish, recall, cancel of a failed job, retry,
remove, purge. The readers set ``pgstore.stats_lag_ms`` to 0, so job_history
moves at every call that may, not once per ten seconds.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

HISTORY = "jobs_dispatched, jobs_recalled, jobs_cancelled, jobs_failed"


@pytest.fixture
def db(pgstore_database: str, pgstore_schema: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pgstore_schema)))
        conn.execute("SET pgstore.stats_lag_ms = 0")  # advance at every call, not every 10 s
        conn.execute("TRUNCATE jobs")
        conn.execute("UPDATE job_history SET upto = -9223372036854775808, finished = 0,"
                     " dispatched = 0, recalled = 0, failed = 0, next_upto = NULL,"
                     " next_snapshot = NULL")
        yield conn


def _scanned(conn: psycopg.Connection[Any]) -> tuple[int, ...]:
    """The history counts by a scan of the table, as store_stats read them up to 0013."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE dispatched),"
        "       count(*) FILTER (WHERE dispatched AND cancelled),"
        "       count(*) FILTER (WHERE cancelled AND NOT dispatched),"
        "       count(*) FILTER (WHERE failed AND NOT cancelled AND NOT dispatched)"
        "  FROM jobs").fetchone()
    assert row is not None
    return tuple(row)


def _stats(conn: psycopg.Connection[Any]) -> tuple[int, ...]:
    row = conn.execute(f"SELECT {HISTORY} FROM store_stats()").fetchone()
    assert row is not None
    return tuple(row)


def _upto(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT upto FROM job_history").fetchone()
    assert row is not None
    return int(row[0])


def _caught_up(conn: psycopg.Connection[Any], past: int, timeout: float = 30.0) -> None:
    """Call store_stats() (exact at every call) until job_history.upto is above ``past``:
    an upto is taken only once the transactions running at its proposal have ended,
    other sessions' of the server included."""
    deadline = time.monotonic() + timeout
    while _upto(conn) <= past:
        assert time.monotonic() < deadline, f"upto {_upto(conn)} never passed {past}"
        assert _stats(conn) == _scanned(conn)
        time.sleep(0.05)


def test_random_moves_keep_the_counts_exact_across_advances(
    db: psycopg.Connection[Any],
) -> None:
    rng = random.Random(14)
    ids = [f"j{i:03d}" for i in range(120)]
    for run_id in ids:
        db.execute("SELECT job_schedule(%s, 0, %s)", (run_id, rng.choice([1, 1, 2, 25])))
    counted_below_upto = 0
    for _ in range(10):
        for _ in range(40):
            run_id = rng.choice(ids)
            move = rng.choice(["lease_mark", "lease_mark", "lease_release", "cancel", "retry",
                               "remove", "purge", "schedule", "cancel_then_mark"])
            if move == "lease_mark":
                leased = db.execute("SELECT run_id FROM job_lease('h', NULL, 60000)").fetchall()
                for (got,) in leased:
                    db.execute("SELECT * FROM job_mark_dispatched(%s, 'h', 'bot')", (got,))
            elif move == "lease_release":
                leased = db.execute("SELECT run_id FROM job_lease('h', NULL, 60000)").fetchall()
                for (got,) in leased:
                    db.execute("SELECT job_release(%s, 'h', 0)", (got,))
            elif move == "cancel":
                db.execute("SELECT job_cancel(%s)", (run_id,))
            elif move == "cancel_then_mark":  # a recall: the mark of a cancelled job
                leased = db.execute("SELECT run_id FROM job_lease('h', NULL, 60000)").fetchall()
                for (got,) in leased:
                    db.execute("SELECT job_cancel(%s)", (got,))
                    db.execute("SELECT * FROM job_mark_dispatched(%s, 'h', 'bot')", (got,))
            elif move == "retry":
                failed = db.execute(
                    "SELECT run_id FROM job_list('failed', NULL, 3)").fetchall()
                for (got,) in failed:
                    db.execute("SELECT job_retry(%s, 0)", (got,))
            elif move == "remove":  # refused (55000, nothing changes) unless it waits unleased
                with contextlib.suppress(psycopg.errors.ObjectNotInPrerequisiteState):
                    db.execute("SELECT job_remove(%s)", (run_id,))
            elif move == "purge":
                db.execute("SELECT job_purge(%s, %s)",
                           (rng.choice([max(_upto(db), 0), 2**62]), rng.randint(1, 5)))
            else:
                db.execute("SELECT job_schedule(%s, 0, 2)", (run_id,))
            assert _stats(db) == _scanned(db)
        row = db.execute("SELECT count(*) FROM jobs WHERE finished_at < (SELECT upto FROM"
                         " job_history)").fetchone()
        assert row is not None
        counted_below_upto = max(counted_below_upto, row[0])
        time.sleep(0.4)  # past the advance's one-second margin, in a few rounds
        if counted_below_upto == 0:
            newest = db.execute("SELECT coalesce(min(finished_at), 0) FROM jobs").fetchone()
            assert newest is not None
            _caught_up(db, newest[0])
    # The moves did reach jobs counted into job_history, not only recent ones.
    assert counted_below_upto > 0
    assert _stats(db) == _scanned(db)


@pytest.mark.parametrize("mark", [
    "SELECT * FROM job_mark_dispatched('late', 'h', 'bot')",
    "SELECT * FROM job_mark_dispatched_many(ARRAY['late'], 'h', ARRAY['bot'])",
])
def test_a_finish_committed_late_is_counted(
    db: psycopg.Connection[Any], pgstore_database: str, pgstore_schema: str, mark: str
) -> None:
    """finished_at is the clock of the mark, not of its commit: a mark held open past
    the advance's margin commits a finished_at that an advance could have passed."""
    db.execute("SELECT job_schedule_many(ARRAY['late', 'other'], ARRAY[0, 0])")
    db.execute("SELECT run_id FROM job_lease_many('h', NULL, 600000, 2)")
    with psycopg.connect(pgstore_database) as held:
        held.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pgstore_schema)))
        held.execute(mark)  # not committed
        db.execute("SELECT * FROM job_mark_dispatched('other', 'h', 'bot')")
        # Advances meanwhile, past 'other' (committed) but not past the running mark.
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            assert _stats(db) == _scanned(db) == (1, 0, 0, 0)
            time.sleep(0.1)
        held.commit()
    assert _stats(db) == _scanned(db) == (2, 0, 0, 0)
    newest = db.execute("SELECT max(finished_at) FROM jobs").fetchone()
    assert newest is not None
    _caught_up(db, newest[0])  # both now counted in job_history, once
    assert _stats(db) == _scanned(db) == (2, 0, 0, 0)


def test_concurrent_moves_and_readers_stay_exact(
    db: psycopg.Connection[Any], pgstore_database: str, pgstore_schema: str
) -> None:
    """Writers finishing, retrying, removing and purging jobs on four connections while
    a reader advances job_history; at the end the counts agree with a scan."""
    n = 400
    db.execute("SELECT job_schedule_many(%s, %s)",
               ([f"c{i:04d}" for i in range(n)], [0] * n))
    db.execute("UPDATE jobs SET max_attempts = 1 WHERE run_id LIKE 'c%%3'")
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(pgstore_database, autocommit=True) as conn:
                conn.execute(sql.SQL("SET search_path = {}").format(
                    sql.Identifier(pgstore_schema)))
                while not stop.is_set():
                    leased = conn.execute(
                        "SELECT run_id FROM job_lease('w', NULL, 60000)").fetchall()
                    for (run_id,) in leased:
                        if run_id.endswith("3"):
                            conn.execute("SELECT job_release(%s, 'w', 0)", (run_id,))
                        elif rng.random() < 0.2:
                            conn.execute("SELECT job_cancel(%s)", (run_id,))
                            conn.execute("SELECT * FROM job_mark_dispatched(%s, 'w', 'b')",
                                         (run_id,))
                        else:
                            conn.execute("SELECT * FROM job_mark_dispatched(%s, 'w', 'b')",
                                         (run_id,))
                    pick = f"c{rng.randrange(n):04d}"
                    roll = rng.random()
                    if roll < 0.05:
                        conn.execute("SELECT job_retry(%s, 0)", (pick,))
                    elif roll < 0.08:
                        with contextlib.suppress(psycopg.errors.ObjectNotInPrerequisiteState):
                            conn.execute("SELECT job_remove(%s)", (pick,))  # waiting: removed
                        conn.execute("SELECT job_schedule(%s, 0, 1)", (pick,))
                    elif roll < 0.09:
                        conn.execute("SELECT job_purge(now_ms() - 300, 3)")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            _stats(db)
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    newest = db.execute("SELECT max(finished_at) FROM jobs").fetchone()
    assert newest is not None and newest[0] is not None
    _caught_up(db, newest[0])
    assert _stats(db) == _scanned(db)


def test_the_memory_store_stamps_finished_at_as_the_sql_does() -> None:
    """MemoryJobStore's jobs carry finished_at as the SQL's rows do: set by the first
    finish, kept by a later one, cleared by a retry."""
    from pgstore.memory.jobs import MemoryJobStore

    store = MemoryJobStore()
    for run_id in ("sent", "cancelled", "fails"):
        store.schedule(run_id, 0, 1)
    assert store.get("sent") is not None and store.get("sent").finished_at is None  # type: ignore[union-attr]
    leased = {job.run_id: job for job in iter(lambda: store.lease("h", None, 60_000), None)}
    assert set(leased) == {"sent", "cancelled", "fails"}
    store.mark_dispatched("sent", "h", "bot")
    store.cancel("cancelled")
    store.release("fails", "h", 0)
    finished = {run_id: store.get(run_id).finished_at for run_id in leased}  # type: ignore[union-attr]
    assert all(at is not None and at > 1_700_000_000_000 for at in finished.values())
    time.sleep(0.01)
    store.mark_dispatched("cancelled", "h", "bot")  # a recall keeps the cancel's time
    assert store.get("cancelled").finished_at == finished["cancelled"]  # type: ignore[union-attr]
    store.retry("fails", 0)
    assert store.get("fails").finished_at is None  # type: ignore[union-attr]


def test_read_only_and_repeatable_read_callers_read_exact_counts_and_write_nothing(
    db: psycopg.Connection[Any], pgstore_database: str, pgstore_schema: str
) -> None:
    """store_stats() in a read-only or a REPEATABLE READ transaction (a standby's
    reader, a report) answers the same counts and leaves job_history alone."""
    db.execute("SELECT job_schedule_many(ARRAY['a', 'b', 'c'], ARRAY[0, 0, 0])")
    for (run_id,) in db.execute("SELECT run_id FROM job_lease_many('h', NULL, 1000, 3)"
                                ).fetchall():
        db.execute("SELECT * FROM job_mark_dispatched(%s, 'h', 'bot')", (run_id,))
    assert db.execute("SELECT job_cancel('b')").fetchone() == ("already_dispatched",)
    kept = db.execute("SELECT * FROM job_history").fetchone()
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pgstore_schema)))
        conn.execute("SET pgstore.stats_lag_ms = 0")
        for mode in ("READ ONLY", "ISOLATION LEVEL REPEATABLE READ"):
            conn.execute(f"BEGIN {mode}")
            assert _stats(conn) == _scanned(conn) == (3, 0, 0, 0)
            conn.execute("COMMIT")
            assert db.execute("SELECT * FROM job_history").fetchone() == kept


def _counted(conn: psycopg.Connection[Any]) -> tuple[int, ...]:
    """job_history's own counts: (finished, dispatched, recalled, failed)."""
    row = conn.execute("SELECT finished, dispatched, recalled, failed FROM job_history").fetchone()
    assert row is not None
    return tuple(row)


def _counted_by_scan(conn: psycopg.Connection[Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """job_history's counts and, in the same snapshot, the jobs below its upto by kind."""
    row = conn.execute(
        "SELECT h.finished, h.dispatched, h.recalled, h.failed, s.*"
        "  FROM job_history h,"
        "       LATERAL (SELECT count(*),"
        "                       count(*) FILTER (WHERE dispatched AND NOT cancelled),"
        "                       count(*) FILTER (WHERE dispatched AND cancelled),"
        "                       count(*) FILTER (WHERE failed AND NOT cancelled"
        "                                          AND NOT dispatched)"
        "                  FROM jobs WHERE finished_at < h.upto) AS s").fetchone()
    assert row is not None
    return tuple(row[:4]), tuple(row[4:])


def test_moves_of_jobs_already_counted_go_through_job_history(
    db: psycopg.Connection[Any],
) -> None:
    """Every rare move of a job job_history already counted changes job_history's own
    counts, exactly: a recall by job_mark_dispatched and by job_mark_dispatched_many
    (their repeats move nothing), the cancel of a failed job, a retry and a purge."""
    kinds = {"r1": 2, "r2": 2, "r3": 2, "f1": 1, "f2": 1, "f3": 1, "d1": 2, "c1": 2}
    for run_id, attempts in kinds.items():
        db.execute("SELECT job_schedule(%s, 0, %s)", (run_id, attempts))
    leased = db.execute("SELECT run_id FROM job_lease_many('h', NULL, 1500, 10)").fetchall()
    assert sorted(r for (r,) in leased) == sorted(kinds)
    db.execute("SELECT * FROM job_mark_dispatched('d1', 'h', 'bot')")
    for run_id in ("c1", "r1", "r2", "r3"):
        db.execute("SELECT job_cancel(%s)", (run_id,))
    for run_id in ("f1", "f2", "f3"):
        assert db.execute("SELECT job_release(%s, 'h', 0)", (run_id,)).fetchone() == (True,)
    newest = db.execute("SELECT max(finished_at) FROM jobs").fetchone()
    assert newest is not None
    _caught_up(db, newest[0])
    assert _counted(db) == (8, 1, 0, 3)  # r1, r2, r3 and c1 counted as cancelled
    assert _stats(db) == _scanned(db) == (1, 0, 4, 3)

    steps: list[tuple[str, tuple[int, ...]]] = [
        ("SELECT * FROM job_mark_dispatched('r1', 'h', 'bot')", (8, 1, 1, 3)),
        ("SELECT * FROM job_mark_dispatched('r1', 'h', 'bot2')", (8, 1, 1, 3)),
        ("SELECT * FROM job_mark_dispatched_many(ARRAY['r2', 'd1', 'r3'], 'h',"
         " ARRAY['b', 'b', 'b'])", (8, 1, 3, 3)),
        ("SELECT * FROM job_mark_dispatched_many(ARRAY['r3', 'r2'], 'h', ARRAY['c', 'c'])",
         (8, 1, 3, 3)),
        ("SELECT job_cancel('f1')", (8, 1, 3, 2)),
        ("SELECT job_cancel('f1')", (8, 1, 3, 2)),
        ("SELECT job_retry('f2', 2000000000000000)", (7, 1, 3, 1)),
    ]
    for call, counted in steps:
        db.execute(call)
        assert _counted(db) == counted, call
        assert _stats(db) == _scanned(db), call
    assert _stats(db) == (4, 3, 2, 1)  # r1-r3 recalled, c1 and f1 cancelled, f3 failed
    assert db.execute("SELECT worker_id FROM jobs WHERE run_id = 'r1'").fetchone() == ("bot2",)
    ends = db.execute("SELECT max(lease_until) FROM jobs").fetchone()
    assert ends is not None
    while _now_ms(db) <= ends[0]:  # the leases end: job_purge keeps a live lease's job
        time.sleep(0.05)
    assert db.execute("SELECT job_purge(%s, 100)", (2**62,)).fetchone() == (7,)
    assert _counted(db) == (0, 0, 0, 0)
    assert _stats(db) == _scanned(db) == (0, 0, 0, 0)


def _now_ms(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT now_ms()").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(("job", "move"), [
    ("recalled", "SELECT * FROM job_mark_dispatched('late', 'h', 'bot')"),
    ("recalled", "SELECT * FROM job_mark_dispatched_many(ARRAY['late'], 'h', ARRAY['bot'])"),
    ("failed", "SELECT job_cancel('late')"),
])
def test_a_move_held_open_blocks_no_reader_and_counts_once(
    db: psycopg.Connection[Any], pgstore_database: str, pgstore_schema: str, job: str,
    move: str,
) -> None:
    """A recall (or the cancel of a failed job) of a job already counted, held open while
    readers advance job_history past newer finishes: the readers never wait and stay
    exact, and the move counts once, when it commits."""
    db.execute("SELECT job_schedule('late', 0, 1)")
    db.execute("SELECT run_id FROM job_lease('h', NULL, 600000)")
    if job == "recalled":
        db.execute("SELECT job_cancel('late')")
        before, after = (0, 0, 1, 0), (1, 1, 0, 0)
    else:
        db.execute("SELECT job_release('late', 'h', 0)")
        before, after = (0, 0, 0, 1), (0, 0, 1, 0)
    first = db.execute("SELECT finished_at FROM jobs").fetchone()
    assert first is not None
    _caught_up(db, first[0])
    assert _stats(db) == _scanned(db) == before
    with psycopg.connect(pgstore_database) as held:
        held.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pgstore_schema)))
        held.execute(move)  # not committed: it holds job_history's row
        db.execute("SELECT job_schedule('other', 0)")
        db.execute("SELECT run_id FROM job_lease('h', NULL, 600000)")
        db.execute("SELECT * FROM job_mark_dispatched('other', 'h', 'bot')")
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert _stats(db) == _scanned(db) == tuple(
                a + b for a, b in zip(before, (1, 0, 0, 0), strict=True))
            assert time.monotonic() - started < 0.5  # never waits for the held move
            time.sleep(0.1)
        held.commit()
    expect = tuple(a + b for a, b in zip(after, (1, 0, 0, 0), strict=True))
    assert _stats(db) == _scanned(db) == expect
    newest = db.execute("SELECT max(finished_at) FROM jobs").fetchone()
    assert newest is not None
    _caught_up(db, newest[0])
    assert _stats(db) == _scanned(db) == expect
    counted, scanned = _counted_by_scan(db)
    assert counted == scanned and counted[0] == 2


def test_concurrent_moves_of_counted_jobs_race_the_advances_exactly(
    db: psycopg.Connection[Any], pgstore_database: str, pgstore_schema: str
) -> None:
    """Four connections recall cancelled jobs (singly and in batches), cancel and retry
    failed ones and purge, while those jobs are being counted into job_history by a
    reader advancing it at every call: at every reading job_history holds exactly the
    jobs below its upto, by kind, and store_stats agrees with a scan."""
    n = 480
    ids = [f"m{i:04d}" for i in range(n)]
    for start in range(0, n, 60):  # finishes spread over a few advances
        chunk = ids[start:start + 60]
        db.execute("SELECT job_schedule_many(%s, %s)", (chunk, [0] * len(chunk)))
        db.execute("UPDATE jobs SET max_attempts = 1 WHERE run_id = ANY (%s)"
                   " AND right(run_id, 1) IN ('0', '5')", (chunk,))
        db.execute("SELECT run_id FROM job_lease_many('h', NULL, 600000, 60)")
        for run_id in chunk:
            if run_id[-1] in "05":
                db.execute("SELECT job_release(%s, 'h', 0)", (run_id,))  # failed
            else:
                db.execute("SELECT job_cancel(%s)", (run_id,))
        _stats(db)
        time.sleep(0.15)
    errors: list[BaseException] = []

    def writer(part: int) -> None:
        rng = random.Random(part)
        mine = ids[part::4]
        try:
            with psycopg.connect(pgstore_database, autocommit=True) as conn:
                conn.execute(sql.SQL("SET search_path = {}").format(
                    sql.Identifier(pgstore_schema)))
                batch: list[str] = []
                for run_id in mine:
                    if run_id[-1] in "05":
                        conn.execute("SELECT job_cancel(%s)" if rng.random() < 0.5
                                     else "SELECT job_retry(%s, 0)", (run_id,))
                    elif rng.random() < 0.5:
                        conn.execute("SELECT * FROM job_mark_dispatched(%s, 'h', 'b')",
                                     (run_id,))
                    else:
                        batch.append(run_id)
                    if len(batch) == 5:
                        conn.execute("SELECT * FROM job_mark_dispatched_many(%s, 'h', %s)",
                                     (batch, ["b"] * 5))
                        batch = []
                    if rng.random() < 0.02:
                        conn.execute("SELECT job_purge(now_ms(), 3)")
                if batch:
                    conn.execute("SELECT * FROM job_mark_dispatched_many(%s, 'h', %s)",
                                 (batch, ["b"] * len(batch)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(part,)) for part in range(4)]
    for t in threads:
        t.start()
    readings = 0
    try:
        while any(t.is_alive() for t in threads):
            _stats(db)  # advances job_history
            counted, scanned = _counted_by_scan(db)  # one snapshot
            assert counted == scanned
            readings += 1
    finally:
        for t in threads:
            t.join()
    assert not errors, errors
    assert readings > 0
    newest = db.execute("SELECT max(finished_at) FROM jobs").fetchone()
    assert newest is not None and newest[0] is not None
    _caught_up(db, newest[0])
    assert _stats(db) == _scanned(db)
    counted, scanned = _counted_by_scan(db)
    assert counted == scanned
    recalled = db.execute("SELECT count(*) FROM jobs WHERE dispatched AND cancelled").fetchone()
    assert recalled is not None and recalled[0] > 0


#: The repair docs/migrations.md gives for a move job_history missed (a recall that ran
#: the old function body across the upgrade to pgstore_0028): count again from the rows.
RECOUNT = ("UPDATE job_history SET upto = -9223372036854775808, finished = 0, dispatched = 0,"
           " recalled = 0, failed = 0, next_upto = NULL, next_snapshot = NULL")


def test_a_missed_move_stops_the_purge_until_the_history_is_counted_again(
    db: psycopg.Connection[Any],
) -> None:
    """A recall that moved no count (as old code finishing across the upgrade would)
    leaves job_history one recall short: purging the recalled jobs then fails on its
    check, and changes nothing, rather than count below zero. The documented repair
    counts the history again from the rows, exactly, and the purge goes on."""
    for run_id in ("r1", "r2", "d1"):
        db.execute("SELECT job_schedule(%s, 0)", (run_id,))
    db.execute("SELECT run_id FROM job_lease_many('h', NULL, 1000, 10)").fetchall()
    for run_id in ("r1", "r2"):
        db.execute("SELECT job_cancel(%s)", (run_id,))
    db.execute("SELECT * FROM job_mark_dispatched_many(ARRAY['r1', 'r2', 'd1'], 'h',"
               " ARRAY['b', 'b', 'b'])")
    newest = db.execute("SELECT max(finished_at) FROM jobs").fetchone()
    assert newest is not None
    _caught_up(db, newest[0])
    assert _stats(db) == _scanned(db) == (3, 2, 0, 0)
    db.execute("UPDATE job_history SET recalled = recalled - 1")  # the missed move
    assert _stats(db) != _scanned(db)
    ends = db.execute("SELECT max(lease_until) FROM jobs").fetchone()
    assert ends is not None
    while _now_ms(db) <= ends[0]:  # the leases end: job_purge keeps a live lease's job
        time.sleep(0.05)
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("SELECT job_purge(%s, 100)", (2**62,))
    assert _scanned(db) == (3, 2, 0, 0)  # nothing purged
    db.execute(RECOUNT)
    _caught_up(db, newest[0])
    assert _stats(db) == _scanned(db) == (3, 2, 0, 0)
    assert db.execute("SELECT job_purge(%s, 100)", (2**62,)).fetchone() == (3,)
    assert _stats(db) == _scanned(db) == (0, 0, 0, 0)
