"""The documentation matches the code: a README that is a front page, a quickstart that
runs, a site that builds.

* README.md stays at most 10 KB and names ``make test`` and ``make demo``, and its
  quickstart code is taken from ``examples/quickstart.py`` (every line of it is a line
  of the file), so the two cannot drift apart.
* ``examples/quickstart.py`` runs against the test server and exits 0.
* Every page in ``mkdocs.yml``'s nav exists in ``docs/``, every page under ``docs/`` is
  in the nav, and ``mkdocs build --strict`` passes (skipped, with the reason, where
  mkdocs is not installed: ``make docs`` installs it).
* Every ``.PHONY`` target of the Makefile has a rule, and no tracked file is one
  ``.gitignore`` lists (generated output such as ``docs/bench/results.json`` stays out
  of the tree).
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


def _tracked_and_ignored() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--ignored",
             "--exclude-standard"],
            capture_output=True, check=True, timeout=60,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout (git ls-files failed: {exc})")
    return [name for name in out.decode().split("\0") if name]


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


def test_no_tracked_file_is_ignored() -> None:
    assert _tracked_and_ignored() == [], "tracked, though .gitignore lists them"


def test_every_phony_target_has_a_rule() -> None:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    phony = {t for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for t in line.split()}
    rules = set(re.findall(r"^([\w.-]+):", text, re.M))
    assert phony, "the Makefile declares no .PHONY target"
    assert sorted(phony - rules) == [], ".PHONY targets without a rule"


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
