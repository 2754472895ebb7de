"""``pgstore queues``: the list (text and --json), pause and resume, bad input."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from pgstore import PgJobStore
from tests.support.cli_support import Run, clean_environment, in_process

#: A queue's limits in ``--json`` when it has none.
NONE = {"concurrency_limit": None, "rate_limit": None, "rate_period_ms": None, "rate_used": None}


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
    assert status == 0
    assert out.splitlines()[-1] == "no queues (no waiting job, none paused or limited)"
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
    assert lines[1].split() == ["queue", "waiting", "due", "leased", "paused", "limits"]
    assert [line.split() for line in lines[3:]] == [
        ["default", "1", "1", "0", "no", "-"], ["provider-x", "2", "1", "0", "yes", "-"]]

    status, out, _ = cli("queues", "--json", *where)
    doc = json.loads(out)
    assert doc["schema"] == "cli_queues" and isinstance(doc["now_ms"], int)
    assert doc["queues"] == [
        {"queue": "default", "waiting": 1, "due": 1, "leased": 0, "paused": False, **NONE},
        {"queue": "provider-x", "waiting": 2, "due": 1, "leased": 0, "paused": True, **NONE}]

    status, out, _ = cli("queues", "resume", "provider-x", "--json", *where)
    doc = json.loads(out)
    assert status == 0 and doc["result"] == "is resumed"
    assert doc["queues"] == [
        {"queue": "provider-x", "waiting": 2, "due": 1, "leased": 0, "paused": False, **NONE}]
    status, out, _ = cli("queues", "resume", "provider-x", *where)
    assert "was not paused: nothing changed" in out.splitlines()[0]

    # Bad input: refused (22023, the parameter named), nothing changed.
    status, _, err = cli("queues", "pause", "x" * 1025, *where)
    assert status != 0 and "queue must be a non-empty string" in err
    with PgJobStore(dsn, schema="cli_queues") as store:
        assert [q.paused for q in store.list_queues()] == [False, False]


def test_jobs_by_queue_at_80_columns(
    cli: Run, pgstore_fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pgstore jobs`` shows each job's queue, cut in the middle like the holders (two
    names that differ only at their end stay apart); ``--queue`` (repeatable) keeps to
    those queues in every filter, ``--json`` says which; a bad name is refused."""
    monkeypatch.setenv("COLUMNS", "80")
    dsn = pgstore_fresh_database()
    where = ["--dsn", dsn, "--schema", "cli_jq"]
    assert cli("migrate", *where)[0] == 0
    long_queues = [f"provider-x.prod.eu-west-1.internal.example.com-{n}" for n in (1, 2)]
    with PgJobStore(dsn, schema="cli_jq") as store:
        now = store.now_ms()
        store.schedule("m-1", now - 3000, queue=long_queues[0], priority=5)
        store.schedule("m-2", now - 2000, queue=long_queues[1])
        store.schedule("d-1", now - 1000)
        store.schedule("later", now + 60_000, queue="python")
        leased = store.lease("dispatcher@host-a.prod.internal.example.com:4412", None, 60_000,
                             queues=[long_queues[1]])
        assert leased is not None and leased.run_id == "m-2"

    status, out, err = cli("jobs", *where)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), out
    assert lines[1].split() == ["run_id", "queue", "state", "due", "attempts", "lease", "holder"]
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    assert list(rows) == ["m-1", "m-2", "d-1", "later"]
    cut = [rows["m-1"][1], rows["m-2"][1]]
    assert all("\u2026" in q and q.startswith("provide") for q in cut)
    assert cut[0].endswith("-1") and cut[1].endswith("-2")
    assert (rows["d-1"][1], rows["later"][1]) == ("default", "python")

    status, out, _ = cli("jobs", *where, "--queue", long_queues[0], "--queue", "python")
    assert status == 0 and [line.split()[0] for line in out.splitlines()[3:]] == ["m-1", "later"]
    status, out, _ = cli("jobs", *where, "--due", "--queue", "default")
    assert [line.split()[0] for line in out.splitlines()[3:]] == ["d-1"]
    status, out, _ = cli("jobs", *where, "--leased", "--queue", "python")
    assert status == 0 and out.splitlines()[-1] == "no leased jobs in queue 'python'"
    status, out, _ = cli("jobs", *where, "--leased", "--queue", long_queues[1], "--wide")
    wide = out.splitlines()
    assert wide[1].split()[7] == "priority" and wide[3].split()[:3] == ["m-2", long_queues[1],
                                                                           "leased"]
    status, out, _ = cli("jobs", *where, "--dispatched", "--queue", "python")
    assert out.splitlines()[-1] == "no dispatched jobs in queue 'python'"

    doc = json.loads(cli("jobs", *where, "--queue", long_queues[0], "--json")[1])
    assert (doc["queues"], doc["matching"]) == ([long_queues[0]], 1)
    assert (doc["jobs"][0]["queue"], doc["jobs"][0]["priority"]) == (long_queues[0], 5)

    # Bad input: 22023 naming queues, exit status 1; the listing changes nothing anyway.
    status, _, err = cli("jobs", *where, "--queue", "")
    assert status == 1 and "queues must be NULL (every queue)" in err


def test_queues_limit_sets_and_removes_limits(
    cli: Run, pgstore_fresh_database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    dsn = pgstore_fresh_database()
    where = ["--dsn", dsn, "--schema", "cli_limits"]
    assert cli("migrate", *where)[0] == 0
    status, out, _ = cli("queues", "limit", "provider-x", "--concurrency", "5",
                         "--rate", "10/1s", *where)
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == ("schema 'cli_limits': queue 'provider-x': concurrency limit set,"
                        " rate limit set")
    assert lines[-1].split() == ["provider-x", "0", "0", "0", "no", "5", "at", "once,",
                                 "10/1s", "(0", "used)"]
    status, out, _ = cli("queues", "limit", "provider-x", "--concurrency", "5", *where)
    assert out.splitlines()[0].endswith("concurrency limit unchanged")
    status, out, _ = cli("queues", "limit", "provider-x", "--rate", "none", "--json", *where)
    doc = json.loads(out)
    assert status == 0 and doc["result"] == "rate limit set"
    assert doc["queues"] == [{"queue": "provider-x", "waiting": 0, "due": 0, "leased": 0,
                              "paused": False, **NONE, "concurrency_limit": 5}]

    # Bad input: refused, the parameter named, nothing changed.
    for bad, said in ((["--concurrency", "0"], "limit must be NULL"),
                      (["--concurrency", "10001"], "limit must be NULL"),
                      (["--rate", "10"], "not a rate"),
                      (["--rate", "10/0s"], "not an age"),
                      ([], "give --concurrency, --rate or both")):
        status, _, err = cli("queues", "limit", "provider-x", *bad, *where)
        assert status != 0 and said in err, (bad, err)
    with PgJobStore(dsn, schema="cli_limits") as store:
        [queue] = store.list_queues()
        assert (queue.concurrency_limit, queue.rate_limit) == (5, None)
