"""``pgstore schedules pause|resume|trigger ID``: messages, ``--json``, exit statuses, and
what each refuses (nothing changed)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import pytest

from pgstore import PgScheduleStore, ScheduleRecord
from tests.support.cli_support import Run, clean_environment, in_process, one_error_line


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_environment(monkeypatch)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Run:
    return in_process(capsys)


def _refused(status: int, out: str, err: str) -> str:
    assert (status, out) == (1, ""), (status, out, err)
    return one_error_line(err)


def test_pause_resume_trigger_from_the_shell(
    cli: Run, pgstore_fresh_database: Callable[[], str]
) -> None:
    dsn = pgstore_fresh_database()
    where = ["--dsn", dsn, "--schema", "cli_s"]
    assert cli("migrate", *where)[0] == 0
    with PgScheduleStore(dsn, schema="cli_s") as store:
        now = store.now_ms()
        store.register("report", "cron", "0 * * * *", now + 3_600_000, now)

    def record() -> ScheduleRecord | None:
        with PgScheduleStore(dsn, schema="cli_s") as store:
            return store.get("report")

    status, out, err = cli("schedules", "pause", *where, "report")
    assert (status, err) == (0, ""), err
    assert out.splitlines()[0] == (
        "schema 'cli_s': schedule 'report' is paused: nothing claims it until it is resumed")
    assert "  paused, in " in out.splitlines()[3]  # the next_run cell says so
    status, out, _ = cli("schedules", "pause", *where, "report")
    assert status == 0 and "was already paused: nothing changed" in out
    paused = record()
    assert paused is not None and paused.paused

    # A paused schedule cannot be triggered.
    line = _refused(*cli("schedules", "trigger", *where, "report"))
    assert line == ("pgstore: error: schedule 'report' is paused: nothing changed (resume it "
                    "first)")
    assert record() == paused

    status, out, err = cli("schedules", "resume", *where, "report", "--json")
    assert (status, err) == (0, "")
    document = json.loads(out)
    assert document["result"] == "is resumed" and document["schedule"]["paused"] is False
    assert document["schedule"]["next_run_at_ms"] == paused.next_run_at
    assert document["schedule"]["due_at_ms"] == paused.next_run_at  # no jitter

    status, out, err = cli("schedules", "trigger", *where, "report")
    assert (status, err) == (0, ""), err
    assert "schedule 'report' is triggered" in out.splitlines()[0]
    triggered = record()
    assert triggered is not None and triggered.triggered_at is not None
    assert triggered.next_run_at == paused.next_run_at

    # A run in progress (a live lease) refuses a trigger.
    with PgScheduleStore(dsn, schema="cli_s") as store:
        claim = store.claim_due("report", "scheduler@host-a:1", None, 600_000)
        assert claim is not None and claim.record.triggered_at is not None
    held = record()
    line = _refused(*cli("schedules", "trigger", *where, "report"))
    assert "schedule 'report' is running: leased by scheduler@host-a:1" in line
    assert "nothing changed" in line
    assert record() == held

    # Pausing a running schedule says its run finishes.
    status, out, _ = cli("schedules", "pause", *where, "report")
    assert status == 0 and "the run in progress (scheduler@host-a:1) finishes" in out

    # Unknown ids: exit status 1, nothing created.
    for action in ("pause", "resume", "trigger"):
        line = _refused(*cli("schedules", action, *where, "nope"))
        assert line == "pgstore: error: no schedule 'nope' in schema 'cli_s'"
    with PgScheduleStore(dsn, schema="cli_s") as store:
        assert store.get("nope") is None


def test_schedule_actions_usage(cli: Run) -> None:
    status, _, err = cli("schedules", "pause")
    assert status == 2 and "ID" in err
    status, out, _ = cli("schedules", "trigger", "--help")
    assert status == 0 and "schedule_trigger()" in out and "--json" in out


def test_status_neither_counts_a_paused_schedule_unclaimed_nor_a_jittered_one_early() -> None:
    from pgstore.cli.status import next_run_state, unclaimed_for

    base = ScheduleRecord("r", "cron", "0 * * * *", 1_000, None, None, 0, None, None, 0,
                          due_at=1_000)
    assert unclaimed_for(base, 61_000) == 60_000
    assert next_run_state(base, 61_000) == "overdue 60s"
    paused = dataclasses.replace(base, paused=True)
    assert unclaimed_for(paused, 61_000) is None  # nothing may claim it: not a stall
    assert next_run_state(paused, 61_000) == "paused, due 60s ago"
    jittered = dataclasses.replace(base, jitter_ms=600_000, due_at=301_000)
    assert unclaimed_for(jittered, 61_000) is None  # not claimable before its due time
    assert unclaimed_for(jittered, 361_000) == 60_000
