"""The built wheel, installed in a clean virtualenv, migrates from outside the source tree.

The wheel must carry sql/ and migrations/ inside the package (the source tree
keeps them beside it) and the ``pgstore`` console script.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pgstore import HEAD_REVISION

ROOT = Path(__file__).resolve().parent.parent
HEAD = HEAD_REVISION

pytestmark = pytest.mark.slow


def _clean_env() -> dict[str, str]:
    """The environment minus anything pointing back at the source tree or its venv."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PGSTORE_")}


def _run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    outside: Path  # a working directory outside the source tree

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def pgstore(self) -> Path:
        return self.venv / "bin" / "pgstore"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    dist, venv, outside = base / "dist", base / "venv", base / "elsewhere"
    outside.mkdir()
    # --no-isolation: hatchling is in this venv; no network for a build env.
    _ok(
        _run(
            [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
            cwd=ROOT,
        )
    )
    (wheel,) = dist.glob("pgstore-*.whl")
    _ok(_run([sys.executable, "-m", "venv", str(venv)], cwd=outside))
    _ok(
        _run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                str(wheel),
            ],
            cwd=outside,
            timeout=240,
        )
    )
    yield Installed(wheel, venv, outside)


def test_wheel_carries_sql_migrations_and_the_script(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        entry_points = next(
            wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")
        )
    sql_files = {Path(n).name for n in names if n.startswith("pgstore/sql/")}
    assert sql_files == {p.name for p in (ROOT / "sql").iterdir() if p.is_file()}
    versions = {Path(n).name for n in names if n.startswith("pgstore/migrations/versions/")}
    assert versions == {p.name for p in (ROOT / "migrations" / "versions").iterdir() if p.is_file()}
    assert "pgstore/migrations/env.py" in names
    assert {"pgstore/cli/__init__.py", "pgstore/__main__.py", "pgstore/py.typed"} <= names
    # make demo and make bench run from a clone: neither ships in the wheel
    assert not [n for n in names if n.startswith(("pgstore/demo/", "pgstore/bench/"))]
    assert "pgstore/testing_ha.py" not in names  # the failover rig of the trials and the bench
    assert "pgstore/new_revision.py" not in names  # make revision: writes a clone's revisions
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "pgstore = pgstore.cli:main" in entry_points
    # pgstore web's templates and stylesheet ship beside its code
    console = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "pgstore" / "web").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert {"pgstore/web/templates/base.html", "pgstore/web/static/console.css"} <= console
    assert console <= names


def test_installed_package_is_self_contained(installed: Installed) -> None:
    probe = (
        "import pgstore, pgstore.schema.files as r\n"
        "print(pgstore.__file__)\n"
        "print(r.sql_dir())\n"
        "print(r.migrations_dir())\n"
    )
    package_file, sql_dir, migrations_dir = (
        Path(line)
        for line in _ok(_run([str(installed.python), "-c", probe], installed.outside)).splitlines()
    )
    package = package_file.parent
    assert package.is_relative_to(installed.venv), package  # not the source tree
    assert sql_dir == package / "sql"
    assert migrations_dir == package / "migrations"
    assert sorted(p.name for p in sql_dir.iterdir()) == sorted(
        p.name for p in (ROOT / "sql").iterdir() if p.is_file()
    )
    shipped = sorted(p.name for p in (migrations_dir / "versions").iterdir() if p.is_file())
    assert shipped == sorted(
        p.name for p in (ROOT / "migrations" / "versions").iterdir() if p.is_file()
    )
    assert (migrations_dir / "env.py").is_file()


def test_installed_script_migrates_from_elsewhere(
    installed: Installed, pgstore_fresh_database: Callable[[], str]
) -> None:
    dsn = pgstore_fresh_database()
    where = ["--dsn", dsn, "--schema", "wheel_s"]
    script = str(installed.pgstore)
    run = installed.outside

    assert _ok(_run([script, "current", *where], run)) == "none (not migrated)\n"
    # The wheel finds its head among the revisions it carries (pgstore/migrations).
    shown = _run([str(installed.python), "-c", "import pgstore; print(pgstore.HEAD_REVISION)"], run)
    assert _ok(shown) == f"{HEAD}\n"
    assert HEAD in _ok(_run([script, "migrate", *where], run))
    assert _ok(_run([script, "current", *where], run)) == f"{HEAD}\n"
    assert _ok(_run([str(installed.python), "-m", "pgstore", "current", *where], run)) == (
        f"{HEAD}\n"
    )
    assert "no schedules" in _ok(_run([script, "schedules", *where], run))

    bad = _run([script, "current", "--dsn", "host=127.0.0.1 port=1"], run)
    assert bad.returncode == 1
    assert bad.stderr.startswith("pgstore: error: ")
    assert len(bad.stderr.splitlines()) == 1 and "Traceback" not in bad.stderr

    assert "none (not migrated)" in _ok(_run([script, "downgrade", *where, "--yes"], run))
