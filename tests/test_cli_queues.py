"""``pgstore queues``: the list (text and --json), pause and resume, bad input."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from pgstore import PgJobStore
from tests.support.cli_support import Run, clean_environment, in_process


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    clean_environment(monkeypatch)
    return in_process(capsys)


def test_queues_list_pause_and_resume(
    cli: Run, pgstore_fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    dsn = pgstore_fresh_database()
    where = ["--dsn", dsn, "--schema", "cli_queues"]
    assert cli("migrate", *where)[0] == 0
    status, out, _ = cli("queues", *where)
    assert status == 0 and out.splitlines()[-1] == "no queues (no waiting job, none paused)"
    with PgJobStore(dsn, schema="cli_queues") as store:
        now = store.now_ms()
        store.schedule("a", now - 1000, queue="provider-x")
        store.schedule("b", now + 60_000, queue="provider-x")
        store.schedule("c", now - 1000)

    status, out, _ = cli("queues", "pause", "provider-x", *where)
    assert status == 0
    assert out.splitlines()[0] == "schema 'cli_queues': queue 'provider-x' is paused"
    status, out, _ = cli("queues", "pause", "provider-x", *where)
    assert "was already paused: nothing changed" in out.splitlines()[0]

    status, out, _ = cli("queues", *where)
    lines = out.splitlines()
    assert status == 0 and all(len(line) <= 80 for line in lines)
    assert lines[1].split() == ["queue", "waiting", "due", "leased", "paused"]
    assert [line.split() for line in lines[3:]] == [
        ["default", "1", "1", "0", "no"], ["provider-x", "2", "1", "0", "yes"]]

    status, out, _ = cli("queues", "--json", *where)
    doc = json.loads(out)
    assert doc["schema"] == "cli_queues" and isinstance(doc["now_ms"], int)
    assert doc["queues"] == [
        {"queue": "default", "waiting": 1, "due": 1, "leased": 0, "paused": False},
        {"queue": "provider-x", "waiting": 2, "due": 1, "leased": 0, "paused": True}]

    status, out, _ = cli("queues", "resume", "provider-x", "--json", *where)
    doc = json.loads(out)
    assert status == 0 and doc["result"] == "is resumed"
    assert doc["queues"] == [
        {"queue": "provider-x", "waiting": 2, "due": 1, "leased": 0, "paused": False}]
    status, out, _ = cli("queues", "resume", "provider-x", *where)
    assert "was not paused: nothing changed" in out.splitlines()[0]

    # Bad input: refused (22023, the parameter named), nothing changed.
    status, _, err = cli("queues", "pause", "x" * 1025, *where)
    assert status != 0 and "queue must be a non-empty string" in err
    with PgJobStore(dsn, schema="cli_queues") as store:
        assert [q.paused for q in store.list_queues()] == [False, False]
