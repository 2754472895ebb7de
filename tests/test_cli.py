"""The ``pgstore`` command: in-process through ``main([...])``, and as a real process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgstore import (
    HEAD_REVISION,
    CompletePatch,
    Dispatcher,
    PgJobStore,
    PgScheduleStore,
    Scheduler,
)
from pgstore.cli.app import AppError, load_runtime
from pgstore.cli.commands import (
    CUT_MARK,
    MIN_CUT,
    clip,
    clip_middle,
    due_state,
    format_duration,
    format_instant,
    job_lease_state,
    jobs_table,
    lease_state,
    main,
)
from pgstore.cli.format import lease_left, parse_when, short_duration
from pgstore.cli.status import status_text
from pgstore.models import Job, LastStatus, ScheduleKind, ScheduleRecord, StoreStats
from tests.conftest import present
from tests.support.cli_support import job_gauges

HEAD = HEAD_REVISION
# Nothing listens on port 1: the connection is refused at once.
BAD_DSN = "host=127.0.0.1 port=1 user=nobody dbname=nothing connect_timeout=5"
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture(autouse=True)
def _no_pgstore_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGSTORE_DSN", raising=False)
    monkeypatch.delenv("PGSTORE_SCHEMA", raising=False)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Run:
    """``cli("current", "--dsn", ...)`` -> (exit status, stdout, stderr), in-process."""

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    return run


def _process_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTORE_")}
    env.update(extra)
    return env


def _script() -> Path:
    script = Path(sys.executable).parent / "pgstore"
    if not script.exists():
        pytest.fail(f"{script} is missing: run `pip install -e .` to create the console script")
    return script


def _assert_one_error_line(status: int, out: str, err: str) -> str:
    assert status == 1, (status, out, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pgstore: error: ")
    assert out == ""
    return lines[0]


def _record(**changes: Any) -> ScheduleRecord:
    fields: dict[str, Any] = {
        "id": "t",
        "kind": "interval",
        "spec": "1000",
        "next_run_at": 0,
        "last_run_at": None,
        "last_status": None,
        "fencing_token": 0,
        "lease_owner": None,
        "lease_until": None,
        "updated_at": 0,
    }
    fields.update(changes)
    return ScheduleRecord(**fields)


# --- formatting, without a database -----------------------------------------


def test_instants_are_ms_and_iso_utc() -> None:
    assert format_instant(None) == "-"
    assert format_instant(0) == "0 (1970-01-01T00:00:00.000Z)"
    assert format_instant(1_700_000_000_123) == "1700000000123 (2023-11-14T22:13:20.123Z)"
    assert format_instant(-1) == "-1 (1969-12-31T23:59:59.999Z)"
    # bigint extremes are valid store values, beyond what datetime can show.
    assert format_instant(2**63 - 1) == f"{2**63 - 1} (out of range)"


def test_lease_state_against_the_given_clock() -> None:
    now = 1_700_000_000_000
    assert lease_state(_record(), now) == "free"
    held = _record(lease_owner="w1", lease_until=now + 29_001)
    assert lease_state(held, now) == "held by w1, 30s left"
    assert lease_state(held, now, absolute=True) == "held by w1 until 2023-11-14T22:13:49.001Z"
    # lease_until == now is no longer live: a claim at now succeeds (docs/contract.md).
    assert lease_state(_record(lease_owner="w1", lease_until=now), now) == "expired (w1)"
    assert lease_state(_record(lease_owner="w1", lease_until=now - 1), now) == "expired (w1)"


def test_usage_errors_exit_2(cli: Run) -> None:
    status, _, err = cli()
    assert status == 2
    assert "usage: pgstore" in err
    status, _, err = cli("migrate", "--bogus")
    assert status == 2
    status, out, _ = cli("--help")
    assert status == 0
    for command in ("migrate", "downgrade", "current", "schedules"):
        assert command in out


# --- in-process, on a fresh database ----------------------------------------


def test_migrate_current_schedules_downgrade(
    cli: Run, pgstore_fresh_database: Callable[[], str]
) -> None:
    dsn = pgstore_fresh_database()
    where = ["--dsn", dsn, "--schema", "cli_s"]

    assert cli("current", *where) == (0, "none (not migrated)\n", "")
    status, out, err = cli("migrate", *where)
    assert (status, err) == (0, "")
    assert HEAD in out and "cli_s" in out
    assert cli("current", *where) == (0, f"{HEAD}\n", "")
    assert cli("migrate", *where)[0] == 0  # at head already: a no-op

    # Another schema of the same database is untouched.
    assert cli("current", "--dsn", dsn, "--schema", "other")[1] == "none (not migrated)\n"

    assert cli("schedules", *where)[1].rstrip().endswith("no schedules")

    with PgScheduleStore(dsn, schema="cli_s") as store:
        now = store.now_ms()
        store.register("a-held", "interval", "60000", now - 1_000)
        assert store.claim_due("a-held", "worker-1", None, 600_000) is not None
        store.register("b-expired", "once", "0", now - 1_000)
        assert store.claim_due("b-expired", "worker-2", now - 500, 1) is not None
        store.register("c-free", "cron", "*/5 * * * *", 1_700_000_000_000, None, "all")
        store.register("d-done", "interval", "1000", 0)
        claim = store.claim_due("d-done", "worker-3", None, 60_000)
        assert claim is not None
        patch = CompletePatch(next_run_at=None, last_run_at=1_600_000_000_000, last_status="ok")
        assert store.complete("d-done", claim.fencing_token, patch)
        store.register("e-failing", "interval", "1000", 0)
        for _ in range(2):
            claim = store.claim_due("e-failing", "worker-4", None, 60_000)
            assert claim is not None
            patch = CompletePatch(next_run_at=0, last_run_at=1_600_000_000_000, last_status="error")
            assert store.complete("e-failing", claim.fencing_token, patch)

    status, out, err = cli("schedules", *where)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert re.fullmatch(rf"schema 'cli_s', database clock {ISO}", lines[0])
    header = lines[1].split()
    assert header == [
        "id",
        "kind",
        "spec",
        "next_run",
        "last_run",
        "last_status",
        "failures",
        "catch_up",
        "token",
        "lease",
    ]
    assert set(lines[2]) <= {"-", " "}
    rows = {line.split()[0]: line for line in lines[3:]}
    assert list(rows) == ["a-held", "b-expired", "c-free", "d-done", "e-failing"]  # by id

    # One form per time: relative to the database clock.
    assert re.search(r"interval +60000 +\d+s ago +- +- +0 +once +1 +", rows["a-held"])
    assert re.search(r"held by worker-1, (9|10)m left$", rows["a-held"])
    assert rows["b-expired"].endswith("expired (worker-2)")
    assert re.search(r"\*/5 \* \* \* \* +\d+d ago +- +- +0 +all +0 +free$", rows["c-free"])
    assert re.search(r"d-done +interval +1000 +- +\d+d ago +ok +0 +once +1 +free$",
                     rows["d-done"])
    assert re.search(r" +error +2 +once +2 +free$", rows["e-failing"])  # 2 failures in a row, token 2
    assert "(" not in out.replace("(worker-2)", "")  # no second form in parentheses

    # --absolute: ISO UTC instead, once each.
    status, out, err = cli("schedules", *where, "--absolute")
    assert (status, err) == (0, "")
    rows = {line.split()[0]: line for line in out.splitlines()[3:]}
    assert "2023-11-14T22:13:20.000Z" in rows["c-free"] and "1700000000000" not in out
    assert re.search(
        r"d-done +interval +1000 +- +2020-09-13T12:26:40\.000Z +ok +0 +once +1 +free$",
        rows["d-done"],
    )
    assert re.search(rf"held by worker-1 until {ISO}$", rows["a-held"])

    # --json: every field, instants as epoch ms and ISO.
    status, out, err = cli("schedules", *where, "--json")
    assert (status, err) == (0, "")
    document = json.loads(out)
    assert document["schema"] == "cli_s" and isinstance(document["now_ms"], int)
    by_id = {r["id"]: r for r in document["schedules"]}
    assert list(by_id) == ["a-held", "b-expired", "c-free", "d-done", "e-failing"]
    c_free = by_id["c-free"]
    assert (c_free["next_run_at_ms"], c_free["next_run_at"]) == (
        1_700_000_000_000, "2023-11-14T22:13:20.000Z")
    assert (c_free["kind"], c_free["spec"], c_free["catch_up"]) == ("cron", "*/5 * * * *", "all")
    assert by_id["a-held"]["lease_owner"] == "worker-1" and by_id["a-held"]["lease_live"]
    assert not by_id["b-expired"]["lease_live"]
    assert by_id["e-failing"]["consecutive_failures"] == 2
    assert by_id["d-done"]["next_run_at_ms"] is None and by_id["d-done"]["next_run_at"] is None

    status, out, err = cli("downgrade", *where, "--yes")
    assert (status, err) == (0, "")
    assert "none (not migrated)" in out
    assert cli("current", *where) == (0, "none (not migrated)\n", "")


def test_schedules_on_an_unmigrated_schema_says_what_to_run(
    cli: Run, pgstore_fresh_database: Callable[[], str]
) -> None:
    dsn = pgstore_fresh_database()
    line = _assert_one_error_line(*cli("schedules", "--dsn", dsn, "--schema", "nothing_here"))
    assert "pgstore migrate --dsn DSN --schema nothing_here" in line


@pytest.mark.parametrize("command", ["migrate", "downgrade", "current", "schedules"])
def test_bad_dsn_is_one_line_and_exit_1(cli: Run, command: str) -> None:
    line = _assert_one_error_line(*cli(command, "--dsn", BAD_DSN))
    assert "127.0.0.1" in line
    assert "sqlalchemy" not in line.lower()  # the driver's message, not SQLAlchemy's wrapping


def test_other_failures_are_one_line(cli: Run, pgstore_fresh_database: Callable[[], str]) -> None:
    dsn = pgstore_fresh_database()
    assert "revision" in _assert_one_error_line(
        *cli("migrate", "--dsn", dsn, "--revision", "no_such_revision")
    )
    assert "schema" in _assert_one_error_line(*cli("current", "--dsn", dsn, "--schema", ""))
    assert "connection" in _assert_one_error_line(*cli("current", "--dsn", "not a conninfo"))


def test_environment_supplies_dsn_and_schema(
    cli: Run, pgstore_fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = pgstore_fresh_database()
    monkeypatch.setenv("PGSTORE_DSN", dsn)
    monkeypatch.setenv("PGSTORE_SCHEMA", "env_s")
    assert cli("migrate")[0] == 0
    assert cli("current")[1] == f"{HEAD}\n"
    assert cli("current", "--schema", "pgstore")[1] == "none (not migrated)\n"
    # --dsn wins over PGSTORE_DSN.
    _assert_one_error_line(*cli("current", "--dsn", BAD_DSN))


# --- as a process -------------------------------------------------------------


def _run(argv: list[str], **env: str) -> tuple[int, str, str]:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=_process_env(**env),
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def test_console_script_and_python_m(
    pgstore_fresh_database: Callable[[], str], tmp_path: Path
) -> None:
    dsn = pgstore_fresh_database()
    script = [str(_script())]
    module = [sys.executable, "-m", "pgstore"]
    cli_module = [sys.executable, "-m", "pgstore.cli"]
    where = ["--dsn", dsn, "--schema", "proc_s"]

    assert _run([*script, "current", *where]) == (0, "none (not migrated)\n", "")
    status, out, err = _run([*script, "migrate", *where])
    assert (status, err) == (0, ""), err
    assert HEAD in out
    assert _run([*module, "current", *where]) == (0, f"{HEAD}\n", "")
    assert _run([*cli_module, "current"], PGSTORE_DSN=dsn, PGSTORE_SCHEMA="proc_s") == (
        0,
        f"{HEAD}\n",
        "",
    )

    with PgScheduleStore(dsn, schema="proc_s") as store:
        store.register("job", "interval", "5000", 1_700_000_000_000)
        assert store.claim_due("job", "host-a:123", None, 120_000) is not None
        store.register("later", "once", "60000", 4_102_444_800_000)

    status, out, err = _run([*script, "schedules", *where, "--absolute"])
    assert (status, err) == (0, ""), err
    assert "2023-11-14T22:13:20.000Z" in out
    assert "2100-01-01T00:00:00.000Z" in out
    assert re.search(rf"held by host-a:123 until {ISO}", out)
    assert re.search(r"later .* free$", out, re.MULTILINE)

    for argv in ([*script, "schedules", "--dsn", BAD_DSN], [*module, "migrate", "--dsn", BAD_DSN]):
        _assert_one_error_line(*_run(argv))

    status, out, err = _run([*script, "downgrade", *where, "--yes"])
    assert (status, err) == (0, ""), err
    assert _run([*script, "current", *where]) == (0, "none (not migrated)\n", "")


# --- pgstore jobs -----------------------------------------------------------

JOB_HEADER = ["run_id", "queue", "state", "due", "attempts", "lease", "holder"]
WIDE_HEADER = [*JOB_HEADER, "priority", "sequence", "finished", "worker_id", "last_error"]


def _job(**changes: Any) -> Job:
    fields: dict[str, Any] = {
        "run_id": "r",
        "dispatch_at": 0,
        "lease_holder": None,
        "lease_until": None,
        "worker_id": None,
        "dispatched": False,
        "cancelled": False,
    }
    fields.update(changes)
    return Job(**fields)


def _job_rows(out: str, header: list[str] = JOB_HEADER) -> dict[str, dict[str, str]]:
    """``pgstore jobs`` output -> {run_id: {column: cell}}, in the printed order.

    Columns are two or more spaces apart and no cell holds two spaces in a row.
    """
    lines = out.splitlines()
    assert re.fullmatch(rf"schema '[^']+', database clock {ISO}", lines[0])
    assert re.split(r" {2,}", lines[1]) == header
    assert set(lines[2]) <= {"-", " "}
    rows: dict[str, dict[str, str]] = {}
    for line in lines[3:]:
        if line.startswith("... "):
            break
        cells = re.split(r" {2,}", line)
        assert len(cells) == len(header), line
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_job_cells_against_the_given_clock() -> None:
    now = 1_700_000_000_000
    assert [format_duration(ms) for ms in (0, 999, 1_000, 59_999, 60_000, 3_599_999)] == [
        "0ms",
        "999ms",
        "1s",
        "59s",
        "1m00s",
        "59m59s",
    ]
    assert format_duration(3_600_000) == "1h00m"
    assert format_duration(90_061_000) == "1d01h"
    assert [short_duration(ms) for ms in (250, 1_000, 99_999, 100_000, 5_999_999, 6_000_000,
                                          172_799_999, 172_800_000)] == [
        "250ms", "1s", "99s", "1m", "99m", "1h", "47h", "2d"]

    assert due_state(_job(dispatch_at=now + 1), now) == "in 1s"  # rounded up, never "in 0s"
    assert due_state(_job(dispatch_at=now + 300_000), now) == "in 5m"
    assert due_state(_job(dispatch_at=now), now) == "due now"
    assert due_state(_job(dispatch_at=now - 12_500), now) == "12s late"
    assert due_state(_job(dispatch_at=now - 12_500, dispatched=True), now) == "12s ago"
    assert due_state(_job(dispatch_at=now - 12_500, cancelled=True), now) == "12s ago"
    assert due_state(_job(dispatch_at=now - 12_500), now, True) == "2023-11-14T22:13:07.500Z"

    assert job_lease_state(_job(), now) == "-"
    live = _job(lease_holder="h1", lease_until=now + 29_001)
    assert job_lease_state(live, now) == "live: h1, 30s left"
    assert job_lease_state(live, now, absolute=True) == "live: h1 until 2023-11-14T22:13:49.001Z"
    # lease_until == now is expired: job_lease takes it at now (docs/contract.md).
    at_now = _job(lease_holder="h1", lease_until=now)
    assert job_lease_state(at_now, now) == "expired: h1, 0ms ago"
    old = _job(lease_holder="h\n1", lease_until=now - 61_000)
    assert job_lease_state(old, now) == "expired: 'h\\n1', 61s ago"
    assert lease_left(now + 29_001, now) == "30s left"
    assert lease_left(now - 61_000, now) == "expired 61s ago"
    assert lease_left(now - 61_000, now, True) == "expired 2023-11-14T22:12:19.000Z"
    assert lease_left(None, now) == "-"

    table = jobs_table(
        [_job(run_id="x", dispatched=True, worker_id="w9", finished_at=1_000)], now
    ).splitlines()
    assert re.split(r" {2,}", table[0]) == JOB_HEADER
    assert re.split(r" {2,}", table[2]) == [
        "x", "default", "dispatched", "19675d ago", "0/25", "-", "-"]
    wide = jobs_table(
        [_job(run_id="x", dispatched=True, worker_id="w9", finished_at=1_000)], now, wide=True,
        absolute=True,
    ).splitlines()
    assert re.split(r" {2,}", wide[0]) == WIDE_HEADER
    assert re.split(r" {2,}", wide[2]) == [
        "x", "default", "dispatched", "1970-01-01T00:00:00.000Z", "0/25", "-", "-", "0", "0",
        "1970-01-01T00:00:01.000Z", "w9", "-"]


def test_cuts_keep_both_ends_of_an_identifier() -> None:
    holder = "dispatcher@host-a.prod.internal.example.com:4412"
    assert clip_middle(holder, 20) == "dispatche\u2026e.com:4412"  # the end gets the odd one
    assert clip_middle(holder, 20).endswith(":4412") and len(clip_middle(holder, 20)) == 20
    assert clip_middle(holder, None) == holder and clip_middle("short", 20) == "short"
    assert clip("provider 503: upstream timeout", 12) == "provider 50\u2026"  # free text
    # Two holders that differ only at the end stay apart at any width the table allows.
    other = holder[:-1] + "3"
    for width in range(MIN_CUT, len(holder)):
        assert clip_middle(holder, width) != clip_middle(other, width)


@pytest.mark.parametrize("columns", [80, 160])
def test_jobs_table_fits_the_width_and_never_cuts_a_run_id(columns: int) -> None:
    now = 1_700_000_000_000
    holders = [f"dispatcher@host-a.prod.internal.example.com:{port}" for port in (4412, 4413)]
    jobs = [
        _job(run_id=f"meeting-{n}", dispatch_at=now - 60_000 * n, lease_holder=holder,
             lease_until=now + 300_000, attempts=1)
        for n, holder in enumerate(holders)
    ]
    jobs.append(_job(run_id="standup-7f3a9c", dispatch_at=now + 180_000))
    table = jobs_table(jobs, now, columns)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= columns, table
    rows = [re.split(r" {2,}", line) for line in lines[2:]]
    assert [r[0] for r in rows] == ["meeting-0", "meeting-1", "standup-7f3a9c"]
    shown = [r[6] for r in rows[:2]]
    assert shown[0].endswith(":4412") and shown[1].endswith(":4413")  # the end survives
    # Beside the queue column, 80 columns leave a holder 16 characters: "dispatc…com:4412".
    assert shown[0].startswith("dispatc") and (CUT_MARK in shown[0]) is (columns == 80)
    # A run id longer than the width is never cut: the line overflows instead.
    long_id = "meeting-" + "x" * 100
    wide = jobs_table([_job(run_id=long_id, lease_holder=holders[0], lease_until=now + 1)],
                      now, columns)
    assert long_id in wide and CUT_MARK in wide  # the holder cut, the run id whole


def test_jobs_usage(cli: Run) -> None:
    status, out, _ = cli("--help")
    assert (status, "jobs" in out) == (0, True)
    status, out, _ = cli("jobs", "--help")
    assert status == 0
    for option in ("--dispatched", "--due", "--leased", "--limit", "default: 100", "--dsn",
                   "--schema", "--json", "--wide", "--absolute", "cancel", "reschedule"):
        assert option in out
    # Usage errors come before any connection (BAD_DSN would be exit 1).
    assert cli("jobs", "--dsn", BAD_DSN, "--due", "--dispatched")[0] == 2
    assert cli("jobs", "--dsn", BAD_DSN, "--due", "--leased")[0] == 2
    assert cli("jobs", "--dsn", BAD_DSN, "--limit", "-1")[0] == 2
    assert cli("jobs", "--dsn", BAD_DSN, "--limit", "many")[0] == 2
    assert cli("jobs", "schedule", "x", "--dsn", BAD_DSN)[0] == 2  # --at is required
    for bad in ("tomorrow", "2024-05-01T12:00:00", "+5", "in 0s", "99999999999999999999"):
        assert cli("jobs", "schedule", "x", "--dsn", BAD_DSN, "--at", bad)[0] == 2, bad
    assert cli("jobs", "schedule", "x", "--dsn", BAD_DSN, "--at", "now",
               "--max-attempts", "0")[0] == 2


def test_instants_typed_after_at() -> None:
    assert parse_when("now") == (None, 0)
    assert parse_when("+5m") == parse_when("in 5m") == (None, 300_000)
    assert parse_when("5m ago") == (None, -300_000)
    assert parse_when("2023-11-14T22:13:20Z") == (1_700_000_000_000, 0)
    assert parse_when("2023-11-14T23:13:20.5+01:00") == (1_700_000_000_500, 0)
    assert parse_when("1700000000000") == (1_700_000_000_000, 0)
    for bad in ("", "soon", "2023-11-14T22:13:20", "+0m", "5 minutes"):
        with pytest.raises(ValueError, match="not an"):
            parse_when(bad)


def test_jobs_lists_filters_and_limits(cli: Run, pgstore_fresh_database: Callable[[], str]) -> None:
    dsn = pgstore_fresh_database()
    where = ["--dsn", dsn, "--schema", "cli_j"]
    assert cli("migrate", *where)[0] == 0
    status, out, err = cli("jobs", *where)
    assert (status, err, out.splitlines()[1:]) == (0, "", ["no jobs"])

    with PgJobStore(dsn, schema="cli_j") as store:
        now = store.now_ms()
        # Leased jobs first, while nothing else is due: job_lease takes the earliest.
        store.schedule("dispatched", now - 300_000)
        lease = store.lease("holder-2", None, 60_000)
        assert lease is not None and lease.run_id == "dispatched"
        assert store.mark_dispatched("dispatched", "holder-2", "worker-7").recorded
        store.schedule("sent-early", now - 400_000)
        lease = store.lease("holder-4", None, 60_000)
        assert lease is not None and lease.run_id == "sent-early"
        assert store.mark_dispatched("sent-early", "holder-4", None).recorded
        store.schedule("leased", now - 120_000)
        lease = store.lease("holder-1", None, 600_000)
        assert lease is not None and lease.run_id == "leased"
        store.schedule("expired", now - 10_000)
        lease = store.lease("holder-3", now - 5_000, 1_000)  # expired at now - 4 s
        assert lease is not None and lease.run_id == "expired"
        store.schedule("cancelled", now - 90_000)
        assert str(store.cancel("cancelled")) == "cancelled"
        store.schedule("due", now - 60_000)
        store.schedule("future", now + 3_600_000)

    # Every job, by dispatch_at (not by run_id).
    status, out, err = cli("jobs", *where)
    assert (status, err) == (0, ""), err
    rows = _job_rows(out)
    by_time = ["sent-early", "dispatched", "leased", "cancelled", "due", "expired", "future"]
    assert list(rows) == by_time

    leased = rows["leased"]
    assert (leased["state"], leased["due"]) == ("leased", "2m late")
    assert re.fullmatch(r"(9|10)m left", leased["lease"]) and leased["holder"] == "holder-1"

    dispatched = rows["dispatched"]
    assert (dispatched["state"], dispatched["due"]) == ("dispatched", "5m ago")  # not "late"
    # mark_dispatched leaves the lease as it was.
    assert re.fullmatch(r"\d+s left", dispatched["lease"])
    assert dispatched["holder"] == "holder-2"

    assert re.fullmatch(r"expired \ds ago", rows["expired"]["lease"])
    assert (rows["expired"]["state"], rows["expired"]["holder"]) == ("due", "holder-3")
    assert re.fullmatch(r"1\ds late", rows["expired"]["due"])
    assert (rows["cancelled"]["state"], rows["cancelled"]["lease"]) == ("cancelled", "-")
    assert re.fullmatch(r"9[01]s ago", rows["cancelled"]["due"])
    assert (rows["due"]["state"], rows["due"]["lease"]) == ("due", "-")
    assert re.fullmatch(r"6\ds late", rows["due"]["due"])
    assert rows["future"]["state"] == "pending"
    assert re.fullmatch(r"in (59|60)m", rows["future"]["due"])

    # --wide --absolute: every column, one ISO instant per time.
    status, out, err = cli("jobs", *where, "--wide", "--absolute")
    assert (status, err) == (0, "")
    wide = _job_rows(out, WIDE_HEADER)
    assert wide["future"]["due"] == _iso(now + 3_600_000)
    assert wide["dispatched"]["worker_id"] == "worker-7"
    assert wide["sent-early"]["worker_id"] == "-"
    assert re.fullmatch(ISO, wide["dispatched"]["finished"]) and wide["due"]["finished"] == "-"
    assert re.fullmatch(rf"until {ISO}", wide["leased"]["lease"])
    assert wide["leased"]["sequence"] == "1" and wide["due"]["sequence"] == "0"

    # --json: parses, every job with every field; epoch ms and ISO both.
    status, out, err = cli("jobs", *where, "--json")
    assert (status, err) == (0, "")
    document = json.loads(out)
    assert (document["schema"], document["filter"], document["matching"]) == ("cli_j", "all", 7)
    assert document["queues"] is None
    assert isinstance(document["now_ms"], int) and re.fullmatch(ISO, document["now"])
    by_id = {j["run_id"]: j for j in document["jobs"]}
    assert list(by_id) == by_time
    assert set(by_id["due"]) == {
        "run_id", "queue", "priority", "state", "dispatch_at_ms", "dispatch_at", "lease_holder",
        "lease_until_ms", "lease_until", "lease_live", "lease_sequence", "attempts",
        "max_attempts", "worker_id", "dispatched", "cancelled", "failed", "finished_at_ms",
        "finished_at", "last_error", "payload"}
    assert (by_id["due"]["dispatch_at_ms"], by_id["due"]["dispatch_at"]) == (
        now - 60_000, _iso(now - 60_000))
    assert by_id["leased"]["state"] == "leased" and by_id["leased"]["lease_live"]
    assert by_id["expired"]["lease_holder"] == "holder-3" and not by_id["expired"]["lease_live"]
    assert by_id["dispatched"]["worker_id"] == "worker-7" and by_id["dispatched"]["dispatched"]
    assert by_id["cancelled"]["finished_at_ms"] is not None

    # --dispatched: only dispatched jobs, by dispatch_at like the others.
    status, out, err = cli("jobs", *where, "--dispatched")
    assert (status, err) == (0, "")
    shown = _job_rows(out)
    assert list(shown) == ["sent-early", "dispatched"]
    assert shown["dispatched"]["holder"] == "holder-2"

    # --due: what a lease could take now or once its lease ends, leased or not.
    status, out, err = cli("jobs", *where, "--due")
    assert (status, err) == (0, "")
    shown = _job_rows(out)
    assert list(shown) == ["leased", "due", "expired"]
    assert out.splitlines()[-1].startswith("expired ")  # no "... more" line

    # --leased: only the jobs under a live lease, not dispatched.
    status, out, err = cli("jobs", *where, "--leased")
    assert (status, err) == (0, "")
    assert list(_job_rows(out)) == ["leased"]
    document = json.loads(cli("jobs", *where, "--leased", "--json")[1])
    assert (document["filter"], document["matching"]) == ("leased", 1)

    # --limit cuts the list, earliest first, and says how many are left out.
    status, out, err = cli("jobs", *where, "--limit", "2")
    assert (status, err) == (0, "")
    assert list(_job_rows(out)) == by_time[:2]
    assert out.splitlines()[-1].startswith("... 5 more")
    status, out, _ = cli("jobs", *where, "--due", "--limit", "1")
    assert list(_job_rows(out)) == ["leased"]
    assert out.splitlines()[-1].startswith("... 2 more")
    status, out, _ = cli("jobs", *where, "--dispatched", "--limit", "1")
    assert list(_job_rows(out)) == ["sent-early"]
    assert out.splitlines()[-1].startswith("... 1 more")
    status, out, _ = cli("jobs", *where, "--limit", "7")
    assert list(_job_rows(out)) == by_time
    assert not out.splitlines()[-1].startswith("...")
    assert list(_job_rows(cli("jobs", *where, "--limit", "0")[1])) == by_time
    document = json.loads(cli("jobs", *where, "--limit", "2", "--json")[1])
    assert (len(document["jobs"]), document["matching"]) == (2, 7)

    # Nothing matches a filter: say so. (job_remove deletes only unleased waiting
    # jobs: the owner deletes these rows itself.)
    def delete(*run_ids: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM cli_j.jobs WHERE run_id = ANY(%s)", (list(run_ids),))

    delete("leased", "due", "expired")
    assert cli("jobs", *where, "--due")[1].splitlines()[1:] == ["no due jobs"]
    assert cli("jobs", *where, "--leased")[1].splitlines()[1:] == ["no leased jobs"]
    delete("sent-early", "dispatched")
    assert cli("jobs", *where, "--dispatched")[1].splitlines()[1:] == ["no dispatched jobs"]

    # The environment supplies the DSN and schema, as for the other commands.
    env_status, env_out, _ = _run([str(_script()), "jobs"], PGSTORE_DSN=dsn, PGSTORE_SCHEMA="cli_j")
    assert env_status == 0
    assert list(_job_rows(env_out)) == ["cancelled", "future"]


def test_jobs_failed_lists_failed_jobs_and_retry_takes_one_back(
    cli: Run, pgstore_fresh_database: Callable[[], str]
) -> None:
    dsn = pgstore_fresh_database()
    where = ["--dsn", dsn, "--schema", "cli_f"]
    assert cli("migrate", *where)[0] == 0
    assert cli("jobs", *where, "--failed")[1].splitlines()[1:] == ["no failed jobs"]
    with PgJobStore(dsn, schema="cli_f") as store:
        now = store.now_ms()
        # lost is due before flaky, which waits again at now - 1 s: each lease takes its job.
        for run_id, attempts, at in (("doomed", 2, 1_000), ("flaky", 5, 1_000), ("lost", 1, 2_000)):
            store.schedule(run_id, now - at, attempts)
            for n in range(min(2, attempts)):
                lease = store.lease("h", None, 60_000)
                assert lease is not None and lease.run_id == run_id
                assert store.release(run_id, "h", now - 1_000, lease.lease_sequence,
                                     f"provider 503 (try {n + 1})")
        store.schedule("waiting", now + 60_000)

    failed_header = [*JOB_HEADER, "last_error"]
    status, out, err = cli("jobs", *where, "--failed")
    assert (status, err) == (0, "")
    rows = _job_rows(out, failed_header)
    assert list(rows) == ["lost", "doomed"]  # by dispatch_at
    assert (rows["doomed"]["state"], rows["doomed"]["attempts"]) == ("failed", "2/2")
    assert rows["doomed"]["last_error"] == "provider 503 (try 2)"
    assert re.fullmatch(r"[12]s ago", rows["doomed"]["due"])  # failed: not "late"
    assert _job_rows(cli("jobs", *where)[1])["flaky"]["attempts"] == "2/5"
    assert "  failed      2  out of attempts" in cli("status", *where)[1]
    document = json.loads(cli("jobs", *where, "--failed", "--json")[1])
    assert [j["last_error"] for j in document["jobs"]] == ["provider 503 (try 1)",
                                                           "provider 503 (try 2)"]

    # The old spelling, 'pgstore retry', still works, with an instant in epoch ms.
    status, out, err = cli("retry", *where, "doomed", "--at", str(now + 5_000))
    assert (status, err) == (0, ""), err
    assert out.splitlines()[0] == "schema 'cli_f': job 'doomed' waits again, attempts reset"
    shown = _job_rows("schema 'cli_f', database clock 1970-01-01T00:00:00.000Z\n"
                      + "\n".join(out.splitlines()[1:]), failed_header)
    assert (shown["doomed"]["state"], shown["doomed"]["attempts"]) == ("pending", "0/2")
    with PgJobStore(dsn, schema="cli_f") as store:
        job = store.get("doomed")
        assert job is not None and job.dispatch_at == now + 5_000
    assert list(_job_rows(cli("jobs", *where, "--failed")[1], failed_header)) == ["lost"]
    line = _assert_one_error_line(*cli("retry", *where, "doomed"))
    assert line == "pgstore: error: job 'doomed' is not failed (it is waiting): nothing changed"
    line = _assert_one_error_line(*cli("jobs", "retry", *where, "nope"))
    assert line == "pgstore: error: no job 'nope' in schema 'cli_f'"
    assert cli("retry", *where, "doomed", "--at", "-1")[0] == 2  # a usage error

    # 'pgstore jobs retry' takes several; each missing or not-failed one is named, the
    # others are retried, and the status is 1.
    status, out, err = cli("jobs", "retry", *where, "lost", "nope", "--at", "+1h", "--json")
    assert status == 1 and err == "pgstore: error: no job 'nope' in schema 'cli_f'\n"
    document = json.loads(out)
    assert document["result"] == "waits again, attempts reset"
    assert document["job"]["run_id"] == "lost" and document["job"]["state"] == "pending"
    assert document["job"]["dispatch_at_ms"] - document["now_ms"] == 3_600_000
    assert cli("jobs", *where, "--failed")[1].splitlines()[1:] == ["no failed jobs"]
    with PgJobStore(dsn, schema="cli_f") as store:
        for run_id in ("doomed", "lost"):
            job = store.get(run_id)
            assert job is not None and (job.attempts, job.state) == (0, "waiting")


def test_jobs_cancel_schedule_and_reschedule(
    cli: Run, pgstore_fresh_database: Callable[[], str]
) -> None:
    dsn = pgstore_fresh_database()
    where = ["--dsn", dsn, "--schema", "cli_a"]
    assert cli("migrate", *where)[0] == 0

    def job(run_id: str) -> Job | None:
        with PgJobStore(dsn, schema="cli_a") as store:
            return store.get(run_id)

    # schedule: a new job, due at --at (ISO, relative or epoch ms).
    status, out, err = cli("jobs", "schedule", *where, "a", "--at", "2100-01-01T00:00:00Z",
                           "--max-attempts", "3")
    assert (status, err) == (0, ""), err
    assert out.splitlines()[0] == "schema 'cli_a': job 'a' is scheduled"
    got = job("a")
    assert got is not None and (got.dispatch_at, got.max_attempts) == (4_102_444_800_000, 3)
    status, out, err = cli("jobs", "schedule", *where, "b", "--at", "+10m", "--json")
    assert (status, err) == (0, "")
    document = json.loads(out)
    assert document["job"]["dispatch_at_ms"] - document["now_ms"] == 600_000
    # An existing job is refused, unchanged.
    line = _assert_one_error_line(*cli("jobs", "schedule", *where, "a", "--at", "now"))
    assert "job 'a' exists" in line and "reschedule" in line
    assert job("a") == got

    # reschedule: a waiting job moves, attempts kept; only dispatch_at.
    status, out, err = cli("jobs", "reschedule", *where, "a", "--at", "5m ago")
    assert (status, err) == (0, ""), err
    assert out.splitlines()[0] == "schema 'cli_a': job 'a' is rescheduled"
    assert _job_rows("schema 'x', database clock 1970-01-01T00:00:00.000Z\n"
                     + "\n".join(out.splitlines()[1:]))["a"]["due"] == "5m late"
    moved = job("a")
    assert moved is not None and moved.max_attempts == 3 and moved.dispatch_at < got.dispatch_at

    # A leased job is refused: its dispatch may be under way.
    with PgJobStore(dsn, schema="cli_a") as store:
        lease = store.lease("dispatcher@host-a:4412", None, 600_000)
        assert lease is not None and lease.run_id == "a"
    before = job("a")
    line = _assert_one_error_line(*cli("jobs", "reschedule", *where, "a", "--at", "+1h"))
    assert "job 'a' is leased by dispatcher@host-a:4412" in line and "nothing changed" in line
    assert job("a") == before

    # cancel: a leased job is cancelled too; its holder learns it at mark_dispatched.
    status, out, err = cli("jobs", "cancel", *where, "a")
    assert (status, err) == (0, ""), err
    assert "is cancelled; its live lease's holder (dispatcher@host-a:4412)" in out
    cancelled = job("a")
    assert cancelled is not None and cancelled.state == "cancelled"
    status, out, _ = cli("jobs", "cancel", *where, "a")
    assert status == 0 and "was already cancelled: nothing changed" in out
    # A cancelled (or dispatched, or failed) job is not rescheduled.
    line = _assert_one_error_line(*cli("jobs", "reschedule", *where, "a", "--at", "now"))
    assert "job 'a' is cancelled: only a waiting job moves, nothing changed" in line
    assert job("a") == cancelled

    # A dispatched job cannot be cancelled; a missing one neither.
    with PgJobStore(dsn, schema="cli_a") as store:
        store.schedule("sent", store.now_ms() - 1_000)
        lease = store.lease("h", None, 60_000)
        assert lease is not None and lease.run_id == "sent"
        assert store.mark_dispatched("sent", "h", "bot-1").recorded
    line = _assert_one_error_line(*cli("jobs", "cancel", *where, "sent"))
    assert "job 'sent' was already dispatched: nothing changed" in line
    sent = job("sent")
    assert sent is not None and not sent.cancelled
    line = _assert_one_error_line(*cli("jobs", "cancel", *where, "nope"))
    assert line == "pgstore: error: no job 'nope' in schema 'cli_a'"
    line = _assert_one_error_line(*cli("jobs", "reschedule", *where, "nope", "--at", "now"))
    assert line == "pgstore: error: no job 'nope' in schema 'cli_a'"
    assert job("nope") is None  # reschedule never creates a job


def test_jobs_on_a_missing_or_old_schema_says_what_to_run(
    cli: Run, pgstore_fresh_database: Callable[[], str]
) -> None:
    dsn = pgstore_fresh_database()
    for flags in ([], ["--dispatched"], ["--due"]):
        line = _assert_one_error_line(
            *cli("jobs", "--dsn", dsn, "--schema", "nothing_here", *flags)
        )
        assert "pgstore migrate --dsn DSN --schema nothing_here" in line

    assert cli("migrate", "--dsn", dsn, "--schema", "old_j", "--revision", "pgstore_0001")[0] == 0
    line = _assert_one_error_line(*cli("jobs", "--dsn", dsn, "--schema", "old_j"))
    assert "is at revision pgstore_0001" in line
    assert "pgstore migrate --dsn DSN --schema old_j" in line


def test_jobs_connection_failures_are_one_line(cli: Run) -> None:
    line = _assert_one_error_line(*cli("jobs", "--dsn", BAD_DSN))
    assert "127.0.0.1" in line
    _assert_one_error_line(*cli("jobs", "--dsn", "not a conninfo", "--due"))
    _assert_one_error_line(*_run([str(_script()), "jobs", "--dsn", BAD_DSN, "--dispatched"]))


# --- pgstore status -----------------------------------------------------------

STATUS_COLUMNS = ["id", "next run", "last run", "token", "lease", "unclaimed for"]
JOB_STATES = ["pending", "due", "leased", "dispatched", "cancelled", "failed"]

EXPECTED_STATUS = """\
schema 'ops', database clock 2023-11-14T22:13:20.000Z

schedules: 6 (2 due and unclaimed, 1 leased, 1 one-shot done, 1 whose last run failed)
id         next run             last run                   token  lease                     unclaimed for
---------  -------------------  -------------------------  -----  ------------------------  -------------
a-due      overdue 3m           -                          0      -                         3m10s
b-leased   due 5s ago           -                          1      live: host-b, 9m left     -
c-ok       in 42s               ok 10s ago                 1      -                         -
d-error    in 60m               error (3 in a row) 2m ago  2      -                         -
e-done     none (one-shot ran)  ok 2h ago                  1      -                         -
f-expired  overdue 60s          -                          3      expired: host-f, 15s ago  15s

jobs: 12
  pending     2  not due yet
  due         3  leasable now (1 after an expired lease)
  leased      2  live lease, not dispatched
  dispatched  2  sent (1 cancelled meanwhile: bot recalled)
  cancelled   2  never dispatched
  failed      1  out of attempts (pgstore jobs retry RUN_ID)
oldest due job: d-old, 5m00s late"""


def test_status_text_against_the_given_clock() -> None:
    now = 1_700_000_000_000
    records = [
        _record(id="a-due", next_run_at=now - 190_000),
        _record(
            id="b-leased",
            next_run_at=now - 5_000,
            fencing_token=1,
            lease_owner="host-b",
            lease_until=now + 595_000,
        ),
        _record(
            id="c-ok", next_run_at=now + 42_000, last_run_at=now - 10_000, last_status="ok",
            fencing_token=1,
        ),
        _record(
            id="d-error", kind="cron", spec="*/5 * * * *", next_run_at=now + 3_600_000,
            last_run_at=now - 130_000, last_status="error", fencing_token=2,
            consecutive_failures=3,
        ),
        _record(
            id="e-done", kind="once", spec="60000", next_run_at=None, last_run_at=now - 7_200_000,
            last_status="ok", fencing_token=1,
        ),
        _record(
            id="f-expired", next_run_at=now - 60_000, fencing_token=3, lease_owner="host-f",
            lease_until=now - 15_000,
        ),
    ]
    counts = job_gauges(
        now, pending=2, due=3, due_expired_lease=1, leased=2, dispatched=2, recalled=1,
        cancelled=2, failed=1, oldest_due_job_id="d-old", oldest_due_job_at=now - 300_000,
    )
    assert status_text("ops", now, records, counts) == EXPECTED_STATUS

    nothing = job_gauges(now)
    assert status_text("ops", now, [], nothing).splitlines()[1:] == [
        "",
        "schedules: none",
        "",
        "jobs: 0",
        "  pending     0  not due yet",
        "  due         0  leasable now",
        "  leased      0  live lease, not dispatched",
        "  dispatched  0  sent",
        "  cancelled   0  never dispatched",
        "  failed      0  out of attempts (pgstore jobs retry RUN_ID)",
        "oldest due job: none",
    ]
    # Due exactly now, with nobody on it: claimable for 0 ms.
    at_now = status_text("ops", now, [_record(id="x", next_run_at=now)], nothing).splitlines()
    assert re.split(r" {2,}", at_now[5]) == ["x", "due now", "-", "0", "-", "0ms"]
    # --absolute: one ISO instant per time, none relative.
    absolute = status_text("ops", now, records, counts, absolute=True)
    assert "a-due      2023-11-14T22:10:10.000Z (overdue)" in absolute
    assert "live: host-b until 2023-11-14T22:23:15.000Z" in absolute
    assert "ok at 2023-11-14T22:13:10.000Z" in absolute
    assert "oldest due job: d-old, 5m00s late (dispatch_at 2023-11-14T22:08:20.000Z)" in absolute
    assert " ago" not in absolute.split("jobs: 12")[0] and "in 42s" not in absolute


def _parse_status(out: str) -> tuple[str, dict[str, dict[str, str]], list[str]]:
    """``pgstore status`` output -> (schedules summary, {id: {column: cell}}, job lines)."""
    lines = out.splitlines()
    assert re.fullmatch(rf"schema '[^']+', database clock {ISO}", lines[0])
    assert lines[1] == ""
    summary = lines[2]
    assert re.split(r" {2,}", lines[3]) == STATUS_COLUMNS
    assert set(lines[4]) <= {"-", " "}
    rows: dict[str, dict[str, str]] = {}
    end = lines.index("", 5)
    for line in lines[5:end]:
        cells = re.split(r" {2,}", line)
        assert len(cells) == len(STATUS_COLUMNS), line
        rows[cells[0]] = dict(zip(STATUS_COLUMNS, cells, strict=True))
    return summary, rows, lines[end + 1 :]


def _all_jobs(conn: psycopg.Connection[Any], schema: str) -> list[Job]:
    query = psycopg.sql.SQL(
        "SELECT run_id, dispatch_at, lease_holder, lease_until, worker_id, dispatched, cancelled,"
        " lease_sequence, attempts, max_attempts, last_error, failed, finished_at FROM {}.jobs"
    ).format(psycopg.sql.Identifier(schema))
    return [Job(*row) for row in conn.execute(query).fetchall()]


def _job_part(stats: StoreStats) -> StoreStats:
    """``stats`` with only its job gauges (for comparing with ``_counts_by_hand``)."""
    return job_gauges(
        stats.now, pending=stats.jobs_pending, due=stats.jobs_due,
        due_expired_lease=stats.jobs_due_expired_lease, leased=stats.jobs_leased,
        dispatched=stats.jobs_dispatched, recalled=stats.jobs_recalled,
        cancelled=stats.jobs_cancelled, failed=stats.jobs_failed,
        oldest_due_job_id=stats.oldest_due_job_id,
        oldest_due_job_at=stats.oldest_due_job_at,
    )


def _counts_by_hand(jobs: list[Job], now: int) -> StoreStats:
    """The states of the status docstring, job by job, in Python."""
    states: dict[str, list[Job]] = {state: [] for state in JOB_STATES}
    for j in jobs:
        live = j.lease_until is not None and j.lease_until > now
        if j.dispatched:
            states["dispatched"].append(j)
        elif j.cancelled:
            states["cancelled"].append(j)
        elif j.failed:
            states["failed"].append(j)
        elif live:
            states["leased"].append(j)
        elif j.dispatch_at <= now:
            states["due"].append(j)
        else:
            states["pending"].append(j)
    due = sorted(states["due"], key=lambda j: (j.dispatch_at, j.run_id))
    return job_gauges(
        now,
        pending=len(states["pending"]),
        due=len(due),
        due_expired_lease=sum(1 for j in due if j.lease_until is not None),
        leased=len(states["leased"]),
        dispatched=len(states["dispatched"]),
        recalled=sum(1 for j in states["dispatched"] if j.cancelled),
        cancelled=len(states["cancelled"]),
        failed=len(states["failed"]),
        oldest_due_job_id=due[0].run_id if due else None,
        oldest_due_job_at=due[0].dispatch_at if due else None,
    )


def test_status_on_a_fresh_schema(cli: Run, pgstore_database: str, pgstore_schema: str) -> None:
    dsn, schema = pgstore_database, pgstore_schema
    where = ["--dsn", dsn, "--schema", schema]
    status, out, err = cli("status", *where)
    assert (status, err) == (0, "")
    assert out.splitlines()[1:4] == ["", "schedules: none", ""]
    assert out.splitlines()[4:] == [
        "jobs: 0",
        "  pending     0  not due yet",
        "  due         0  leasable now",
        "  leased      0  live lease, not dispatched",
        "  dispatched  0  sent",
        "  cancelled   0  never dispatched",
        "  failed      0  out of attempts (pgstore jobs retry RUN_ID)",
        "oldest due job: none",
    ]

    with PgScheduleStore(dsn, schema=schema) as store:
        now = store.now_ms()
        store.register("a-due", "interval", "60000", now - 190_000)
        store.register("b-leased", "interval", "60000", now - 5_000)
        assert store.claim_due("b-leased", "host-b", None, 600_000) is not None
        finished: list[tuple[str, ScheduleKind, str, int | None, int, LastStatus]] = [
            ("c-ok", "interval", "60000", now + 42_000, now - 10_000, "ok"),
            ("d-error", "cron", "*/5 * * * *", now + 3_600_000, now - 130_000, "error"),
            ("e-done", "once", "60000", None, now - 7_200_000, "ok"),
        ]
        for id, kind, spec, next_at, last_at, last in finished:
            store.register(id, kind, spec, now - 1_000)
            claim = store.claim_due(id, "host-c", None, 60_000)
            assert claim is not None
            patch = CompletePatch(next_at, last_at, last)
            assert store.complete(id, claim.fencing_token, patch)
        store.register("f-expired", "interval", "1000", now - 60_000)
        assert store.claim_due("f-expired", "host-f", now - 20_000, 5_000) is not None

    with PgJobStore(dsn, schema=schema) as jobs:
        # Leased jobs first, while nothing else is due: job_lease takes the earliest due.
        def lease(run_id: str, dispatch_at: int, holder: str, at: int | None, ttl: int) -> None:
            jobs.schedule(run_id, dispatch_at)
            got = jobs.lease(holder, at, ttl)
            assert got is not None and got.run_id == run_id

        lease("x-sent", now - 1_000_000, "h-x", None, 60_000)
        assert jobs.mark_dispatched("x-sent", "h-x", "bot-1").recorded
        lease("x-recalled", now - 950_000, "h-x", None, 60_000)
        assert str(jobs.cancel("x-recalled")) == "cancelled"
        mark = jobs.mark_dispatched("x-recalled", "h-x", "bot-2")
        assert mark.cancelled and mark.recorded
        lease("c-leased", now - 800_000, "h-c", None, 600_000)
        assert str(jobs.cancel("c-leased")) == "cancelled"  # cancelled under a live lease
        lease("l-old", now - 600_000, "h-l", None, 600_000)  # older than any due job
        lease("l-moved", now - 500_000, "h-l", None, 600_000)
        jobs.schedule("l-moved", now + 3_600_000)  # moved ahead: its lease is kept
        lease("d-expired", now - 10_000, "h-dead", now - 5_000, 1_000)  # expired at now - 4 s
        jobs.schedule("c-plain", now - 900_000)
        assert str(jobs.cancel("c-plain")) == "cancelled"
        jobs.schedule("d-old", now - 300_000)
        jobs.schedule("d-new", now - 1_000)
        jobs.schedule("p-soon", now + 60_000)
        jobs.schedule("p-later", now + 3_600_000)
        lease("f-failed", now - 2_000_000, "h-f", None, 60_000)  # the earliest of all
        jobs.schedule("f-failed", now - 2_000_000, 1)
        assert jobs.release("f-failed", "h-f", now, None, "no bot left")  # its only attempt

    status, out, err = cli("status", *where)
    assert (status, err) == (0, ""), err
    summary, rows, job_lines = _parse_status(out)
    assert summary == (
        "schedules: 6 (2 due and unclaimed, 1 leased, 1 one-shot done, 1 whose last run failed)"
    )
    assert list(rows) == ["a-due", "b-leased", "c-ok", "d-error", "e-done", "f-expired"]

    # The relative cells are judged at the command's clock, a moment after `now`.
    a = rows["a-due"]
    assert a["next run"] == "overdue 3m"
    assert (a["last run"], a["token"], a["lease"]) == ("-", "0", "-")
    assert re.fullmatch(r"3m1[01]s", a["unclaimed for"])
    b = rows["b-leased"]
    assert re.fullmatch(r"due [56]s ago", b["next run"])
    assert re.fullmatch(r"live: host-b, (9|10)m left", b["lease"])
    assert (b["last run"], b["token"], b["unclaimed for"]) == ("-", "1", "-")
    c = rows["c-ok"]
    assert re.fullmatch(r"in 4[12]s", c["next run"])
    assert re.fullmatch(r"ok 1[01]s ago", c["last run"])
    assert (c["token"], c["lease"], c["unclaimed for"]) == ("1", "-", "-")
    d = rows["d-error"]
    assert re.fullmatch(r"in (59|60)m", d["next run"])
    assert d["last run"] == "error 2m ago"
    e = rows["e-done"]
    assert (e["next run"], e["lease"], e["unclaimed for"]) == ("none (one-shot ran)", "-", "-")
    assert e["last run"] == "ok 2h ago"
    f = rows["f-expired"]
    assert re.fullmatch(r"overdue 6[01]s", f["next run"])
    assert re.fullmatch(r"expired: host-f, 1[56]s ago", f["lease"])
    assert re.fullmatch(r"1[56]s", f["unclaimed for"])  # since the lease ran out, not since due

    assert job_lines[:7] == [
        "jobs: 12",
        "  pending     2  not due yet",
        "  due         3  leasable now (1 after an expired lease)",
        "  leased      2  live lease, not dispatched",
        "  dispatched  2  sent (1 cancelled meanwhile: bot recalled)",
        "  cancelled   2  never dispatched",
        "  failed      1  out of attempts (pgstore jobs retry RUN_ID)",
    ]
    # The oldest due job: not l-old (leased) nor c-plain (cancelled), though both are older.
    assert re.fullmatch(r"oldest due job: d-old, 5m0[01]s late", job_lines[7])
    assert len(job_lines) == 8

    # --json: the same view as data, with stable keys.
    status, out, err = cli("status", *where, "--json")
    assert (status, err) == (0, "")
    document = json.loads(out)
    assert document["schema"] == schema and re.fullmatch(ISO, document["now"])
    assert document["jobs"] == {
        "total": 12, "pending": 2, "due": 3, "leased": 2, "dispatched": 2, "cancelled": 2,
        "failed": 1, "due_expired_lease": 1, "recalled": 1}
    oldest = document["oldest_due_job"]
    assert (oldest["run_id"], oldest["dispatch_at_ms"]) == ("d-old", now - 300_000)
    assert oldest["dispatch_at"] == _iso(now - 300_000) and oldest["late_ms"] >= 300_000
    by_id = {r["id"]: r for r in document["schedules"]}
    assert list(by_id) == ["a-due", "b-leased", "c-ok", "d-error", "e-done", "f-expired"]
    assert by_id["a-due"]["unclaimed_ms"] >= 190_000 and by_id["b-leased"]["lease_live"]
    assert by_id["b-leased"]["unclaimed_ms"] is None and by_id["c-ok"]["spec_problem"] is None

    # The one SELECT agrees with a job-by-job partition, at instants around every edge.
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        every = _all_jobs(conn, schema)
        edges = {j.dispatch_at for j in every} | {j.lease_until for j in every if j.lease_until}
        for at in sorted({now, *(e + d for e in edges for d in (-1, 0, 1))}):
            stats = PgJobStore(conn, schema=schema).stats(at)
            assert _job_part(stats) == _counts_by_hand(every, at), at


def _iso(ms: int) -> str:
    return format_instant(ms).split(" ")[1].strip("()")


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += _plan_nodes(child)
    return nodes


def test_status_job_counts_read_only_waiting_jobs_from_the_index(
    pgstore_database: str, pgstore_schema: str
) -> None:
    """With 200,000 dispatched jobs, the waiting states and the oldest due job come from the
    partial index (touching only the waiting jobs), and the history counts scan nothing:
    job_history and the jobs finished since its upto. In the plan store_stats runs: a
    generic one (plan_cache_mode = force_generic_plan), where neither instant is known."""
    schema = psycopg.sql.Identifier(pgstore_schema)
    waiting = 1_000
    conn: psycopg.Connection[Any]
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL(
                "INSERT INTO {}.jobs (run_id, dispatch_at, lease_holder, lease_until, worker_id,"
                " dispatched, cancelled, finished_at)"
                " SELECT 'sent-' || g, g, 'h', g + 1000, 'w', true, g % 50 = 0, g + 500"
                " FROM generate_series(1, 200000) AS g"
            ).format(schema)
        )
        conn.execute(
            psycopg.sql.SQL(
                "INSERT INTO {}.jobs (run_id, dispatch_at, lease_holder, lease_until)"
                " SELECT 'wait-' || g, 1000000 + g * 10,"
                "        CASE WHEN g %% 4 = 0 THEN 'h' END,"
                "        CASE WHEN g %% 4 = 0 THEN 1000000 + g * 20 END"
                " FROM generate_series(1, %s) AS g"
            ).format(schema),
            (waiting,),
        )
        conn.execute(psycopg.sql.SQL("ANALYZE {}.jobs").format(schema))
        now = 1_000_000 + 5_000
        # Calls of store_stats move job_history past the finished jobs (once every
        # transaction running at its proposal has ended, other sessions' included).
        upto = psycopg.sql.SQL("SELECT upto FROM {}.job_history").format(schema)
        deadline = time.monotonic() + 20
        while (conn.execute(upto).fetchone() or (0,))[0] <= 200_500:  # the last finished_at
            assert time.monotonic() < deadline, "job_history never moved past the history"
            conn.execute(psycopg.sql.SQL("SELECT FROM {}.store_stats()").format(schema))
            time.sleep(0.05)
        # store_stats' one statement, taken from the installed store_stats_read, with
        # the instant a parameter of a generic plan (as the function runs it), on the
        # function's pinned search_path.
        body = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE oid = %s::regprocedure",
            (psycopg.sql.SQL("{}.store_stats_read(bigint)").format(schema).as_string(conn),),
        ).fetchone()
        assert body is not None
        query = body[0][body[0].index("RETURN QUERY") + len("RETURN QUERY"):body[0].rindex(";")]
        conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", (pgstore_schema,))
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE stats_query(bigint) AS " + query.replace("p_now", "$1"))
        row = conn.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE stats_query({now})").fetchone()
        conn.execute("RESET plan_cache_mode")
        assert row is not None
        doc = row[0] if isinstance(row[0], list) else json.loads(row[0])
        nodes = _plan_nodes(doc[0]["Plan"])
        stats = PgJobStore(conn, schema=pgstore_schema).stats(now)

    nodes = [n for n in nodes if n.get("Relation Name", "jobs") == "jobs"]  # not schedules

    scans = [n for n in nodes if "Relation Name" in n or "Index Name" in n]
    on_index = [n for n in scans if n.get("Index Name") == "jobs_pending_by_dispatch_at"]
    described = [(n["Node Type"], n.get("Index Name"), n.get("Actual Rows")) for n in scans]
    assert not [n for n in scans if n["Node Type"] == "Seq Scan"], described
    # The waiting counts and the oldest due job: the partial index, twice.
    assert len(on_index) >= 2, described
    for node in on_index:  # never more rows than the waiting jobs
        assert node["Actual Rows"] * node["Actual Loops"] <= waiting, described
    # The history: job_history, and the finished jobs' index from its upto (nothing
    # finished since). No node reads more than the waiting jobs.
    for node in scans:
        assert node["Actual Rows"] * node["Actual Loops"] <= waiting, described
    assert [n for n in scans if n.get("Index Name") == "jobs_finished_by_finished_at"], described
    assert stats.jobs_dispatched == 200_000 and stats.jobs_recalled == 4_000
    assert stats.oldest_due_job_id == "wait-1"
    assert stats.jobs_pending + stats.jobs_due + stats.jobs_leased == waiting


def test_status_usage_and_errors(cli: Run, pgstore_fresh_database: Callable[[], str]) -> None:
    status, out, _ = cli("status", "--help")
    assert status == 0
    for text in ("--dsn", "--schema", "pending", "dispatched", "scan"):
        assert text in out
    dsn = pgstore_fresh_database()
    line = _assert_one_error_line(*cli("status", "--dsn", dsn, "--schema", "nothing_here"))
    assert "pgstore migrate --dsn DSN --schema nothing_here" in line
    assert "127.0.0.1" in _assert_one_error_line(*cli("status", "--dsn", BAD_DSN))
    _assert_one_error_line(*_run([str(_script()), "status", "--dsn", BAD_DSN]))


# --- pgstore run ----------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
LOG_LINE = re.compile(rf"({ISO}) (DEBUG|INFO|WARNING|ERROR|CRITICAL) ([\w.]+): (.*)")


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.support.cli_app", "'tests.support.cli_app' is not MODULE:OBJECT"),
        (":scheduler", "is not MODULE:OBJECT"),
        ("tests.support.cli_app:", "is not MODULE:OBJECT"),
        ("tests.support.cli_app:apps..dispatcher", "is not MODULE:OBJECT"),
        ("tests.support.cli_app:scheduler:again", "is not MODULE:OBJECT"),
        ("tests/support/cli_app.py:scheduler", "is not MODULE:OBJECT"),
        ("tests.support.cli_app:1st", "is not MODULE:OBJECT"),
        ("tests.support.cli_app: scheduler", "is not MODULE:OBJECT"),
        ("tests.no_such_module:app", "no module named 'tests.no_such_module'"),
        ("no_such_package_4711.app:app", "no module named 'no_such_package_4711'"),
        ("tests.support.cli_app:nothing", "module 'tests.support.cli_app' has no attribute 'nothing'"),
        ("tests.support.cli_app:apps.nothing", "module 'tests.support.cli_app' has no attribute 'apps.nothing'"),
        (
            "tests.support.cli_app:not_a_runtime",
            "tests.support.cli_app:not_a_runtime is an int, not a pgstore.Scheduler or "
            "pgstore.Dispatcher (or a zero-argument callable returning one)",
        ),
        ("tests.support.cli_app:needs_arguments", "tests.support.cli_app:needs_arguments needs arguments"),
        ("tests.support.cli_app:Scheduler", "tests.support.cli_app:Scheduler needs arguments"),
        ("tests.support.cli_app:returns_a_number", "returns_a_number() returned an int, not a pgstore"),
        (
            "tests.support.cli_app:raises",
            "tests.support.cli_app:raises() raised LookupError: no such environment (cli_app.py:",
        ),
    ],
)
def test_run_rejects_what_is_not_a_runtime(
    cli: Run, monkeypatch: pytest.MonkeyPatch, target: str, message: str
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # run may put the cwd first
    line = _assert_one_error_line(*cli("run", target))
    assert message in line, line


def test_run_reports_an_app_that_fails_to_import(
    cli: Run, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)  # the current directory is where run looks first
    tag = uuid.uuid4().hex[:8]
    (tmp_path / f"broken_{tag}.py").write_text('"""Broken."""\n\nLIMIT = 1 / 0\n')
    (tmp_path / f"needy_{tag}.py").write_text("import no_such_dependency_4711\n")
    (tmp_path / f"plain_{tag}.py").write_text("answer = 42\n")
    line = _assert_one_error_line(*cli("run", f"broken_{tag}:app"))
    assert line.endswith(
        f"importing 'broken_{tag}' raised ZeroDivisionError: division by zero (broken_{tag}.py:3)"
    )
    # A missing dependency of the app is not a missing app.
    line = _assert_one_error_line(*cli("run", f"needy_{tag}:app"))
    assert f"importing 'needy_{tag}' raised ModuleNotFoundError" in line
    assert "no_such_dependency_4711" in line and f"(needy_{tag}.py:1)" in line
    line = _assert_one_error_line(*cli("run", f"plain_{tag}:answer"))
    assert f"plain_{tag}:answer is an int" in line


def test_run_usage(cli: Run) -> None:
    status, out, _ = cli("run", "--help")
    assert status == 0
    for text in ("MODULE:OBJECT", "--log-level", "SIGTERM", "zero-argument callable"):
        assert text in out
    assert "--dsn DSN" not in out and "--schema SCHEMA" not in out  # no such options
    assert cli("run")[0] == 2
    assert cli("run", "--dsn", "x", "tests.support.cli_app:scheduler")[0] == 2
    assert cli("run", "tests.support.cli_app:scheduler", "--log-level", "loud")[0] == 2


def test_run_finds_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    import tests.support.cli_app as app

    assert load_runtime("tests.support.cli_app:scheduler") is app.scheduler
    assert isinstance(app.scheduler, Scheduler)
    assert load_runtime("tests.support.cli_app:apps.dispatcher") is app.apps.dispatcher
    made = load_runtime("tests.support.cli_app:make_dispatcher")
    assert isinstance(made, Dispatcher) and made is not app.apps.dispatcher
    with pytest.raises(AppError):
        load_runtime("tests.support.cli_app:not_a_runtime")


def _log_events(text: str) -> list[tuple[str, str, str]]:
    """(level, logger, message) of every log line. Each line is one event with a UTC
    timestamp of about now, except the traceback lines that follow an ERROR event."""
    events: list[tuple[str, str, str]] = []
    traceback_allowed = False
    for line in text.splitlines():
        m = LOG_LINE.fullmatch(line)
        if m is None:
            assert traceback_allowed, f"not a log line: {line!r}\n{text}"
            continue
        stamp = datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
        assert abs(stamp.timestamp() - time.time()) < 600, line  # UTC, not local time
        events.append((m[2], m[3], m[4]))
        traceback_allowed = m[2] == "ERROR"
    return events


def _messages(events: list[tuple[str, str, str]], logger: str, pattern: str) -> list[re.Match[str]]:
    return [m for _, name, msg in events if name == logger and (m := re.fullmatch(pattern, msg))]


def _create_marks(dsn: str, schema: str) -> None:
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL(
                "CREATE TABLE {}.cli_app_marks (kind text NOT NULL, key text NOT NULL,"
                " token bigint, owner text NOT NULL)"
            ).format(psycopg.sql.Identifier(schema))
        )


def _marks(dsn: str, schema: str) -> list[tuple[str, str, int | None, str]]:
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            psycopg.sql.SQL("SELECT kind, key, token, owner FROM {}.cli_app_marks").format(
                psycopg.sql.Identifier(schema)
            )
        ).fetchall()


class _App:
    """``python -m pgstore run TARGET`` as a child process, its stderr in a file."""

    def __init__(self, target: str, dsn: str, schema: str, tmp_path: Path, *args: str) -> None:
        self.log_path = tmp_path / "run.log"
        self.out_path = tmp_path / "run.out"
        with self.log_path.open("wb") as err, self.out_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pgstore", "run", target, *args],
                cwd=REPO,
                # A zone far from UTC: the log's timestamps must be UTC all the same.
                env=_process_env(CLI_APP_DSN=dsn, CLI_APP_SCHEMA=schema, TZ="Asia/Tokyo"),
                stdout=out,
                stderr=err,
            )

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None:
                pytest.fail(f"exited {self.proc.returncode} before {what}:\n{self.log()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} after {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, sig: signal.Signals) -> tuple[int, float]:
        """Send ``sig``; the exit status and how many seconds the process took to exit."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            status = self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 15 s after {sig.name}:\n{self.log()}")
        return status, time.monotonic() - started

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_run_scheduler_until_sigterm(
    pgstore_database: str, pgstore_schema: str, tmp_path: Path
) -> None:
    dsn, schema = pgstore_database, pgstore_schema
    _create_marks(dsn, schema)
    app = _App("tests.support.cli_app:scheduler", dsn, schema, tmp_path)
    try:

        def ran() -> bool:
            kinds = [kind for kind, *_ in _marks(dsn, schema)]
            return kinds.count("tick") >= 2 and kinds.count("boom") >= 1

        app.wait_for("two ticks and a boom", ran)
        status, seconds = app.stop(signal.SIGTERM)
    finally:
        app.kill()
    log = app.log()
    assert status == 0, log
    assert seconds < 5, log
    assert app.out_path.read_text() == ""
    events = _log_events(log)

    owner = f"scheduler@{socket.gethostname()}:{app.proc.pid}"
    who = re.escape(owner)
    marks = _marks(dsn, schema)
    assert {mark_owner for *_, mark_owner in marks} == {owner}
    for task, outcome in [("tick", "ok"), ("boom", "error")]:
        ran_tokens = sorted(present(token) for kind, _, token, _ in marks if kind == task)
        assert ran_tokens == list(range(1, len(ran_tokens) + 1)), task
        claimed = _messages(
            events, "pgstore.scheduler", rf"{who}: claimed {task} token (\d+) \(scheduled \d+\)"
        )
        completed = _messages(
            events,
            "pgstore.scheduler",
            rf"{who}: completed {task} token (\d+) {outcome}, next run at \d+",
        )
        # Every claim ran, and was completed within the grace period.
        assert [int(m[1]) for m in claimed] == ran_tokens, log
        assert [int(m[1]) for m in completed] == ran_tokens, log
    raised = [m for lvl, _, m in events if lvl == "ERROR"]
    assert raised and all(re.fullmatch(rf"{who}: boom token \d+ raised", m) for m in raised), log
    assert "RuntimeError: boom goes the handler" in log  # the traceback follows its line
    assert _messages(events, "pgstore.scheduler", rf"{who}: registered tick \(interval 200, catch_up once\), next run at \d+")
    assert _messages(
        events,
        "pgstore.run",
        rf"running scheduler {who} \(tasks: boom, tick\) from tests\.support\.cli_app:scheduler until"
        r" SIGTERM or SIGINT",
    )
    assert _messages(events, "pgstore.scheduler", rf"{who}: stopping; \d running, grace 5\.0s")
    assert events[-1] == ("INFO", "pgstore.run", "stopped")

    with PgScheduleStore(dsn, schema=schema) as store:
        records = {r.id: r for r in store.list()}
    assert records["tick"].last_status == "ok" and records["boom"].last_status == "error"
    assert records["tick"].lease_owner is None  # completed, nothing left held
    assert records["tick"].fencing_token == sum(1 for kind, *_ in marks if kind == "tick")


def test_a_restarted_dispatcher_process_continues_from_the_stored_attempts(
    pgstore_database: str, pgstore_schema: str, tmp_path: Path
) -> None:
    """A job whose every dispatch fails (max_attempts=5), one dispatcher process stopped
    (SIGTERM) after its second attempt and a new one started: the new process's first
    lease is attempt 3 and backs off from it (250 ms * 2^(n-1), no jitter), and the
    release of attempt 5 fails the job with the last error's text."""
    dsn, schema = pgstore_database, pgstore_schema
    _create_marks(dsn, schema)
    with PgJobStore(dsn, schema=schema) as jobs:
        jobs.schedule("doomed", jobs.now_ms(), 5)

    def attempts() -> list[tuple[int, str]]:
        return sorted((token or 0, owner) for kind, _, token, owner in _marks(dsn, schema)
                      if kind == "attempt")

    def stored() -> Any:
        with PgJobStore(dsn, schema=schema) as jobs:
            return jobs.get("doomed")

    for run in ("1", "2"):
        (tmp_path / run).mkdir()
    first = _App("tests.support.cli_app:make_doomed_dispatcher", dsn, schema, tmp_path / "1")
    try:
        first.wait_for("two attempts, the second released",
                       lambda: len(attempts()) >= 2 and stored().lease_holder is None)
        status, _ = first.stop(signal.SIGTERM)
    finally:
        first.kill()
    assert status == 0, first.log()
    stopped_at = stored()
    second = _App("tests.support.cli_app:make_doomed_dispatcher", dsn, schema, tmp_path / "2")
    try:
        second.wait_for("the job failed", lambda: stored().failed)
        status, _ = second.stop(signal.SIGTERM)
    finally:
        second.kill()
    assert status == 0, second.log()
    holders = [f"dispatcher@{socket.gethostname()}:{app.proc.pid}" for app in (first, second)]
    seen = attempts()
    by_first = stopped_at.attempts
    print(f"\nattempts by process: {seen}; the first stopped at {by_first}")
    assert [n for n, _ in seen] == [1, 2, 3, 4, 5]
    assert 2 <= by_first < 5
    assert [owner for _, owner in seen] == [holders[0]] * by_first + [holders[1]] * (5 - by_first)
    delays = sorted((token or 0, int(key)) for kind, key, token, _ in _marks(dsn, schema)
                    if kind == "backoff")
    print(f"backoff (attempt, delay ms): {delays}")
    assert delays == [(1, 250), (2, 500), (3, 1_000), (4, 2_000), (5, 2_000)]
    job = stored()
    assert (job.state, job.attempts, job.max_attempts, job.lease_holder) == ("failed", 5, 5, None)
    assert job.last_error == "RuntimeError: provider down (attempt 5)"
    who = re.escape(holders[1])
    events = _log_events(second.log())
    assert _messages(events, "pgstore.dispatcher",
                     rf"{who}: dispatch of doomed failed \(attempt {by_first + 1} of 5\)")
    assert _messages(events, "pgstore.dispatcher",
                     rf"{who}: doomed failed for good after 5 attempt\(s\): RuntimeError: "
                     r"provider down \(attempt 5\)")


def test_run_dispatcher_factory_until_sigint(
    pgstore_database: str, pgstore_schema: str, tmp_path: Path
) -> None:
    dsn, schema = pgstore_database, pgstore_schema
    _create_marks(dsn, schema)
    with PgJobStore(dsn, schema=schema) as jobs:
        now = jobs.now_ms()
        for run_id in ("meeting-a", "flaky-c", "cancel-d"):
            jobs.schedule(run_id, now - 1_000)
    # The factory form, and a lower-case level.
    app = _App("tests.support.cli_app:make_dispatcher", dsn, schema, tmp_path, "--log-level", "info")
    try:
        with PgJobStore(dsn, schema=schema) as jobs:

            def dispatched(*run_ids: str) -> bool:
                found = [jobs.get(r) for r in run_ids]
                return all(j is not None and j.dispatched for j in found)

            app.wait_for("meeting-a dispatched", lambda: dispatched("meeting-a"))
            jobs.schedule("meeting-b", jobs.now_ms())  # while it runs
            app.wait_for(
                "every job dispatched",
                lambda: dispatched("meeting-a", "meeting-b", "flaky-c", "cancel-d")
                and any(kind == "recall" for kind, *_ in _marks(dsn, schema)),
            )
            final = {r: jobs.get(r) for r in ("meeting-a", "meeting-b", "flaky-c", "cancel-d")}
        status, seconds = app.stop(signal.SIGINT)
    finally:
        app.kill()
    log = app.log()
    assert status == 0, log
    assert seconds < 5, log
    events = _log_events(log)

    holder = f"dispatcher@{socket.gethostname()}:{app.proc.pid}"
    who = re.escape(holder)
    for run_id, job in final.items():
        assert job is not None
        assert (job.worker_id, job.lease_holder) == (f"bot-{run_id}", holder)
        assert job.cancelled == (run_id == "cancel-d")
    leased = _messages(events, "pgstore.dispatcher", rf"{who}: leased ([\w-]+) \(due \d+\) until \d+")
    assert sorted(m[1] for m in leased) == [
        "cancel-d", "flaky-c", "flaky-c", "meeting-a", "meeting-b"
    ], log
    sent = _messages(events, "pgstore.dispatcher", rf"{who}: dispatched ([\w-]+) to bot-([\w-]+)")
    assert sorted((m[1], m[2]) for m in sent) == [
        ("flaky-c", "flaky-c"), ("meeting-a", "meeting-a"), ("meeting-b", "meeting-b")
    ], log
    assert _messages(events, "pgstore.dispatcher", rf"{who}: dispatch of flaky-c failed \(attempt 1 of 25\)")
    assert "ConnectionError: the provider did not answer" in log
    assert _messages(events, "pgstore.dispatcher", rf"{who}: released flaky-c for a retry at \d+")
    assert _messages(
        events, "pgstore.dispatcher", rf"{who}: cancel-d: cancelled meanwhile; recalling bot-cancel-d"
    )
    assert ("recall", "cancel-d", None, "bot-cancel-d") in _marks(dsn, schema)
    assert _messages(
        events, "pgstore.run", rf"running dispatcher {who} from tests\.support\.cli_app:make_dispatcher .*"
    )
    assert events[-1] == ("INFO", "pgstore.run", "stopped")


def test_run_console_script_imports_from_the_current_directory(tmp_path: Path) -> None:
    """The console script's sys.path does not hold the current directory; run adds it."""
    (tmp_path / "memory_app.py").write_text(
        "from pathlib import Path\n\n"
        "from pgstore import Dispatcher, MemoryJobStore\n\n"
        "store = MemoryJobStore()\n"
        "store.schedule('ready', 0)\n"
        "dispatcher = Dispatcher(store, lambda job: Path('ready').touch(), holder='mem-1',"
        " poll_interval=0.05)\n"
        "answer = 42\n"
    )
    env = _process_env()
    done = subprocess.run(
        [str(_script()), "run", "memory_app:answer"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert "memory_app:answer is an int" in _assert_one_error_line(
        done.returncode, done.stdout, done.stderr
    )
    with (tmp_path / "err").open("wb") as err:
        proc = subprocess.Popen(
            [str(_script()), "run", "memory_app:dispatcher", "--log-level", "WARNING"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err,
        )
    try:
        # The job due at 0 is dispatched once the run loop (and its SIGTERM handler) is
        # up; a fixed sleep raced a slow start on a loaded machine.
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the dispatcher never dispatched 'ready'"
            time.sleep(0.05)
        assert proc.poll() is None, (tmp_path / "err").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "err").read_text() == ""  # WARNING: the INFO lines are left out


def test_run_on_an_unmigrated_schema_is_one_error_line(
    pgstore_database: str, tmp_path: Path
) -> None:
    app = _App("tests.support.cli_app:scheduler", pgstore_database, "nothing_here", tmp_path)
    try:
        status = app.proc.wait(timeout=60)
    finally:
        app.kill()
    lines = app.log().splitlines()
    assert status == 1, lines
    assert "Traceback" not in app.log()
    assert lines[-1].startswith("pgstore: error: ")
    assert "pgstore migrate --dsn DSN --schema nothing_here" in lines[-1]
    assert all(LOG_LINE.fullmatch(line) for line in lines[:-1]), lines


def test_migrate_client_role_option(cli: Run, pgstore_fresh_database: Callable[[], str]) -> None:
    dsn = pgstore_fresh_database()
    database = conninfo_to_dict(dsn)["dbname"]
    on_role, off_role = f"cr_on_client_{database}", f"cr_off_client_{database}"

    def roles() -> set[str]:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)",
                ([on_role, off_role, "cr_named_callers"],),
            ).fetchall()
        return {r[0] for r in rows}

    assert cli("migrate", "--dsn", dsn, "--schema", "cr_on")[0] == 0
    assert cli("migrate", "--dsn", dsn, "--schema", "cr_off", "--client-role", "off")[0] == 0
    assert cli("migrate", "--dsn", dsn, "--schema", "cr_named",
               "--client-role", "cr_named_callers")[0] == 0
    assert roles() == {on_role, "cr_named_callers"}
    assert cli("downgrade", "--dsn", dsn, "--schema", "cr_named",
               "--client-role", "cr_named_callers", "--yes")[0] == 0
    assert cli("downgrade", "--dsn", dsn, "--schema", "cr_on", "--yes")[0] == 0
    assert roles() == set()
