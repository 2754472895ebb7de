"""clients/typescript: the TypeScript package's own suite, run against the test database.

``npm ci`` (from the committed package-lock.json), ``npm run build`` (tsc), then
``node --test`` on the compiled suite: the shared conformance scenarios
(tests/conformance/*.json) on a pool, a client and (when a pgbouncer binary is found)
through PgBouncer in transaction pooling; two Node processes racing leases, and a
cancel racing a mark, 300 trials each; bigints past 2^53; transactions and errors.
Then ``tsc --noEmit`` of test/seeds/seeds.ts (the stores assigned to the seed
interfaces as the pages declare them), and the two examples of docs/typescript.md.

Skips, with one line saying which, when ``node`` or ``npm`` is missing or the npm
registry cannot be reached for the first install (tests/support/node.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgstore.testing import PgBouncer, install_schema, pgbouncer_binary
from tests.support.node import CLIENT, NodeProject, node_url

SCHEMA = 'ts "client" store'
#: With tests/test_typescript_example.py: both install and build clients/typescript, which
#: two xdist workers must not do at once.
pytestmark = pytest.mark.xdist_group("node_projects")


@pytest.fixture(scope="module")
def client_project() -> NodeProject:
    """clients/typescript, installed with npm ci and built (package and test suite)."""
    project = NodeProject(CLIENT)
    project.install()
    project.build(
        ["run", "--silent", "build"], ["run", "--silent", "build:test"],
        sources=["src", "test", "examples"],
    )
    return project


@pytest.fixture
def migrated(pgstore_database: str) -> Iterator[str]:
    """A schema holding the current pgstore objects, whose name needs quoting."""
    install_schema(pgstore_database, SCHEMA)
    yield pgstore_database
    with psycopg.connect(pgstore_database, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("DROP SCHEMA {} CASCADE").format(psycopg.sql.Identifier(SCHEMA)))


def _env(dsn: str, bouncer: PgBouncer | None = None) -> dict[str, str]:
    env = {**os.environ, "PGSTORE_TS_DSN": node_url(dsn), "PGSTORE_TS_SCHEMA": SCHEMA}
    env["PGSTORE_DSN"], env["PGSTORE_SCHEMA"] = env["PGSTORE_TS_DSN"], SCHEMA
    if bouncer is not None:
        env["PGSTORE_TS_BOUNCER"] = node_url(bouncer.dsn_for(dsn))
    return env


def test_typescript_suite(
    client_project: NodeProject, migrated: str, request: pytest.FixtureRequest
) -> None:
    bouncer: PgBouncer | None = None
    if pgbouncer_binary() is not None:
        bouncer = request.getfixturevalue("pgstore_pgbouncer")
    tests = sorted(str(p) for p in (CLIENT / "build-test" / "test").glob("*.test.js"))
    assert len(tests) == 3, tests
    done = client_project.node(
        ["--test", "--test-concurrency=1", "--test-reporter=tap", *tests],
        env=_env(migrated, bouncer), timeout=900,
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr
    summary = dict(
        line[2:].split(" ", 1) for line in done.stdout.splitlines()
        if line.startswith("# ") and line[2:].split(" ", 1)[0] in ("pass", "fail", "skipped")
    )
    scenarios = sum(
        len(json.loads(p.read_text())["scenarios"])
        for p in (Path(__file__).parent / "conformance").glob("*.json")
    )
    modes = 3 if bouncer is not None else 2
    # every scenario in every mode, then the races (3) and the client tests (13)
    assert summary["fail"] == "0", summary
    assert summary["pass"] == str(scenarios * modes + 3 + 13), summary


def test_the_stores_are_the_seed_interfaces(client_project: NodeProject) -> None:
    """tsc --noEmit of test/seeds/seeds.ts: each store assigned to its seed interface."""
    done = client_project.npm(["run", "--silent", "check:seeds"], timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_seed_check_fails_on_a_wrong_signature(client_project: NodeProject) -> None:
    """The check above can fail: a store whose renew takes its arguments in another
    order is not a ScheduleStore."""
    seeds_dir = CLIENT / "test" / "seeds"
    broken = seeds_dir / "broken.ts"
    config = seeds_dir / "broken.tsconfig.json"
    broken.write_text(
        (seeds_dir / "seeds.ts").read_text().replace(
            "renew(id: string, fencingToken: number, leaseUntil: number)",
            "renew(fencingToken: number, id: string, leaseUntil: number)",
        )
    )
    config.write_text(json.dumps({"extends": "./tsconfig.json", "include": ["./broken.ts"]}))
    try:
        done = client_project.npx(["tsc", "-p", str(config)], timeout=300)
    finally:
        broken.unlink()
        config.unlink()
    assert done.returncode != 0
    assert "ScheduleStore" in done.stdout, done.stdout


def _example(project: NodeProject, name: str, dsn: str) -> list[dict[str, object]]:
    done = project.node([str(CLIENT / "build-test" / "examples" / f"{name}.js")], env=_env(dsn), timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_scheduler_example(client_project: NodeProject, migrated: str) -> None:
    steps = _example(client_project, "scheduler", migrated)
    by_step = {str(s["step"]): s for s in steps}
    assert sorted(by_step) == ["claim", "complete", "fenced", "register", "restart", "skip"], steps
    assert by_step["register"]["fencingToken"] == 0
    claims = [s for s in steps if s["step"] == "claim"]
    assert len(claims) == 1 and claims[0]["fencingToken"] == 1  # one node of two claimed
    assert by_step["skip"]["owner"] != claims[0]["owner"]
    assert by_step["complete"]["committed"] is True
    assert by_step["restart"]["kept"] is True
    assert by_step["fenced"] == {
        "step": "fenced", "staleToken": 2, "staleCommitted": False,
        "currentToken": 3, "currentCommitted": True,
    }


def test_dispatcher_example(client_project: NodeProject, migrated: str) -> None:
    steps = _example(client_project, "dispatcher", migrated)
    dispatched = {s["runId"]: s for s in steps if s["step"] == "dispatched"}
    assert set(dispatched) == {"standup", "flaky-retro"}
    assert all(s["recorded"] is True and s["cancelled"] is False for s in dispatched.values())
    assert dispatched["flaky-retro"]["key"] == "flaky-retro:2"  # its second lease
    assert [s["runId"] for s in steps if s["step"] == "release"] == ["flaky-retro"]
    assert [s["answer"] for s in steps if s["step"] == "cancel"] == ["cancelled", "already_dispatched"]
    with psycopg.connect(migrated) as conn:
        rows = conn.execute(
            psycopg.sql.SQL(
                "SELECT run_id, dispatched, cancelled, attempts, last_error FROM {}.jobs ORDER BY run_id"
            ).format(psycopg.sql.Identifier(SCHEMA))
        ).fetchall()
    assert rows == [
        ("cancelled-sync", False, True, 0, None),
        ("flaky-retro", True, False, 2, "provider timeout"),
        ("standup", True, False, 1, None),
        ("tomorrow", False, False, 0, None),
    ]
