"""What the tables show: wide values cut to the width, and specs that do not parse.

Ids, owners, holders and worker ids (up to 1024 characters) are cut, with a
mark, to ``COLUMNS`` or the terminal's width; a pipe gets them whole.
``status`` names each schedule whose spec does not parse, and why.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import termios
import threading
from dataclasses import replace

import pytest

from pgstore import PgJobStore, PgScheduleStore
from pgstore.cli.commands import jobs_table, schedules_table
from pgstore.cli.status import status_text
from pgstore.models import Job, ScheduleKind, ScheduleRecord
from tests.support.cli_support import (
    Run,
    clean_environment,
    in_process,
    job_gauges,
    pgstore_argv,
    process_env,
)

WIDE = 1024  # the longest id, owner, holder or worker id the store takes
CUT_MARK = "\u2026"  # pgstore.cli.CUT_MARK


@pytest.fixture(autouse=True)
def _no_pgstore_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_environment(monkeypatch)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Run:
    return in_process(capsys)


# --- wide values, cut to the terminal's width -------------------------------------

NOW = 1_700_000_000_000


def _record(id: str, owner: str | None, spec: str = "60000") -> ScheduleRecord:
    return ScheduleRecord(
        id=id, kind="interval", spec=spec, next_run_at=NOW - 5_000, last_run_at=None,
        last_status=None, fencing_token=1, lease_owner=owner,
        lease_until=None if owner is None else NOW + 30_000, updated_at=NOW,
    )


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_tables_cut_wide_values_to_the_width() -> None:
    from pgstore.cli.commands import CUT_MARK as mark

    assert mark == CUT_MARK
    wide_id, owner = "id-" + "i" * (WIDE - 3), "owner-" + "o" * (WIDE - 6)
    records = [_record(wide_id, owner), _record("short", None)]
    whole = schedules_table(records, NOW)
    assert wide_id in whole and owner in whole and CUT_MARK not in whole
    for width in (200, 210, 400):  # 194: the fixed columns and the cut values
        cut = schedules_table(records, NOW, width)
        assert _widest(cut) <= width, cut
        assert CUT_MARK in cut and "id-iiii" in cut and "owner-oooo" in cut
        assert "short" in cut.splitlines()[3]  # narrow values stay whole
    assert schedules_table(records, NOW, 10_000) == whole  # wide enough: nothing cut

    worker = "worker-" + "w" * (WIDE - 7)
    job = Job("run-1", NOW - 1_000, owner, NOW + 30_000, worker, True, False,
              last_error="e" * 4096)
    cut = jobs_table([job], NOW, 200)
    assert _widest(cut) <= 200 and cut.count(CUT_MARK) == 1  # the holder
    cut = jobs_table([job], NOW, 200, errors=True)
    assert _widest(cut) <= 200 and cut.count(CUT_MARK) == 2  # and the last error
    whole = jobs_table([job], NOW, None, wide=True)  # --wide: every column, nothing cut
    assert CUT_MARK not in whole and owner in whole and worker in whole
    # A run id is never cut, whatever the width: the line overflows, the holder is cut.
    long_run = replace(job, run_id=wide_id)
    cut = jobs_table([long_run], NOW, 200)
    assert wide_id in cut and cut.count(CUT_MARK) == 1
    counts = job_gauges(
        NOW, due=1, dispatched=1, oldest_due_job_id="d-1", oldest_due_job_at=NOW - 1_000
    )
    text = status_text("s", NOW, records, counts, 160)
    assert _widest(text) <= 160 and text.count(CUT_MARK) >= 2
    # The oldest due job's run id is whole, even on a narrow terminal.
    counts = replace(counts, oldest_due_job_id=wide_id)
    assert f"oldest due job: {wide_id}, " in status_text("s", NOW, records, counts, 160)


def _fill_wide(dsn: str, schema: str) -> None:
    with PgScheduleStore(dsn, schema=schema) as store:
        now = store.now_ms()
        store.register("s-" + "s" * (WIDE - 2), "interval", "60000", now - 1_000)
        assert store.claim_due("s-" + "s" * (WIDE - 2), "o-" + "o" * (WIDE - 2), None, 600_000)
    with PgJobStore(dsn, schema=schema) as jobs:
        jobs.schedule("j-" + "j" * (WIDE - 2), now - 2_000)
        assert jobs.lease("h-" + "h" * (WIDE - 2), None, 600_000) is not None
        assert jobs.mark_dispatched(
            "j-" + "j" * (WIDE - 2), "h-" + "h" * (WIDE - 2), "w-" + "w" * (WIDE - 2)
        ).recorded
        jobs.schedule("d-" + "d" * (WIDE - 2), now - 1_000)  # the oldest due job


def test_commands_cut_to_columns_and_keep_pipes_whole(
    cli: Run, pgstore_database: str, pgstore_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill_wide(pgstore_database, pgstore_schema)
    where = ["--dsn", pgstore_database, "--schema", pgstore_schema]
    for verb in ("schedules", "jobs", "status"):
        status, out, err = cli(verb, *where)  # stdout is not a terminal, no COLUMNS
        assert (status, err) == (0, "")
        assert CUT_MARK not in out and _widest(out) > WIDE
    monkeypatch.setenv("COLUMNS", "220")
    run_ids = ("j-" + "j" * (WIDE - 2), "d-" + "d" * (WIDE - 2))
    for verb in ("schedules", "jobs", "status"):
        status, out, err = cli(verb, *where)
        assert (status, err) == (0, "")
        assert CUT_MARK in out, out
        # Only the lines of a table with a long run id (never cut) may overflow.
        for line in out.splitlines():
            assert len(line) <= 220 or any(run_id in line for run_id in run_ids) \
                or line.startswith("run_id  ") or set(line) <= {"-", " "}, line
    assert all(run_id in cli("jobs", *where)[1] for run_id in run_ids)
    status, out, err = cli("jobs", *where, "--wide")  # --wide: nothing cut, even here
    assert (status, err) == (0, "") and CUT_MARK not in out and "h-" + "h" * (WIDE - 2) in out


@pytest.mark.parametrize("columns", [80, 160])
def test_jobs_at_80_and_160_columns(
    cli: Run, pgstore_database: str, pgstore_schema: str, monkeypatch: pytest.MonkeyPatch,
    columns: int,
) -> None:
    """Long lease holders that differ only at their end stay apart, cut in the middle;
    the run ids are whole; every line fits."""
    holders = [f"dispatcher@host-a.prod.internal.example.com:{port}" for port in (4412, 4413)]
    with PgJobStore(pgstore_database, schema=pgstore_schema) as jobs:
        now = jobs.now_ms()
        for n, holder in enumerate(holders):
            jobs.schedule(f"standup-{n}", now - 60_000 * (2 - n))
            leased = jobs.lease(holder, None, 300_000)
            assert leased is not None and leased.run_id == f"standup-{n}"
        jobs.schedule("retro-q4", now + 180_000)
        jobs.schedule("weekly-sync-6c1e", now - 5_000)
    monkeypatch.setenv("COLUMNS", str(columns))
    status, out, err = cli("jobs", "--dsn", pgstore_database, "--schema", pgstore_schema)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert _widest(out) <= columns, out
    rows = {line.split()[0]: line for line in lines[3:]}
    assert list(rows) == ["standup-0", "standup-1", "weekly-sync-6c1e", "retro-q4"]
    for n, port in enumerate((4412, 4413)):
        holder = rows[f"standup-{n}"].split()[-1]
        assert holder.startswith("dispatc") and holder.endswith(f":{port}")
        assert (CUT_MARK in holder) is (columns == 80)
    assert " ago" not in out and "(" not in out  # one form: relative, nothing doubled
    assert re.search(r" in [23]m ", rows["retro-q4"]) and "s late " in rows["weekly-sync-6c1e"]


def _terminal_output(argv: list[str], columns: int) -> tuple[int, str]:
    """Run ``argv`` with stdout on a pseudo-terminal ``columns`` wide (COLUMNS unset)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, env=process_env())
        os.close(slave)
        status = proc.wait(timeout=120)
        reader.join(timeout=30)
    finally:
        os.close(master)
    return status, b"".join(chunks).decode().replace("\r\n", "\n")


def test_commands_on_a_terminal_cut_to_its_width(pgstore_database: str, pgstore_schema: str) -> None:
    _fill_wide(pgstore_database, pgstore_schema)
    # One command suffices: schedules, jobs and status share output_width() (tested above
    # through COLUMNS), and status has both a table and the lines naming a job.
    argv = [*pgstore_argv(), "status", "--dsn", pgstore_database, "--schema", pgstore_schema]
    status, out = _terminal_output(argv, 230)
    assert status == 0, out
    assert out.count(CUT_MARK) >= 2, out
    oldest = "d-" + "d" * (WIDE - 2)  # the oldest due job's run id: whole
    assert f"oldest due job: {oldest}, " in out
    assert all(len(line) <= 230 for line in out.splitlines() if oldest not in line), out


# --- status flags specs that do not parse --------------------------------------------


@pytest.mark.parametrize(
    ("kind", "spec", "reason"),
    [
        ("cron", "61 * * * *", "invalid cron expression '61 * * * *'"),
        ("cron", "TZ=Nowhere/City 0 3 * * *", "unknown time zone 'Nowhere/City'"),
        ("cron", "@reboot", "'@reboot' is not supported"),
        ("interval", "abc", "an interval must be a positive integer of ms, not 'abc'"),
        ("interval", "0", "an interval must be a positive integer of ms, not '0'"),
        ("interval", "9223372036854775808", "positive integer of ms"),
        ("interval", "0" * 18 + "1", None),  # 19 digits, within bigint: parses
        ("interval", "9" * 5000, "positive integer of ms"),  # beyond int()'s digit limit
        ("once", "-5", "a one-shot delay must be a positive integer of ms, not '-5'"),
        ("once", "1.5", "a one-shot delay must be a positive integer of ms"),
    ],
)
def test_spec_problem_names_what_does_not_parse(
    kind: ScheduleKind, spec: str, reason: str | None
) -> None:
    from pgstore.cli.status import spec_problem

    record = replace(_record("r", None, spec), kind=kind)
    problem = spec_problem(record)
    assert problem is None if reason is None else (problem is not None and reason in problem)


def test_spec_problem_accepts_what_the_scheduler_writes() -> None:
    from pgstore.cli.status import spec_problem

    cases: list[tuple[ScheduleKind, str]] = [
        ("cron", "*/5 * * * *"), ("cron", "TZ=Europe/Berlin 30 2 * * *"), ("cron", "@daily"),
        ("interval", "1"), ("interval", "9223372036854775807"), ("once", "60000"),
    ]
    for kind, spec in cases:
        assert spec_problem(replace(_record("r", None, spec), kind=kind)) is None, spec


def test_status_flags_schedules_whose_spec_does_not_parse(
    cli: Run, pgstore_database: str, pgstore_schema: str
) -> None:
    with PgScheduleStore(pgstore_database, schema=pgstore_schema) as store:
        records: list[tuple[str, ScheduleKind, str]] = [
            ("bad-cron", "cron", "61 * * * *"),
            ("bad-interval", "interval", "every minute"),
            ("bad-once", "once", "0"),
            ("good-cron", "cron", "0 3 * * *"),
            ("good-interval", "interval", "60000"),
        ]
        for id, kind, spec in records:
            store.register(id, kind, spec, NOW)
    status, out, err = cli("status", "--dsn", pgstore_database, "--schema", pgstore_schema)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert "5 schedules" not in lines[2] and lines[2].startswith("schedules: 5 (")
    assert lines[2].endswith(", 3 with a spec that does not parse)")
    flagged = [line for line in lines if "spec does not parse" in line and ":" in line[:20]]
    assert [line.split(":", 1)[0] for line in flagged] == ["bad-cron", "bad-interval", "bad-once"]
    assert "bad-cron: spec does not parse: invalid cron expression '61 * * * *'" in out
    assert "bad-interval: spec does not parse: an interval must be a positive integer of ms, " \
        "not 'every minute'" in out
    assert "bad-once: spec does not parse: a one-shot delay must be a positive integer" in out
    # The table still shows every schedule, the jobs section follows.
    assert all(any(line.startswith(id) for line in lines[5:10]) for id in ("good-cron", "bad-once"))
    assert "jobs: 0" in lines
