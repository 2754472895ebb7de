"""A pg_auto_failover formation of our own: a monitor and two nodes, for failover trials.

``formation(root)`` runs Debian's ``pg_autoctl`` (``pg-auto-failover-cli``) with the
PostgreSQL binaries its extension was built for (``postgresql-NN-auto-failover``):
a monitor and two nodes on free 127.0.0.1 ports, every file (data, ``pg_autoctl``'s
configuration, state and pid files through ``HOME`` and the ``XDG_*`` variables)
inside one temporary directory. As root, everything runs as the unprivileged user
``pgstore/testing_ha.py`` picks (PostgreSQL refuses to run as root).

Started fast:

* every data directory is made by ``initdb --no-sync`` beforehand (``pg_autoctl``
  adopts an existing one for the monitor and the first node; the second node is
  a ``pg_basebackup`` of the first, made by ``pg_autoctl`` itself);
* ``fsync = off`` on the nodes: the trials kill processes, never the machine, and
  the kernel keeps what a killed server wrote; replication, and so what a
  promotion keeps, is unchanged;
* ``--no-ssl --auth trust``, and the monitor's health checks every second with
  a node unhealthy after two (``pgautofailover.*`` settings, see ``MONITOR``).

``pg_auto_failover``'s own defaults are kept otherwise: with two nodes the
primary names the secondary in ``synchronous_standby_names`` (``ANY 1 (...)``)
and ``synchronous_commit = on``, so a commit is acknowledged once the secondary
has it; while the primary is alone (``wait_primary``) it commits asynchronously.

What a trial can do with a ``Formation``: read ``uri()`` (``pg_autoctl show uri
--formation default``), ``state()``, ``primary()``, ``wait_healthy()`` (a primary
and a secondary), ``set_synchronous(False)`` (``pg_autoctl set node
replication-quorum false`` on both nodes: asynchronous replication),
``perform_failover()`` (``pg_autoctl perform failover``), ``stall_replication(node)``
(SIGSTOP to the primary's WAL senders, so what it commits alone is lost), and
``kill(node)`` (SIGKILL to the node's ``pg_autoctl`` and every process under it,
postgres included). Every process started is killed when the context exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pgstore.testing_ha import free_port, server_directory, wait_for

#: The monitor's settings: health checks every second, a node unhealthy after 2 s
#: without a report, a dead primary given up on after 3 s (defaults: 5 s, 20 s, 30 s).
MONITOR = {
    "pgautofailover.health_check_period": "1000",
    "pgautofailover.health_check_timeout": "1000",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "500",
    "pgautofailover.node_considered_unhealthy_timeout": "2000",
    "pgautofailover.primary_demote_timeout": "3000",
    "pgautofailover.startup_grace_period": "2000",
}
#: The nodes' own settings, beside pg_autoctl's (written into postgresql.conf).
NODE_SETTINGS = {
    "fsync": "off",
    # pg_basebackup asks for a spread checkpoint: paced at 100 ms a buffer otherwise.
    "checkpoint_completion_target": "0",
    "shared_buffers": "'16MB'",
    "max_connections": "60",
    "wal_receiver_status_interval": "'1s'",
    "log_min_messages": "warning",
}
#: Generous bound on every wait (a noisy shared 2-core machine).
WAIT_SECONDS = 60.0


def autoctl_binaries() -> tuple[Path, Path] | None:
    """``pg_autoctl`` and the PostgreSQL ``bin`` directory whose server has the
    ``pgautofailover`` extension, or None when either is missing."""
    found = shutil.which("pg_autoctl")
    if found is None:
        return None
    for lib in sorted(Path("/usr/lib/postgresql").glob("*/lib/pgautofailover.so"), reverse=True):
        bin_dir = lib.parent.parent / "bin"
        if all(os.access(bin_dir / exe, os.X_OK) for exe in ("initdb", "pg_ctl", "postgres")):
            return Path(found), bin_dir
    return None


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (from ``/proc``), parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Service:
    """A ``pg_autoctl`` process we started (a session of its own) and its data."""

    name: str
    data: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    def postmaster(self) -> int | None:
        """The pid in ``postmaster.pid``, if the file is there."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL to ``pg_autoctl`` and everything under it, postgres and its backends."""
        victims = []
        if self.process is not None:
            victims += _descendants(self.process.pid)
        postmaster = self.postmaster()
        if postmaster is not None and postmaster not in victims:
            victims += _descendants(postmaster)
        _kill(victims)
        if self.process is not None:
            self.process.wait(10)
        # A backend that outlived its postmaster for a moment: gone too.
        if postmaster is not None:
            _kill(_descendants(postmaster))


class Formation:
    """A monitor and two nodes under ``pg_autoctl``, in ``root``."""

    def __init__(self, root: Path, autoctl: Path, bin_dir: Path, user: str | None) -> None:
        self.root = root
        self.autoctl = autoctl
        self.bin_dir = bin_dir
        self.user = user
        self.superuser = user or _current_user()  # initdb's default: the OS user
        self.monitor = Service("monitor", root / "monitor", free_port())
        self.nodes = {
            name: Service(name, root / name, free_port()) for name in ("node_a", "node_b")
        }
        self.env = {
            "HOME": str(root),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_DATA_HOME": str(root / "share"),
            "XDG_RUNTIME_DIR": str(root / "run"),
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PG_CONFIG": str(bin_dir / "pg_config"),
            "LANG": "C.UTF-8",
            "PGHOST": str(root),  # pg_autoctl's own local connections: our sockets
        }

    # --- processes ----------------------------------------------------------------

    def _ids(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        import pwd

        entry = pwd.getpwnam(self.user)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def run(self, *args: str, timeout: float = WAIT_SECONDS) -> str:
        """Run a command (``pg_autoctl`` unless a path is given) to its end; its output."""
        exe = args[0] if "/" in args[0] else str(self.autoctl)
        argv = [exe, *args[1:]] if "/" in args[0] else [exe, *args]
        with tempfile.TemporaryFile() as out:  # a file: a server started must not hold a pipe
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, cwd=self.root, env=self.env,
                                  timeout=timeout, **self._ids())
            out.seek(0)
            text = out.read().decode(errors="replace")
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{text}")
        return text

    def spawn(self, service: Service, *args: str) -> None:
        """Start ``pg_autoctl args`` in a session of its own, logging to ``<name>.log``."""
        with (self.root / f"{service.name}.log").open("ab") as log:
            service.process = subprocess.Popen(
                [str(self.autoctl), *args], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=self.root, env=self.env,
                start_new_session=True, **self._ids(),
            )

    def log_tail(self, size: int = 3000) -> str:
        parts = []
        for service in (self.monitor, *self.nodes.values()):
            with contextlib.suppress(OSError):
                text = (self.root / f"{service.name}.log").read_text(errors="replace")
                parts.append(f"--- {service.name}.log\n{text[-size:]}")
        return "\n".join(parts)

    def initdb(self, service: Service, *options: str) -> None:
        """A data directory whose socket is in ``root`` (not the packaged default)."""
        self.run(str(self.bin_dir / "initdb"), "-D", str(service.data), "--auth=trust",
                 "--encoding=UTF8", "--locale=C", "--no-sync", *options)
        with (service.data / "postgresql.conf").open("a") as conf:
            conf.write(f"unix_socket_directories = '{self.root}'\n")

    # --- building -----------------------------------------------------------------

    def start(self) -> None:
        for key in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR"):
            self.run("/bin/mkdir", "-m", "700", "-p", self.env[key])
        first, second = self.nodes.values()
        with ThreadPoolExecutor(2) as pool:  # both initdb at once
            list(pool.map(self.initdb, (self.monitor, first)))
        with (first.data / "postgresql.conf").open("a") as conf:  # node_b: a copy of it
            conf.writelines(f"{key} = {value}\n" for key, value in NODE_SETTINGS.items())
        self.spawn(self.monitor, "create", "monitor", "--pgdata", str(self.monitor.data),
                   "--pgport", str(self.monitor.port), "--hostname", "127.0.0.1",
                   "--auth", "trust", "--no-ssl", "--run")
        wait_for(self._monitor_ready, "the monitor to serve pg_auto_failover")
        with psycopg.connect(self.monitor_dsn(self.superuser), autocommit=True) as conn:
            for key, value in MONITOR.items():
                conn.execute(f"ALTER SYSTEM SET {key} = {value}".encode())
            conn.execute(b"SELECT pg_reload_conf()")
        self._create_node(first)
        wait_for(lambda: self._reported(first.name) == "single", f"{first.name} to be single")
        self._create_node(second)
        self.wait_healthy()

    def _create_node(self, node: Service) -> None:
        self.spawn(node, "create", "postgres", "--pgdata", str(node.data),
                   "--pgport", str(node.port), "--pghost", "127.0.0.1",
                   "--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--name", node.name,
                   "--auth", "trust", "--no-ssl", "--username", self.superuser,
                   "--dbname", "postgres", "--monitor", self.monitor_uri(), "--run")

    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover"

    def monitor_dsn(self, user: str = "autoctl_node") -> str:
        return (f"host=127.0.0.1 port={self.monitor.port} user={user}"
                " dbname=pg_auto_failover connect_timeout=5")

    def _monitor_ready(self) -> bool:
        with psycopg.connect(self.monitor_dsn(), autocommit=True) as conn:
            row = conn.execute(b"SELECT count(*) FROM pg_extension"
                               b" WHERE extname = 'pgautofailover'").fetchone()
        return row is not None and row[0] == 1

    # --- reading ------------------------------------------------------------------

    def state(self) -> list[dict[str, Any]]:
        """The monitor's view of the nodes (``pgautofailover.node``)."""
        with psycopg.connect(self.monitor_dsn(), autocommit=True) as conn:
            rows = conn.execute(
                b"SELECT nodename, reportedstate::text, goalstate::text, reportedtli"
                b" FROM pgautofailover.node ORDER BY nodeid"
            ).fetchall()
        return [{"name": r[0], "reported": r[1], "goal": r[2], "timeline": r[3]} for r in rows]

    def _reported(self, name: str) -> str | None:
        return next((n["reported"] for n in self.state() if n["name"] == name), None)

    def healthy(self) -> bool:
        """A primary and a secondary, each where the monitor wants it."""
        states = sorted((n["reported"], n["goal"]) for n in self.state())
        return states == [("primary", "primary"), ("secondary", "secondary")]

    def wait_healthy(self, timeout: float = WAIT_SECONDS) -> None:
        try:
            wait_for(self.healthy, "a primary and a secondary", timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.state()}\n{self.log_tail()}") from None

    def primary(self) -> Service:
        """The node the monitor has as primary (reported and goal)."""
        names = [n["name"] for n in self.state()
                 if n["reported"] in ("primary", "wait_primary") and n["reported"] == n["goal"]]
        assert len(names) == 1, f"no single primary: {self.state()}"
        return self.nodes[names[0]]

    def uri(self) -> str:
        """``pg_autoctl show uri --formation default``: every node, the writable one chosen."""
        shown = self.run("show", "uri", "--pgdata", str(self.monitor.data),
                         "--formation", "default", "--json")
        return str(json.loads(shown)["default"])

    def node_dsn(self, node: Service) -> str:
        return (f"host=127.0.0.1 port={node.port} user={self.superuser} dbname=postgres"
                " connect_timeout=5")

    def set_synchronous(self, on: bool) -> None:
        """Every node's ``replication-quorum``: true (pg_auto_failover's default, the
        primary waits for the secondary) or false (asynchronous); returns once the
        primary's ``synchronous_standby_names`` says so."""
        for node in self.nodes.values():
            self.run("set", "node", "replication-quorum", "--pgdata", str(node.data),
                     "true" if on else "false")
        self.wait_healthy()  # the primary goes through apply_settings
        primary = self.node_dsn(self.primary())

        def applied() -> bool:
            with psycopg.connect(primary, autocommit=True) as conn:
                row = conn.execute(b"SHOW synchronous_standby_names").fetchone()
            return row is not None and bool(row[0]) == on

        wait_for(applied, f"synchronous_standby_names to be {'set' if on else 'empty'}")

    # --- failing over -------------------------------------------------------------

    def perform_failover(self) -> None:
        """``pg_autoctl perform failover``: returns once the old primary is a secondary."""
        self.run("perform", "failover", "--pgdata", str(self.monitor.data),
                 "--formation", "default", "--wait", str(int(WAIT_SECONDS)))

    def kill(self, node: Service) -> None:
        node.kill()

    def stall_replication(self, node: Service) -> int:
        """SIGSTOP to every WAL sender of ``node`` (the primary): from here on, what it
        commits without waiting for a standby reaches none. Returns how many were
        stopped; they stay stopped until ``kill(node)`` (SIGKILL ends stopped processes)."""
        with psycopg.connect(self.node_dsn(node), autocommit=True) as conn:
            pids = [r[0] for r in conn.execute(b"SELECT pid FROM pg_stat_replication").fetchall()]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return len(pids)

    def stop(self) -> None:
        """Every process we started, and everything under it, killed."""
        for service in (*self.nodes.values(), self.monitor):
            service.kill()


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


@contextmanager
def formation() -> Iterator[Formation]:
    """A monitor, a primary and a synchronous secondary; all killed and removed on exit."""
    found = autoctl_binaries()
    if found is None:
        raise RuntimeError("pg_autoctl or a PostgreSQL with the pgautofailover extension is missing")
    with server_directory("pgstore-autofailover-") as (root, user):
        built = Formation(root, *found, user)
        try:
            try:
                built.start()
            except (AssertionError, RuntimeError) as exc:
                raise RuntimeError(f"{exc}\n{built.log_tail()}") from None
            yield built
        finally:
            built.stop()
