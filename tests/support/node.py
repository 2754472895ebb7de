"""The Node projects the tests build: clients/typescript and examples/typescript.

``npm ci`` runs only when package-lock.json changed since the last install, and the
build only when the sources did (digests stamped in node_modules/ and the build's
output, all ignored by git). A test is skipped, with one line saying which, when
``node`` or ``npm`` is not on PATH or the npm registry cannot be reached for the first
install; any other npm or compiler failure fails it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent.parent
CLIENT = ROOT / "clients" / "typescript"
NETWORK_ERROR = re.compile(
    r"\b(ENOTFOUND|ECONNREFUSED|ECONNRESET|ETIMEDOUT|EAI_AGAIN|ENETUNREACH|EHOSTUNREACH"
    r"|network)\b"
)


def tool(name: str) -> str:
    """``name``'s path, or a skip saying it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not on PATH: the TypeScript tests were not run")
    return path


def node_url(conninfo: str) -> str:
    """A libpq conninfo (keywords or URI) as the postgresql:// URL node-postgres reads;
    host and port go in the query, so a socket directory works too."""
    params = conninfo_to_dict(conninfo)
    user = quote(str(params.get("user") or os.environ.get("USER", "postgres")), safe="")
    password = params.get("password")
    auth = f"{user}:{quote(str(password), safe='')}" if password else user
    query = {k: str(params[k]) for k in ("host", "port", "sslmode") if params.get(k)}
    database = quote(str(params.get("dbname") or ""), safe="")
    return f"postgresql://{auth}@/{database}?{urlencode(query)}"


class NodeProject:
    """A directory with a package.json and a committed package-lock.json."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node_bin = tool("node")
        self.npm_bin = tool("npm")
        self.npx_bin = tool("npx")

    def run(self, argv: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=self.root, capture_output=True, text=True, timeout=timeout, check=False,
            **kwargs,
        )

    def node(self, args: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run([self.node_bin, *args], timeout, **kw)

    def npm(self, args: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run([self.npm_bin, *args], timeout, **kw)

    def npx(self, args: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run([self.npx_bin, "--no-install", *args], timeout, **kw)

    def _digest(self, paths: list[Path]) -> str:
        sha = hashlib.sha256()
        for path in paths:
            sha.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
        return sha.hexdigest()

    def install(self) -> None:
        """``npm ci`` unless node_modules already holds exactly this package-lock.json."""
        stamp = self.root / "node_modules" / ".pgstore-lock-sha256"
        digest = self._digest([self.root / "package-lock.json"])
        if stamp.exists() and stamp.read_text() == digest:
            return
        argv = ["ci", "--no-audit", "--no-fund", "--fetch-timeout=30000", "--fetch-retries=1"]
        try:
            done = self.npm(argv, timeout=300)
        except subprocess.TimeoutExpired:
            pytest.skip("npm registry unreachable: npm ci had no answer within 300 s")
        if done.returncode != 0:
            output = done.stdout + done.stderr
            if NETWORK_ERROR.search(output):
                line = next((x for x in output.splitlines() if NETWORK_ERROR.search(x)), "")
                pytest.skip(f"npm registry unreachable: {line.strip()}")
            pytest.fail(f"npm ci in {self.root} exited {done.returncode}:\n{output}")
        stamp.write_text(digest)

    def build(self, *commands: list[str], sources: list[str]) -> None:
        """The npm ``commands`` unless the output was built from exactly these sources
        (the .ts and tsconfig files under ``sources``, the lock file, package.json)."""
        files = sorted(
            p
            for s in sources
            for p in (self.root / s).rglob("*")
            if p.is_file() and (p.suffix == ".ts" or p.name.startswith("tsconfig"))
        )
        files += [self.root / "package.json", self.root / "package-lock.json"]
        files += sorted(self.root.glob("tsconfig*.json"))
        digest = self._digest(files)
        which = hashlib.sha256(repr(commands).encode()).hexdigest()[:12]
        stamp = self.root / "node_modules" / f".pgstore-build-{which}"
        if stamp.exists() and stamp.read_text() == digest:
            return
        for command in commands:
            done = self.npm(command, timeout=300)
            assert done.returncode == 0, f"npm {' '.join(command)} failed:\n{done.stdout}{done.stderr}"
        stamp.write_text(digest)
