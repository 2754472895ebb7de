"""``pgstore purge --older-than AGE [--batch N]``: batches, progress lines, usage errors."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from pgstore import PgJobStore
from pgstore.cli.purge import age_ms, batch_size
from tests.support.cli_support import Run, clean_environment, in_process

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

    status, out, err = cli("purge", *where, "--older-than", "7d", "--batch", "4")
    assert status == 0, err
    progress = err.splitlines()
    assert len(progress) == 2
    assert progress[0].startswith("purge: batch 1: 4 deleted, 4 in all (finished before ")
    assert progress[1].startswith("purge: batch 2: 2 deleted, 6 in all")
    assert out.startswith("schema 'cli_purge': purged 6 jobs finished before ")
    with PgJobStore(dsn, schema="cli_purge") as store:
        assert store.get("recent") is not None and store.get("waiting") is not None
        assert all(store.get(f"old-{n}") is None for n in range(6))

    # Nothing left that old: one batch, nothing deleted.
    status, out, err = cli("purge", *where, "--older-than", "1h")
    assert status == 0 and err.startswith("purge: batch 1: 0 deleted, 0 in all")
    assert "purged 0 jobs" in out
    # An age beyond the epoch is clamped to it: nothing finished before 1970.
    status, out, _ = cli("purge", *where, "--older-than", "999999999999w")
    assert status == 0 and "purged 0 jobs" in out
