"""The SQL functions called as plain SELECTs, as another language's driver would."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.catalog import HELPER_CONFIG, INLINED_HELPERS


@pytest.fixture
def db(pgstore_database: str, pgstore_schema: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pgstore_schema)))
        yield conn


def _state(db: psycopg.Connection[Any]) -> list[Any]:
    return [
        db.execute("SELECT * FROM schedules ORDER BY id").fetchall(),
        db.execute("SELECT * FROM schedule_fences ORDER BY id").fetchall(),
        db.execute("SELECT * FROM jobs ORDER BY run_id").fetchall(),
    ]


def test_claim_renew_complete_delete_register_cycle(db: psycopg.Connection[Any]) -> None:
    row = db.execute("SELECT * FROM schedule_register('report', 'cron', '0 * * * *', 1000, 500)").fetchone()
    # consecutive_failures and catch_up come after the other columns; then paused,
    # jitter_ms, triggered_at and due_at (pgstore_0018).
    assert row == ("report", "cron", "0 * * * *", 1000, None, None, 0, None, None, 500, 0, "once",
                   False, 0, None, 1000)
    claim = db.execute("SELECT fencing_token, lease_owner, lease_until FROM schedule_claim_due('report', 'host-a', 1000, 30000)").fetchone()
    assert claim == (1, "host-a", 31000)
    assert db.execute("SELECT schedule_claim_due('report', 'host-b', 1001, 30000)").fetchall() == []
    assert db.execute("SELECT schedule_renew('report', 1, 61000)").fetchone() == (True,)
    assert db.execute("SELECT schedule_complete('report', 1, 3600000, 1000, 'ok', 2000)").fetchone() == (True,)
    assert db.execute("SELECT schedule_complete('report', 1, 3600000, 1000, 'ok', 2000)").fetchone() == (False,)
    db.execute("SELECT schedule_delete('report')")
    assert db.execute("SELECT * FROM schedule_fences").fetchall() == [("report", 1)]
    again = db.execute("SELECT fencing_token FROM schedule_register('report', 'cron', '0 * * * *', 0, 3000)").fetchone()
    assert again == (1,)
    assert len(db.execute("SELECT * FROM schedule_list()").fetchall()) == 1
    assert db.execute("SELECT count(*) FROM schedule_claim_next('w', NULL, 1000, 5, NULL)").fetchone() == (1,)
    assert db.execute("SELECT now_ms() > 1700000000000").fetchone() == (True,)


def test_functions_work_whatever_the_callers_search_path(
    pgstore_database: str, pgstore_schema: str
) -> None:
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute("SET search_path = pg_catalog")
        q = sql.SQL("SELECT fencing_token FROM {}.schedule_register('x', 'once', '1', 0, 0)")
        assert conn.execute(q.format(sql.Identifier(pgstore_schema))).fetchone() == (0,)


NULL_CALLS = [
    ("schedule_get(NULL)", "id"),
    ("schedule_register(NULL, 'once', '1', 0, 0)", "id"),
    ("schedule_register('t', NULL, '1', 0, 0)", "kind"),
    ("schedule_register('t', 'once', NULL, 0, 0)", "spec"),
    ("schedule_register('t', 'once', repeat('1', 1025), 0, 0)", "spec"),
    ("schedule_register('absent', 'once', repeat('1', 1025), 0, 0)", "spec"),
    ("schedule_register('t', 'interval', '1', 0, 0, NULL)", "catch_up"),
    ("schedule_register('t', 'interval', '1', 0, 0, '')", "catch_up"),
    ("schedule_register('t', 'interval', '1', 0, 0, 'ONCE')", "catch_up"),
    ("schedule_register('t', 'interval', '1', 0, 0, 'skipped')", "catch_up"),
    ("schedule_register('t', 'interval', '2', 0, 0, 'never')", "catch_up"),
    ("schedule_register('absent', 'once', '1', 0, 0, NULL)", "catch_up"),
    ("schedule_claim_due(NULL, 'w', 0, 1)", "id"),
    ("schedule_claim_due('t', NULL, 0, 1)", "owner"),
    ("schedule_claim_due('t', 'w', 0, NULL)", "lease_ms"),
    ("schedule_renew(NULL, 1, 1)", "id"),
    ("schedule_renew('t', NULL, 1)", "fencing_token"),
    ("schedule_renew('t', 1, NULL)", "lease_until"),
    ("schedule_complete(NULL, 1, 1, 1, 'ok', 1)", "id"),
    ("schedule_complete('t', NULL, 1, 1, 'ok', 1)", "fencing_token"),
    ("schedule_complete('t', 1, 1, NULL, 'ok', 1)", "last_run_at"),
    ("schedule_complete('t', 1, 1, 1, NULL, 1)", "last_status"),
    ("schedule_complete('t', 1, 1, 1, 'maybe', 1)", "last_status"),
    ("schedule_complete('t', 1, 1, 1, 'SKIPPED', 1)", "last_status"),
    ("schedule_delete(NULL)", "id"),
    ("schedule_delete('')", "id"),
    ("schedule_claim_next(NULL, 0, 1, 1)", "owner"),
    ("schedule_claim_next('w', 0, NULL, 1)", "lease_ms"),
    ("schedule_claim_next('w', 0, 1, NULL)", "limit"),
    ("schedule_claim_next('w', 0, 1, -3)", "limit"),
    ("schedule_claim_next('w', 0, 1, 1, ARRAY['t', NULL])", "ids"),
    ("schedule_claim_next('w', 0, 1, 1, ARRAY[''])", "ids"),
]


JOB_NULL_CALLS = [
    ("job_schedule(NULL, 1)", "run_id"),
    ("job_schedule('', 1)", "run_id"),
    ("job_schedule('r', NULL)", "dispatch_at"),
    ("job_lease(NULL, 0, 1)", "holder"),
    ("job_lease('', 0, 1)", "holder"),
    ("job_lease('h', 0, NULL)", "ttl_ms"),
    ("job_lease('h', 0, 0)", "ttl_ms"),
    ("job_renew(NULL, 'h', 0, 1)", "run_id"),
    ("job_renew('r', NULL, 0, 1)", "holder"),
    ("job_renew('r', 'h', 0, NULL)", "ttl_ms"),
    ("job_renew('r', 'h', 0, -1)", "ttl_ms"),
    ("job_mark_dispatched(NULL, 'h', 'w')", "run_id"),
    ("job_mark_dispatched('r', NULL, 'w')", "holder"),
    ("job_mark_dispatched('r', 'h', repeat('w', 1025))", "worker_id"),
    ("job_release(NULL, 'h', 1)", "run_id"),
    ("job_release('r', NULL, 1)", "holder"),
    ("job_release('r', 'h', NULL)", "retry_at"),
    ("job_release('r', 'h', 1, NULL, repeat('e', 4097))", "error"),
    ("job_release('absent', 'h', 1, NULL, repeat('é', 4097))", "error"),
    ("job_schedule('r', 1, 0)", "max_attempts"),
    ("job_schedule('new', 1, -1)", "max_attempts"),
    ("job_schedule('r', 1, -2147483648)", "max_attempts"),
    ("job_retry(NULL, 1)", "run_id"),
    ("job_retry('', NULL)", "run_id"),
    ("job_retry(repeat('r', 1025), 1)", "run_id"),
    ("job_list('failures', NULL, 1)", "filter"),
    ("job_list('all', NULL, 1, ARRAY[]::text[])", "queues"),
    ("job_list('due', NULL, 1, ARRAY['q', NULL])", "queues"),
    ("job_list('failed', NULL, 1, ARRAY[''])", "queues"),
    ("job_list('all', NULL, 1, ARRAY[[ 'a' ]])", "queues"),
    ("job_cancel(NULL)", "run_id"),
    ("job_cancel(repeat('r', 1025))", "run_id"),
    ("job_get(NULL)", "run_id"),
    ("job_remove(NULL)", "run_id"),
    ("job_purge(NULL, 10)", "before"),
    ("job_purge(-1, 10)", "before"),
    ("job_purge(-9223372036854775808, 10)", "before"),
    ("job_purge(9223372036854775807, NULL)", "limit"),
    ("job_purge(9223372036854775807, 0)", "limit"),
    ("job_purge(9223372036854775807, -2147483648)", "limit"),
    ("job_schedule_many(NULL, ARRAY[1])", "run_ids"),
    ("job_schedule_many(ARRAY['r', NULL], ARRAY[1, 2])", "run_ids"),
    ("job_schedule_many(ARRAY['r', ''], ARRAY[1, 2])", "run_ids"),
    ("job_schedule_many(ARRAY['r', 'r'], ARRAY[1, 2])", "run_ids"),
    ("job_schedule_many(ARRAY[repeat('r', 1025)], ARRAY[1])", "run_ids"),
    ("job_schedule_many(ARRAY[ARRAY['r', 's']], ARRAY[1, 2])", "run_ids"),
    ("job_schedule_many(array_fill('r'::text, ARRAY[10001]), array_fill(0::bigint, ARRAY[10001]))",
     "run_ids"),
    ("job_schedule_many(ARRAY['r', 's'], NULL)", "dispatch_at"),
    ("job_schedule_many(ARRAY['r', 's'], ARRAY[1])", "dispatch_at"),
    ("job_schedule_many(ARRAY['r', 's'], ARRAY[1, NULL])", "dispatch_at"),
    ("job_lease_many(NULL, 0, 1, 1)", "holder"),
    ("job_lease_many('h', 0, NULL, 1)", "ttl_ms"),
    ("job_lease_many('h', 0, 1, NULL)", "limit"),
    ("job_lease_many('h', 0, 1, 0)", "limit"),
    ("job_lease_many('h', 0, 1, -2147483648)", "limit"),
    ("job_lease_many('h', 0, 1, 10001)", "limit"),
    ("job_lease_many('h', 0, 1, 2147483647)", "limit"),
    ("job_mark_dispatched_many(NULL, 'h', ARRAY['w'])", "run_ids"),
    ("job_mark_dispatched_many(ARRAY['r', 'r'], 'h', ARRAY['w', 'w'])", "run_ids"),
    # A repeat beside a later fault: the first rule broken, in the checks' order.
    ("job_mark_dispatched_many(ARRAY['r', 'r'], 'h', ARRAY['w', repeat('w', 1025)])",
     "run_ids"),
    ("job_mark_dispatched_many(ARRAY['r', 'r'], '', ARRAY['w', 'w'])", "run_ids"),
    ("job_mark_dispatched_many(ARRAY['r', 'r'], 'h', ARRAY['w', 'w'], ARRAY[1, 0])",
     "run_ids"),
    ("job_mark_dispatched_many(ARRAY['r', 'r', 'nope'], 'h', ARRAY['w', 'w', 'w'])",
     "run_ids"),
    ("job_mark_dispatched_many(ARRAY['r'], NULL, ARRAY['w'])", "holder"),
    ("job_mark_dispatched_many(ARRAY['r'], 'h', NULL)", "worker_ids"),
    ("job_mark_dispatched_many(ARRAY['r'], 'h', ARRAY['w', 'x'])", "worker_ids"),
    ("job_mark_dispatched_many(ARRAY['r'], 'h', ARRAY[repeat('w', 1025)])", "worker_ids"),
    ("job_mark_dispatched_many(ARRAY['r'], 'h', ARRAY['w'], ARRAY[0])", "lease_sequences"),
    ("job_mark_dispatched_many(ARRAY['r'], 'h', ARRAY['w'], ARRAY[1, 2])", "lease_sequences"),
    ("job_mark_dispatched_many(ARRAY['r'], 'h', ARRAY['w'], ARRAY[-9223372036854775808])",
     "lease_sequences"),
    ("job_renew_many(NULL, 'h', 0, 1)", "run_ids"),
    ("job_renew_many(ARRAY['r'], NULL, 0, 1)", "holder"),
    ("job_renew_many(ARRAY['r'], 'h', 0, NULL)", "ttl_ms"),
    ("job_renew_many(ARRAY['r'], 'h', 0, 0)", "ttl_ms"),
    ("job_renew_many(ARRAY['r'], 'h', 0, 1, ARRAY[]::bigint[])", "lease_sequences"),
    ("job_renew_many(ARRAY['r'], 'h', 0, 1, ARRAY[-1])", "lease_sequences"),
]


@pytest.mark.parametrize(("call", "param"), NULL_CALLS + JOB_NULL_CALLS)
def test_bad_arguments_raise_22023_naming_the_parameter(
    db: psycopg.Connection[Any], call: str, param: str
) -> None:
    db.execute("SELECT schedule_register('t', 'interval', '1', 0, 0)")
    db.execute("SELECT schedule_claim_due('t', 'w', 0, 100000)")
    db.execute("SELECT job_schedule('r', 0)")
    db.execute("SELECT job_lease('h', 0, 100000)")
    before = _state(db)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        db.execute(f"SELECT * FROM {call}")
    assert raised.value.sqlstate == "22023"
    assert param in (raised.value.diag.message_primary or "")
    assert _state(db) == before


def test_overflow_raises_22003(db: psycopg.Connection[Any]) -> None:
    db.execute("SELECT schedule_register('t', 'interval', '1', 0, 0)")
    before = _state(db)
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        db.execute("SELECT * FROM schedule_claim_due('t', 'w', 9223372036854775000, 1000)")
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        db.execute("SELECT * FROM schedule_claim_due('unknown', 'w', 9223372036854775000, 1000)")
    assert _state(db) == before


def test_batch_calls_lease_mark_and_renew_many_jobs_in_one_statement(
    db: psycopg.Connection[Any],
) -> None:
    db.execute("SELECT job_schedule_many(ARRAY['b', 'a', 'c', 'late'],"
               " ARRAY[100, 100, 50, 900])")
    assert db.execute("SELECT run_id, dispatch_at FROM job_list('all', NULL, NULL)"
                      " ORDER BY run_id").fetchall() == [
        ("a", 100), ("b", 100), ("c", 50), ("late", 900)]
    db.execute("SELECT job_schedule_many(ARRAY['late'], ARRAY[800])")  # moves dispatch_at only
    db.execute("SELECT job_schedule_many('{}', '{}')")  # nothing to do
    # Lease order, up to the limit; the next call gets the rest that is due.
    leased = db.execute("SELECT run_id, lease_holder, lease_until, lease_sequence"
                        " FROM job_lease_many('h1', 500, 1000, 2)").fetchall()
    assert leased == [("c", "h1", 1500, 1), ("a", "h1", 1500, 1)]
    assert db.execute("SELECT run_id FROM job_lease_many('h2', 500, 1000, 10)").fetchall() == [
        ("b",)]
    assert db.execute("SELECT count(*) FROM job_lease_many('h3', 500, 1000, 10)").fetchone() == (0,)
    db.execute("SELECT job_cancel('a')")
    # One answer per job, in the order given: recorded with the cancel flag; another
    # holder's job; a stale fence; a missing job.
    marks = db.execute(
        "SELECT * FROM job_mark_dispatched_many(ARRAY['a', 'b', 'c', 'nope'], 'h1',"
        " ARRAY['w-a', 'w-b', 'w-c', NULL], ARRAY[1, NULL, 7, NULL])").fetchall()
    assert marks == [("a", True, True), ("b", False, False), ("c", False, False),
                     ("nope", False, False)]
    assert db.execute("SELECT run_id, dispatched, worker_id, finished_at IS NOT NULL"
                      " FROM jobs ORDER BY run_id").fetchall() == [
        ("a", True, "w-a", True), ("b", False, None, False), ("c", False, None, False),
        ("late", False, None, False)]
    renewed = db.execute("SELECT * FROM job_renew_many(ARRAY['c', 'b', 'a'], 'h1', 600, 5000,"
                         " ARRAY[1, 1, NULL])").fetchall()
    assert renewed == [("c", True), ("b", False), ("a", True)]
    # c's lease now runs to 5600: live at 5599, expired at 5600.
    assert db.execute("SELECT * FROM job_renew_many(ARRAY['c'], 'h1', 5599, 5000)").fetchall() == [
        ("c", True)]
    assert db.execute("SELECT * FROM job_renew_many(ARRAY['c'], 'h1', 10600, 5000)").fetchall() == [
        ("c", False)]


def test_a_fully_recorded_batch_mark_answers_in_order_at_one_clock_reading(
    db: psycopg.Connection[Any],
) -> None:
    """Every job recorded and none cancelled: (run_id, false, true) in the order given,
    each its own worker id, all one finished_at read during the call."""
    db.execute("SELECT job_schedule_many(ARRAY['a', 'b', 'c'], ARRAY[0, 0, 0])")
    seqs = dict(db.execute("SELECT run_id, lease_sequence"
                           " FROM job_lease_many('h', NULL, 60000, 3)").fetchall())
    before = db.execute("SELECT now_ms()").fetchone()
    marks = db.execute(
        "SELECT * FROM job_mark_dispatched_many(ARRAY['c', 'a', 'b'], 'h',"
        " ARRAY['w-c', NULL, 'w-b'], %s)", ([seqs["c"], seqs["a"], seqs["b"]],)).fetchall()
    after = db.execute("SELECT now_ms()").fetchone()
    assert marks == [("c", False, True), ("a", False, True), ("b", False, True)]
    rows = db.execute("SELECT run_id, dispatched, worker_id, finished_at FROM jobs"
                      " ORDER BY run_id").fetchall()
    assert [r[:3] for r in rows] == [("a", True, None), ("b", True, "w-b"), ("c", True, "w-c")]
    assert before is not None and after is not None
    assert len({r[3] for r in rows}) == 1 and before[0] <= rows[0][3] <= after[0]
    # Marked again, later: recorded again, finished_at kept.
    assert db.execute("SELECT * FROM job_mark_dispatched_many(ARRAY['a'], 'h', ARRAY['w'])"
                      ).fetchall() == [("a", False, True)]
    assert db.execute("SELECT finished_at FROM jobs WHERE run_id = 'a'").fetchone() == (
        rows[0][3],)


# The kinds of job in the 1000-job batches below, as (lease_holder, lease_until, cancelled,
# fence, in the table): the fence is what the call passes for the job, "ok" its own
# lease_sequence, "stale" another one, None no fence. BATCH_NOW is the renew's p_now.
BATCH_NOW = 1_000_000
BATCH_KINDS: dict[str, tuple[str | None, int | None, bool, str | None, bool]] = {
    "mine": ("h", BATCH_NOW + 1, False, "ok", True),
    "mine_unfenced": ("h", BATCH_NOW + 1, False, None, True),
    "mine_cancelled": ("h", BATCH_NOW + 1, True, "ok", True),
    "mine_expired": ("h", BATCH_NOW, False, "ok", True),  # lease_until = now: expired
    "fenced_out": ("h", BATCH_NOW + 1, False, "stale", True),
    "fenced_out_cancelled": ("h", BATCH_NOW + 1, True, "stale", True),
    "other": ("other", BATCH_NOW + 1, False, None, True),
    "other_cancelled": ("other", BATCH_NOW + 1, True, "ok", True),
    "never_leased": (None, None, False, None, True),
    "missing": (None, None, False, None, False),
}


def _batch_run_id(i: int) -> str:
    """Run ids of many lengths and bytes, so the lookups by key see every kind of order
    (jsonb sorts an object's keys by length, then bytes)."""
    shapes = [f"run-{i}", f"réunion-{i}", f"{i}", f'q"uote\\{i}', f"{i:0>300}", f"🤖 {i}",
              f"{i} trailing ", "x" * (900 + i % 24)]
    return shapes[i % len(shapes)] + ("" if i % len(shapes) != 7 else f"-{i}")


@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_generic_plan"])
def test_batch_mark_and_renew_of_1000_jobs_answer_each_job_in_order_in_the_cached_plan(
    db: psycopg.Connection[Any], plan_cache_mode: str,
) -> None:
    """job_renew_many and job_mark_dispatched_many over 1000 jobs of every kind, given in
    a shuffled order, in a session that has called them more than five times already, so
    plpgsql runs its cached (generic) plans: each job gets its own rule's answer, in the
    order given, and only the jobs recorded or renewed change."""
    rng = random.Random(13)
    kinds = list(BATCH_KINDS)
    jobs = [(_batch_run_id(i), kinds[i % len(kinds)], 10 + i) for i in range(1000)]
    rng.shuffle(jobs)
    stored = [(r, k, seq) for r, k, seq in jobs if BATCH_KINDS[k][4]]
    db.execute(
        "INSERT INTO jobs (run_id, dispatch_at, lease_holder, lease_until, cancelled,"
        " finished_at, lease_sequence)"
        " SELECT r, 0, h, u, c, CASE WHEN c THEN 7 END, s"
        " FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::boolean[], %s::bigint[])"
        " AS x(r, h, u, c, s)",
        ([r for r, _, _ in stored], [BATCH_KINDS[k][0] for _, k, _ in stored],
         [BATCH_KINDS[k][1] for _, k, _ in stored], [BATCH_KINDS[k][2] for _, k, _ in stored],
         [seq for _, _, seq in stored]))
    db.execute("ANALYZE jobs")
    db.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.Literal(plan_cache_mode)))
    for call in range(6):  # past plpgsql's five custom plans; nothing of these is stored
        warm = [f"warm-{call}-{i}" for i in range(call + 1)]
        assert db.execute("SELECT * FROM job_renew_many(%s, 'h', %s, 10, %s)",
                          (warm, BATCH_NOW, [1] * len(warm))).fetchall() == [
            (r, False) for r in warm]
        assert db.execute("SELECT * FROM job_mark_dispatched_many(%s, 'h', %s, %s)",
                          (warm, warm, [1] * len(warm))).fetchall() == [
            (r, False, False) for r in warm]
    before = {row[0]: row for row in db.execute("SELECT * FROM jobs")}

    def fence(kind: str, seq: int) -> int | None:
        given = BATCH_KINDS[kind][3]
        return None if given is None else seq if given == "ok" else seq + 1000

    run_ids = [r for r, _, _ in jobs]
    fences = [fence(k, seq) for _, k, seq in jobs]
    # renew: the holder's unexpired lease, fenced or not.
    renewed = db.execute("SELECT * FROM job_renew_many(%s, 'h', %s, 5000, %s)",
                         (run_ids, BATCH_NOW, fences)).fetchall()
    renewing = {"mine", "mine_unfenced", "mine_cancelled"}
    assert renewed == [(r, k in renewing) for r, k, _ in jobs]
    # mark: the holder's lease, expired or not; the cancel flag, recorded or not.
    workers = [None if i % 5 == 0 else f"bot-{i}" for i in range(len(jobs))]
    for _ in range(2):  # the same holder may mark again: the same answers
        marks = db.execute("SELECT * FROM job_mark_dispatched_many(%s, 'h', %s, %s)",
                           (run_ids, workers, fences)).fetchall()
        recording = renewing | {"mine_expired"}
        assert marks == [(r, BATCH_KINDS[k][2], k in recording) for r, k, _ in jobs]

    after = {row[0]: row for row in db.execute("SELECT * FROM jobs")}
    assert after.keys() == before.keys()
    columns = [c.name for c in db.execute("SELECT * FROM jobs LIMIT 0").description or []]
    for (run_id, kind, _), worker in zip(jobs, workers, strict=True):
        if not BATCH_KINDS[kind][4]:
            continue
        old, new = dict(zip(columns, before[run_id], strict=True)), dict(zip(columns, after[run_id], strict=True))
        changed = {c for c in columns if old[c] != new[c]}
        if kind in renewing:
            assert changed == {"lease_until", "dispatched", "worker_id", "finished_at"} - (
                {"finished_at"} if BATCH_KINDS[kind][2] else set()) - (
                set() if worker is not None else {"worker_id"}), (kind, changed)
            assert (new["lease_until"], new["dispatched"], new["worker_id"]) == (
                BATCH_NOW + 5000, True, worker)
        elif kind == "mine_expired":
            assert changed == {"dispatched", "worker_id", "finished_at"} - (
                set() if worker is not None else {"worker_id"}), (kind, changed)
        else:
            assert changed == set(), (kind, changed)


def test_job_lease_dispatch_cycle(db: psycopg.Connection[Any]) -> None:
    assert db.execute("SELECT job_schedule('meeting-R', 36000000)").fetchone() == ("",)
    assert db.execute("SELECT * FROM job_lease('dispatcher-1', 35999999, 30000)").fetchall() == []
    row = db.execute("SELECT * FROM job_lease('dispatcher-1', 36000000, 30000)").fetchone()
    # The lease sequence comes after the other columns (the first lease is 1), then
    # finished_at (NULL while the job waits), then attempts (this lease counted),
    # max_attempts (the store default), last_error and failed; from pgstore_0019 the
    # queue, priority and payload (the defaults: 'default', 0, none).
    assert row == ("meeting-R", 36000000, "dispatcher-1", 36030000, None, False, False, 1, None,
                   1, 25, None, False, "default", 0, None)
    assert db.execute("SELECT job_renew('meeting-R', 'dispatcher-1', 36010000, 30000)").fetchone() == (True,)
    assert db.execute("SELECT * FROM job_mark_dispatched('meeting-R', 'dispatcher-1', 'bot-9')").fetchone() == (False, True)
    assert db.execute("SELECT job_cancel('meeting-R')").fetchone() == ("already_dispatched",)
    assert db.execute("SELECT run_id, worker_id FROM job_list_dispatched()").fetchall() == [("meeting-R", "bot-9")]
    assert db.execute("SELECT * FROM job_mark_dispatched('gone', 'h', NULL)").fetchall() == [(False, False)]
    assert db.execute("SELECT job_release('meeting-R', 'dispatcher-1', 0)").fetchone() == (False,)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is dispatched"):
        db.execute("SELECT job_remove('meeting-R')")  # history: job_purge's, the owner's
    assert db.execute("SELECT job_purge(9223372036854775807, 10)").fetchone() == (1,)
    assert db.execute("SELECT * FROM job_get('meeting-R')").fetchall() == []
    assert db.execute("SELECT job_cancel('meeting-R')").fetchone() == ("missing",)


def test_job_purge_deletes_finished_jobs_only_and_hostile_calls_change_nothing(
    db: psycopg.Connection[Any],
) -> None:
    clock = db.execute("SELECT now_ms()").fetchone()
    assert clock is not None
    db.execute("SELECT job_schedule(r, 0) FROM unnest(ARRAY['done', 'cancelled', 'held', 'waiting']) r")
    db.execute("SELECT job_schedule('later', 9223372036854775807)")
    assert db.execute("SELECT run_id FROM job_lease('h', NULL, 3600000)").fetchone() == ("cancelled",)
    assert db.execute("SELECT job_release('cancelled', 'h', 0)").fetchone() == (True,)
    assert db.execute("SELECT job_cancel('cancelled')").fetchone() == ("cancelled",)
    assert db.execute("SELECT run_id FROM job_lease('h', 0, 1)").fetchone() == ("done",)
    assert db.execute("SELECT recorded FROM job_mark_dispatched('done', 'h', 'w')").fetchone() == (True,)
    assert db.execute("SELECT run_id FROM job_lease('h', NULL, 3600000)").fetchone() == ("held",)
    assert db.execute("SELECT job_cancel('held')").fetchone() == ("cancelled",)  # lease live
    finished = dict(db.execute("SELECT run_id, finished_at FROM jobs").fetchall())
    assert finished["waiting"] is None and finished["later"] is None
    assert all(finished[r] >= clock[0] for r in ("done", "cancelled", "held"))
    before = _state(db)
    for call in ("job_purge(NULL, 1)", "job_purge(-1, 1)", "job_purge(1, NULL)",
                 "job_purge(1, 0)", "job_purge(1, -1)"):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            db.execute(f"SELECT job_purge FROM {call}")
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        db.execute("SELECT job_purge(1, 2147483648::bigint::integer)")
    assert db.execute("SELECT job_purge(0, 2147483647)").fetchone() == (0,)
    assert _state(db) == before
    # The largest arguments: every finished job without a live lease, nothing else.
    assert db.execute("SELECT job_purge(9223372036854775807, 2147483647)").fetchone() == (2,)
    assert [r for (r,) in db.execute("SELECT run_id FROM jobs ORDER BY run_id")] == [
        "held", "later", "waiting"]


def test_job_lease_and_renew_overflow_raise_22003(db: psycopg.Connection[Any]) -> None:
    db.execute("SELECT job_schedule('r', 0)")
    db.execute("SELECT job_lease('h', 0, 1000)")
    before = _state(db)
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        db.execute("SELECT * FROM job_lease('h', 9223372036854775000, 1000)")
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        db.execute("SELECT job_renew('r', 'h', 9223372036854775000, 1000)")
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        db.execute("SELECT job_renew('unknown', 'h', 9223372036854775000, 1000)")
    assert _state(db) == before


def test_every_function_has_a_comment(db: psycopg.Connection[Any], pgstore_schema: str) -> None:
    rows = db.execute(
        "SELECT p.proname, obj_description(p.oid, 'pg_proc'), p.proconfig FROM pg_proc p"
        " WHERE p.pronamespace = %s::regnamespace",
        (pgstore_schema,),
    ).fetchall()
    assert len(rows) >= 23
    for name, comment, config in rows:
        assert comment, f"{name} has no COMMENT ON FUNCTION"
        if name in INLINED_HELPERS:  # a SET clause would stop the planner inlining them
            assert config == HELPER_CONFIG.get(name), name
        else:
            assert config == [f"search_path={pgstore_schema}, pg_temp"], name


@pytest.mark.parametrize(
    ("file", "fn", "updates", "locks"),
    [
        ("11_schedule_functions.sql", "schedule_claim_due", 1, 0),
        ("11_schedule_functions.sql", "schedule_renew", 1, 0),
        ("11_schedule_functions.sql", "schedule_complete", 1, 0),
        # From pgstore_0019 job_lease (and job_lease_many) run one UPDATE in the
        # common case (every pending job in the default group) and otherwise call
        # job_lease_take, which runs one of its two: one group other than the default
        # one, or several (a round).
        # job_lease_many's default-group walk is job_lease_default (from pgstore_0025:
        # planned once per session), so its own body updates nothing.
        ("21_job_functions.sql", "job_lease", 1, 1),
        ("22_job_batches.sql", "job_lease_default", 1, 1),
        ("22_job_batches.sql", "job_lease_many", 0, 0),
        ("21_job_functions.sql", "job_lease_take", 2, 2),
    ],
)
def test_claim_renew_complete_and_lease_are_single_update_statements(
    file: str, fn: str, updates: int, locks: int
) -> None:
    from pgstore.schema.files import sql_dir

    text = (sql_dir() / file).read_text()
    body = text.split(f"CREATE FUNCTION {fn}(")[1].split("$$")[1]
    code = "\n".join(line.split("--")[0] for line in body.splitlines())
    found = code.count("UPDATE ") - code.count("FOR UPDATE")
    assert found == updates and code.count("RETURNING") == updates, fn
    assert "advisory" not in code and "BEGIN;" not in code, fn
    # Each lease UPDATE picks its rows in a subquery FOR UPDATE SKIP LOCKED: the
    # default group's walk, another group's, or the merge of several (docs/contract.md);
    # the schedule functions lock nothing but the row they update.
    assert code.count("FOR UPDATE") == locks, fn


def test_job_schedule_notifies_job_channel_at_commit(
    pgstore_database: str, pgstore_schema: str, db: psycopg.Connection[Any]
) -> None:
    channel = db.execute("SELECT job_channel()").fetchone()
    assert channel == (f"{pgstore_schema}.jobs",)
    with psycopg.connect(pgstore_database, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel[0])))
        with db.transaction():
            db.execute("SELECT job_schedule('r', 1234)")
            assert list(listener.notifies(timeout=0.2)) == []  # not before commit
        notes = list(listener.notifies(timeout=2.0, stop_after=1))
        assert [(n.channel, n.payload) for n in notes] == [(channel[0], "1234")]
        db.execute("SELECT job_lease('h', 2000, 1000)")
        db.execute("SELECT job_mark_dispatched('r', 'h', 'w')")
        assert list(listener.notifies(timeout=0.3)) == []  # the lease path never notifies


def test_register_racing_a_delete_under_repeatable_read_is_a_serialization_failure(
    db: psycopg.Connection[Any], pgstore_database: str, pgstore_schema: str
) -> None:
    """The register's snapshot predates the delete: it would see the deleted row beside
    its own and not the delete's fence. It raises 40001 and changes nothing; retried, it
    starts from the fence (tests/isolation/specs/delete_vs_register_rr.spec shows the
    same interleaving step by step)."""
    db.execute("SELECT schedule_register('a', 'interval', '60000', 0, 0)")
    for now in (10, 20, 30):
        assert db.execute("SELECT * FROM schedule_claim_due('a', 'w', %s, 1)", (now,)).fetchall()
    with psycopg.connect(pgstore_database) as rr:
        rr.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pgstore_schema)))
        rr.commit()
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        rr.execute("SELECT count(*) FROM schedules")  # the snapshot
        db.execute("SELECT schedule_delete('a')")
        before = _state(db)
        assert before[1] == [("a", 3)]
        with pytest.raises(psycopg.errors.SerializationFailure):
            rr.execute("SELECT * FROM schedule_register('a', 'interval', '30000', 0, 40)")
        rr.rollback()
        assert _state(db) == before
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        row = rr.execute(
            "SELECT fencing_token FROM schedule_register('a', 'interval', '30000', 0, 40)"
        ).fetchone()
        rr.commit()
    assert row == (3,)


def _job(db: psycopg.Connection[Any], run_id: str) -> tuple[Any, ...]:
    row = db.execute(
        "SELECT attempts, max_attempts, last_error, failed, finished_at IS NOT NULL,"
        " lease_holder, dispatch_at FROM job_get(%s)", (run_id,)
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_a_job_fails_when_released_out_of_attempts_and_retry_revives_it(
    db: psycopg.Connection[Any],
) -> None:
    db.execute("SELECT job_schedule('r', 0, 2)")
    db.execute("SELECT job_schedule('other', 0)")  # the store default, 25
    assert _job(db, "other")[:2] == (0, 25)
    lease = "SELECT run_id, attempts FROM job_lease('h', 10, 1000)"
    assert db.execute(lease).fetchone() == ("other", 1)
    assert db.execute("SELECT job_release('other', 'h', 99)").fetchone() == (True,)  # old form
    assert _job(db, "other") == (1, 25, None, False, False, None, 99)
    assert db.execute(lease).fetchone() == ("r", 1)
    assert db.execute("SELECT job_release('r', 'h', 5, NULL, 'timeout')").fetchone() == (True,)
    assert _job(db, "r") == (1, 2, "timeout", False, False, None, 5)
    assert db.execute(lease).fetchone() == ("r", 2)  # due at 5 <= 10
    # The last attempt's release fails the job: dispatch_at kept, finished_at set.
    assert db.execute("SELECT job_release('r', 'h', 7, 2, NULL)").fetchone() == (True,)
    assert _job(db, "r") == (2, 2, "timeout", True, True, None, 5)
    far = "SELECT run_id FROM job_lease('h', 9223372036854775000, 1)"
    assert db.execute(far).fetchall() == [("other",)]
    assert db.execute(far).fetchall() == []  # never r
    assert db.execute("SELECT job_release('r', 'h', 7)").fetchone() == (False,)  # no lease
    listed = db.execute("SELECT run_id, failed, matching FROM job_list('failed', NULL, 5)")
    assert listed.fetchall() == [("r", True, 1)]
    stats = db.execute("SELECT jobs_failed, jobs_leased FROM store_stats(10)").fetchone()
    assert stats == (1, 1)
    assert db.execute("SELECT run_id FROM job_list('due', 9223372036854775807, NULL)").fetchall() == [
        ("other",)]
    # job_schedule moves dispatch_at only: the job stays failed.
    db.execute("SELECT job_schedule('r', 0)")
    assert _job(db, "r")[3] is True
    assert db.execute("SELECT job_retry('other', NULL)").fetchone() == ("not_failed",)
    assert db.execute("SELECT job_retry('absent', NULL)").fetchone() == ("missing",)
    assert db.execute("SELECT job_retry('r', 3)").fetchone() == ("retried",)
    assert _job(db, "r") == (0, 2, "timeout", False, False, None, 3)
    assert db.execute("SELECT job_retry('r', 3)").fetchone() == ("not_failed",)
    assert db.execute(lease).fetchone() == ("r", 1)


def test_a_failed_job_is_purged_and_a_cancelled_one_is_not_retried(
    db: psycopg.Connection[Any],
) -> None:
    db.execute("SELECT job_schedule(r, 0, 1) FROM unnest(ARRAY['a', 'b']) r")
    for run_id in ("a", "b"):
        assert db.execute("SELECT run_id FROM job_lease('h', 10, 1000)").fetchone() == (run_id,)
        assert db.execute("SELECT job_release(%s, 'h', 0, NULL, '')", (run_id,)).fetchone() == (True,)
    assert db.execute("SELECT job_cancel('b')").fetchone() == ("cancelled",)
    assert db.execute("SELECT job_retry('b', NULL)").fetchone() == ("not_failed",)
    assert db.execute("SELECT jobs_failed, jobs_cancelled FROM store_stats(NULL)").fetchone() == (1, 1)
    assert db.execute("SELECT run_id FROM job_list('failed', NULL, NULL)").fetchall() == [("a",)]
    assert _job(db, "a")[2] == ""  # an empty error is kept as given
    assert db.execute("SELECT job_purge(9223372036854775807, 10)").fetchone() == (2,)


def test_release_error_is_capped_at_4096_characters_and_max_attempts_at_integer(
    db: psycopg.Connection[Any],
) -> None:
    db.execute("SELECT job_schedule('r', 0, 2147483647)")
    db.execute("SELECT job_lease('h', 10, 1000)")
    before = _state(db)
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        db.execute("SELECT job_schedule('r', 0, 2147483648::bigint::integer)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="error"):
        db.execute("SELECT job_release('r', 'h', 0, NULL, repeat('😀', 4097))")
    assert _state(db) == before
    assert db.execute("SELECT job_release('r', 'h', 0, NULL, repeat('😀', 4096))").fetchone() == (True,)
    assert _job(db, "r")[:4] == (1, 2147483647, "😀" * 4096, False)


def test_the_store_default_max_attempts_applies_to_jobs_scheduled_after_it(
    db: psycopg.Connection[Any],
) -> None:
    db.execute("SELECT job_schedule('before', 0)")
    db.execute("UPDATE store_settings SET default_max_attempts = 3")
    try:
        db.execute("SELECT job_schedule('after', 0)")
        db.execute("SELECT job_schedule('given', 0, 7)")
        db.execute("SELECT job_schedule('before', 1)")  # kept: no p_max_attempts
        assert [_job(db, r)[1] for r in ("before", "after", "given")] == [25, 3, 7]
        db.execute("SELECT job_schedule('before', 1, 4)")  # given: moved
        assert _job(db, "before")[1] == 4
        with pytest.raises(psycopg.errors.CheckViolation):
            db.execute("UPDATE store_settings SET default_max_attempts = 0")
    finally:
        db.execute("UPDATE store_settings SET default_max_attempts = 25")


def test_schedule_complete_counts_consecutive_failures(db: psycopg.Connection[Any]) -> None:
    db.execute("SELECT schedule_register('t', 'interval', '1', 0, 0)")
    seen = []
    for token, status in enumerate(["error", "error", "ok", "error"], start=1):
        db.execute("SELECT schedule_claim_due('t', 'w', %s, 1)", (token * 10,))
        done = db.execute(
            "SELECT schedule_complete('t', %s, 0, %s, %s, NULL)", (token, token * 10, status)
        ).fetchone()
        assert done == (True,)
        row = db.execute("SELECT last_status, consecutive_failures FROM schedule_get('t')")
        seen.append(row.fetchone())
    assert seen == [("error", 1), ("error", 2), ("ok", 0), ("error", 1)]
    # A stale complete changes nothing; a re-register with another spec keeps the count.
    assert db.execute("SELECT schedule_complete('t', 1, 0, 0, 'error', NULL)").fetchone() == (False,)
    db.execute("SELECT schedule_register('t', 'interval', '2', 0, 0)")
    assert db.execute("SELECT consecutive_failures FROM schedule_get('t')").fetchone() == (1,)


def test_job_list_of_some_queues(db: psycopg.Connection[Any]) -> None:
    """p_queues keeps each filter to those queues' jobs, from both pending indexes for
    'due', and matching counts them; NULL and the three-argument call: every queue."""
    db.execute("SELECT job_schedule('d', 10)")
    db.execute("SELECT job_schedule('d-hi', 20, p_priority => 3)")
    db.execute("SELECT job_schedule('px', 30, p_queue => 'provider-x')")
    db.execute("SELECT job_schedule('py', 40, p_queue => 'python', p_priority => -1)")
    db.execute("SELECT job_schedule('later', 1000000, p_queue => 'python')")
    for (run_id,) in db.execute("SELECT run_id FROM job_lease_many('h', 100, 1000, 10,"
                                " ARRAY['python'])").fetchall():
        db.execute("SELECT * FROM job_mark_dispatched(%s, 'h', 'bot')", (run_id,))

    def listed(call: str) -> tuple[list[str], int | None]:
        rows = db.execute(f"SELECT run_id, matching FROM {call}").fetchall()
        return [r[0] for r in rows], (rows[0][1] if rows else None)

    assert listed("job_list('all', 100, NULL)") == (["d", "d-hi", "px", "py", "later"], 5)
    assert listed("job_list('all', 100, NULL, NULL)") == listed("job_list('all', 100, NULL)")
    assert listed("job_list('all', 100, 1, ARRAY['python'])") == (["py"], 2)
    assert listed("job_list('due', 100, NULL, ARRAY['default'])") == (["d", "d-hi"], 2)
    assert listed("job_list('due', 100, NULL, ARRAY['provider-x', 'python'])") == (["px"], 1)
    assert listed("job_list('dispatched', 100, NULL, ARRAY['python'])") == (["py"], 1)
    assert listed("job_list('dispatched', 100, NULL, ARRAY['default'])") == ([], None)
    assert listed("job_list('failed', 100, NULL, ARRAY['python'])") == ([], None)


def test_job_list_answers_the_jobs_columns_in_order_then_matching(
    db: psycopg.Connection[Any], pgstore_database: str, pgstore_schema: str
) -> None:
    """job_list answers every column of the jobs table (finished_at included, as
    docs/sql.md says), in the table's order, then matching; the store's Job carries it."""
    from pgstore.postgres.jobs import PgJobStore

    table = [c.name for c in db.execute("SELECT * FROM jobs LIMIT 0").description or []]
    for filter in ("all", "due", "dispatched", "failed"):
        cursor = db.execute("SELECT * FROM job_list(%s, NULL, 1)", (filter,))
        assert [c.name for c in cursor.description or []] == [*table, "matching"], filter
    db.execute("SELECT job_schedule_many(ARRAY['sent', 'waits', 'fails'], ARRAY[0, 0, 0])")
    db.execute("UPDATE jobs SET max_attempts = 1 WHERE run_id = 'fails'")
    for (run_id,) in db.execute("SELECT run_id FROM job_lease_many('h', NULL, 1000, 3)"
                                ).fetchall():
        if run_id == "sent":
            db.execute("SELECT * FROM job_mark_dispatched('sent', 'h', 'bot')")
        elif run_id == "fails":
            db.execute("SELECT job_release('fails', 'h', 0)")
    stored = dict(db.execute("SELECT run_id, finished_at FROM jobs").fetchall())
    listed = dict(db.execute("SELECT run_id, finished_at FROM job_list('all', NULL, NULL)"
                             ).fetchall())
    assert listed == stored
    assert stored["waits"] is None and stored["sent"] is not None
    assert stored["fails"] is not None
    with PgJobStore(pgstore_database, schema=pgstore_schema) as store:
        page = store.list_jobs("all", None, None)
        assert {j.run_id: j.finished_at for j in page.jobs} == stored
        assert [j.finished_at for j in store.list_failed()] == [stored["fails"]]
        store.retry("fails", 0)
        again = store.get("fails")
        assert again is not None and again.finished_at is None
