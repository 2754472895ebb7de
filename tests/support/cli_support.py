"""What the ``pgstore`` command-line tests share: running it in-process and as a process."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

from pgstore.cli.commands import main
from pgstore.models import StoreStats

Run = Callable[..., tuple[int, str, str]]


def in_process(capsys: pytest.CaptureFixture[str]) -> Run:
    """``run("current", ...)`` -> (exit status, stdout, stderr), through ``main``."""

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    return run


def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``PGSTORE_*`` defaults and no ``COLUMNS`` for in-process runs."""
    for name in ("PGSTORE_DSN", "PGSTORE_SCHEMA", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def process_env(**extra: str) -> dict[str, str]:
    """This process's environment without ``PGSTORE_*``, ``COLUMNS`` and ``LINES``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PGSTORE_") and k not in ("COLUMNS", "LINES")
    }
    env.update(extra)
    return env


def pgstore_argv() -> list[str]:
    """The command, as a process: ``python -m pgstore``."""
    return [sys.executable, "-m", "pgstore"]


def one_error_line(err: str) -> str:
    """The only line of ``err``, which holds no traceback."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def job_gauges(
    now: int,
    *,
    pending: int = 0,
    due: int = 0,
    due_expired_lease: int = 0,
    leased: int = 0,
    dispatched: int = 0,
    recalled: int = 0,
    cancelled: int = 0,
    failed: int = 0,
    oldest_due_job_id: str | None = None,
    oldest_due_job_at: int | None = None,
) -> StoreStats:
    """``StoreStats`` with these job gauges (the schedule gauges, which status computes
    from the records, all zero)."""
    return StoreStats(
        now=now, schedules=0, schedules_due=0, schedules_leased=0, schedules_done=0,
        oldest_due_schedule_id=None, oldest_due_schedule_since=None,
        jobs_pending=pending, jobs_due=due, jobs_due_expired_lease=due_expired_lease,
        jobs_leased=leased, jobs_dispatched=dispatched, jobs_recalled=recalled,
        jobs_cancelled=cancelled, jobs_failed=failed, oldest_due_job_id=oldest_due_job_id,
        oldest_due_job_at=oldest_due_job_at,
    )


def on_a_terminal(argv: list[str], typed: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``argv`` with stdin on a pseudo-terminal where ``typed`` has been typed:
    (exit status, stdout, stderr)."""
    import subprocess

    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            argv, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        os.close(slave)
        slave = -1
        os.write(master, typed.encode())
        out, err = proc.communicate(timeout=120)
    finally:
        if slave != -1:
            os.close(slave)
        os.close(master)
    return proc.returncode, out, err
