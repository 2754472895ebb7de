"""The ``pgstore`` command: in-process through ``main([...])``, and as a real process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pgstore import CompletePatch, PgJobStore, PgScheduleStore
from pgstore.cli import (
    due_state,
    format_duration,
    format_instant,
    job_lease_state,
    jobs_table,
    lease_state,
    main,
)
from pgstore.models import Job, ScheduleRecord

HEAD = "pgstore_0003"
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


def _record(**changes: object) -> ScheduleRecord:
    fields: dict[str, object] = {
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
    return ScheduleRecord(**fields)  # type: ignore[arg-type]


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
    assert lease_state(held, now) == "held by w1 until 2023-11-14T22:13:49.001Z (in 30s)"
    # lease_until == now is no longer live: a claim at now succeeds (SPEC §4).
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
        store.register("c-free", "cron", "*/5 * * * *", 1_700_000_000_000)
        store.register("d-done", "interval", "1000", 0)
        claim = store.claim_due("d-done", "worker-3", None, 60_000)
        assert claim is not None
        patch = CompletePatch(next_run_at=None, last_run_at=1_600_000_000_000, last_status="ok")
        assert store.complete("d-done", claim.fencing_token, patch)

    status, out, err = cli("schedules", *where)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert re.fullmatch(rf"schema 'cli_s', database clock \d+ \({ISO}\)", lines[0])
    header = lines[1].split()
    assert header == [
        "id",
        "kind",
        "spec",
        "next_run_at",
        "last_run_at",
        "last_status",
        "fencing_token",
        "lease",
    ]
    assert set(lines[2]) <= {"-", " "}
    rows = {line.split()[0]: line for line in lines[3:]}
    assert list(rows) == ["a-held", "b-expired", "c-free", "d-done"]  # ordered by id

    assert re.search(rf"interval +60000 +\d+ \({ISO}\) +- +- +1 +", rows["a-held"])
    assert re.search(rf"held by worker-1 until {ISO} \(in (599|600)s\)$", rows["a-held"])
    assert rows["b-expired"].endswith("expired (worker-2)")
    assert "1700000000000 (2023-11-14T22:13:20.000Z)" in rows["c-free"]
    assert "*/5 * * * *" in rows["c-free"]
    assert rows["c-free"].endswith("free")
    assert re.search(
        r"d-done +interval +1000 +- +1600000000000 \(2020-09-13T12:26:40\.000Z\) +ok +1 +free$",
        rows["d-done"],
    )

    status, out, err = cli("downgrade", *where)
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

    status, out, err = _run([*script, "schedules", *where])
    assert (status, err) == (0, ""), err
    assert "1700000000000 (2023-11-14T22:13:20.000Z)" in out
    assert "4102444800000 (2100-01-01T00:00:00.000Z)" in out
    assert re.search(rf"held by host-a:123 until {ISO} \(in 1[12]\ds\)", out)
    assert re.search(r"later .* free$", out, re.MULTILINE)

    for argv in ([*script, "schedules", "--dsn", BAD_DSN], [*module, "migrate", "--dsn", BAD_DSN]):
        _assert_one_error_line(*_run(argv))

    status, out, err = _run([*script, "downgrade", *where])
    assert (status, err) == (0, ""), err
    assert _run([*script, "current", *where]) == (0, "none (not migrated)\n", "")


# --- pgstore jobs -----------------------------------------------------------

JOB_HEADER = ["run_id", "dispatch_at", "due", "lease", "dispatched", "cancelled", "worker_id"]


def _job(**changes: object) -> Job:
    fields: dict[str, object] = {
        "run_id": "r",
        "dispatch_at": 0,
        "lease_holder": None,
        "lease_until": None,
        "worker_id": None,
        "dispatched": False,
        "cancelled": False,
    }
    fields.update(changes)
    return Job(**fields)  # type: ignore[arg-type]


def _job_rows(out: str) -> dict[str, dict[str, str]]:
    """``pgstore jobs`` output -> {run_id: {column: cell}}, in the printed order.

    Columns are two or more spaces apart and no cell holds two spaces in a row.
    """
    lines = out.splitlines()
    assert re.fullmatch(rf"schema '[^']+', database clock \d+ \({ISO}\)", lines[0])
    assert re.split(r" {2,}", lines[1]) == JOB_HEADER
    assert set(lines[2]) <= {"-", " "}
    rows: dict[str, dict[str, str]] = {}
    for line in lines[3:]:
        if line.startswith("... "):
            break
        cells = re.split(r" {2,}", line)
        assert len(cells) == len(JOB_HEADER), line
        rows[cells[0]] = dict(zip(JOB_HEADER, cells, strict=True))
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

    assert due_state(_job(dispatch_at=now + 1), now) == "in 1s"  # rounded up, never "in 0s"
    assert due_state(_job(dispatch_at=now + 300_000), now) == "in 5m00s"
    assert due_state(_job(dispatch_at=now), now) == "due now"
    assert due_state(_job(dispatch_at=now - 12_500), now) == "overdue 12s"
    assert due_state(_job(dispatch_at=now - 12_500, dispatched=True), now) == "12s ago"
    assert due_state(_job(dispatch_at=now - 12_500, cancelled=True), now) == "12s ago"

    assert job_lease_state(_job(), now) == "-"
    live = _job(lease_holder="h1", lease_until=now + 29_001)
    assert job_lease_state(live, now) == "live: h1 until 2023-11-14T22:13:49.001Z (in 30s)"
    # lease_until == now is expired: job_lease takes it at now (SPEC §5).
    at_now = _job(lease_holder="h1", lease_until=now)
    assert job_lease_state(at_now, now) == "expired: h1 until 2023-11-14T22:13:20.000Z (0ms ago)"
    old = _job(lease_holder="h\n1", lease_until=now - 61_000)
    assert (
        job_lease_state(old, now) == "expired: 'h\\n1' until 2023-11-14T22:12:19.000Z (1m01s ago)"
    )

    table = jobs_table([_job(run_id="x", dispatched=True, worker_id="w9")], now).splitlines()
    assert re.split(r" {2,}", table[0]) == JOB_HEADER
    assert re.split(r" {2,}", table[2]) == [
        "x",
        "0 (1970-01-01T00:00:00.000Z)",
        "19675d22h ago",
        "-",
        "yes",
        "no",
        "w9",
    ]


def test_jobs_usage(cli: Run) -> None:
    status, out, _ = cli("--help")
    assert (status, "jobs" in out) == (0, True)
    status, out, _ = cli("jobs", "--help")
    assert status == 0
    for option in ("--dispatched", "--due", "--limit", "default: 100", "--dsn", "--schema"):
        assert option in out
    # Usage errors come before any connection (BAD_DSN would be exit 1).
    assert cli("jobs", "--dsn", BAD_DSN, "--due", "--dispatched")[0] == 2
    assert cli("jobs", "--dsn", BAD_DSN, "--limit", "-1")[0] == 2
    assert cli("jobs", "--dsn", BAD_DSN, "--limit", "many")[0] == 2


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
    assert leased["dispatch_at"] == format_instant(now - 120_000)
    assert re.fullmatch(r"overdue 2m0\ds", leased["due"])
    assert re.fullmatch(rf"live: holder-1 until {ISO} \(in (9m5\ds|10m00s)\)", leased["lease"])
    assert (leased["dispatched"], leased["cancelled"], leased["worker_id"]) == ("no", "no", "-")

    dispatched = rows["dispatched"]
    assert dispatched["dispatch_at"] == format_instant(now - 300_000)
    assert re.fullmatch(r"5m0\ds ago", dispatched["due"])  # dispatched: not "overdue"
    # mark_dispatched leaves the lease as it was.
    assert re.fullmatch(rf"live: holder-2 until {ISO} \(in (5\ds|1m00s)\)", dispatched["lease"])
    assert (dispatched["dispatched"], dispatched["cancelled"]) == ("yes", "no")
    assert dispatched["worker_id"] == "worker-7"
    assert rows["sent-early"]["worker_id"] == "-"

    assert re.fullmatch(rf"expired: holder-3 until {ISO} \(\d+s ago\)", rows["expired"]["lease"])
    assert re.fullmatch(r"overdue \d+s", rows["expired"]["due"])
    assert rows["cancelled"]["lease"] == "-"
    assert (rows["cancelled"]["dispatched"], rows["cancelled"]["cancelled"]) == ("no", "yes")
    assert re.fullmatch(r"1m3\ds ago", rows["cancelled"]["due"])
    assert rows["due"]["lease"] == "-"
    assert re.fullmatch(r"overdue 1m0\ds", rows["due"]["due"])
    assert re.fullmatch(r"in 59m\d\ds|in 1h00m", rows["future"]["due"])
    assert rows["future"]["dispatch_at"] == format_instant(now + 3_600_000)

    # --dispatched: only dispatched jobs, by dispatch_at like the others.
    status, out, err = cli("jobs", *where, "--dispatched")
    assert (status, err) == (0, "")
    shown = _job_rows(out)
    assert list(shown) == ["sent-early", "dispatched"]
    # The same cells as the full list (the relative times may have moved a second).
    for column in ("dispatch_at", "dispatched", "cancelled", "worker_id"):
        assert shown["dispatched"][column] == rows["dispatched"][column]
    assert shown["dispatched"]["lease"].startswith("live: holder-2 until ")

    # --due: what a lease could take now or once its lease ends, leased or not.
    status, out, err = cli("jobs", *where, "--due")
    assert (status, err) == (0, "")
    shown = _job_rows(out)
    assert list(shown) == ["leased", "due", "expired"]
    assert shown["leased"]["lease"].startswith("live: holder-1 until ")
    assert out.splitlines()[-1].startswith("expired ")  # no "... more" line

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

    # Nothing matches a filter: say so.
    with PgJobStore(dsn, schema="cli_j") as store:
        for run_id in ("leased", "due", "expired"):
            store.remove(run_id)
    assert cli("jobs", *where, "--due")[1].splitlines()[1:] == ["no due jobs"]
    with PgJobStore(dsn, schema="cli_j") as store:
        for run_id in ("sent-early", "dispatched"):
            store.remove(run_id)
    assert cli("jobs", *where, "--dispatched")[1].splitlines()[1:] == ["no dispatched jobs"]

    # The environment supplies the DSN and schema, as for the other commands.
    env_status, env_out, _ = _run([str(_script()), "jobs"], PGSTORE_DSN=dsn, PGSTORE_SCHEMA="cli_j")
    assert env_status == 0
    assert list(_job_rows(env_out)) == ["cancelled", "future"]


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
