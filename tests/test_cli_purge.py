"""``pgstore purge --older-than AGE``: batches, progress lines, usage errors; failed jobs
kept unless ``--include-failed``; ``--dry-run``; a terminal asks, elsewhere ``--yes``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import psycopg
import pytest

from pgstore import PgJobStore
from pgstore.cli.purge import age_ms, batch_size
from tests.support.cli_support import (
    Run,
    clean_environment,
    in_process,
    on_a_terminal,
    one_error_line,
    pgstore_argv,
    process_env,
)

DAY = 86_400_000
BAD_DSN = "host=127.0.0.1 port=1 user=nobody dbname=nothing connect_timeout=5"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    clean_environment(monkeypatch)
    return in_process(capsys)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("7d", 7 * DAY), ("12h", 43_200_000), ("30m", 1_800_000), ("90s", 90_000),
     ("500ms", 500), ("2w", 14 * DAY), (" 1d ", DAY)],
)
def test_ages(text: str, ms: int) -> None:
    assert age_ms(text) == ms


@pytest.mark.parametrize("text", ["", "7", "d", "0d", "-1d", "7x", "1.5d", "7 d", "1d2h",
                                  "9999999999999d"])
def test_bad_ages_and_batches(text: str) -> None:
    with pytest.raises(ValueError, match="not an age"):
        age_ms(text)
    assert batch_size("1") == 1 and batch_size("2147483647") == 2147483647
    for bad in ("0", "-1", "2147483648", "x", ""):
        with pytest.raises(ValueError, match="not a batch size"):
            batch_size(bad)


def test_usage_errors_come_before_any_connection(cli: Run) -> None:
    status, out, _ = cli("purge", "--help")
    assert status == 0 and "--older-than" in out and "--batch" in out
    assert cli("purge", "--dsn", BAD_DSN)[0] == 2  # --older-than is required
    assert cli("purge", "--dsn", BAD_DSN, "--older-than", "7x")[0] == 2
    assert cli("purge", "--dsn", BAD_DSN, "--older-than", "7d", "--batch", "0")[0] == 2


def test_purge_deletes_old_finished_jobs_in_batches(
    cli: Run, pgstore_fresh_database: Callable[[], str]
) -> None:
    dsn = pgstore_fresh_database()
    where = ["--dsn", dsn, "--schema", "cli_purge"]
    assert cli("migrate", *where)[0] == 0
    with PgJobStore(dsn, schema="cli_purge") as store:
        now = store.now_ms()
        for n in range(6):
            store.schedule(f"old-{n}", now - 10 * DAY)
            assert str(store.cancel(f"old-{n}")) == "cancelled"
        store.schedule("recent", now - 10 * DAY)
        assert str(store.cancel("recent")) == "cancelled"
        store.schedule("waiting", now - 10 * DAY)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # As if they had finished eight days ago (the owner may write the table).
        conn.execute("UPDATE cli_purge.jobs SET finished_at = finished_at - 8 * 86400000"
                     " WHERE run_id LIKE 'old-%'")

    status, out, err = cli("purge", *where, "--older-than", "7d", "--batch", "4", "--yes")
    assert status == 0, err
    assert out.startswith("schema 'cli_purge': purged 6 jobs finished before ")
    progress = err.splitlines()
    assert len(progress) == 2
    assert progress[0].startswith("purge: batch 1: 4 deleted, 4 in all (finished before ")
    assert progress[1].startswith("purge: batch 2: 2 deleted, 6 in all")
    assert out.startswith("schema 'cli_purge': purged 6 jobs finished before ")
    with PgJobStore(dsn, schema="cli_purge") as store:
        assert store.get("recent") is not None and store.get("waiting") is not None
        assert all(store.get(f"old-{n}") is None for n in range(6))

    # Nothing left that old: nothing to ask, nothing deleted.
    status, out, err = cli("purge", *where, "--older-than", "1h")
    assert (status, err) == (0, "") and out.endswith("\nnothing to purge\n")
    # An age beyond the epoch is clamped to it: nothing finished before 1970.
    status, out, _ = cli("purge", *where, "--older-than", "999999999999w")
    assert status == 0 and "nothing to purge" in out


def _states(dsn: str, schema: str) -> dict[str, str]:
    with PgJobStore(dsn, schema=schema) as store:
        jobs = store.list_jobs("all", None, None).jobs
    return {j.run_id: j.state for j in jobs}


def _fill(dsn: str, schema: str) -> None:
    """Finished ten days ago: 3 dispatched, 2 cancelled, 2 failed; a recent cancelled
    job, a waiting one, and a dispatched one whose lease is still live."""
    with PgJobStore(dsn, schema=schema) as store:
        now = store.now_ms()
        for n in range(2):
            store.schedule(f"failed-{n}", now - 20 * DAY + n, 1)
            lease = store.lease("h", None, 60_000)
            assert lease is not None and lease.run_id == f"failed-{n}"
            assert store.release(f"failed-{n}", "h", now, lease.lease_sequence, "boom")
        for n in range(3):
            store.schedule(f"sent-{n}", now - 10 * DAY)
            lease = store.lease("h", None, 1 if n else 600_000)  # sent-0: a live lease
            assert lease is not None and lease.run_id == f"sent-{n}"
            assert store.mark_dispatched(f"sent-{n}", "h", f"bot-{n}").recorded
        store.schedule("sent-3", now - 10 * DAY)
        lease = store.lease("h", None, 1)
        assert lease is not None and store.mark_dispatched("sent-3", "h", "bot-3").recorded
        for n in range(2):
            store.schedule(f"cancelled-{n}", now - 10 * DAY)
            assert str(store.cancel(f"cancelled-{n}")) == "cancelled"
        store.schedule("recent", now - DAY)
        assert str(store.cancel("recent")) == "cancelled"
        store.schedule("waiting", now + DAY)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.jobs SET finished_at = finished_at - 10 * 86400000"
                     " WHERE run_id <> 'recent' AND finished_at IS NOT NULL")


def test_purge_keeps_failed_jobs_says_first_and_asks(
    cli: Run, pgstore_fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = pgstore_fresh_database()
    schema = "cli_purge_safe"
    where = ["--dsn", dsn, "--schema", schema]
    assert cli("migrate", *where)[0] == 0
    _fill(dsn, schema)
    before = _states(dsn, schema)
    assert sorted(before.values()).count("failed") == 2

    # --dry-run: what it would delete, per state; nothing deleted.
    status, out, err = cli("purge", *where, "--older-than", "7d", "--dry-run")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].endswith(": 3 dispatched, 2 cancelled, 2 failed (kept); "
                             "1 more under a live lease (kept)"), lines[0]
    assert lines[1] == "dry run: would delete 5 jobs; nothing deleted"
    status, out, _ = cli("purge", *where, "--older-than", "7d", "--dry-run", "--include-failed")
    assert out.splitlines()[1] == "dry run: would delete 7 jobs; nothing deleted"
    assert ": 3 dispatched, 2 cancelled, 2 failed; " in out
    assert _states(dsn, schema) == before

    # Failed jobs older than the cutoff: job_purge cannot spare them, so it stops.
    line = one_error_line(cli("purge", *where, "--older-than", "7d", "--yes")[2])
    assert line.startswith(f"pgstore: error: schema {schema!r}: 2 failed jobs finished before ")
    assert "nothing deleted" in line and "--include-failed" in line
    assert cli("purge", *where, "--older-than", "7d", "--yes")[0] == 1
    assert _states(dsn, schema) == before

    # Off a terminal without --yes: exit 2, nothing deleted (as pgstore downgrade).
    older = ["--older-than", "7d", "--include-failed"]
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # noqa: SIM115 - closed by pytest
    status, out, err = cli("purge", *where, *older)
    assert (status, out) == (2, "")
    line = one_error_line(err)
    assert "purging deletes 7 jobs" in line and "--yes" in line and "nothing deleted" in line
    assert _states(dsn, schema) == before
    done = subprocess.run([*pgstore_argv(), "purge", *where, *older], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=process_env(), timeout=60)
    assert (done.returncode, done.stdout) == (2, "") and "--yes" in done.stderr
    assert _states(dsn, schema) == before

    # On a terminal it asks for the schema's name; anything else stops.
    argv = [*pgstore_argv(), "purge", *where, *older]
    status, out, err = on_a_terminal(argv, "y\n", process_env())
    assert (status, out) == (2, ""), err
    assert f"Type the schema name ({schema}) to go ahead" in err
    assert "pgstore: error: purge not confirmed, nothing deleted" in err
    assert _states(dsn, schema) == before
    status, out, err = on_a_terminal(argv, f"{schema}\n", process_env())
    assert status == 0, err
    assert out.startswith(f"schema {schema!r}: purged 7 jobs finished before ")
    # The live lease's job, the recent and the waiting one are kept.
    assert _states(dsn, schema) == {"sent-0": "dispatched", "recent": "cancelled",
                                    "waiting": "waiting"}


def test_purge_without_failed_jobs_deletes_only_what_it_counted(
    cli: Run, pgstore_fresh_database: Callable[[], str]
) -> None:
    dsn = pgstore_fresh_database()
    schema = "cli_purge_nofail"
    where = ["--dsn", dsn, "--schema", schema]
    assert cli("migrate", *where)[0] == 0
    _fill(dsn, schema)
    with PgJobStore(dsn, schema=schema) as store:
        for n in range(2):  # failed jobs revived: none left to keep
            assert str(store.retry(f"failed-{n}", store.now_ms() + DAY)) == "retried"
    status, out, err = cli("purge", *where, "--older-than", "7d", "--dry-run")
    assert (status, err) == (0, "")
    assert out.splitlines()[1] == "dry run: would delete 5 jobs; nothing deleted"
    status, out, err = cli("purge", *where, "--older-than", "7d", "--yes")
    assert status == 0, err
    assert "purged 5 jobs" in out
    assert _states(dsn, schema) == {"sent-0": "dispatched", "recent": "cancelled",
                                    "waiting": "waiting", "failed-0": "waiting",
                                    "failed-1": "waiting"}


def test_purge_help_says_what_it_deletes(cli: Run) -> None:
    status, out, _ = cli("purge", "--help")
    text = " ".join(out.split())
    assert status == 0
    assert "Delete the jobs that were dispatched or cancelled more than AGE before" in text
    assert "Failed jobs (out of attempts, not cancelled) are deleted only with " \
        "--include-failed" in text
    for option in ("--dry-run", "--yes", "--include-failed", "--batch"):
        assert option in text
