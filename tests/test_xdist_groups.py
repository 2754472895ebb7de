"""The suite's spread over pytest-xdist workers (``tests/support/xdist_groups.py``), run on a
small suite of its own in a subprocess with two workers: the tests sharing a
module-scoped fixture run on one worker that builds it once, an ``xdist_group`` stays on
one worker, the other tests go to both, and ``slow`` tests start first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("xdist")

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = """
from tests.support.xdist_groups import (
    pytest_collection_modifyitems as pytest_collection_modifyitems,
)
from tests.support.xdist_groups import pytest_configure as pytest_configure
from tests.support.xdist_groups import pytest_xdist_make_scheduler as pytest_xdist_make_scheduler
"""

RECORD = """
import json, os, time
import pytest

def record(name, **extra):
    with open(os.environ["RECORD_FILE"], "a") as f:
        f.write(json.dumps({"test": name, "worker": os.environ["PYTEST_XDIST_WORKER"],
                            "at": time.monotonic(), **extra}) + "\\n")
"""

SHARED = RECORD + """
@pytest.fixture(scope="module")
def built():
    record("built")
    return object()

@pytest.mark.parametrize("n", range(12))
def test_shared(built, n):
    time.sleep(0.02)
    record(f"shared-{n}", built=id(built))
"""

GROUPED = RECORD + """
@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("n", range(12))
def test_grouped(n):
    time.sleep(0.02)
    record(f"grouped-{n}")
"""

LOOSE = RECORD + """
@pytest.mark.parametrize("n", range(24))
def test_loose(n):
    time.sleep(0.05)
    record(f"loose-{n}")

@pytest.mark.slow
def test_zz_slow():
    record("slow")
"""


def _run_two_workers(tmp_path: Path) -> list[dict[str, object]]:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    for name, body in {"shared": SHARED, "grouped": GROUPED, "loose": LOOSE}.items():
        (suite / f"test_{name}.py").write_text(textwrap.dedent(body))
    (suite / "pytest.ini").write_text(
        "[pytest]\naddopts = --dist loadgroup\nmarkers =\n    slow: long\n"
    )
    record_file = tmp_path / "record.jsonl"
    env = {**os.environ, "RECORD_FILE": str(record_file), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", str(suite)],
        cwd=suite, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "49 passed" in done.stdout, done.stdout
    return [json.loads(line) for line in record_file.read_text().splitlines()]


def test_groups_stay_on_one_worker_and_the_rest_spreads(tmp_path: Path) -> None:
    records = _run_two_workers(tmp_path)

    def workers(prefix: str) -> set[object]:
        return {r["worker"] for r in records if str(r["test"]).startswith(prefix)}

    built = [r for r in records if r["test"] == "built"]
    assert len(built) == 1  # the module-scoped fixture, once
    assert workers("shared-") == {built[0]["worker"]}
    assert len({r["built"] for r in records if str(r["test"]).startswith("shared-")}) == 1
    assert len(workers("grouped-")) == 1
    assert workers("loose-") == {"gw0", "gw1"}
    # The slow test, last in its file, runs before nearly all the loose ones (collected
    # in file order it would run after every one of them).
    slow = next(float(str(r["at"])) for r in records if r["test"] == "slow")
    loose_before = [r for r in records
                    if str(r["test"]).startswith("loose-") and float(str(r["at"])) < slow]
    assert len(loose_before) <= 6, loose_before
