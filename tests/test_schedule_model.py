"""Hypothesis stateful test: the PostgreSQL store against the memory store, step by step."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from psycopg import sql

from pgstore import CompletePatch, InvalidArgument, MemoryScheduleStore, PgScheduleStore

IDS = st.sampled_from(["a", "b", "c"])
OWNERS = st.sampled_from(["w1", "w2"])
KINDS = st.sampled_from(["cron", "interval", "once"])
SPECS = st.sampled_from(["1000", "2000"])
STEP = st.integers(min_value=0, max_value=1_500)
LEASES = st.integers(min_value=1, max_value=2_000)
MAYBE_AT = st.one_of(st.none(), st.integers(min_value=0, max_value=20_000))


def _outcome(call: Any) -> Any:
    try:
        return ("ok", call())
    except InvalidArgument as exc:
        return ("invalid", exc.sqlstate)


def run_model(dsn: str, schema: str) -> None:
    conn = psycopg.connect(dsn, autocommit=True)
    pg_store = PgScheduleStore(conn, schema=schema)

    class Model(RuleBasedStateMachine):
        @initialize()
        def reset(self) -> None:
            conn.execute(
                sql.SQL("TRUNCATE {}.schedules, {}.schedule_fences").format(
                    sql.Identifier(schema), sql.Identifier(schema)
                )
            )
            self.pg = pg_store
            self.mem = MemoryScheduleStore()
            self.now = 0
            self.tokens: set[int] = {0, 1, 2}

        def both(self, name: str, *args: Any) -> Any:
            got_pg = _outcome(lambda: getattr(self.pg, name)(*args))
            got_mem = _outcome(lambda: getattr(self.mem, name)(*args))
            assert got_pg == got_mem, (name, args)
            assert self.pg.list() == self.mem.list()
            return got_pg

        @rule(step=STEP)
        def tick(self, step: int) -> None:
            self.now += step

        @rule(id=IDS, kind=KINDS, spec=SPECS, at=MAYBE_AT)
        def register(self, id: str, kind: str, spec: str, at: int | None) -> None:
            self.both("register", id, kind, spec, at, self.now)

        @rule(id=IDS, owner=OWNERS, lease=LEASES)
        def claim_due(self, id: str, owner: str, lease: int) -> None:
            _, claim = self.both("claim_due", id, owner, self.now, lease)
            if claim is not None:
                self.tokens.add(claim.fencing_token)

        @rule(owner=OWNERS, lease=LEASES, limit=st.integers(1, 4),
              ids=st.one_of(st.none(), st.lists(IDS, max_size=3)))
        def claim_next(self, owner: str, lease: int, limit: int, ids: list[str] | None) -> None:
            _, claims = self.both("claim_next", owner, self.now, lease, limit, ids)
            self.tokens.update(c.fencing_token for c in claims)

        @rule(id=IDS, token=st.data(), extra=LEASES)
        def renew(self, id: str, token: st.DataObject, extra: int) -> None:
            chosen = token.draw(st.sampled_from(sorted(self.tokens)))
            self.both("renew", id, chosen, self.now + extra)

        @rule(id=IDS, token=st.data(), at=MAYBE_AT, status=st.sampled_from(["ok", "error"]))
        def complete(self, id: str, token: st.DataObject, at: int | None, status: str) -> None:
            chosen = token.draw(st.sampled_from(sorted(self.tokens)))
            self.both("complete", id, chosen, CompletePatch(at, self.now, status), self.now)  # type: ignore[arg-type]

        @rule(id=IDS)
        def delete(self, id: str) -> None:
            self.both("delete", id)

        @rule(id=IDS)
        def get(self, id: str) -> None:
            self.both("get", id)

        @rule(bad=st.sampled_from([
            ("claim_due", ("a", "", 0, 10)),
            ("claim_due", ("a", "w1", 0, 0)),
            ("claim_next", ("w1", 0, 10, 0)),
            ("register", ("a", "weekly", "1", 0, 0)),
            ("complete", ("a", 1, CompletePatch(0, 0, "meh"), 0)),  # type: ignore[arg-type]
            ("claim_due", ("a", "w1", 2**63 - 10, 100)),
        ]))
        def bad_call(self, bad: tuple[str, tuple[Any, ...]]) -> None:
            status, _ = self.both(bad[0], *bad[1])
            assert status == "invalid"

    try:
        run_state_machine_as_test(
            Model, settings=settings(max_examples=40, stateful_step_count=30, deadline=None)
        )
    finally:
        conn.close()


@pytest.mark.slow
def test_postgres_store_matches_memory_store(pgstore_database: str, pgstore_schema: str) -> None:
    run_model(pgstore_database, pgstore_schema)
