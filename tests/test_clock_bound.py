"""The owner's optional bounds on how far a given p_now may be from the database clock,
and on how long a lease may be.

Off by default (store_settings.max_clock_skew_ms IS NULL): any p_now is taken, as
before. Set, every function taking p_now rejects a given p_now further than the
bound from now_ms() with 22023 naming now and changes nothing; a NULL p_now (the
database clock) is never refused.

store_settings.max_lease_ms bounds every lease end a call sets (lease_ms, ttl_ms,
and schedule_renew's lease_until past now_ms()), on the database-clock path too:
22023 naming the parameter, nothing changed. NULL with max_clock_skew_ms set: one
day; both NULL: no bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgstore import InvalidArgument, PgJobStore, PgScheduleStore

BOUND = 60_000
FAR = 10 * 60_000  # well past the bound, whatever the clock does during a call
CENTURIES = 10**14  # about the year 5138

#: Every function taking p_now, called with the placeholder {now} for it.
CALLS = {
    "schedule_register": "SELECT * FROM schedule_register('new', 'once', '1', 0, {now})",
    "schedule_claim_due": "SELECT * FROM schedule_claim_due('t', 'w2', {now}, 1000)",
    "schedule_complete": "SELECT schedule_complete('t', 1, 0, 0, 'ok', {now})",
    "schedule_claim_next": "SELECT * FROM schedule_claim_next('w2', {now}, 1000, 5, NULL)",
    "job_lease": "SELECT * FROM job_lease('h2', {now}, 1000)",
    "job_renew": "SELECT job_renew('r', 'h', {now}, 1000)",
}


@pytest.fixture
def db(pgstore_database: str, pgstore_schema: str) -> Iterator[psycopg.Connection[Any]]:
    """The test's schema on its search_path, holding a claimed schedule, a fence, a
    leased job and a due one."""
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pgstore_schema)))
        conn.execute("SELECT schedule_register('t', 'interval', '1000', 0, NULL)")
        conn.execute("SELECT schedule_claim_due('t', 'w', NULL, 3600000)")
        conn.execute("SELECT schedule_register('u', 'interval', '1000', 0, NULL)")
        conn.execute("SELECT schedule_register('gone', 'once', '1', 0, NULL)")
        conn.execute("SELECT schedule_claim_due('gone', 'w', NULL, 1)")
        conn.execute("SELECT schedule_delete('gone')")
        conn.execute("SELECT job_schedule('r', 0)")
        conn.execute("SELECT job_lease('h', NULL, 3600000)")
        conn.execute("SELECT job_schedule('s', 0)")
        yield conn


def _state(db: psycopg.Connection[Any]) -> list[Any]:
    return [
        db.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
        for t in ("schedules", "schedule_fences", "jobs", "store_settings")
    ]


def _clock(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT now_ms()").fetchone()
    assert row is not None
    return int(row[0])


def _set_bound(db: psycopg.Connection[Any], ms: int | None) -> None:
    """What the documentation tells the owner to run."""
    db.execute("UPDATE store_settings SET max_clock_skew_ms = %s", (ms,))


def test_off_by_default_far_futures_are_taken(db: psycopg.Connection[Any]) -> None:
    assert db.execute("SELECT singleton, max_clock_skew_ms FROM store_settings").fetchall() == [
        (True, None)
    ]
    leased = db.execute("SELECT lease_until FROM schedule_claim_due('u', 'w', %s, 1000)",
                        (CENTURIES,)).fetchone()
    assert leased == (CENTURIES + 1000,)  # a live lease for centuries, as before 0006
    for function, call in CALLS.items():
        db.execute(call.format(now=CENTURIES)).fetchall()
        db.execute(call.format(now=-CENTURIES)).fetchall()
        assert function  # each one answered


@pytest.mark.parametrize("function", sorted(CALLS))
@pytest.mark.parametrize("offset", [FAR, -FAR, CENTURIES, -(2**63), 2**63 - 1])
def test_on_refuses_a_now_past_the_bound_and_changes_nothing(
    db: psycopg.Connection[Any], function: str, offset: int
) -> None:
    _set_bound(db, BOUND)
    before = _state(db)
    now = offset if abs(offset) >= 2**62 else _clock(db) + offset
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        db.execute(CALLS[function].format(now=now)).fetchall()
    message = raised.value.diag.message_primary or ""
    assert message.startswith(f"now must be within {BOUND} ms of the database clock"), message
    assert _state(db) == before


@pytest.mark.parametrize("function", sorted(CALLS))
def test_on_exactly_at_the_bound_is_taken(db: psycopg.Connection[Any], function: str) -> None:
    """now = the clock read just before the call + the bound: the clock only moves on,
    so at the check p_now is at most the bound ahead of it."""
    _set_bound(db, BOUND)
    db.execute(CALLS[function].format(now=_clock(db) + BOUND)).fetchall()


def test_on_the_database_clock_and_a_close_now_are_taken(db: psycopg.Connection[Any]) -> None:
    _set_bound(db, 0)  # zero: only the database clock itself (a NULL now)
    claimed = db.execute("SELECT id FROM schedule_claim_next('w2', NULL, 1000, 5, NULL)")
    assert claimed.fetchall() == [("u",)]
    assert db.execute("SELECT job_renew('r', 'h', NULL, 1000)").fetchone() == (True,)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="now must be within 0 ms"):
        db.execute("SELECT job_renew('r', 'h', %s, 1000)", (_clock(db) - FAR,))
    _set_bound(db, BOUND)
    close = _clock(db) - 1_000  # a client clock a second behind
    assert db.execute("SELECT job_renew('r', 'h', %s, 1000)", (close,)).fetchone() == (True,)
    _set_bound(db, None)  # cleared: off again
    leased = db.execute("SELECT lease_until FROM job_lease('h2', %s, 1000)", (CENTURIES,))
    assert leased.fetchall() == [(CENTURIES + 1000,)]


def test_the_bound_is_checked_after_the_arguments_and_never_negative(
    db: psycopg.Connection[Any],
) -> None:
    _set_bound(db, BOUND)
    before = _state(db)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="lease_ms"):
        db.execute("SELECT * FROM schedule_claim_due('t', 'w', %s, 0)", (CENTURIES,))
    with pytest.raises(psycopg.errors.CheckViolation):
        _set_bound(db, -1)
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute("INSERT INTO store_settings DEFAULT VALUES")  # one row, always
    assert _state(db) == before


def test_the_python_stores_raise_invalid_argument(
    db: psycopg.Connection[Any], pgstore_schema: str
) -> None:
    _set_bound(db, BOUND)
    before = _state(db)
    schedules = PgScheduleStore(db, schema=pgstore_schema)
    jobs = PgJobStore(db, schema=pgstore_schema)
    for call in (
        lambda: schedules.claim_due("u", "w", CENTURIES, 1000),
        lambda: schedules.claim_next("w", CENTURIES, 1000, 5),
        lambda: schedules.register("new", "once", "1", 0, CENTURIES),
        lambda: jobs.lease("h2", CENTURIES, 1000),
    ):
        with pytest.raises(InvalidArgument, match="now must be within") as raised:
            call()
        assert raised.value.sqlstate == "22023"
    assert _state(db) == before
    claim = schedules.claim_due("u", "w", None, 1000)  # the database clock: fine
    assert claim is not None and claim.record.lease_owner == "w"


# --- the bound on leases ----------------------------------------------------------------------

DAY = 86_400_000

#: Every function that sets a lease end, with the placeholder {ms} for its length (for
#: schedule_renew, how far past the database clock its lease_until lies), and the name of
#: the parameter a refusal names.
LEASE_CALLS = {
    "schedule_claim_due": ("SELECT * FROM schedule_claim_due('u', 'w2', NULL, {ms})", "lease_ms"),
    "schedule_claim_next": ("SELECT * FROM schedule_claim_next('w2', NULL, {ms}, 5, NULL)",
                            "lease_ms"),
    "schedule_renew": ("SELECT schedule_renew('t', 1, now_ms() + {ms})", "lease_until"),
    "job_lease": ("SELECT * FROM job_lease('h2', NULL, {ms})", "ttl_ms"),
    "job_lease_many": ("SELECT * FROM job_lease_many('h2', NULL, {ms}, 5)", "ttl_ms"),
    "job_renew": ("SELECT job_renew('r', 'h', NULL, {ms})", "ttl_ms"),
    "job_renew_many": ("SELECT * FROM job_renew_many(ARRAY['r'], 'h', NULL, {ms})", "ttl_ms"),
}
#: Past the bound by more than any call takes, so a clock that moves on during the call
#: cannot bring schedule_renew's lease_until back within it.
PAST = 5_000


def _set_lease_bound(db: psycopg.Connection[Any], ms: int | None) -> None:
    """What the documentation tells the owner to run."""
    db.execute("UPDATE store_settings SET max_lease_ms = %s", (ms,))


def test_no_lease_bound_by_default(db: psycopg.Connection[Any]) -> None:
    assert db.execute("SELECT max_clock_skew_ms, max_lease_ms FROM store_settings").fetchall() == [
        (None, None)]
    for call, _ in LEASE_CALLS.values():
        db.execute(call.format(ms=CENTURIES)).fetchall()  # a lease for centuries, as before
    assert db.execute("SELECT schedule_renew('t', 1, 9223372036854775807)").fetchone() == (True,)


@pytest.mark.parametrize("function", sorted(LEASE_CALLS))
@pytest.mark.parametrize("bounds", ["max_lease_ms", "max_clock_skew_ms alone"])
def test_a_lease_past_the_bound_is_refused_and_changes_nothing(
    db: psycopg.Connection[Any], function: str, bounds: str
) -> None:
    if bounds == "max_lease_ms":
        bound, setting = 60_000, "(store_settings.max_lease_ms)"
        _set_lease_bound(db, bound)
    else:  # the bound on now alone bounds leases too: to a day
        bound, setting = DAY, "one day while only max_clock_skew_ms is set"
        _set_bound(db, BOUND)
    call, param = LEASE_CALLS[function]
    before = _state(db)
    for ms in (bound + PAST, CENTURIES, 2**63 - 1 - _clock(db) - 60_000):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
            db.execute(call.format(ms=ms)).fetchall()
        message = raised.value.diag.message_primary or ""
        assert message.startswith(f"{param} must be at most {bound} ms"), message
        assert setting in message, message
        assert _state(db) == before
    db.execute(call.format(ms=bound)).fetchall()  # exactly the bound: taken


def test_a_given_now_is_checked_against_both_bounds_in_one_call(
    db: psycopg.Connection[Any],
) -> None:
    _set_bound(db, BOUND)
    _set_lease_bound(db, 60_000)
    before = _state(db)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"^now must be within"):
        db.execute("SELECT * FROM job_lease('h2', %s, 1000)", (_clock(db) + FAR,))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"^ttl_ms must be at most"):
        db.execute("SELECT * FROM job_lease('h2', %s, 60001)", (_clock(db),))
    assert _state(db) == before
    leased = db.execute("SELECT run_id FROM job_lease('h2', %s, 60000)", (_clock(db),))
    assert leased.fetchall() == [("s",)]


def test_renewing_to_the_past_is_still_allowed_under_the_bound(
    db: psycopg.Connection[Any],
) -> None:
    _set_lease_bound(db, 60_000)
    assert db.execute("SELECT schedule_renew('t', 1, -9223372036854775808)").fetchone() == (True,)
    assert db.execute("SELECT schedule_renew('t', 1, now_ms() - 1)").fetchone() == (True,)
    assert db.execute("SELECT lease_until < now_ms() FROM schedules WHERE id = 't'").fetchone() == (
        True,)


def test_max_lease_ms_must_be_positive(db: psycopg.Connection[Any]) -> None:
    for bad in (0, -1):
        with pytest.raises(psycopg.errors.CheckViolation):
            _set_lease_bound(db, bad)


def test_the_python_stores_raise_invalid_argument_past_the_lease_bound(
    db: psycopg.Connection[Any], pgstore_schema: str
) -> None:
    _set_lease_bound(db, 60_000)
    before = _state(db)
    schedules = PgScheduleStore(db, schema=pgstore_schema)
    jobs = PgJobStore(db, schema=pgstore_schema)
    for call, param in (
        (lambda: schedules.claim_due("u", "w", None, 60_001), "lease_ms"),
        (lambda: schedules.claim_next("w", None, 60_001, 5), "lease_ms"),
        (lambda: schedules.renew("t", 1, 2**63 - 1), "lease_until"),
        (lambda: jobs.lease("h2", None, 60_001), "ttl_ms"),
        (lambda: jobs.lease_many("h2", None, 60_001, 5), "ttl_ms"),
        (lambda: jobs.renew("r", "h", None, 60_001), "ttl_ms"),
        (lambda: jobs.renew_many(["r"], "h", None, 60_001), "ttl_ms"),
    ):
        with pytest.raises(InvalidArgument, match=f"^{param} must be at most 60000 ms") as raised:
            call()
        assert raised.value.sqlstate == "22023"
    assert _state(db) == before
