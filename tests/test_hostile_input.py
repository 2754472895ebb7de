"""Hostile input: arbitrary values thrown at every SQL function and every store method.

SQL level: each function of the schema, called as plain SQL with arguments of
its declared types drawn by hypothesis: text with control characters, NUL,
unicode, SQL fragments and lengths up to 5,000 characters; bigints and
integers across their whole range, at the bounds, past them, and NULL; text[]
with NULL and empty elements, empty and two-dimensional. The only answers
allowed are success, SQLSTATE 22023 or 22003, or (for a NUL character) the
driver's own refusal to send it (``psycopg.DataError``, nothing sent). After a
rejected call the tables are unchanged; after a successful one they still
hold the invariants the functions promise.

Python level: every method of the PostgreSQL stores (sync and asyncio) and of
the memory stores, with values of any Python type (None, bools, floats, bytes,
lists, dicts, huge ints, NUL and lone-surrogate strings, ...): the only error
allowed is ``InvalidArgument`` with sqlstate 22023 or 22003, a rejected call
changes nothing, and the three stores agree on accepting or rejecting each call
(the two PostgreSQL stores on the sqlstate too).

Finally the server must still be the one the module started with (no backend
crash restarted it). The counts of inputs tried and outcomes seen are printed
at the end of the module (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum, IntEnum
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from pgstore import (
    AsyncPgJobStore,
    AsyncPgScheduleStore,
    CancelResult,
    CompletePatch,
    InvalidArgument,
    JobNotRemovable,
    MemoryJobStore,
    MemoryScheduleStore,
    PgJobStore,
    PgScheduleStore,
)
from pgstore.postgres.grants import CLIENT_FUNCTIONS
from pgstore.protocols import JobStore, ScheduleStore
from pgstore.runtime.dispatcher import Dispatcher
from pgstore.testing import drop_schema, install_schema

pytestmark = pytest.mark.slow

EXAMPLES = 120
DOCUMENTED = {"22023", "22003"}
HOSTILE = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.data_too_large,
    ],
)

#: Inputs tried, and outcomes seen (one per store called), by level; printed at the end.
INPUTS: Counter[str] = Counter()
STATS: dict[str, Counter[str]] = {"sql": Counter(), "python": Counter()}

# --- Strategies --------------------------------------------------------------------

FRAGMENTS = [
    "'); DROP TABLE schedules; --",
    "x'; DELETE FROM jobs WHERE 'a'='a",
    "' OR '1'='1",
    "$$; SELECT pg_sleep(10); $$",
    "\\", "\\\\'", '"', "%s", "%(id)s", "{}", "{a,b}", "NULL", "null", "",
    " ", "\t", "\n", "\r\n", "\x1b[31m", "\x7f", "\u202e", "\ufeff", "\u200b",
    "é", "😀", "\U0001d54f", "\U0010ffff", "\x01\x02\x03", "a\x00b",
]
SEED_IDS = ["s-due", "s-leased", "s-gone", "s-tomb"]
SEED_JOBS = ["j-due", "j-leased", "j-done", "j-cancelled", "j-failed"]
NAMES = [*SEED_IDS, *SEED_JOBS, "w1", "w2", "cron", "interval", "once", "ok", "error"]

# NUL only now and then (psycopg refuses it before sending: see test_nul_*).
no_nul = st.characters(exclude_characters="\x00", exclude_categories=["Cs"])


def _repeated(piece: str, length: int) -> str:
    return (piece * (length // len(piece) + 1))[:length]


def _scrambled(length: int, seed: int) -> str:
    """``length`` 4-byte characters that do not compress (a btree key's size is its
    compressed size)."""
    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x10000, 0x110000)) for _ in range(length))


texts = st.one_of(
    st.sampled_from(FRAGMENTS),
    st.sampled_from(NAMES),
    st.text(no_nul, max_size=40),  # any code point but surrogates and NUL: controls, ...
    # Long: around the 1024-character limit, and up to 5,000 (cheaper to draw repeated).
    # (Lone surrogates are not text for the driver at all: the Python level tries them.)
    st.builds(_repeated, st.text(no_nul, min_size=1, max_size=12),
              st.one_of(st.integers(1020, 1030), st.integers(1000, 5000))),
    st.builds(_scrambled, st.integers(600, 1030), st.integers(0, 2**32)),
)
BIGINT_EDGES = [0, 1, -1, 2**63 - 1, -(2**63), 2**62, -(2**62), 2**31, -(2**31) - 1, 10**13]
bigints = st.one_of(
    st.none(),
    st.sampled_from(BIGINT_EDGES),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-2000, 2000),
    st.sampled_from([2**63, -(2**63) - 1, 2**64, -(10**30)]),  # past the type: the cast's 22003
)
integers = st.one_of(
    st.none(),
    st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**40]),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-5, 10),
)
text_or_null = st.one_of(st.none(), texts)
text_arrays = st.one_of(
    st.none(),
    st.lists(text_or_null, max_size=6),
    st.lists(st.lists(text_or_null, min_size=2, max_size=2), min_size=1, max_size=3),
)
#: The batch calls' companion arrays: as long as their run_ids or not, NULL elements,
#: the bigint edges, two dimensions.
bigint_arrays = st.one_of(
    st.none(),
    st.lists(st.one_of(st.none(), st.sampled_from(BIGINT_EDGES), st.integers(-3, 5)),
             max_size=6),
    st.lists(st.lists(st.integers(-3, 5), min_size=2, max_size=2), min_size=1, max_size=3),
)


#: A job's payload: none, any JSON value, or a string around the 65536-byte default cap
#: (its JSON text is 2 bytes longer).
json_payloads = st.one_of(
    st.none(),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(no_nul,
                  max_size=10), st.floats(allow_nan=False, allow_infinity=False)),
        lambda kids: st.one_of(st.lists(kids, max_size=3),
                               st.dictionaries(st.text(no_nul, max_size=5), kids, max_size=3)),
        max_leaves=8),
    st.builds(_repeated, st.text(no_nul, min_size=1, max_size=3), st.integers(65530, 65540)),
)


#: A queue limit at the SQL level: each valid one is that many places in queue_slots, which
#: every state check reads, so the valid ones drawn stay small; and the bounds, and past.
SQL_QUEUE_LIMITS = st.one_of(st.none(), st.integers(-2, 4),
                             st.sampled_from([10_001, 2**31 - 1, -(2**31)]))


def sql_argument(name: str, type_: str, function: str = "") -> st.SearchStrategy[Any]:
    if function.startswith("queue_set_") and name == "p_limit":
        return SQL_QUEUE_LIMITS
    if type_ == "text":
        drawn = text_or_null
        return drawn
    if type_ == "bigint":
        return bigints
    if type_ == "integer":
        return integers
    if type_ == "text[]":
        return text_arrays
    if type_ == "bigint[]":
        return bigint_arrays
    if type_ == "jsonb":
        return json_payloads.map(lambda v: None if v is None else Jsonb(v))
    if type_ == "jsonb[]":
        return st.one_of(st.none(), st.lists(
            json_payloads.map(lambda v: None if v is None else Jsonb(v)), max_size=4))
    raise AssertionError(f"no strategy for {name} {type_}: add one")


# --- The SQL level -----------------------------------------------------------------

#: Every function a client calls (read from the catalog: ``grants.CLIENT_FUNCTIONS``), and
#: job_purge, which only the owner runs (the check_* helpers are internal and not granted).
SQL_FUNCTIONS = sorted({f.name for f in CLIENT_FUNCTIONS} | {"job_purge"})

STATE_SQL = """
SELECT (SELECT md5(coalesce(string_agg(s::text, '|' ORDER BY s.id), '')) FROM {s}.schedules s),
       (SELECT md5(coalesce(string_agg(f::text, '|' ORDER BY f.id), '')) FROM {s}.schedule_fences f),
       (SELECT md5(coalesce(string_agg(j::text, '|' ORDER BY j.run_id), '')) FROM {s}.jobs j),
       (SELECT md5(coalesce(string_agg(q::text, '|' ORDER BY q.queue), '')) FROM {s}.queues q),
       (SELECT md5(coalesce(string_agg(
                   (pg_column_size(l.queue), l.slot, l.run_ids, l.lease_sequences,
                    l.lease_untils, l.taken_ats)::text, '|' ORDER BY l.queue, l.slot), ''))
          FROM {s}.queue_slots l)  -- not the names: up to 10000 rows share a long one
"""

#: Rows that break a promise of the functions; each query must return no row.
INVARIANTS = {
    "schedule lease fields": "SELECT id FROM {s}.schedules"
    " WHERE (lease_owner IS NULL) <> (lease_until IS NULL)",
    "schedule names": "SELECT id FROM {s}.schedules WHERE length(id) NOT BETWEEN 1 AND 1024"
    " OR length(lease_owner) NOT BETWEEN 1 AND 1024",
    "token below its fence": "SELECT id FROM {s}.schedules JOIN {s}.schedule_fences f USING (id)"
    " WHERE schedules.fencing_token < f.fencing_token",
    "negative token": "SELECT id FROM {s}.schedules WHERE fencing_token < 0"
    " UNION ALL SELECT id FROM {s}.schedule_fences WHERE fencing_token < 0",
    "job lease fields": "SELECT run_id FROM {s}.jobs"
    " WHERE (lease_holder IS NULL) <> (lease_until IS NULL)"
    " OR (dispatched AND lease_holder IS NULL) OR (worker_id IS NOT NULL AND NOT dispatched)",
    "job names": "SELECT run_id FROM {s}.jobs WHERE length(run_id) NOT BETWEEN 1 AND 1024"
    " OR length(lease_holder) NOT BETWEEN 1 AND 1024 OR length(worker_id) > 1024",
    "job attempts": "SELECT run_id FROM {s}.jobs WHERE length(last_error) > 4096"
    " OR (failed AND (lease_holder IS NOT NULL OR finished_at IS NULL OR dispatched))"
    " OR (NOT failed AND NOT dispatched AND NOT cancelled AND finished_at IS NOT NULL)",
}


@dataclass
class Database:
    """The module's schema on the test server, and one autocommit connection to it."""

    dsn: str
    schema: str
    conn: psycopg.Connection[Any]

    def q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(s=sql.Identifier(self.schema))

    def state(self) -> tuple[Any, ...]:
        row = self.conn.execute(self.q(STATE_SQL)).fetchone()
        assert row is not None
        return tuple(row)

    def broken_invariants(self) -> list[Any]:
        union = " UNION ALL ".join(
            f"(SELECT {name!r} AS broken, x.key FROM ({query}) AS x(key) LIMIT 3)"
            for name, query in INVARIANTS.items()
        )
        return self.conn.execute(self.q(union)).fetchall()


def seed(store: Any, jobs: Any) -> None:
    """A little of every state: due, leased, deleted (a fence), tombstone; due, leased,
    dispatched and cancelled jobs. Later successful calls add and change more."""
    store.register("s-due", "interval", "1000", 0, 0)
    store.register("s-leased", "cron", "* * * * *", 0, 0)
    store.claim_due("s-leased", "w1", 10, 10**9)
    store.register("s-gone", "once", "0", 0, 0)
    store.claim_due("s-gone", "w1", 10, 5)
    store.delete("s-gone")
    store.register("s-tomb", "once", "0", None, 0)
    for run_id in SEED_JOBS[:4]:
        jobs.schedule(run_id, 0)
    for holder in ("w1", "w2", "w3"):
        jobs.lease(holder, 10, 10**9)  # j-cancelled, j-done, j-due, in lease order
    jobs.mark_dispatched("j-done", "w2", "bot")
    jobs.cancel("j-cancelled")
    jobs.release("j-due", "w3", 0)
    jobs.schedule("j-failed", -1, 1)  # first in lease order
    jobs.lease("w1", 10, 10**9)
    jobs.release("j-failed", "w1", 0, None, "boom")
    assert jobs.get("j-failed").state == "failed"


@pytest.fixture(scope="module")
def db(pgstore_database: str) -> Iterator[Database]:
    schema = f"pgstore_hostile_{uuid.uuid4().hex[:12]}"
    install_schema(pgstore_database, schema)
    conn = psycopg.connect(pgstore_database, autocommit=True)
    seed(PgScheduleStore(conn, schema=schema), PgJobStore(conn, schema=schema))
    try:
        yield Database(pgstore_database, schema, conn)
    finally:
        conn.close()
        drop_schema(pgstore_database, schema)


@pytest.fixture(scope="module")
def signatures(db: Database) -> dict[str, list[tuple[str, str]]]:
    """Each function's parameters (name, declared type), from the catalog."""
    rows = db.conn.execute(
        """
        SELECT p.proname,
               (coalesce(p.proargnames, '{}'))[1:p.pronargs],  -- inputs, not TABLE columns
               ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = %s AND p.proname NOT LIKE 'check\\_%%'
           AND p.proname NOT IN ('raise_invalid', 'raise_standby', 'token_floor', 'batch_max',
                                 'token_floor_at', 'raise_no_epoch', 'fence_after_restore',
                                 'job_history_advance', 'job_history_move', 'store_stats_read',
                                 'schedule_due_at',
                                 'job_lease_groups', 'job_lease_due',
                                 'job_lease_take', 'job_lease_default', 'queue_limit_max',
                                 'queue_slot_free', 'queue_limits_reserve',
                                 'queue_limits_fill', 'queue_limits_keep',
                                 'queue_limits_caps', 'queue_limits_wants',
                                 'queue_lane_free', 'queue_lane_usable',
                                 'queue_slots_layout', 'queue_slots_sweep')
           -- the helpers: not granted to clients; and the owner's readings and fence, with
           -- no argument or tested on their own (tests/test_restore_fence.py); schedule_due_at,
           -- the generated column's expression, against its reference in
           -- tests/test_schedule_controls.py
        """,
        (db.schema,),
    ).fetchall()
    return {name: list(zip(names, types, strict=True)) for name, names, types in rows}


@pytest.fixture(scope="module", autouse=True)
def server_survives(db: Database) -> Iterator[None]:
    """The server is the one the module started with (a crashed backend restarts it),
    and the module's connection is still the same live backend."""
    started, pid = db.conn.execute(
        "SELECT pg_postmaster_start_time(), pg_backend_pid()").fetchone() or (None, None)
    yield
    print("\nhostile input, inputs tried and outcomes by kind:")
    for level, counts in STATS.items():
        print(f"  {level}: {INPUTS[level]} inputs, {sum(counts.values())} outcomes: "
              f"{dict(sorted(counts.items()))}")
    assert db.conn.execute(
        "SELECT pg_postmaster_start_time(), pg_backend_pid()").fetchone() == (started, pid)


def test_every_client_function_is_covered(signatures: dict[str, list[tuple[str, str]]]) -> None:
    assert sorted(signatures) == sorted(SQL_FUNCTIONS)


def _has_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


@pytest.mark.parametrize("function", SQL_FUNCTIONS)
@HOSTILE
@given(data=st.data())
def test_sql_function_answers_only_documented_errors(
    db: Database, signatures: dict[str, list[tuple[str, str]]], function: str, data: st.DataObject
) -> None:
    params = signatures[function]
    args = [data.draw(sql_argument(name, type_, function), label=name)
            for name, type_ in params]
    call = sql.SQL("SELECT * FROM {}.{}({})").format(
        sql.Identifier(db.schema), sql.Identifier(function),
        sql.SQL(", ").join(sql.SQL("%s::" + type_) for _, type_ in params),
    )
    before = db.state()
    INPUTS["sql"] += 1
    try:
        db.conn.execute(call, args).fetchall()
    except psycopg.Error as exc:
        # job_remove also answers 55000 for a job it may not delete.
        if exc.sqlstate in DOCUMENTED or (exc.sqlstate == "55000" and function == "job_remove"):
            outcome = exc.sqlstate
        elif isinstance(exc, psycopg.DataError) and exc.sqlstate is None and _has_nul(args):
            outcome = "driver refused NUL"
        else:
            raise AssertionError(
                f"{function}{tuple(args)!r:.500} answered {exc.sqlstate} "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        STATS["sql"][outcome] += 1
        assert db.state() == before, f"a rejected {function} call changed the tables"
        return
    STATS["sql"]["ok"] += 1
    assert db.broken_invariants() == []


def test_nul_never_reaches_a_function(db: Database) -> None:
    """PostgreSQL text cannot hold NUL. psycopg refuses to send it (client side, no
    SQLSTATE); the server's ways of making one fail before any function runs."""
    before = db.state()
    call = db.q("SELECT * FROM {s}.schedule_register(%s::text, 'once', '0', 0, 0)")
    with pytest.raises(psycopg.DataError, match="NUL") as refused:
        db.conn.execute(call, ["a\x00b"])
    assert refused.value.sqlstate is None
    attempts = {
        "convert_from('\\x6100'::bytea, 'UTF8')": "22021",  # invalid byte sequence
        "chr(0)": "54000",  # null character not permitted
        "E'a\\x00b'": "22021",
    }
    for expression, sqlstate in attempts.items():
        with pytest.raises(psycopg.Error) as failed:
            db.conn.execute(
                db.q("SELECT * FROM {s}.schedule_register(" + expression + ", 'once', '0', 0, 0)")
            )
        assert failed.value.sqlstate == sqlstate, expression
    assert db.state() == before


def _incompressible_4_byte_id(length: int = 1024) -> str:
    return "".join(chr(0x10000 + (i * 7919) % 0xF0000) for i in range(length))


@pytest.mark.parametrize("call", [
    "SELECT * FROM {s}.schedule_register(%s, 'once', '0', 0, 0)",
    "SELECT * FROM {s}.job_schedule(%s, 0)",
    "SELECT * FROM {s}.job_schedule_many(ARRAY[%s], ARRAY[0]::bigint[])",
])
def test_long_multibyte_id_is_stored_or_rejected_cleanly_in_sql(db: Database, call: str) -> None:
    # 1024 incompressible 4-byte characters pass check_name but cannot fit a btree
    # entry: 22023 naming the parameter, nothing changed.
    before = db.state()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="too long to index"):
        db.conn.execute(db.q(call), [_incompressible_4_byte_id()]).fetchall()
    assert db.state() == before
    # 1024 of one 4-byte character compress: exactly 1024 is fine.
    db.conn.execute(db.q(call), ["\U0001F600" * 1024]).fetchall()


@pytest.mark.parametrize("call", [
    "SELECT * FROM {s}.queue_set_concurrency(%s, 2)",
    "SELECT * FROM {s}.queue_set_rate(%s, 2, 1000)",
])
def test_a_queue_name_near_the_index_limit_is_kept_or_refused_cleanly(
    db: Database, call: str
) -> None:
    """Every byte length across the btree's limit, in incompressible 4-byte characters
    (within the 1024-character rule): the limit is set, or 22023 and nothing changed.
    queue_slots' key (queue, slot) is a few bytes wider than queues': 2,689 to 2,692
    bytes fitted queues and then failed in queue_slots with 54000 (pgstore_0029)."""
    outcomes = []
    for size in range(2_680, 2_712):
        name = _incompressible_4_byte_id(size // 4) + "a" * (size % 4)
        assert len(name.encode()) == size
        before = db.state()
        try:
            db.conn.execute(db.q(call), [name]).fetchall()
            outcomes.append("set")
        except psycopg.errors.InvalidParameterValue as refused:
            assert "too long to index" in str(refused)
            assert db.state() == before, size
            outcomes.append("refused")
    assert "set" in outcomes and "refused" in outcomes  # both sides of the limit tried
    assert outcomes == sorted(outcomes, key=["set", "refused"].index)  # one boundary


@pytest.mark.parametrize("method", ["register", "schedule"])
def test_long_multibyte_id_is_stored_or_rejected_cleanly_in_python(
    db: Database, method: str
) -> None:
    key = _incompressible_4_byte_id()
    with pytest.raises(InvalidArgument) as raised:
        if method == "register":
            PgScheduleStore(db.conn, schema=db.schema).register(key, "once", "0", 0, 0)
        else:
            PgJobStore(db.conn, schema=db.schema).schedule(key, 0)
    assert raised.value.sqlstate == "22023"


@pytest.mark.parametrize("schema", ["pgstore\ud800", "é" * 32, "", "a\x00b"])
def test_a_schema_name_postgres_would_not_keep_is_rejected(db: Database, schema: str) -> None:
    with pytest.raises(InvalidArgument, match=r"at most 63 bytes|control character"):
        PgScheduleStore(db.conn, schema=schema)
    assert PgScheduleStore(db.conn, schema="é" * 31).schema == "é" * 31  # 62 bytes: fine


# --- The Python level --------------------------------------------------------------


class Color(Enum):
    RED = "s-due"


class Small(IntEnum):
    ONE = 1


class Text(str):
    """A str subclass: a str for every purpose."""


def _indexable(value: object) -> bool:
    """False for a name check_name accepts but no btree entry can hold (more than about
    2,000 bytes of incompressible UTF-8): PostgreSQL rejects it (22023, see
    test_long_multibyte_id_*), the memory store, which has no index, keeps it. That is
    the one accept/reject difference between them, so the cross-store comparison
    below does not draw such values."""
    return not (isinstance(value, str) and len(value) <= 1024
                and len(value.encode("utf-8", "surrogatepass")) > 2000)


anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63 - 3, max_value=2**80),
    st.integers(min_value=-(2**80), max_value=-(2**63) + 3),
    st.floats(),
    st.binary(max_size=8),
    st.text(max_size=20),
    st.sampled_from(["a\x00b", "\x00", "\ud800", "a\udfffb", "\U0001F600\ud83d"]),
    texts,
    st.lists(st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=3),
    st.tuples(st.text(max_size=5)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([
        float("nan"), float("inf"), 1.0, 1.5, complex(1, 1), b"s-due", bytearray(b"x"),
        memoryview(b"x"), object(), Color.RED, Small.ONE, Text("s-due"), CancelResult.CANCELLED,
        {"s-due"}, frozenset(), range(3), ..., NotImplemented, type, print,
    ]),
).filter(_indexable)

ids = st.one_of(st.sampled_from(SEED_IDS), st.text(min_size=1, max_size=8))
run_ids = st.one_of(st.sampled_from(SEED_JOBS), st.text(min_size=1, max_size=8))
names = st.sampled_from(["w1", "w2", "w3"])
times = st.one_of(st.none(), st.integers(-(10**6), 10**13))
positives = st.integers(1, 10**9)
#: A lease sequence fence: none, a plausible one, or one SQL rejects (not positive).
sequences = st.one_of(st.none(), st.integers(-2, 5))
statuses = st.sampled_from(["ok", "error", "skipped"])
#: The catch-up policies, and strings next to them that both stores must refuse.
catch_ups = st.sampled_from(["skip", "once", "all", "", "ONCE", "all ", "never", "skipped"])
#: A batch's run ids: usually distinct seeded and fresh ones, sometimes a repeat.
batch_ids = st.one_of(st.lists(run_ids, max_size=4, unique=True), st.lists(run_ids, max_size=4))
#: Specs around their 1024-character limit too, so the stores agree at the edge.
specs = st.one_of(
    st.text(max_size=20),
    st.builds(_repeated, st.text(no_nul, min_size=1, max_size=3), st.integers(1020, 1030)),
)
patches = st.one_of(
    st.builds(CompletePatch, times, st.integers(0, 10**13), statuses),
    st.builds(CompletePatch, anything, anything, anything),
)


def hostile(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Half the time a value the parameter accepts, half the time anything at all."""
    return st.one_of(valid, anything)


SCHEDULE_METHODS: dict[str, list[st.SearchStrategy[Any]]] = {
    "get": [ids],
    "register": [ids, st.sampled_from(["cron", "interval", "once"]), specs, times, times,
                 catch_ups,
                 st.one_of(st.integers(0, 86_400_000),
                           st.sampled_from([-1, 86_400_001, 2**63 - 1, 2**63, None]))],
    "claim_due": [ids, names, times, positives],
    "renew": [ids, st.integers(0, 5), times],
    "complete": [ids, st.integers(0, 5), patches, times],
    "delete": [ids],
    "list": [],
    "claim_next": [names, times, positives, st.integers(1, 5),
                   st.one_of(st.none(), st.lists(ids, max_size=4))],
    "now_ms": [],
}
#: A maximum of attempts: none, a plausible one, or one SQL rejects (not positive, or past
#: integer).
max_attempts = st.one_of(st.none(), st.integers(-2, 5),
                         st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1]))
#: A release's error text: none, short, around its 4096-character limit.
errors = st.one_of(
    st.none(), st.text(max_size=20),
    st.builds(_repeated, st.text(no_nul, min_size=1, max_size=3), st.integers(4090, 4100)),
)
#: A queue name: the default, a few others, or anything text (empty and too long too).
queue_names = st.one_of(st.none(), st.sampled_from(["default", "q1", "q2", "", "x" * 1025]),
                        st.text(max_size=8))
#: The queues a lease takes: every one, some, or lists SQL rejects (empty, a bad name).
queue_lists = st.one_of(st.none(), st.lists(st.sampled_from(["default", "q1", "q2", ""]),
                                            max_size=3))
#: A queue limit: none, a few valid ones (small: each is that many rows), and out of range.
queue_limits = st.one_of(st.none(), st.integers(-1, 4),
                         st.sampled_from([10_001, 2**31 - 1, 2**31]))
priorities = st.one_of(st.none(), st.integers(-5, 5),
                       st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1]))
JOB_METHODS: dict[str, list[st.SearchStrategy[Any]]] = {
    "schedule": [run_ids, times, max_attempts, queue_names, priorities, json_payloads],
    "lease": [names, times, positives, queue_lists],
    "renew": [run_ids, names, times, positives, sequences],
    "mark_dispatched": [run_ids, names, st.one_of(st.none(), st.text(max_size=10)), sequences],
    "release": [run_ids, names, times, sequences, errors],
    "retry": [run_ids, times],
    "reschedule": [run_ids, times, times],
    "list_failed": [st.one_of(st.none(), positives, st.sampled_from([0, -1, 2**31 - 1, 2**31]))],
    "cancel": [run_ids],
    "get": [run_ids],
    "list_dispatched": [],
    "remove": [run_ids],
    "purge": [st.one_of(times, st.sampled_from([-1, -(2**63), 2**63 - 1, 2**63])),
              st.one_of(st.none(), positives, st.sampled_from([0, -1, 2**31 - 1, 2**31]))],
    "schedule_many": [batch_ids, st.lists(st.integers(-(10**6), 10**13), max_size=4),
                      queue_names, priorities,
                      st.one_of(st.none(), st.lists(json_payloads, max_size=4))],
    "lease_many": [names, times, positives,
                   st.one_of(st.integers(1, 5), st.sampled_from([0, -1, 10_000, 10_001])),
                   queue_lists],
    "pause_queue": [queue_names],
    "resume_queue": [queue_names],
    "list_queues": [times],
    "set_queue_concurrency": [queue_names, queue_limits],
    "set_queue_rate": [queue_names, queue_limits,
                       st.one_of(st.none(), st.integers(-2, 3), st.sampled_from(
                           [1_000, 31_622_400_000, 31_622_400_001, 2**63 - 1, 2**63]))],
    "mark_dispatched_many": [batch_ids, names,
                             st.lists(st.one_of(st.none(), st.text(max_size=10)), max_size=4),
                             st.one_of(st.none(), st.lists(sequences, max_size=4))],
    "renew_many": [batch_ids, names, times, positives,
                   st.one_of(st.none(), st.lists(sequences, max_size=4))],
    "now_ms": [],
}
#: What a store method's parameter draws, by its name, for a method with no entry above: a
#: new method whose parameters are named as the others' are is tried with no edit here.
BY_PARAMETER: dict[str, st.SearchStrategy[Any]] = {
    "id": ids, "run_id": run_ids, "owner": names, "holder": names, "now": times,
    "dispatch_at": times, "retry_at": times, "lease_ms": positives, "ttl_ms": positives,
    "lease_sequence": sequences, "max_attempts": max_attempts, "error": errors,
}


def _every_method(
    protocol: type, listed: dict[str, list[st.SearchStrategy[Any]]]
) -> dict[str, list[st.SearchStrategy[Any]]]:
    """``listed``, and each other method of ``protocol`` drawn by its parameters' names
    (``BY_PARAMETER``; a name not there fails here, asking for a strategy)."""
    methods = dict(listed)
    for name, function in inspect.getmembers(protocol, inspect.isfunction):
        if name.startswith("_") or name in methods or name in LIFECYCLE:
            continue
        params = list(inspect.signature(function).parameters)[1:]
        missing = [p for p in params if p not in BY_PARAMETER]
        assert not missing, f"{protocol.__name__}.{name}: name a strategy for {missing}"
        methods[name] = [BY_PARAMETER[p] for p in params]
    return methods


#: Methods that take no per-call value worth drawing (lifecycle).
#: ``job_wakeups`` calls no SQL function (it makes a LISTEN, not yet started): what a
#: notification may carry is tested in tests/test_listen_hostile.py.
LIFECYCLE = {"start", "close", "schema", "conninfo", "job_wakeups"}
#: The operator's reads of the PostgreSQL stores (no memory counterpart): tried below.
SCHEDULE_METHODS = _every_method(ScheduleStore, SCHEDULE_METHODS)
JOB_METHODS = _every_method(JobStore, JOB_METHODS)
OPERATOR_VIEWS: dict[str, list[st.SearchStrategy[Any]]] = {
    "stats": [times],
    "list_jobs": [st.sampled_from(["all", "due", "dispatched", "failed"]), times,
                  st.one_of(st.none(), positives), queue_lists],
}


@dataclass
class Stores:
    """One family (schedules or jobs): the sync, asyncio and memory stores, and ways to
    read each one's whole state."""

    sync: Any
    asyncio: Any
    memory: Any
    loop: asyncio.AbstractEventLoop
    pg_state: Callable[[], tuple[Any, ...]]
    memory_state: Callable[[], Any]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


@pytest.fixture(scope="module")
def async_conn(
    db: Database, loop: asyncio.AbstractEventLoop
) -> Iterator[psycopg.AsyncConnection[Any]]:
    conn = loop.run_until_complete(psycopg.AsyncConnection.connect(db.dsn, autocommit=True))
    yield conn
    loop.run_until_complete(conn.close())


def _seeded_memory() -> tuple[MemoryScheduleStore, MemoryJobStore]:
    schedules, jobs = MemoryScheduleStore(), MemoryJobStore()
    seed(schedules, jobs)
    return schedules, jobs


@pytest.fixture(scope="module")
def schedule_stores(
    db: Database, async_conn: psycopg.AsyncConnection[Any], loop: asyncio.AbstractEventLoop
) -> Stores:
    memory, _ = _seeded_memory()
    return Stores(
        PgScheduleStore(db.conn, schema=db.schema),
        AsyncPgScheduleStore(async_conn, schema=db.schema),
        memory, loop, db.state,
        lambda: (dict(memory._records), dict(memory._fences)),
    )


@pytest.fixture(scope="module")
def job_stores(
    db: Database, async_conn: psycopg.AsyncConnection[Any], loop: asyncio.AbstractEventLoop
) -> Stores:
    _, memory = _seeded_memory()
    return Stores(
        PgJobStore(db.conn, schema=db.schema),
        AsyncPgJobStore(async_conn, schema=db.schema),
        memory, loop, db.state, lambda: memory.list_all(),
    )


def _outcome(call: Callable[[], Any]) -> str:
    """"ok", or the sqlstate of the InvalidArgument (or, from remove, JobNotRemovable)
    raised; any other exception escapes."""
    try:
        call()
    except InvalidArgument as exc:
        assert exc.sqlstate in DOCUMENTED, exc
        assert str(exc), "InvalidArgument without a message"
        return exc.sqlstate
    except JobNotRemovable as exc:
        assert str(exc), "JobNotRemovable without a message"
        return exc.sqlstate
    return "ok"


def _check_method(stores: Stores, method: str, args: list[Any]) -> None:
    INPUTS["python"] += 1
    outcomes = {}
    for kind in ("sync", "asyncio", "memory"):
        store = getattr(stores, kind)
        read = stores.memory_state if kind == "memory" else stores.pg_state
        bound = getattr(store, method)
        call: Callable[[], Any]
        if kind == "asyncio":
            def run_awaited(bound: Callable[..., Awaitable[Any]] = bound) -> Any:
                return stores.loop.run_until_complete(bound(*args))

            call = run_awaited
        else:
            def run(bound: Callable[..., Any] = bound) -> Any:
                return bound(*args)

            call = run
        before = read()
        try:
            outcome = _outcome(call)
        except Exception as exc:
            raise AssertionError(
                f"{type(store).__name__}.{method}{tuple(args)!r:.500} raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if outcome != "ok":
            assert read() == before, f"a rejected {type(store).__name__}.{method} changed state"
        outcomes[kind] = outcome
        STATS["python"][outcome] += 1
    # Which error wins when several arguments are bad is not part of the contract (the
    # PostgreSQL stores check types before values), so the stores agree on accepting or
    # rejecting; the two PostgreSQL stores, one code path, on the sqlstate too. A remove
    # that a job's state refuses (55000) took well-formed arguments: the memory store's
    # jobs, driven apart from the table's by earlier examples, may be in another state.
    assert outcomes["sync"] == outcomes["asyncio"], f"{method}{tuple(args)!r:.300}: {outcomes}"
    accepted = {kind: outcome in ("ok", "55000") for kind, outcome in outcomes.items()}
    assert accepted["sync"] == accepted["memory"], f"{method}{tuple(args)!r:.300}: {outcomes}"


#: The PostgreSQL stores' owner-only method with no memory counterpart, not fuzzed here
#: (each call lifts the floor, which the memory stores know nothing of): its bad input
#: and what it changes are tested in tests/test_cli_fence.py.
FENCE = {"fence_after_restore"}


def test_every_public_method_is_covered() -> None:
    def public(cls: type) -> set[str]:
        return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")} - LIFECYCLE

    for cls in (PgScheduleStore, AsyncPgScheduleStore):
        assert public(cls) == set(SCHEDULE_METHODS) | {"stats"} | FENCE, cls
    assert public(MemoryScheduleStore) == set(SCHEDULE_METHODS)
    for job_cls in (PgJobStore, AsyncPgJobStore):
        assert public(job_cls) == set(JOB_METHODS) | set(OPERATOR_VIEWS) | FENCE, job_cls
    assert public(MemoryJobStore) == set(JOB_METHODS) | {"forget", "list_all"}


@pytest.mark.parametrize("method", sorted(SCHEDULE_METHODS))
@HOSTILE
@given(data=st.data())
def test_schedule_methods_raise_only_invalid_argument(
    schedule_stores: Stores, method: str, data: st.DataObject
) -> None:
    args = [data.draw(hostile(s), label=f"arg{i}") for i, s in enumerate(SCHEDULE_METHODS[method])]
    _check_method(schedule_stores, method, args)


@pytest.mark.parametrize("method", sorted(JOB_METHODS))
@HOSTILE
@given(data=st.data())
def test_job_methods_raise_only_invalid_argument(
    job_stores: Stores, method: str, data: st.DataObject
) -> None:
    args = [data.draw(hostile(s), label=f"arg{i}") for i, s in enumerate(JOB_METHODS[method])]
    _check_method(job_stores, method, args)


@pytest.mark.parametrize("method", sorted(OPERATOR_VIEWS))
@HOSTILE
@given(data=st.data())
def test_operator_views_raise_only_invalid_argument_and_change_nothing(
    db: Database, method: str, data: st.DataObject
) -> None:
    args = [data.draw(hostile(s), label=f"arg{i}") for i, s in enumerate(OPERATOR_VIEWS[method])]
    store = PgJobStore(db.conn, schema=db.schema)
    before = db.state()
    INPUTS["python"] += 1
    outcome = _outcome(lambda: getattr(store, method)(*args))
    assert db.state() == before
    STATS["python"][outcome] += 1


@HOSTILE
@given(run_id=anything)
def test_memory_forget_raises_only_invalid_argument(run_id: Any) -> None:
    _, memory = _seeded_memory()
    before = memory.list_all()
    INPUTS["python"] += 1
    outcome = _outcome(lambda: memory.forget(run_id))
    if outcome != "ok":
        assert memory.list_all() == before
    STATS["python"][outcome] += 1


# --- the Dispatcher's retention options (purge_after, purge_interval, purge_batch) ---------

_PURGE_OPTIONS: dict[str, tuple[list[Any], list[Any]]] = {
    # option: (accepted, rejected). None turns purge_after off; the others need a value.
    "purge_after": (
        [None, 1, 2**63 - 1, timedelta(days=7), timedelta(milliseconds=1)],
        [0, -1, 2**63, "", "7d", 1.5, True, timedelta(0), timedelta(days=-1),
         timedelta(microseconds=999), float("nan")],
    ),
    "purge_interval": (
        [0.001, 1, 3600.0],
        [None, 0, -1, "", float("nan"), True, "60"],
    ),
    "purge_batch": (
        [1, 2**31 - 1],
        [None, 0, -1, 2**31, 2**63, 2**63 - 1, "", 1.0, True],
    ),
}


@pytest.mark.parametrize(("option", "value"), [
    (option, value) for option, (_, rejected) in _PURGE_OPTIONS.items() for value in rejected
])
def test_a_dispatchers_bad_retention_option_is_invalid_argument_and_purges_nothing(
    option: str, value: Any
) -> None:
    store = MemoryJobStore()
    store.schedule("sent", store.now_ms() - 1)
    assert store.lease("h", None, 1) is not None
    assert store.mark_dispatched("sent", "h", "bot").recorded
    before = store.list_all()
    kwargs: dict[str, Any] = {"purge_after": 1, option: value}
    with pytest.raises(InvalidArgument) as raised:
        Dispatcher(store, lambda job: None, **kwargs)
    assert raised.value.sqlstate in DOCUMENTED
    assert store.list_all() == before


@pytest.mark.parametrize(("option", "value"), [
    (option, value) for option, (accepted, _) in _PURGE_OPTIONS.items() for value in accepted
])
def test_a_dispatchers_retention_option_at_its_bounds_is_accepted(option: str, value: Any) -> None:
    kwargs: dict[str, Any] = {option: value}
    d = Dispatcher(MemoryJobStore(), lambda job: None, **kwargs)
    if option == "purge_after":
        assert d.purge_after_ms == (None if value is None else
                                    value if isinstance(value, int) else
                                    value // timedelta(milliseconds=1))
