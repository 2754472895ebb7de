"""``python -m pgstore.bench --quick``: every section of our own runs against the test
server and writes a results document of the promised shape, with every ratio a positive
number. Speed is never asserted (the numbers of a quick run mean little); the peers run
only where their packages (the ``bench`` extra) are installed."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pgstore.runtime.dispatcher import BATCH_SIZE

OWN_SECTIONS = ["floors", "ops", "naive", "scale", "hot", "wakeup", "retention"]
OPS = ["claim_due", "renew", "complete", "register_unchanged", "claim_next_100", "job_lease",
       "job_renew", "job_mark_dispatched", "job_cancel"]


def _bench(dsn: str, out: Path, *args: str, path: str | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PGSTORE_DSN"}
    if path is not None:
        env["PATH"] = path
    done = subprocess.run(
        [sys.executable, "-m", "pgstore.bench", "--quick", "--dsn", dsn, "--out", str(out),
         *args],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "Targets" in done.stdout  # the printed table
    doc: dict[str, Any] = json.loads((out / "results.json").read_text())
    return doc


def _ratios(node: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every value stored under a key named ``ratio``, anywhere in the document."""
    found: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}"
            if key == "ratio":
                found.append((where, value))
            found += _ratios(value, where)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _ratios(value, f"{path}[{i}]")
    return found


def _positive(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _check_ratios(doc: dict[str, Any]) -> int:
    ratios = _ratios(doc["results"])
    for where, value in ratios:
        if isinstance(value, dict):  # a summary of repeats
            assert value["n"] > 0, where
            for key in ("median", "min", "max"):
                assert _positive(value[key]), (where, key, value)
            assert all(_positive(v) for v in value["repeats"]), (where, value)
            assert value["min"] <= value["median"] <= value["max"], (where, value)
        else:
            assert _positive(value), (where, value)
    return len(ratios)


def test_quick_bench_of_our_own_sections(pgstore_database: str, tmp_path: Path) -> None:
    doc = _bench(pgstore_database, tmp_path, "--only", ",".join(OWN_SECTIONS))
    assert doc["errors"] == {}
    meta = doc["meta"]
    assert meta["machine"]["nproc"] >= 1
    assert meta["server"]["server_version_num"] >= 100000
    assert meta["server"]["fsync"] in ("on", "off")
    assert sorted(doc["results"]) == sorted(OWN_SECTIONS)
    res = doc["results"]

    assert _positive(res["floors"]["select1"]["median"])
    assert _positive(res["floors"]["durable_update"]["median"])
    assert sorted(res["ops"]["ops"]) == sorted(OPS)
    for op in OPS:
        for mode in ("sync", "sync_unprepared", "async", "async_unprepared", "sql"):
            assert _positive(res["ops"]["ops"][op][mode]["us"]["median"]), (op, mode)
            assert res["ops"]["ops"][op][mode]["ratio"]["n"] == 3, (op, mode)  # --quick repeats
    assert _positive(res["naive"]["naive_transaction"]["us"]["median"])
    assert _positive(res["naive"]["bare_update"]["us"]["median"])
    assert set(res["scale"]["cases"]) >= {"job_lease", "claim_due", "claim_next_100_with_ids"}
    lease_cpu = res["scale"]["lease_cpu"]
    assert set(lease_cpu["head"]) == {"job_lease", "job_lease_queues", "job_lease_many_10",
                                      "job_lease_many_10_queues"}
    for case in lease_cpu["head"].values():
        assert case["ratio"]["n"] == 3 and _positive(case["big_us"]["median"])  # --quick
    for table, phases in (("schedules", {"claim", "complete"}),
                          ("jobs", {"lease", "renew", "mark_dispatched"})):
        shipped = res["hot"][table]["shipped"]
        assert set(shipped["phases"]) == phases
        for phase in shipped["phases"].values():
            assert phase["updates"] == phase["calls"] > 0  # one row version per call
            assert 0 <= phase["hot_share"] <= 1
        assert shipped["sizes_after"]["heap"] > 0
    assert res["wakeup"]["latency_ms"]["n"] == 3
    assert _positive(res["wakeup"]["notify_cost_us"]["median"]) or \
        res["wakeup"]["notify_cost_us"]["median"] <= 0  # a difference: any sign, but a number

    retention = res["retention"]
    assert set(retention["cases"]) == {
        "big_before_purge", "big_after_purge", "big_after_autovacuum", "dead_before_purge",
        "dead_after_purge", "dead_after_vacuum"}
    kept, history = retention["kept_rows"], retention["history_rows"]
    for table in ("big", "dead"):  # the purge keeps the newest `kept` of the history
        assert retention["purges"][table]["deleted"] == history - kept
    assert retention["vacuum_after_purge"] in ("autovacuum", "manual")

    assert _check_ratios(doc) > 30
    names = [t["name"] for t in doc["targets"]]
    assert any(n.startswith("claim_due (sql)") for n in names)
    assert any(n.startswith("naive") for n in names)
    assert any(n.startswith("claims HOT share") for n in names)
    assert any(n.startswith("job_lease with") for n in names)
    for target in doc["targets"]:
        assert _positive(target["measured"]), target
        assert target["met"] in (True, False), target
    assert "| operation |" in (tmp_path / "results.md").read_text()
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_bench_of_the_stats_section(pgstore_database: str, tmp_path: Path) -> None:
    """With --stats-base-sql (here sql/ itself) the section times a third pair of tables,
    "base", and the write path's ratios to it."""
    base = Path(__file__).resolve().parent.parent / "sql"
    doc = _bench(pgstore_database, tmp_path, "--only", "stats", "--no-chart",
                 "--stats-base-sql", str(base))
    assert doc["errors"] == {}
    stats = doc["results"]["stats"]
    assert (stats["small_rows"], stats["big_rows"]) == (200, 5_000)  # --quick sizes
    assert sorted(stats["store_stats_us"]) == [
        "after_big", "after_small", "base_big", "base_small", "before_big", "before_small"]
    for name, st in [*stats["store_stats_us"].items(), *stats["writes_us"].items()]:
        assert _positive(st["median"]) and st["n"] == 3, name  # --quick repeats
    for side in ("before", "base", "after"):
        assert _positive(stats["growth"][side]["median"])
    assert _positive(stats["write_ratio"]["lease_mark"]["median"])
    assert stats["base_sql"] == str(base)
    for op in ("store_stats_big", "lease_mark", "cancel"):
        assert _positive(stats["base_ratio"][op]["median"]), op
    text = (tmp_path / "results.md").read_text()
    assert "store_stats() with 200 vs 5,000 finished jobs" in text
    assert "The write path at 200 finished jobs, pgstore_0013 against head" in text
    assert "The write path at 200 finished jobs, base against head" in text


NODE_PEERS = ("graphile-worker", "pg-boss")


@pytest.mark.slow
def test_quick_bench_of_the_peers(pgstore_database: str, tmp_path: Path) -> None:
    """Every system drains 120 jobs at W = 1 and 2, each job seen once and finished in the
    database; the Node peers too where node and npm are there (npm installs them once
    into the git-ignored .bench-cache)."""
    for peer in ("procrastinate", "pgqueuer"):
        if importlib.util.find_spec(peer) is None:
            pytest.skip(f"{peer} is not installed (the bench extra: pip install -e '.[bench]')")
    node = shutil.which("node") is not None and shutil.which("npm") is not None
    systems = ["pgstore", "pgstore_batch", "pgstore_unprepared", "pgstore_sql", "procrastinate",
               "pgqueuer"]
    peers_expected = {"procrastinate", "pgqueuer"} | (set(NODE_PEERS) if node else set())
    doc = _bench(pgstore_database, tmp_path, "--only", "peers", "--peer-jobs", "120",
                 "--workers", "1,2", "--peer-systems", ",".join(systems + list(NODE_PEERS)),
                 "--no-chart")
    assert doc["errors"] == {}
    peers = doc["results"]["peers"]
    assert peers["all_checks_ok"]
    assert set(peers["systems"]) == set(systems) | (set(NODE_PEERS) if node else set())
    for name, per in peers["systems"].items():
        for w in ("1", "2"):
            (run,) = per[w]["runs"]
            assert run["leased"] == run["finished_in_db"] == 120, (name, w, run)
            assert run["duplicates"] == 0 and run["errors"] == [], (name, w, run)
            assert sum(run["per_worker"]) == 120 and len(run["per_worker"]) == int(w)
    unflushed = peers["unflushed"]
    assert unflushed["workers"] == 2 and set(unflushed["systems"]) == set(peers["systems"])
    for name, run in unflushed["systems"].items():
        assert run["ok"] and run["leased"] == run["finished_in_db"] == 60, (name, run)
    ours = {"pgstore", "pgstore_batch", "pgstore_unprepared", "pgstore_sql"}
    assert set(unflushed["over"]) == ours and set(peers["over"]) == ours
    for over in peers["over"].values():
        assert set(over) == peers_expected
    assert set(peers["peers"]) == set(peers["systems"])
    assert peers["peers"]["pgqueuer"]["settings"]["batch_size"] >= 1
    if node:
        for name in NODE_PEERS:
            assert peers["peers"][name]["version"], name
            assert peers["peers"][name]["node"], name
    assert peers["peers"]["pgstore_batch"]["settings"]["batch_size"] == BATCH_SIZE
    assert _check_ratios(doc) >= 6
    # The batched path's targets against every peer, each measured or said not to be.
    batch = {t["name"]: t for t in doc["targets"] if "pgstore_batch /" in t["name"]}
    assert set(batch) == {f"lease->dispatch jobs/s, pgstore_batch / {peer} at W=2"
                          for peer in ("procrastinate", "pgqueuer", *NODE_PEERS)}
    for peer in ("procrastinate", "pgqueuer", *(NODE_PEERS if node else ())):
        t = batch[f"lease->dispatch jobs/s, pgstore_batch / {peer} at W=2"]
        assert _positive(t["measured"]) and t["met"] in (True, False), t
    if not node:
        for peer in NODE_PEERS:
            t = batch[f"lease->dispatch jobs/s, pgstore_batch / {peer} at W=2"]
            assert t["measured"] is None and t["note"].startswith("not measured"), t


@pytest.mark.xdist_group("ha")
def test_quick_bench_of_the_ha_section(pgstore_database: str, tmp_path: Path) -> None:
    """The ``ha`` section builds a primary and a standby of its own and times the
    operations at each synchronous_commit level, then the 0007 floor against 0006."""
    from pgstore.bench._ha import EPOCH_COMMITS, EPOCH_SCHEMAS, OPS, REPLICATION

    doc = _bench(pgstore_database, tmp_path, "--only", "ha", "--no-chart")
    assert doc["errors"] == {}
    ha = doc["results"]["ha"]
    by_setting = ha["replication"]["by_setting"]
    assert list(by_setting) == list(REPLICATION)
    for setting in REPLICATION:
        assert list(by_setting[setting]) == list(OPS)
        for op in OPS:
            assert by_setting[setting][op]["ratio"]["n"] == 3, (setting, op)  # --quick repeats
    assert all(by_setting["local"][op]["ratio"]["median"] == 1.0 for op in OPS)
    assert list(ha["epoch"]["by_commit"]) == list(EPOCH_COMMITS)
    for epoch in ha["epoch"]["by_commit"].values():
        assert list(epoch["by_revision"]) == [name for name, _ in EPOCH_SCHEMAS]
        assert set(epoch["within_spread"]) == set(OPS)
        assert all(v in (True, False) for v in epoch["within_spread"].values())
    assert _check_ratios(doc) == len(OPS) * (
        len(REPLICATION) + len(EPOCH_COMMITS) * len(EPOCH_SCHEMAS))
    names = [t["name"] for t in doc["targets"]]
    assert names == [f"{op} pgstore_0007 / pgstore_0006, no standby, synchronous_commit {level}"
                     for level in EPOCH_COMMITS for op in ("claim_due", "job_lease")]
    text = (tmp_path / "results.md").read_text()
    assert "synchronous_commit = local" in text and "0007 / 0006" in text
    leftovers = psycopg_schemas(pgstore_database)
    assert not [s for s in leftovers if s.startswith("pgstore_bench_")], leftovers


def psycopg_schemas(dsn: str) -> list[str]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()]


@pytest.mark.slow
def test_the_node_peers_are_skipped_in_one_line_without_node(
    pgstore_database: str, tmp_path: Path
) -> None:
    """With no node on the PATH: one line says so, the Python systems still run."""
    python_dir = str(Path(sys.executable).parent)
    doc = _bench(pgstore_database, tmp_path, "--only", "peers", "--peer-jobs", "40",
                 "--workers", "1", "--peer-systems", "pgstore,graphile-worker,pg-boss",
                 "--no-chart", path=python_dir)
    peers = doc["results"]["peers"]
    assert set(peers["systems"]) == {"pgstore"}
    assert set(peers["skipped"]) == set(NODE_PEERS)
    assert all("not found on the PATH" in why for why in peers["skipped"].values())
    assert "skipped" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_quick_burst_dispatches_every_job_once_and_draws_the_chart(
    pgstore_database: str, tmp_path: Path
) -> None:
    doc = _bench(pgstore_database, tmp_path, "--only", "burst", "--burst-jobs", "600",
                 "--burst-workers", "2", "--burst-systems", "pgstore_batch,pgstore_single")
    assert doc["errors"] == {}
    burst = doc["results"]["burst"]
    assert burst["all_checks_ok"] and burst["jobs"] == 600 and burst["workers"] == 2
    assert sorted(burst["systems"]) == ["pgstore_batch", "pgstore_single"]
    for name, st in burst["systems"].items():
        (run,) = st["runs"]
        assert run["exactly_once"] and run["errors"] == [], (name, run)
        assert run["timeline"][-1][1] == 600  # every job, on the line drawn
        assert run["drain_s"] > 0 and run["jobs_per_s"] > 0
        assert run["lateness_ms"]["p50"] <= run["lateness_ms"]["p99"] <= run["lateness_ms"]["max"]
    batch = burst["systems"]["pgstore_batch"]["runs"][0]["detail"]
    single = burst["systems"]["pgstore_single"]["runs"][0]["detail"]
    # Batched, or one job a call (counted from the last look before T: every lease of a
    # due job, and at most a few idle polls).
    assert batch["lease_calls"] < 600 / 10 and single["lease_calls"] >= 600
    # The due times were moved to T, and the tables vacuumed, before T.
    assert batch["due_before_t_ms"] > 0 and single["due_before_t_ms"] > 0
    assert _positive(burst["batch_over"]["pgstore_single"]["median"])
    names = [t["name"] for t in doc["targets"]]
    assert any("T to last dispatch" in n for n in names)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "burst.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


BURST_PEERS = ("procrastinate", "pgqueuer", *NODE_PEERS)


@pytest.mark.slow
def test_quick_burst_of_the_peers(pgstore_database: str, tmp_path: Path) -> None:
    """Every peer of the burst stores 300 jobs due at T and drains them with its own
    statements from two workers started before T, each job dispatched once; the Node
    peers where node and npm are there, else each one said "not measured" and why."""
    for peer in ("procrastinate", "pgqueuer"):
        if importlib.util.find_spec(peer) is None:
            pytest.skip(f"{peer} is not installed (the bench extra: pip install -e '.[bench]')")
    node = shutil.which("node") is not None and shutil.which("npm") is not None
    doc = _bench(pgstore_database, tmp_path, "--only", "burst", "--burst-jobs", "300",
                 "--burst-workers", "2", "--burst-systems",
                 ",".join(("pgstore_batch", *BURST_PEERS)), "--no-chart")
    assert doc["errors"] == {}
    burst = doc["results"]["burst"]
    measured = {"pgstore_batch", *(BURST_PEERS if node else BURST_PEERS[:2])}
    assert set(burst["systems"]) == measured and burst["all_checks_ok"]
    assert set(burst["skipped"]) == (set() if node else set(NODE_PEERS))
    for name, st in burst["systems"].items():
        (run,) = st["runs"]
        assert run["exactly_once"] and run["errors"] == [], (name, run)
        assert run["timeline"][-1][1] == 300, name
        assert 0 <= run["lateness_ms"]["p50"] <= run["lateness_ms"]["max"], name
        assert run["drain_s"] > 0, name
        # Every system's due times moved to T, and its tables vacuumed, before T.
        assert run["detail"]["due_before_t_ms"] > 0, name
    assert set(burst["batch_over"]) == measured - {"pgstore_batch"}
    text = (tmp_path / "results.md").read_text()
    for name in BURST_PEERS:
        assert f"| {name} |" in text, name


def test_a_burst_peer_that_cannot_run_is_reported_not_measured(
    pgstore_database: str, tmp_path: Path
) -> None:
    """Without node on the PATH the Node peers of the burst are listed as not measured,
    with why, in the results and in results.md; the others still run."""
    bare = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if not (Path(p) / "node").exists())
    doc = _bench(pgstore_database, tmp_path, "--only", "burst", "--burst-jobs", "100",
                 "--burst-workers", "1", "--burst-systems", "pgstore_batch,graphile-worker",
                 "--no-chart", path=bare)
    burst = doc["results"]["burst"]
    assert set(burst["systems"]) == {"pgstore_batch"} and burst["all_checks_ok"]
    assert set(burst["skipped"]) == {"graphile-worker"}
    assert "| graphile-worker | not measured: " in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_peer_drains_are_scaled_to_peer_seconds_and_recorded(
    pgstore_database: str, tmp_path: Path
) -> None:
    """With ``--peer-seconds``, each system's drains take the job count its first, untimed
    drain of ``--peer-jobs`` says lasts that long (``scaled_jobs``), and the counts and the
    first drain's rate are recorded (speed itself is not asserted)."""
    from pgstore.bench._common import Settings
    from pgstore.bench._peers import scaled_jobs

    doc = _bench(pgstore_database, tmp_path, "--only", "peers", "--peer-jobs", "100",
                 "--peer-seconds", "0.5", "--workers", "1",
                 "--peer-systems", "pgstore,pgstore_batch", "--no-chart")
    peers = doc["results"]["peers"]
    assert peers["all_checks_ok"] and peers["min_seconds"] == 0.5
    cfg = Settings(dsn="", out=tmp_path, peer_jobs=100, peer_seconds=0.5)
    for name in ("pgstore", "pgstore_batch"):
        rate = peers["calibration_jobs_per_s"][name]["1"]
        jobs = peers["jobs_per_drain"][name]["1"]
        assert rate > 0 and jobs == scaled_jobs(rate, cfg) >= 100, (name, rate, jobs)
        (run,) = peers["systems"][name]["1"]["runs"]
        assert run["jobs"] == jobs and run["finished_in_db"] == jobs
        assert peers["unflushed"]["jobs_per_drain"][name] >= 100
    assert "Jobs per drain" in (tmp_path / "results.md").read_text()
    assert isinstance(peers["short_drains"], dict)


def test_scaled_jobs_and_peer_seconds_bounds() -> None:
    """A drain is sized for ``peer_seconds`` with the margin, in round steps, never below
    ``peer_jobs``; a negative ``--peer-seconds`` is refused."""
    from pgstore.bench import parser
    from pgstore.bench._common import Settings
    from pgstore.bench._peers import SCALE_MARGIN, SCALE_STEP, scaled_jobs

    cfg = Settings(dsn="", out=Path("."), peer_jobs=20_000, peer_seconds=10.0)
    assert scaled_jobs(10_000.0, cfg) >= 10_000 * 10 * SCALE_MARGIN
    assert scaled_jobs(10_000.0, cfg) % SCALE_STEP == 0
    assert scaled_jobs(100.0, cfg) == 20_000
    with pytest.raises(SystemExit):
        parser().parse_args(["--peer-seconds", "-1"])
    assert parser().parse_args(["--peer-seconds", "0"]).peer_seconds == 0.0


def test_the_pgqueuer_loop_imports_pgqueuer_before_the_drain() -> None:
    """Building pgqueuer's loop (before the worker reports ready) imports pgqueuer and
    renders its dequeue statement; the drain itself has nothing left to import. (No
    connection is touched until the drain: None stands in for it.)"""
    if importlib.util.find_spec("pgqueuer") is None:
        pytest.skip("pgqueuer is not installed (the bench extra: pip install -e '.[bench]')")
    code = (
        "import sys\n"
        "from pgstore.bench._peers import _loop_pgqueuer\n"
        "assert 'pgqueuer' not in sys.modules\n"
        "drain = _loop_pgqueuer(None, 'peer_pgqueuer', 'me')\n"
        "assert callable(drain), drain\n"
        "assert 'pgqueuer.adapters.persistence.qb' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_quick_bench_of_the_queue_floor(pgstore_database: str, tmp_path: Path) -> None:
    """Every variant drains all its jobs (each marked done, none left), and reports its
    costs a job and their ratios to the text-keyed bare queue."""
    from pgstore.bench._floor import VARIANTS

    doc = _bench(pgstore_database, tmp_path, "--only", "queue-floor", "--floor-jobs", "1200",
                 "--floor-single-jobs", "30", "--no-chart")
    assert doc["errors"] == {}
    floor = doc["results"]["queue-floor"]
    assert floor["all_checks_ok"]
    assert (floor["jobs"], floor["single_jobs"], floor["repeats"]) == (1200, 30, 1)
    assert list(floor["variants"]) == list(VARIANTS)
    for name, v in floor["variants"].items():
        want = 30 if name == "pgstore_single" else 1200
        (run,) = v["runs"]
        assert v["ok"] and run["jobs"] == want and run["left"] == 0, (name, run)
        for m in ("client_cpu_us", "jobs_per_s"):
            assert _positive(v[m]["median"]), (name, m)
        for m in ("server_cpu_us", "server_sched_us", "server_lease_us", "server_mark_us"):
            assert v[m] is None or v[m]["median"] >= 0, (name, m)  # None: server not local
    assert set(floor["over_bare_text"]) == set(VARIANTS) - {"bare_text"}
    for name, over in floor["over_bare_text"].items():
        assert _positive(over["client_cpu_us"]["ratio"]["median"]), name
        assert _positive(over["jobs_per_s"]["ratio"]["median"]), name
    assert _check_ratios(doc) >= 2 * (len(VARIANTS) - 1)
    assert "Queue floor: one process drains" in (tmp_path / "results.md").read_text()


def test_queue_floor_drains_only_the_variants_asked_for(
    pgstore_database: str, tmp_path: Path
) -> None:
    """``--floor-variants dispatcher``: the Dispatcher's drain alone (its client CPU a
    job, against the 15 µs target), no ratios without ``bare_text``."""
    doc = _bench(pgstore_database, tmp_path, "--only", "queue-floor", "--floor-jobs", "600",
                 "--floor-variants", "dispatcher", "--no-chart")
    assert doc["errors"] == {}
    floor = doc["results"]["queue-floor"]
    assert floor["all_checks_ok"] and list(floor["variants"]) == ["dispatcher"]
    (run,) = floor["variants"]["dispatcher"]["runs"]
    assert run["jobs"] == 600 and run["left"] == 0 and _positive(run["client_cpu_us"])
    assert floor["over_bare_text"] == {}
    assert "Dispatcher client CPU a job" in (tmp_path / "results.md").read_text()


def test_queue_floor_drains_the_batch_path_of_another_sql_directory_beside_its_own(
    pgstore_database: str, tmp_path: Path
) -> None:
    """``--floor-base-sql``: base_batch, the batch path on a schema loaded from that
    directory, runs next to pgstore_batch, drains every job and gets its ratios."""
    from pgstore.bench._floor import BASE_VARIANT, VARIANTS
    from pgstore.schema.files import sql_dir

    doc = _bench(pgstore_database, tmp_path, "--only", "queue-floor", "--floor-jobs", "600",
                 "--floor-single-jobs", "10", "--floor-base-sql", str(sql_dir()), "--no-chart")
    assert doc["errors"] == {}
    floor = doc["results"]["queue-floor"]
    assert floor["all_checks_ok"]
    at = VARIANTS.index("pgstore_batch") + 1
    assert list(floor["variants"]) == [*VARIANTS[:at], BASE_VARIANT, *VARIANTS[at:]]
    (run,) = floor["variants"][BASE_VARIANT]["runs"]
    assert run["jobs"] == 600 and run["left"] == 0
    assert _positive(floor["over_bare_text"][BASE_VARIANT]["jobs_per_s"]["ratio"]["median"])


def test_quick_bench_of_the_limits_section(pgstore_database: str, tmp_path: Path) -> None:
    """``--only limits`` drains an unlimited, a concurrency-limited, a rate-limited and a
    both-limited queue on each path, every job dispatched, with each kind's costs a job
    and ratios to the unlimited queue; ``--limits-base-sql`` adds the same on a schema
    loaded from that directory."""
    from pgstore.bench._limits import KINDS, PATHS
    from pgstore.schema.files import sql_dir

    doc = _bench(pgstore_database, tmp_path, "--only", "limits", "--limits-jobs", "300",
                 "--limits-single-jobs", "20", "--limits-repeats", "1",
                 "--limits-base-sql", str(sql_dir()), "--no-chart")
    assert doc["errors"] == {}
    limits = doc["results"]["limits"]
    assert limits["all_checks_ok"]
    assert limits["sizes"] == {"batch": 300, "single": 20}
    assert list(limits["schemas"]) == ["head", "base"]
    for name, paths in limits["schemas"].items():
        assert list(paths) == list(PATHS)
        for path, kinds in paths.items():
            assert list(kinds) == list(KINDS)
            for kind, v in kinds.items():
                (run,) = v["runs"]
                assert v["ok"] and run["jobs"] == (300 if path == "batch" else 20)
                assert _positive(v["jobs_per_s"]["median"]), (name, path, kind)
                assert _positive(v["jobs_per_s_over_unlimited"]["median"]), (name, path, kind)
    assert "Queue limits: one process drains" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_peer_counts_count_each_drain_per_thousand_jobs(
    pgstore_database: str, tmp_path: Path
) -> None:
    """``--peer-counts``: each timed drain reports what it cost the server per 1,000 jobs,
    and the bench's own transactions (the wait sampler polls every 5 ms: hundreds a
    second) are not among the commits. pgqueuer's loop over 2,000 jobs in batches of 500
    sends and commits 4 dequeues, 4 acknowledgements and 3 empty dequeues: 5.5 a 1,000
    jobs."""
    if importlib.util.find_spec("pgqueuer") is None:
        pytest.skip("pgqueuer is not installed (the bench extra: pip install -e '.[bench]')")
    doc = _bench(pgstore_database, tmp_path, "--only", "peers", "--peer-jobs", "2000",
                 "--workers", "1", "--peer-systems", "pgstore_batch,pgqueuer", "--no-chart",
                 "--peer-counts")
    peers = doc["results"]["peers"]
    assert peers["all_checks_ok"]
    costs = peers["counted"]["unit_costs_us"]
    for when in ("before", "after"):
        assert _positive(costs[when]["round_trip_us"]), costs
        assert _positive(costs[when]["durable_update_us"]), costs
    for name in ("pgstore_batch", "pgqueuer"):
        (run,) = peers["systems"][name]["1"]["runs"]
        counts = run["counts"]
        assert peers["systems"][name]["1"]["counts"]["commits"] == counts["commits"]
        # A 500-job batch is leased and marked in a commit each, at least (pgstore_batch
        # leases 1, 2, 4, ... jobs a call at first, and checks the queue when idle).
        assert 4.0 <= counts["commits"] <= 30.0, (name, counts)
        assert counts["wal_kb"] > 0 and counts["wal_records"] >= 1000, (name, counts)
        assert _positive(counts["client_cpu_us"]) and _positive(counts["server_cpu_us"])
        # The system's own backends, a part of the server's CPU.
        assert _positive(counts["backend_cpu_us"]), counts
        assert ("statements" in counts) == peers["counted"]["pg_stat_statements"]
        assert "counts" in peers["unflushed"]["systems"][name]
    text = (tmp_path / "results.md").read_text()
    assert "Counts a 1,000 jobs" in text and "Unit costs" in text
    counts = peers["systems"]["pgqueuer"]["1"]["counts"]
    # Up to 4 more a drain: autovacuum's, what the backends reported late.
    assert 5.5 <= counts["commits"] <= 8.0, counts
    if "statements" in counts:
        assert counts["statements"] == 5.5, counts


def test_peer_counts_per_job_takes_the_bench_own_work_off() -> None:
    """The arithmetic of a drain's counts: deltas per 1,000 jobs, less the wait sampler's
    polls and server CPU and the first snapshot's own commit."""
    from pgstore.bench._counts import Counted, Snapshot, median_counts

    values = {"commits": 0.0, "wal_records": 0.0, "wal_bytes": 0.0, "wal_flushes": 0.0,
              "wal_writes": 0.0}
    counted = Counted("", statements=True,
                      before=Snapshot(dict(values), {"lease": (10, 0, 5.0)}, server_cpu_s=1.0))
    after = Snapshot({"commits": 1421.0, "wal_records": 20_000.0, "wal_bytes": 2_048_000.0,
                      "wal_flushes": 40.0, "wal_writes": 44.0},
                     {"lease": (30, 1024_000, 105.0), "mark": (20, 1024_000, 50.0)},
                     server_cpu_s=3.5)
    out = counted.per_job(10_000, after, own_commits=1000, own_cpu_s=0.5,
                          backend_s=(1.2, 0.1), client_s=(1.5, 0.3))
    assert out["commits"] == 42.0  # (1421 - 1000 polls - 1 snapshot) / 10
    assert out["wal_flushes"] == 4.0 and out["wal_writes"] == 4.4
    assert out["wal_records"] == 2000.0 and out["wal_kb"] == 200.0
    assert out["server_cpu_us"] == 200.0 and out["client_cpu_us"] == 150.0
    assert out["backend_cpu_us"] == 120.0 and out["backend_runq_us"] == 10.0
    assert out["client_runq_us"] == 30.0
    assert out["statements"] == 4.0
    assert out["top_statements"][0] == {"query": "lease", "calls": 2.0, "wal_kb": 100.0,
                                        "exec_us_a_job": 10.0}
    assert median_counts([out, {**out, "commits": 40.0}, {**out, "commits": 50.0}]) == {
        **{k: v for k, v in out.items() if k != "top_statements"}, "commits": 42.0}


def test_pgstore_batch_loop_counts_the_leases_in_a_row_that_found_nothing(
    pgstore_database: str,
) -> None:
    """The store of pgstore_batch's peer loop counts the lease calls in a row that found
    nothing, single or batched, and a call that leases a job starts the count again: the
    loop stops after ``EMPTY_RETRIES`` of them, as pgqueuer's stops after as many empty
    dequeues, with no query of its own."""
    import asyncio

    import psycopg

    from pgstore.bench._common import drop_schema, fresh_store_schema, ident
    from pgstore.bench._peers import empty_leases_store

    schema = "pgstore_bench_test_empty_leases"
    fresh_store_schema(pgstore_database, schema)

    async def main() -> list[int]:
        conn = await psycopg.AsyncConnection.connect(pgstore_database, autocommit=True)
        async with conn:
            store = empty_leases_store()(conn, schema=schema)
            seen = [store.empty]
            assert await store.lease("me", None, 30_000) is None
            assert await store.lease_many("me", None, 30_000, 10) == []
            seen.append(store.empty)
            await conn.execute(f"INSERT INTO {ident(schema)}.jobs (run_id, dispatch_at)"
                               f" VALUES ('a', 1), ('b', 2), ('c', 3)".encode())
            assert [j.run_id for j in await store.lease_many("me", None, 30_000, 2)] == [
                "a", "b"]
            job = await store.lease("me", None, 30_000)
            assert job is not None and job.run_id == "c"
            seen.append(store.empty)
            assert await store.lease_many("me", None, 30_000, 10) == []
            seen.append(store.empty)
            await store.close()
            return seen

    try:
        assert asyncio.run(main()) == [0, 2, 0, 1]
    finally:
        with psycopg.connect(pgstore_database, autocommit=True) as conn:
            drop_schema(conn, schema)
