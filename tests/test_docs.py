"""The documentation: a README that is a front page, a quickstart that runs, a site that builds.

* README.md stays at most 10 KB and names the two commands, and its quickstart
  code is taken from ``examples/quickstart.py`` (every line of it is a line of
  the file), so the two cannot drift apart.
* No tracked file points at planning material that lives outside the
  repository (a path out of the clone, the planning document, its sources
  "seeds" or the task "issue" as references). Files under ``pgstore/``,
  ``tests/``, ``migrations/`` and ``sql/`` are checked by a test of their own,
  expected to fail until they are swept; the message lists every offender.
* ``examples/quickstart.py`` runs against the test server and exits 0.
* Every page in ``mkdocs.yml``'s nav exists in ``docs/`` or is one of the pages
  being written on other branches, and ``mkdocs build --strict`` passes
  (skipped, with the reason, where mkdocs is not installed: ``make docs``
  installs it).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
QUICKSTART = ROOT / "examples" / "quickstart.py"
README_MAX_BYTES = 10_240

#: The code's directories (checked by a test of their own, so a failure says where).
CODE_DIRS = ("pgstore/", "tests/", "migrations/", "sql/")
#: This file spells the patterns out.
THIS_FILE = "tests/test_docs.py"

#: References to planning material outside the repository. Precise on purpose: "spec" (a
#: schedule's column, isolationtester specs), "SPECS", a random "seed" or seeding a table,
#: and English uses of "issue" are not matched.
PLANNING_REFERENCES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a path out of the clone", re.compile(r"\.\./shared\b")),
    ("the planning document", re.compile(r"\bSPEC\b")),  # upper case only
    ("the planning document", re.compile(r"\bSPEC\.md\b", re.IGNORECASE)),
    ("a planning source", re.compile(
        r"\bseeds?\s+\d{3}\b|\bseeds/|\bthe\s+seed's\b|\bthe\s+seeds\b", re.IGNORECASE)),
    ("the planning task", re.compile(
        r"\b(?:the|this|that|our)\s+issue(?:'s)?\b(?!\s+(?:is|was|with|here)\b)"
        r"|\bissues?\s*#\d+", re.IGNORECASE)),
)


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"],
            capture_output=True, check=True, timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout (git ls-files failed: {exc})")
    return [name for name in out.decode().split("\0") if name]


def _offenders(keep: Callable[[str], bool]) -> list[str]:
    found: list[str] = []
    for name in _tracked_files():
        if name == THIS_FILE or name.lower().endswith(".png") or not keep(name):
            continue
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the work tree
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            for what, pattern in PLANNING_REFERENCES:
                if pattern.search(line):
                    found.append(f"{name}:{number}: {what}: {line.strip()[:120]}")
    return found


def _in_code_dirs(name: str) -> bool:
    return name.startswith(CODE_DIRS)


def test_readme_is_a_front_page() -> None:
    size = README.stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; at most {README_MAX_BYTES}"
    text = README.read_text(encoding="utf-8")
    assert "make test" in text
    assert "make demo" in text


def test_readme_quickstart_is_taken_from_the_example() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert blocks, "README.md shows no python block"
    example = {line.strip() for line in QUICKSTART.read_text(encoding="utf-8").splitlines()}
    missing = [
        line for line in blocks[0].splitlines() if line.strip() and line.strip() not in example
    ]
    assert not missing, f"README lines not in examples/quickstart.py: {missing}"


def test_no_planning_references_outside_the_code() -> None:
    offenders = _offenders(lambda name: not _in_code_dirs(name))
    assert not offenders, "\n".join(offenders)


def test_no_planning_references_in_the_code() -> None:
    offenders = _offenders(_in_code_dirs)
    assert not offenders, f"{len(offenders)} references:\n" + "\n".join(offenders)


def test_the_patterns_are_precise() -> None:
    def flagged(line: str) -> bool:
        return any(p.search(line) for _, p in PLANNING_REFERENCES)

    # Spelled in pieces, so this file itself holds none of the references it looks for.
    for bad in ["see ../" + "shared/x", "SPEC " + "\u00a74", "the SPEC: rule", "spec.md", "seed 004",
                "the seed's rule", "the issue's targets", "Every target of the issue that"]:
        assert flagged(bad), bad
    for fine in ["spec text NOT NULL", "SPECS = sorted(x)", "random.Random(seed)",
                 "def seed(store)", "seed the tables", "the issue is that", "*.spec files"]:
        assert not flagged(fine), fine


def test_quickstart_runs(pgstore_fresh_database: Callable[[], str], tmp_path: Path) -> None:
    env = {**os.environ, "PGSTORE_DSN": pgstore_fresh_database(), "PGSTORE_SCHEMA": "quick"}
    done = subprocess.run(
        [sys.executable, str(QUICKSTART)], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=180,  # the script gives up by itself at 60 s
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "done: " in done.stdout and "3 of 3 jobs dispatched" in done.stdout, done.stdout


def _nav_pages() -> list[str]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:"):]
    return re.findall(r":\s*([\w./-]+\.md)\b", nav)


def test_every_nav_page_exists_and_every_page_is_in_the_nav() -> None:
    pages = set(_nav_pages())
    missing = sorted(page for page in pages if not (ROOT / "docs" / page).is_file())
    assert not missing, f"nav pages missing from docs/: {missing}"
    written = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert written - pages == set(), "pages under docs/ that the nav does not list"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs and mkdocs-material are not installed (make docs installs them)")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "contract" / "index.html").is_file()
