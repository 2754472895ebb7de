"""The schedule rules (docs/contract.md) as a state machine: PgScheduleStore against MemoryScheduleStore, side by side.

Hypothesis draws random sequences of every schedule operation, with explicit
``now`` values from a clock that mostly moves forward, small id and owner
alphabets (so calls collide) and fencing tokens drawn from those seen plus a
few random ones. After every step both stores must have given the same answer
(or both raised ``InvalidArgument``, with the same SQLSTATE, changing nothing)
and hold the same state: records and fences.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

from pgstore import CompletePatch, InvalidArgument, LastStatus, MemoryScheduleStore, PgScheduleStore
from pgstore.testing import drop_schema, install_schema

pytestmark = pytest.mark.slow

# "A" < "a" < "ab" < "b" in code-point order: ties in claim_next and list() order
# must follow it in both stores.
IDS = st.sampled_from(["a", "b", "c", "A", "ab"])
OWNERS = st.sampled_from(["w1", "w2", "w3"])
KINDS = st.sampled_from(["cron", "interval", "once"])
SPECS = st.sampled_from(["1000", "5000", "0 * * * *"])
STATUSES: st.SearchStrategy[LastStatus] = st.sampled_from(["ok", "error", "skipped"])
CATCH_UPS = st.sampled_from(["skip", "once", "all"])
LEASES = st.integers(min_value=1, max_value=800)
STEPS = st.integers(min_value=0, max_value=400)
OFFSETS = st.integers(min_value=-300, max_value=600)
JITTERS = st.sampled_from([0, 0, 1, 100, 1_000])


class _Context:
    """Where the machine finds its PostgreSQL store (set by the module fixture)."""

    conn: psycopg.Connection[Any] | None = None
    schema: str = ""


@pytest.fixture(scope="module")
def pg_context(pgstore_database: str) -> Iterator[None]:
    schema = f"pgstore_stateful_{uuid.uuid4().hex[:12]}"
    install_schema(pgstore_database, schema)
    conn = psycopg.connect(pgstore_database, autocommit=True)
    _Context.conn, _Context.schema = conn, schema
    try:
        yield
    finally:
        _Context.conn = None
        conn.close()
        drop_schema(pgstore_database, schema)


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", call())
    except InvalidArgument as exc:
        return ("invalid", exc.sqlstate)


class ScheduleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        conn = _Context.conn
        assert conn is not None, "the pg_context fixture must run first"
        self.conn = conn
        conn.execute(
            sql.SQL("TRUNCATE {}.schedules, {}.schedule_fences").format(
                sql.Identifier(_Context.schema), sql.Identifier(_Context.schema)
            )
        )
        self.pg = PgScheduleStore(conn, schema=_Context.schema)
        self.memory = MemoryScheduleStore()
        self.now = 1_000
        self.tokens: set[int] = {0}

    # -- helpers ---------------------------------------------------------------

    def both(self, name: str, *args: Any) -> tuple[str, Any]:
        """Call ``name`` on both stores; they must agree; return the answer."""
        before = self.state()
        mem = _outcome(lambda: getattr(self.memory, name)(*args))
        pg = _outcome(lambda: getattr(self.pg, name)(*args))
        assert pg == mem, f"{name}{args}: pg {pg!r} != memory {mem!r}"
        if mem[0] == "invalid":
            assert self.state() == before, f"{name}{args} raised but changed the state"
        self.note_tokens(mem[1])
        return mem

    def note_tokens(self, answer: Any) -> None:
        for item in answer if isinstance(answer, list) else [answer]:
            token = getattr(item, "fencing_token", None)
            if isinstance(token, int):
                self.tokens.add(token)

    def fences(self) -> dict[str, int]:
        rows = self.conn.execute(
            sql.SQL("SELECT id, fencing_token FROM {}.schedule_fences").format(
                sql.Identifier(_Context.schema)
            )
        ).fetchall()
        return dict(rows)

    def state(self) -> tuple[Any, ...]:
        """Both stores' whole state: records and fences."""
        return self.memory.list(), dict(self.memory._fences), self.pg.list(), self.fences()

    def draw_now(self, data: st.DataObject) -> int:
        """Mostly the clock; now and then a little in the past (a slow caller)."""
        return self.now - data.draw(st.sampled_from([0, 0, 0, 0, 1, 50]), label="lag")

    def draw_token(self, data: st.DataObject) -> int:
        seen = st.sampled_from(sorted(self.tokens))
        return data.draw(seen | st.integers(min_value=-1, max_value=8), label="token")

    def draw_time(self, data: st.DataObject) -> int:
        return self.now + data.draw(OFFSETS, label="offset")

    def draw_optional_time(self, data: st.DataObject) -> int | None:
        offset = data.draw(st.none() | OFFSETS, label="next_run_at offset")
        return None if offset is None else self.now + offset

    # -- rules -----------------------------------------------------------------

    @initialize()
    def empty_at_start(self) -> None:
        assert self.pg.list() == []
        assert self.fences() == {}

    @rule(step=STEPS)
    def tick(self, step: int) -> None:
        self.now += step

    @rule(id=IDS, kind=KINDS, spec=SPECS, catch_up=CATCH_UPS, jitter=JITTERS, data=st.data())
    def register(
        self, id: str, kind: str, spec: str, catch_up: str, jitter: int, data: st.DataObject
    ) -> None:
        self.both("register", id, kind, spec, self.draw_optional_time(data), self.draw_now(data),
                  catch_up, jitter)

    @rule(id=IDS, op=st.sampled_from(["pause", "resume", "trigger"]), data=st.data())
    def control(self, id: str, op: str, data: st.DataObject) -> None:
        answer = self.both(op, id, self.draw_now(data))[1]
        event(f"{op} {'answered' if answer is not None else 'refused or unknown'}")

    @rule(ids=st.lists(IDS, min_size=2, max_size=5, unique=True), kind=KINDS, data=st.data())
    def register_many_due(self, ids: list[str], kind: str, data: st.DataObject) -> None:
        """Several records due now or just before: claim_next then has ties and choices."""
        for id in ids:
            due = self.now - data.draw(st.sampled_from([0, 0, 10, 100]), label="due ago")
            self.both("register", id, kind, "1000", due, self.now)

    @rule(id=IDS, owner=OWNERS, lease_ms=LEASES, data=st.data())
    def claim_due(self, id: str, owner: str, lease_ms: int, data: st.DataObject) -> None:
        self.both("claim_due", id, owner, self.draw_now(data), lease_ms)

    @rule(id=IDS, data=st.data())
    def renew(self, id: str, data: st.DataObject) -> None:
        self.both("renew", id, self.draw_token(data), self.draw_time(data))

    @rule(id=IDS, status=STATUSES, data=st.data())
    def complete(self, id: str, status: LastStatus, data: st.DataObject) -> None:
        patch = CompletePatch(self.draw_optional_time(data), self.draw_now(data), status)
        self.both("complete", id, self.draw_token(data), patch, self.draw_now(data))

    @rule(id=IDS)
    def delete(self, id: str) -> None:
        self.both("delete", id)

    @rule(id=IDS)
    def get(self, id: str) -> None:
        self.both("get", id)

    @rule()
    def list_all(self) -> None:
        self.both("list")

    @rule(
        owner=OWNERS,
        lease_ms=LEASES,
        limit=st.integers(min_value=1, max_value=4),
        ids=st.none() | st.lists(IDS, max_size=4),
        data=st.data(),
    )
    def claim_next(
        self, owner: str, lease_ms: int, limit: int, ids: list[str] | None, data: st.DataObject
    ) -> None:
        claimed = self.both("claim_next", owner, self.draw_now(data), lease_ms, limit, ids)[1]
        event(f"claim_next claimed {min(len(claimed), 2)}{'+' if len(claimed) >= 2 else ''}")

    # -- bad inputs: both raise InvalidArgument and change nothing ---------------

    @rule(id=IDS, owner=OWNERS, data=st.data())
    def bad_claim_due(self, id: str, owner: str, data: st.DataObject) -> None:
        args = data.draw(
            st.sampled_from(
                [
                    (id, "", self.now, 100),  # empty owner
                    (id, owner, self.now, 0),  # lease_ms 0
                    (id, owner, self.now, -5),  # negative lease
                    ("", owner, self.now, 100),  # empty id
                    (id, owner, 2**63 - 10, 100),  # lease end beyond bigint
                ]
            ),
            label="bad args",
        )
        assert self.both("claim_due", *args)[0] == "invalid"

    @rule(owner=OWNERS, data=st.data())
    def bad_claim_next(self, owner: str, data: st.DataObject) -> None:
        args = data.draw(
            st.sampled_from(
                [
                    ("", self.now, 100, 1, None),  # empty owner
                    (owner, self.now, 0, 1, None),  # lease_ms 0
                    (owner, self.now, 100, 0, None),  # limit 0
                    (owner, self.now, 100, 2, ["a", ""]),  # an empty id
                ]
            ),
            label="bad args",
        )
        assert self.both("claim_next", *args)[0] == "invalid"

    @rule(id=IDS, data=st.data())
    def bad_register(self, id: str, data: st.DataObject) -> None:
        args = data.draw(
            st.sampled_from(
                [
                    ("", "interval", "1000", self.now, self.now),  # empty id
                    (id, "weekly", "1000", self.now, self.now),  # unknown kind
                    (id, "interval", "1000", self.now, self.now, "once", -1),  # jitter_ms
                    (id, "interval", "1000", self.now, self.now, "once", 86_400_001),
                ]
            ),
            label="bad args",
        )
        assert self.both("register", *args)[0] == "invalid"

    @rule(id=IDS, data=st.data())
    def bad_complete(self, id: str, data: st.DataObject) -> None:
        bad = CompletePatch(self.now, self.now, "maybe")  # type: ignore[arg-type]
        assert self.both("complete", id, self.draw_token(data), bad, self.now)[0] == "invalid"

    @rule(data=st.data())
    def bad_id(self, data: st.DataObject) -> None:
        name = data.draw(
            st.sampled_from(["get", "delete", "pause", "resume", "trigger"]), label="op"
        )
        assert self.both(name, "")[0] == "invalid"

    # -- same state after every step ---------------------------------------------

    @invariant()
    def same_state(self) -> None:
        assert self.pg.list() == self.memory.list()
        assert self.fences() == self.memory._fences


def test_pg_store_matches_memory_store(pg_context: None) -> None:
    run_state_machine_as_test(
        ScheduleMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
