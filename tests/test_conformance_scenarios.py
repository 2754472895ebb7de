"""The shared conformance scenarios (tests/conformance/*.json) on every Python store kind.

The same files are run by the TypeScript client's suite (clients/typescript/test/
conformance.test.ts, driven by tests/test_typescript_client.py): a rule written there once
holds for the memory stores, the PostgreSQL stores (sync and async, direct and through
PgBouncer) and the TypeScript stores alike. tests/conformance/README.md gives the format.
"""

from __future__ import annotations

from typing import Any

import pytest

import pgstore
from pgstore import CompletePatch
from tests.conftest import JobStoreUnderTest, StoreUnderTest
from tests.support.scenarios import expanded, load, mismatch, plain, state_mismatch

JOB_SCENARIOS = load("jobs")
SCHEDULE_SCENARIOS = load("schedules")


def _jobs_state(jobs: JobStoreUnderTest) -> dict[str, Any]:
    return {"jobs": {job.run_id: plain(job) for job in jobs.state()}}


def _schedules_state(schedules: StoreUnderTest) -> dict[str, Any]:
    records, fences = schedules.state()
    return {"schedules": {r.id: plain(r) for r in records}, "fences": dict(fences)}


def _run(scenario: dict[str, Any], store: Any, read_state: Any) -> None:
    for number, step in enumerate(scenario["steps"]):
        where = f"{scenario['name']} step {number}"
        if "state" in step:
            why = state_mismatch(step["state"], read_state())
            assert why is None, f"{where}: {why}"
            continue
        args = expanded(dict(step["args"]))
        if "patch" in args:
            args["patch"] = CompletePatch(**args["patch"])
        method = getattr(store, step["call"])
        if "raises" in step:
            raises = step["raises"]
            before = read_state()
            with pytest.raises(getattr(pgstore, raises["error"])) as caught:
                method(**args)
            assert getattr(caught.value, "sqlstate", None) == raises["sqlstate"], where
            assert raises["message_contains"] in str(caught.value), f"{where}: {caught.value}"
            assert read_state() == before, f"{where}: the refused call changed the state"
            continue
        answer = plain(method(**args))
        if "expect" in step:
            why = mismatch(step["expect"], answer)
            assert why is None, f"{where} ({step['call']}): {why}"


@pytest.mark.parametrize("scenario", JOB_SCENARIOS, ids=[s["name"] for s in JOB_SCENARIOS])
def test_job_scenario(jobs: JobStoreUnderTest, scenario: dict[str, Any]) -> None:
    _run(scenario, jobs.store, lambda: _jobs_state(jobs))


@pytest.mark.parametrize(
    "scenario", SCHEDULE_SCENARIOS, ids=[s["name"] for s in SCHEDULE_SCENARIOS]
)
def test_schedule_scenario(schedules: StoreUnderTest, scenario: dict[str, Any]) -> None:
    _run(scenario, schedules.store, lambda: _schedules_state(schedules))


def test_every_scenario_is_named_once_and_states_its_rule() -> None:
    for scenarios in (JOB_SCENARIOS, SCHEDULE_SCENARIOS):
        names = [s["name"] for s in scenarios]
        assert len(names) == len(set(names))
        assert all(s["rule"] and s["steps"] for s in scenarios)


def test_the_matcher_is_strict_where_it_must_be() -> None:
    """Partial objects, but exact scalars: True is not 1, a missing key is a mismatch,
    lists match element by element and by length."""
    assert mismatch({"a": 1}, {"a": 1, "b": 2}) is None
    assert mismatch({"a": True}, {"a": 1}) is not None
    assert mismatch({"a": None}, {}) is not None
    assert mismatch([{"a": 1}], [{"a": 1}, {"a": 2}]) is not None
    assert mismatch({"$contains": "out of"}, "out of attempts") is None
    assert mismatch({"$contains": "out of"}, None) is not None
    assert state_mismatch({"jobs": {"a": {}}}, {"jobs": {"a": {}, "b": {}}}) is not None
    assert state_mismatch({"fences": {}}, {"fences": {"r1": 1}}) is not None
