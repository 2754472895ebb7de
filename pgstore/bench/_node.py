"""The Node peers of the lease -> dispatch loop: graphile-worker and pg-boss.

They are installed with ``npm`` into ``<cache>/node`` (``.bench-cache/node`` by
default: git-ignored, kept between runs, reinstalled when the pinned versions
change) and driven by ``node_peers.cjs`` beside this file: one ``node``
process per worker, each told its peer's settings, started together, each
answering the job ids it completed and the ``CLOCK_MONOTONIC`` time of its last
completion (the clock ``time.monotonic_ns`` reads, so the parent times the
drain as it times the Python workers). Without ``node`` and ``npm`` on the PATH,
or when ``npm install`` fails, the Node peers are skipped with one line saying
why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from pgstore.bench._common import connect, ident, schema_name

SCRIPT = Path(__file__).with_name("node_peers.cjs")
NODE_SYSTEMS = ("graphile-worker", "pg-boss")
#: What ``npm install`` puts in the cache: pinned, the versions results.json records.
PACKAGES = {"graphile-worker": "0.17.3", "pg-boss": "10.4.2", "pg": "8.23.1"}

#: Each peer's own batching, at the settings the bench runs it with: batches of 500, as
#: pgqueuer's and pgstore's. 500 beat 100 for both at W = 8 over 20,000 jobs
#: (graphile-worker 13,325 against 11,837 jobs/s, pg-boss 14,752 against 7,027).
SETTINGS: dict[str, dict[str, Any]] = {
    # localQueue.size: jobs fetched (and locked) per fetch, served to the process's
    # workers from memory; completeJobBatchDelay 0: completions written together
    # per tick of the event loop, in one statement.
    "graphile-worker": {"concurrentJobs": 1, "maxPoolSize": 3, "localQueueSize": 500,
                        "completeJobBatchDelay": 0},
    # fetch(batchSize) then complete(ids): one statement each per batch.
    "pg-boss": {"max": 2, "batchSize": 500},
}


def node_missing() -> str | None:
    """Why the Node peers cannot run here, or None."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"{tool} not found on the PATH: graphile-worker and pg-boss skipped"
    return None


def ensure_packages(cache: Path) -> tuple[Path | None, str | None]:
    """``<cache>/node`` with PACKAGES installed (npm, once), or (None, why not)."""
    missing = node_missing()
    if missing:
        return None, missing
    folder = (cache / "node").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"name": "pgstore-bench-node-peers", "private": True,
                "dependencies": dict(PACKAGES)}
    wanted = json.dumps(manifest, indent=2) + "\n"
    package_json = folder / "package.json"
    if package_json.exists() and package_json.read_text() == wanted and all(
        _installed_version(folder, name) == version for name, version in PACKAGES.items()
    ):
        return folder, None
    package_json.write_text(wanted)
    try:
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=folder, check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        err = getattr(exc, "stderr", "") or str(exc)
        why = f"npm install failed ({err.strip()[-300:]})"
        return None, f"{why}: graphile-worker and pg-boss skipped"
    return folder, None


def _installed_version(folder: Path, name: str) -> str | None:
    try:
        data = json.loads((folder / "node_modules" / name / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = data.get("version")
    return str(version) if version else None


def node_env(dsn: str, modules: Path, app: str, pgoptions: str | None = None) -> dict[str, str]:
    """The environment of a node process: the connection as PG* variables (node-postgres
    reads them), the package folder, the application name the wait sampler looks for."""
    params = conninfo_to_dict(dsn)
    env = dict(os.environ)
    for key, var in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER"),
                     ("password", "PGPASSWORD"), ("dbname", "PGDATABASE")):
        value = params.get(key)
        if value is not None:
            env[var] = str(value)
        else:
            env.pop(var, None)
    env.setdefault("PGHOST", "localhost")
    env["PGAPPNAME"] = app
    env["PGSTORE_BENCH_NODE_MODULES"] = str(modules)
    if pgoptions:
        env["PGSTORE_BENCH_PGOPTIONS"] = pgoptions
    else:
        env.pop("PGSTORE_BENCH_PGOPTIONS", None)
    return env


def versions(modules: Path) -> dict[str, str]:
    out = subprocess.run(["node", str(SCRIPT), "versions"], capture_output=True, text=True,
                         check=True, timeout=60,
                         env={**os.environ, "PGSTORE_BENCH_NODE_MODULES": str(modules)})
    return {str(k): str(v) for k, v in json.loads(out.stdout).items()}


class NodeSystem:
    """One Node peer's schema, installed by the peer itself, refilled before each run."""

    def __init__(self, name: str, dsn: str, modules: Path) -> None:
        self.name, self.dsn, self.modules = name, dsn, modules
        self.schema = schema_name("peer_" + name.replace("-", "_"))
        self.settings = dict(SETTINGS[name])
        self.filled = 0

    def _node(self, *args: str) -> None:
        subprocess.run(["node", str(SCRIPT), *args], check=True, capture_output=True,
                       text=True, timeout=600,
                       env=node_env(self.dsn, self.modules, f"bench-setup-{self.name}"))

    def install(self) -> None:
        self.drop()
        self._node("install", self.name, self.schema)

    def fill(self, n: int) -> None:
        """Empty the queue and add ``n`` due jobs with the peer's own bulk enqueue."""
        s = ident(self.schema)
        with connect(self.dsn) as conn:
            if self.name == "graphile-worker":
                conn.execute(f"TRUNCATE {s}._private_jobs, {s}._private_job_queues".encode())
            else:
                conn.execute(f"DELETE FROM {s}.job".encode())
        self._node("fill", self.name, self.schema, str(n))
        self.filled = n
        with connect(self.dsn) as conn:
            for table in self.tables():
                conn.execute(f"VACUUM (ANALYZE) {table}".encode())
            conn.execute(b"CHECKPOINT")

    def tables(self) -> list[str]:
        s = ident(self.schema)
        if self.name == "graphile-worker":
            return [f"{s}._private_jobs"]
        return [f"{s}.job"]

    def finished(self) -> int:
        """How many jobs the database says were finished: graphile-worker deletes a job
        once it succeeded (so: none left, none failed); pg-boss marks it completed."""
        s = ident(self.schema)
        with connect(self.dsn) as c:
            if self.name == "graphile-worker":
                row = c.execute(
                    f"SELECT count(*), count(*) FILTER (WHERE last_error IS NOT NULL)"
                    f" FROM {s}._private_jobs".encode()).fetchone()
                assert row is not None
                return -1 if row[0] else self.filled
            row = c.execute(
                f"SELECT count(*) FROM {s}.job WHERE name = 'bench' AND state = 'completed'"
                f" AND NOT EXISTS (SELECT FROM {s}.job WHERE name = 'bench'"
                f" AND state <> 'completed')".encode()).fetchone()
            assert row is not None
            return int(row[0])

    def start_workers(self, workers: int, unflushed: bool) -> list[subprocess.Popen[str]]:
        """``workers`` node processes, connected and waiting for the go line."""
        options = "-c synchronous_commit=off" if unflushed else None
        env = node_env(self.dsn, self.modules, f"bench-{self.name}", options)
        procs = [
            subprocess.Popen(
                ["node", str(SCRIPT), "work", self.name, self.schema, json.dumps(self.settings)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env=env)
            for _ in range(workers)
        ]
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                err = p.stderr.read() if p.stderr else ""
                for q in procs:
                    q.kill()
                raise RuntimeError(f"{self.name} worker did not start: {line!r} {err[-500:]}")
        return procs

    @staticmethod
    def go(procs: list[subprocess.Popen[str]]) -> int:
        start = time.monotonic_ns()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        return start

    @staticmethod
    def answers(procs: list[subprocess.Popen[str]]) -> list[tuple[dict[str, Any], str | None]]:
        """Each worker's answer (its JSON line: got, last, calls, end, cpu_us) and error or
        None."""
        out: list[tuple[dict[str, Any], str | None]] = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=1800)
            if p.returncode != 0:
                out.append(({}, f"exit {p.returncode}: {stderr.strip()[-500:]}"))
                continue
            out.append((json.loads(stdout.strip().splitlines()[-1]), None))
        return out

    def drop(self) -> None:
        with connect(self.dsn) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident(self.schema)} CASCADE".encode())
