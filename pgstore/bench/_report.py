"""Targets, the printed table, the markdown table, and the chart."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from pgstore.bench._common import spread_pct
from pgstore.bench._limits import limits_table
from pgstore.bench._ops import MODES

SINGLE_ROW_OPS = ("claim_due", "renew", "complete", "register_unchanged", "job_lease",
                  "job_renew", "job_mark_dispatched", "job_cancel")
MODE_LABELS = {"sync": "sync wrapper", "sync_unprepared": "sync, prepare=False",
               "async": "async wrapper", "async_unprepared": "async, prepare=False",
               "sql": "SQL"}


#: What each of our peer-loop systems must reach against each peer at the largest W.
PEER_BOUNDS: dict[str, tuple[tuple[str, float], ...]] = {
    "pgstore": (("procrastinate", 1.5), ("pgqueuer", 3.0)),
    "pgstore_batch": (("procrastinate", 3.0), ("pgqueuer", 5.0), ("graphile-worker", 1.0),
                      ("pg-boss", 1.0)),
}
PEER_NOTES = {"pgqueuer": "pgqueuer at its best batch size (500 of 1, 10, 100, 500)",
              "graphile-worker": "graphile-worker with its batching on"}


def _target(name: str, measured: Any, op: str, bound: float, why: str = "") -> dict[str, Any]:
    value = None if measured is None else float(measured)
    met = None if value is None else (value <= bound if op == "<=" else value >= bound)
    return {"name": name, "measured": value, "op": op, "target": bound, "met": met,
            "note": why}


def targets(results: dict[str, Any], nproc: int) -> list[dict[str, Any]]:
    """Every target this run measured, measured ratio against bound."""
    out: list[dict[str, Any]] = []
    ops = results.get("ops")
    if ops:
        for name in SINGLE_ROW_OPS:
            for mode in MODES:
                r = ops["ops"][name][mode]["ratio"]["median"]
                out.append(_target(f"{name} ({mode}) / durable UPDATE", r, "<=", 1.1))
            sync, sql = (ops["ops"][name][m]["ratio"]["median"] for m in ("sync", "sql"))
            out.append(_target(f"{name}: default sync wrapper / SQL", sync / sql, "<=", 1.05,
                               "medians of each one's ratio to its adjacent durable UPDATE"))
        out.append(_target("claim_next(100) / claim_due one by one, records/s",
                           ops["claim_next_vs_claim_due"]["ratio"]["median"], ">=", 30))
    naive = results.get("naive")
    if naive:
        out.append(_target("naive BEGIN/SELECT FOR UPDATE/UPDATE/COMMIT / claim_due",
                           naive["naive_over_ours"]["ratio"]["median"], ">=", 1.4))
        out.append(_target("schedule_claim_due (SQL function) / its UPDATE sent bare, prepared",
                           1 / naive["bare_over_ours"]["ratio"]["median"], "<=", 1.05))
    peers = results.get("peers")
    if peers:
        top = str(max(peers["workers"]))
        for mine, over in peers.get("over", {}).items():
            for peer, bound in PEER_BOUNDS.get(mine, PEER_BOUNDS["pgstore"]):
                if peer in over:
                    out.append(_target(f"lease->dispatch jobs/s, {mine} / {peer} at W={top}",
                                       over[peer][top]["ratio"]["median"], ">=", bound,
                                       PEER_NOTES.get(peer, "")))
                elif mine == "pgstore_batch":
                    why = (peers.get("skipped") or {}).get(peer, "not in this run")
                    out.append(_target(f"lease->dispatch jobs/s, {mine} / {peer} at W={top}",
                                       None, ">=", bound, f"not measured: {why}"))
        for mine in peers.get("scaling", {}):
            ws = [w for w in peers["workers"] if w <= nproc]
            prev = None
            for w in ws:
                med = peers["systems"][mine][str(w)]["jobs_per_s"]["median"]
                if prev is not None:
                    out.append(_target(f"lease->dispatch jobs/s, {mine} W={w} / W={prev[0]}"
                                       f" (up to {nproc} cores)", med / prev[1], ">=", 1.0))
                prev = (w, med)
        out.append(_target("all peer runs: no job leased twice, all finished",
                           1.0 if peers["all_checks_ok"] else 0.0, ">=", 1.0))
    scale = results.get("scale")
    if scale:
        rows = f"{scale['big_rows']:,}"
        for case in ("job_lease", "job_lease_future_priority", "claim_due",
                     "claim_next_100_no_ids"):
            if case in scale["cases"]:
                out.append(_target(f"{case} at {rows} rows / at {scale['small_rows']:,}",
                                   scale["cases"][case]["ratio"]["median"], "<=", 1.1))
        batch = scale.get("lease_mark_batch")
        if batch:
            out.append(_target(f"lease_many+mark_many per job, head / {batch['before_revision']}",
                               batch["ratio"]["median"], "<=", 1.1))
        lease_cpu = scale.get("lease_cpu")
        if lease_cpu:
            big = lease_cpu["tables"]["big"]
            for case, c in lease_cpu["head"].items():
                out.append(_target(
                    f"{case} server CPU with {big['finished']:,} finished and "
                    f"{big['future_priority']:,} future priority jobs / due jobs alone",
                    c["ratio"]["median"], "<=", 1.1))
    hot = results.get("hot")
    if hot:
        out.append(_target("claims HOT share", hot["claims_hot_share"]["ratio"], ">=", 0.95))
    ha = results.get("ha")
    if ha:
        for level, epoch in ha["epoch"]["by_commit"].items():
            by = epoch["by_revision"]
            for op in ("claim_due", "job_lease"):  # the calls that read the timeline
                out.append(_target(
                    f"{op} pgstore_0007 / pgstore_0006, no standby, synchronous_commit {level}",
                    by["0007"][op]["ratio"]["median"], "<=", by["0006b"][op]["ratio"]["max"],
                    "bound: the largest 0006 / 0006 ratio of the run"))
    retention = results.get("retention")
    if retention:
        rows = f"{retention['history_rows']:,}"
        for case, what in (("big_before_purge", f"{rows} finished jobs"),
                           ("big_after_autovacuum", f"{rows} finished, purged, vacuumed")):
            c = retention["cases"][case]
            out.append(_target(f"job_lease with {what} / {retention['kept_rows']:,}",
                               c["ratio"]["median"], "<=", 1.1))
            out.append(_target(f"job_lease buffers with {what} / {retention['kept_rows']:,}",
                               c["buffers"]["other"] / max(c["buffers"]["small"], 1), "<=", 1.1))
    floor = results.get("queue-floor")
    if floor:
        for name in ("pgstore_batch",):
            over = floor["over_bare_text"].get(name, {}).get("server_sched_us")
            if over:
                out.append(_target(f"queue floor: {name} / bare text-keyed queue, server CPU"
                                   " a job", over["ratio"]["median"], "<=", 1.2))
        dispatcher = floor["variants"].get("dispatcher", {}).get("client_cpu_us")
        if dispatcher:
            out.append(_target("queue floor: Dispatcher client CPU a job (µs)",
                               dispatcher["median"], "<=", 15))
    burst = results.get("burst")
    if burst and "pgstore_batch" in burst["systems"]:
        mine = burst["systems"]["pgstore_batch"]
        n, w = f"{burst['jobs']:,}", burst["workers"]
        out.append(_target(f"burst of {n}, pgstore_batch W={w}: T to last dispatch (s)",
                           mine["drain_s"]["median"], "<=", 5.0))
        out.append(_target(f"burst of {n}, pgstore_batch W={w}: lateness p99 (s)",
                           mine["lateness_p99_ms"]["median"] / 1000, "<=", 5.0))
        cpu = mine.get("cpu_us_per_job") or {}
        if cpu.get("median") is not None:
            out.append(_target(f"burst, pgstore_batch: CPU µs per job (workers + server), at"
                               f" most what {nproc} cores give 5 s of {n}",
                               cpu["median"], "<=", nproc * 5e6 / burst["jobs"]))
        if "procrastinate" in burst["batch_over"]:
            out.append(_target(f"burst lease->dispatch jobs/s, pgstore_batch / procrastinate"
                               f" at W={w}", burst["batch_over"]["procrastinate"]["median"],
                               ">=", 3.0))
        out.append(_target("all bursts: every job dispatched exactly once",
                           1.0 if burst["all_checks_ok"] else 0.0, ">=", 1.0))
    return out


def _us(stat: dict[str, Any]) -> str:
    return f"{stat['median']:.0f} µs (±{spread_pct(stat) / 2:.0f}%)"


def _x(stat: dict[str, Any]) -> str:
    return f"{stat['median']:.2f}x ({stat['min']:.2f}-{stat['max']:.2f})"


def tables(results: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every measured section."""
    out: list[tuple[str, list[str], list[list[str]]]] = []
    floors = results.get("floors")
    if floors:
        out.append(("Floors (same connection)", ["what", "per call", "spread min-max"], [
            ["SELECT 1", _us(floors["select1"]),
             f"{floors['select1']['min']:.0f}-{floors['select1']['max']:.0f} µs"],
            ["durable one-row UPDATE", _us(floors["durable_update"]),
             f"{floors['durable_update']['min']:.0f}-{floors['durable_update']['max']:.0f} µs"],
        ]))
    ops = results.get("ops")
    if ops:
        rows = []
        for name, entry in ops["ops"].items():
            rows.append([name] + [
                f"{entry[m]['us']['median']:.0f} µs · {_x(entry[m]['ratio'])}" for m in MODES])
        rows.append(["claim_next(100) vs claim_due, records/s",
                     _x(ops["claim_next_vs_claim_due"]["ratio"])] + [""] * (len(MODES) - 1))
        out.append((f"Store operations, ratio to the adjacent durable UPDATE "
                    f"(floor {ops['floor_durable_update']['median']:.0f} µs)",
                    ["operation"] + [MODE_LABELS[m] for m in MODES], rows))
        built = ops.get("rows_built")
        if built:
            def cell(stat: dict[str, Any], init: bool) -> str:
                ratio = stat["client_cpu_over_slots"]["ratio"]
                return (f"{stat['client_cpu_us']['median']:.1f} µs"
                        + (f" · {_x(ratio)}" if init else "")
                        + f" [{stat['overhead_us']['median']:+.0f} µs]")

            out.append(("Models built by their slots (shipped) or by their constructor: "
                        "the client thread's CPU a call, constructor / slots in the same "
                        "repeat [wall-clock overhead over that repeat's SQL]",
                        ["operation", "sync, slots", "sync, constructor", "async, slots",
                         "async, constructor"],
                        [[name] + [cell(entry[m], m.endswith("_init"))
                                   for m in ("sync", "sync_init", "async", "async_init")]
                         for name, entry in built["ops"].items()]))
            out.append(("Decoding real rows into models, no server (interleaved)",
                        ["rows", "slots (shipped)", "constructor", "constructor / slots"],
                        [[label, f"{d['slots_us']['median']:.2f} µs",
                          f"{d['init_us']['median']:.2f} µs", _x(d["init_over_slots"]["ratio"])]
                         for label, d in built["decode"].items()]))
    naive = results.get("naive")
    if naive:
        out.append(("Naive transaction vs our claim (SQL)", ["what", "per call", "ratio"], [
            ["schedule_claim_due", _us(naive["ours_claim_due_sql"]["us"]), "1.00x"],
            ["BEGIN; SELECT … FOR UPDATE; UPDATE; COMMIT", _us(naive["naive_transaction"]["us"]),
             _x(naive["naive_over_ours"]["ratio"])],
        ] + ([] if "bare_update" not in naive else [
            ["its UPDATE sent bare (prepared)", _us(naive["bare_update"]["us"]),
             _x(naive["bare_over_ours"]["ratio"])],
            ["durable one-row UPDATE (floor)", _us(naive["floor_durable_update"]), ""],
            ["bare UPDATE / floor", "", _x(naive["bare_update"]["ratio"])],
        ])))
    peers = results.get("peers")
    if peers and peers["systems"]:
        ws = peers["workers"]
        rows = []
        for name, per in peers["systems"].items():
            rows.append([name] + [
                f"{per[str(w)]['jobs_per_s']['median']:.0f} "
                f"({per[str(w)]['jobs_per_s']['min']:.0f}-{per[str(w)]['jobs_per_s']['max']:.0f})"
                + ("" if per[str(w)]["checks_ok"] else " FAILED") for w in ws])
        for mine, over in peers.get("over", {}).items():
            for peer, per in over.items():
                rows.append([f"{mine} / {peer}"] + [_x(per[str(w)]["ratio"]) for w in ws])
        scaled = peers.get("min_seconds") and peers.get("jobs_per_drain")
        over = (f"drains of at least {peers['min_seconds']:g} s (job counts below)" if scaled
                else f"{peers['jobs']:,} jobs")
        out.append((f"Lease → mark dispatched, jobs/s over {over}",
                    ["system"] + [f"W={w}" for w in ws], rows))
        if scaled:
            out.append(("Jobs per drain (scaled from a first, untimed drain of "
                        f"{peers['jobs']:,} jobs)", ["system"] + [f"W={w}" for w in ws],
                        [[name] + [f"{per.get(str(w), 0):,}" for w in ws]
                         for name, per in peers["jobs_per_drain"].items()]))
        counted = peers.get("counted")
        if counted:
            names = ("commits", "statements", "wal_flushes", "wal_kb", "server_cpu_us",
                     "backend_cpu_us", "backend_runq_us", "client_cpu_us", "client_runq_us")
            out.append(("Counts a 1,000 jobs, medians (--peer-counts; CPU: µs a job)",
                        ["system", "W", *names],
                        [[name, w, *(str(c["counts"].get(n, "-")) for n in names)]
                         for name, per in peers["systems"].items()
                         for w, c in per.items() if "counts" in c]))
            out.append(("Unit costs (µs, medians)", ["when", "round trip", "durable UPDATE",
                                                      "unflushed UPDATE", "flush"],
                        [[when, *(str(u[k]) for k in ("round_trip_us", "durable_update_us",
                                                       "unflushed_update_us", "flush_us"))]
                         for when, u in counted["unit_costs_us"].items()]))
        if peers.get("short_drains"):
            out.append((f"Drains that still lasted under {peers['min_seconds']:g} s",
                        ["system", "seconds"],
                        [[k, f"{v:.1f}"] for k, v in peers["short_drains"].items()]))
        info = peers.get("peers") or {}
        if info:
            out.append(("The systems: versions and settings", ["system", "version", "settings"], [
                [name, str(i.get("version")) + (f" (node {i['node']})" if i.get("node") else ""),
                 ", ".join(f"{k}={v}" for k, v in i["settings"].items())]
                for name, i in info.items()]))
        for name, why in (peers.get("skipped") or {}).items():
            out.append((f"{name}: skipped", ["why"], [[why]]))
        unflushed = peers.get("unflushed")
        if unflushed and unflushed["systems"]:
            rows = [[name, f"{r['jobs_per_s']:.0f}" + ("" if r["ok"] else " FAILED"), ""]
                    for name, r in unflushed["systems"].items()]
            rows += [[f"{mine} / {peer}", "", f"{ratio:.2f}x"]
                     for mine, over in unflushed["over"].items() for peer, ratio in over.items()]
            out.append((f"The same loop at W={unflushed['workers']} with synchronous_commit off"
                        f" over {unflushed.get('jobs', peers['jobs']):,} jobs"
                        + (" at most" if unflushed.get("jobs_per_drain") else "")
                        + " (no flush waits: CPU-bound, one run each)",
                        ["system", "jobs/s", "ratio"], rows))
    scale = results.get("scale")
    if scale:
        rows = [[name, _us(c["small_us"]), _us(c["big_us"]), _x(c["ratio"])]
                for name, c in scale["cases"].items()]
        out.append((f"Scale: {scale['small_rows']:,} vs {scale['big_rows']:,} rows",
                    ["case", f"at {scale['small_rows']:,}", f"at {scale['big_rows']:,}",
                     "ratio"], rows))
        if scale.get("lease_cpu"):
            out.append(_lease_cpu_table(scale["lease_cpu"]))
    hot = results.get("hot")
    if hot:
        rows = []
        for table in ("schedules", "jobs"):
            for variant, r in hot[table].items():
                shares = ", ".join(f"{p} {v['hot_share']:.0%}" for p, v in r["phases"].items()
                                   if v["hot_share"] is not None)
                b, a = r["sizes_before"], r["sizes_after"]
                rows.append([f"{table} {variant}", shares,
                             f"{b['heap'] // 1024} → {a['heap'] // 1024} KiB",
                             f"{b['indexes'] // 1024} → {a['indexes'] // 1024} KiB"])
        out.append(("Write amplification: HOT share; heap and index sizes before → after",
                    ["variant", "HOT share", "heap", "indexes"], rows))
    retention = results.get("retention")
    if retention:
        from pgstore.bench._retention import CASE_LABELS

        rows = [[CASE_LABELS.get(name, name), _us(c["small_us"]), _us(c["other_us"]),
                 _x(c["ratio"]), f"{c['buffers']['other']} / {c['buffers']['small']}"]
                for name, c in retention["cases"].items()]
        for name, p in retention["purges"].items():
            rows.append([f"job_purge of the {name} table: {p['deleted']:,} jobs in "
                         f"{p['calls']} calls", f"{p['seconds']} s",
                         f"{p['jobs_per_s'] or 0:,} jobs/s", "", ""])
        out.append((f"Retention: job_lease with {retention['history_rows']:,} finished jobs"
                    f" against {retention['kept_rows']:,} (the purge keeps the newest"
                    f" {retention['kept_rows']:,}; vacuum after it: "
                    f"{retention['vacuum_after_purge']})",
                    ["case", f"at {retention['kept_rows']:,}", "this table", "ratio",
                     "buffers per lease (this / small)"], rows))
    stats = results.get("stats")
    if stats:
        from pgstore.bench._stats import BEFORE

        st, small, big = stats["store_stats_us"], stats["small_rows"], stats["big_rows"]
        sides = [("before", BEFORE), ("after", "head")]
        if "base_small" in st:
            sides.insert(1, ("base", "base (" + str(stats.get("base_sql")) + ")"))
        rows = [[f"store_stats() at {revision}", _us(st[f"{side}_small"]),
                 _us(st[f"{side}_big"]), _x(stats["growth"][side])]
                for side, revision in sides]
        out.append((f"store_stats() with {small:,} vs {big:,} finished jobs",
                    ["revision", f"at {small:,}", f"at {big:,}", "ratio"], rows))
        wr = stats["writes_us"]
        rows = [[label, _us(wr[f"{op}_before"]), _us(wr[f"{op}_after"]),
                 _x(stats["write_ratio"][op])]
                for op, label in (("lease_mark", "job_lease + job_mark_dispatched"),
                                  ("cancel", "job_cancel of a waiting job"))]
        cpu = stats.get("writes_cpu_us")
        if cpu:
            rows += [[f"{label}: server CPU", _us(cpu[f"{op}_before"]),
                      _us(cpu[f"{op}_after"]), _x(stats["write_cpu_ratio"][op])]
                     for op, label in (("lease_mark", "job_lease + job_mark_dispatched"),
                                       ("cancel", "job_cancel of a waiting job"))]
        out.append((f"The write path at {small:,} finished jobs, {BEFORE} against head",
                    ["call", BEFORE, "head", "ratio"], rows))
        if "lease_mark_base" in wr:
            rows = [[label, _us(wr[f"{op}_base"]), _us(wr[f"{op}_after"]),
                     _x(stats["base_ratio"][op])]
                    for op, label in (("lease_mark", "job_lease + job_mark_dispatched"),
                                      ("cancel", "job_cancel of a waiting job"))]
            base_cpu = stats.get("base_cpu_ratio")
            if cpu and base_cpu:
                rows += [[f"{label}: server CPU", _us(cpu[f"{op}_base"]),
                          _us(cpu[f"{op}_after"]), _x(base_cpu[op])]
                         for op, label in (("lease_mark", "job_lease + job_mark_dispatched"),
                                           ("cancel", "job_cancel of a waiting job"))]
            out.append((f"The write path at {small:,} finished jobs, base against head",
                        ["call", "base", "head", "ratio"], rows))
    floor = results.get("queue-floor")
    if floor:
        out.append(_floor_table(floor))
    limits = results.get("limits")
    if limits:
        out.append(limits_table(limits))
    wake = results.get("wakeup")
    if wake:
        rows = [["schedule → dispatch latency (idle dispatcher, 60 s poll)",
                 f"{wake['latency_ms']['median']:.2f} ms "
                 f"({wake['latency_ms']['min']:.2f}-{wake['latency_ms']['max']:.2f})"]]
        for name, st in wake["cost_us"].items():
            rows.append([name, _us(st)])
        rows.append([f"NOTIFY cost (job_schedule - {wake['notify_cost_against']})",
                     f"{wake['notify_cost_us']['median']:.0f} µs"])
        out.append(("Wake-up", ["what", "value"], rows))
    ha = results.get("ha")
    if ha:
        out += _ha_tables(ha)
    burst = results.get("burst")
    if burst:
        out.append((f"Burst: {burst['jobs']:,} jobs due at one instant, W={burst['workers']}"
                    " worker processes per system (median (min-max) of the repeats)",
                    ["system", "T → last dispatch (s)", "jobs/s", "lateness p50 (s)",
                     "p99 (s)", "max (s)", "CPU µs/job (workers + server)", "exactly once"],
                    _burst_rows(burst)))
    return out


def _lease_cpu_table(lc: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """The scale section's lease_cpu cases: each table's cost a call, and the ratios."""
    tables = lc["tables"]

    def shape(name: str) -> str:
        t = tables[name]
        return f"{t['due']:,} due + {t['finished']:,} finished + {t['future_priority']:,} future"

    rows = []
    for kind in ("base", "head"):
        for case, c in (lc.get(kind) or {}).items():
            row = [f"{case} ({kind})", _us(c["plain_us"]), _us(c["shape_us"]), _us(c["big_us"]),
                   _x(c["ratio_shape"]), _x(c["ratio"])]
            if "head_over_base" in lc:
                row.append(_x(lc["head_over_base"][case]["big"]) if kind == "head" else "")
            rows.append(row)
    head = ["case", "plain", f"shape ({shape('shape')})", f"big ({shape('big')})",
            "shape / plain", "big / plain"]
    if "head_over_base" in lc:
        head.append("big: head / base")
    return (f"Lease cost beside future priority jobs: {lc['unit']}, {lc['calls_per_repeat']} "
            f"calls a repeat; p_queues {lc['queues']} in the _queues cases", head, rows)


def _floor_table(floor: dict[str, Any]) -> tuple[str, list[str], list[list[str]]]:
    """The queue-floor section: a job's costs on each variant, and their ratios to the
    text-keyed bare queue."""

    def cell(v: dict[str, Any], o: dict[str, Any] | None, m: str, fmt: str) -> str:
        if v.get(m) is None:
            return "-"
        text = format(v[m]["median"], fmt)
        if o and m in o:
            text += f" · {o[m]['ratio']['median']:.2f}x"
        return text

    rows = []
    for name, v in floor["variants"].items():
        o = floor["over_bare_text"].get(name)
        rows.append([f"{name} ({v['jobs']:,} jobs)" + ("" if v["ok"] else " FAILED"),
                     cell(v, o, "server_sched_us", ".1f"), cell(v, o, "server_lease_us", ".1f"),
                     cell(v, o, "server_mark_us", ".1f"), cell(v, o, "server_cpu_us", ".0f"),
                     cell(v, o, "client_cpu_us", ".1f"), cell(v, o, "jobs_per_s", ",.0f")])
    return (f"Queue floor: one process drains jobs in batches of {floor['batch']}, "
            f"median of {floor['repeats']}; ratio to bare_text",
            ["variant", "server µs/job (schedstat)", "of it lease", "of it mark",
             "server µs/job (stat ticks)", "client CPU µs/job", "jobs/s"], rows)


def _ha_tables(ha: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    rep, epoch = ha["replication"], ha["epoch"]
    by = rep["by_setting"]
    base = rep["settings"][0]
    rows = [[op, _us(by[base][op]["us"])]
            + [f"{by[name][op]['us']['median']:.0f} µs · {_x(by[name][op]['ratio'])}"
               for name in rep["settings"][1:]]
            for op in by[base]]
    out = [(f"A synchronous standby on this machine (PostgreSQL {rep['server']}), ratio to a "
            "commit that waits for the local flush only, from SQL",
            ["operation", "synchronous_commit = local", "on", "remote_apply"], rows)]
    for level, per in epoch["by_commit"].items():
        ev = per["by_revision"]
        erows = [[op, _us(ev["0006"][op]["us"]), _us(ev["0007"][op]["us"]),
                  _x(ev["0007"][op]["ratio"]), _x(ev["0006b"][op]["ratio"]),
                  "yes" if per["within_spread"][op] else "no"]
                 for op in ev["0006"]]
        out.append((f"The failover floor: pgstore_0007 against pgstore_0006 (no standby, "
                    f"synchronous_commit = {level})",
                    ["operation", "0006", "0007", "0007 / 0006",
                     "0006 / 0006 (the run's spread)", "within the spread"], erows))
    return out


def _burst_rows(burst: dict[str, Any]) -> list[list[str]]:
    def med(m: dict[str, Any], scale: float = 1.0) -> str:
        return f"{m['median'] * scale:.2f} ({m['min'] * scale:.2f}-{m['max'] * scale:.2f})"

    rows = []
    for name, st in burst["systems"].items():
        cpu = st.get("cpu_us_per_job") or {}
        rows.append([name, med(st["drain_s"]), f"{st['jobs_per_s']['median']:,.0f}",
                     med(st["lateness_p50_ms"], 0.001), med(st["lateness_p99_ms"], 0.001),
                     med(st["lateness_max_ms"], 0.001),
                     "n/a" if cpu.get("median") is None else f"{cpu['median']:.0f}",
                     "yes" if st["exactly_once"] else "NO"])
    for name, why in (burst.get("skipped") or {}).items():
        rows.append([name, f"not measured: {why}", "", "", "", "", "", ""])
    return rows


def targets_table(tgts: list[dict[str, Any]]) -> tuple[str, list[str], list[list[str]]]:
    rows = []
    for t in tgts:
        measured = "not measured" if t["measured"] is None else f"{t['measured']:.3g}"
        met = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        rows.append([t["name"], measured, f"{t['op']} {t['target']:g}", met,
                     t.get("note") or ""])
    return ("Targets", ["target", "measured", "bound", "", "note"], rows)


def render_text(blocks: list[tuple[str, list[str], list[list[str]]]]) -> str:
    out = []
    for title, header, rows in blocks:
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
        out.append(f"\n{title}")
        out.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        out.append("  ".join("-" * w for w in widths))
        for r in rows:
            out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(out)


def render_markdown(blocks: list[tuple[str, list[str], list[list[str]]]],
                    meta: dict[str, Any]) -> str:
    m, s = meta["machine"], meta["server"]
    out = [
        f"Measured {meta['finished_at']} on {m['nproc']} cores ({m['cpu']}), "
        f"{m['memory_gib']} GiB; PostgreSQL {s['server_version']} ({meta['origin']}), "
        f"fsync={s['fsync']}, synchronous_commit={s['synchronous_commit']}, "
        f"wal_sync_method={s['wal_sync_method']}, shared_buffers={s['shared_buffers']}; "
        f"load average at start {m['loadavg_start'][0]:.2f}; run took "
        f"{meta['duration_s']:.0f} s. Medians of {meta['settings']['repeats']} repeats "
        f"({meta['settings'].get('peer_repeats', 1)} per system and W in the peer loop; "
        f"min-max in brackets).",
    ]
    st = meta["settings"]
    if "calls" in st:
        end = m.get("loadavg_end") or [None]
        out.append(
            f"\nSizes: {st['calls']} calls per repeat; scale {st['scale_rows']:,} rows against "
            f"{st['scale_due']:,}; peer loop {st['peer_jobs']:,} jobs per run"
            + (f" (scaled to drains of at least {st['peer_seconds']:g} s)"
               if st.get("peer_seconds") else "") + ", W = "
            f"{', '.join(str(w) for w in st['workers'])}; HOT {st['hot_cycles']:,} cycles; "
            f"{st['wakeup_samples']} wake-up samples; retention {st['retention_rows']:,} "
            f"finished jobs; burst {st['burst_jobs']:,} jobs, W = {st['burst_workers']}, "
            f"{st['burst_repeats']} burst(s) per system"
            + (f"; load average at the end {end[0]:.2f}." if end[0] is not None else "."))
    for title, header, rows in blocks:
        out.append(f"\n**{title}**\n")
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "|".join(" --- " for _ in header) + "|")
        for r in rows:
            out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out) + "\n"


def chart(results: dict[str, Any], meta: dict[str, Any], path: Path) -> str | None:
    """A 2x2 PNG: op ratios, peer throughput, scale ratios, HOT shares. None if written,
    else why not."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        return f"matplotlib not installed ({exc}); pip install 'pgstore[bench]'"
    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    ax = axes[0][0]
    ops = results.get("ops")
    if ops:
        # claim_next(100) writes a hundred rows: it has its own ratio (records/s).
        names = [n for n in ops["ops"] if ops["ops"][n]["records_per_call"] == 1][::-1]
        for k, mode in enumerate(MODES):
            med = [ops["ops"][n][mode]["ratio"]["median"] for n in names]
            lo = [m - ops["ops"][n][mode]["ratio"]["min"] for m, n in zip(med, names, strict=True)]
            hi = [ops["ops"][n][mode]["ratio"]["max"] - m for m, n in zip(med, names, strict=True)]
            height = 0.8 / len(MODES)
            ys = [i + (k - (len(MODES) - 1) / 2) * height for i in range(len(names))]
            ax.barh(ys, med, height=height, xerr=[lo, hi], label=MODE_LABELS[mode], capsize=2)
        ax.set_yticks(range(len(names)), names)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.axvline(1.1, color="red", ls="--", lw=1, label="target 1.1x")
        ax.set_xlabel("cost / durable one-row UPDATE (per call)")
        ax.set_title("Store operations vs the durable-write floor")
        ax.legend(fontsize=8)
    else:
        ax.set_visible(False)
    ax = axes[0][1]
    peers = results.get("peers")
    if peers and peers["systems"]:
        ws = peers["workers"]
        for name, per in peers["systems"].items():
            med = [per[str(w)]["jobs_per_s"]["median"] for w in ws]
            lo = [m - per[str(w)]["jobs_per_s"]["min"] for m, w in zip(med, ws, strict=True)]
            hi = [per[str(w)]["jobs_per_s"]["max"] - m for m, w in zip(med, ws, strict=True)]
            ax.errorbar(ws, med, yerr=[lo, hi], marker="o", capsize=3, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ws, [str(w) for w in ws])
        ax.set_xlabel("worker processes W")
        ax.set_ylabel("jobs/s (lease → mark dispatched)")
        ax.set_title("Lease → dispatch loop, " + (
            f"drains of at least {peers['min_seconds']:g} s" if peers.get("min_seconds")
            else f"{peers['jobs']:,} jobs"))
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    else:
        ax.set_visible(False)
    ax = axes[1][0]
    scale = results.get("scale")
    if scale:
        names = list(scale["cases"])
        med = [scale["cases"][n]["ratio"]["median"] for n in names]
        ax.bar(range(len(names)), med, color="tab:purple")
        ax.set_xticks(range(len(names)), [n.replace("_", "\n", 2) for n in names], fontsize=8)
        ax.axhline(1.1, color="red", ls="--", lw=1, label="target 1.1x")
        ax.set_yscale("log")
        for i, v in enumerate(med):
            ax.text(i, v, f"{v:.2f}x", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(f"cost at {scale['big_rows']:,} / at {scale['small_rows']:,} (log)")
        ax.set_title("Scale")
        ax.legend(fontsize=8)
    else:
        ax.set_visible(False)
    ax = axes[1][1]
    hot = results.get("hot")
    if hot:
        labels, vals = [], []
        for table in ("schedules", "jobs"):
            for variant, r in hot[table].items():
                for phase, v in r["phases"].items():
                    if v["hot_share"] is not None:
                        labels.append(f"{table[:5]} {variant}\n{phase}")
                        vals.append(100 * v["hot_share"])
        ax.barh(range(len(vals))[::-1], vals, color="tab:green")
        for y, v in zip(range(len(vals))[::-1], vals, strict=True):
            ax.text(v + 1, y, f"{v:.0f}%", va="center", fontsize=7)
        ax.set_yticks(range(len(vals))[::-1], labels, fontsize=7)
        ax.axvline(95, color="red", ls="--", lw=1, label="claims target 95%")
        ax.set_xlabel("HOT updates, % of updates")
        ax.set_title("Write amplification")
        ax.legend(fontsize=8)
    else:
        ax.set_visible(False)
    m, s = meta["machine"], meta["server"]
    fig.suptitle(f"pgstore bench — PostgreSQL {s['server_version']}, fsync={s['fsync']}, "
                 f"{m['nproc']} cores, {m['memory_gib']} GiB — {meta['finished_at']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


def burst_chart(burst: dict[str, Any], meta: dict[str, Any], path: Path) -> str | None:
    """Jobs dispatched over time after T, one line per system (each system's first
    burst). None if written, else why not."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        return f"matplotlib not installed ({exc}); pip install 'pgstore[bench]'"
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for name, st in burst["systems"].items():
        run = st["runs"][0]
        xs = [t for t, _ in run["timeline"]]
        ys = [n for _, n in run["timeline"]]
        ax.plot(xs, ys, label=f"{name}: {run['drain_s']:.2f} s, {run['jobs_per_s']:,.0f} jobs/s")
    ax.axvline(5.0, color="red", ls="--", lw=1, label="target: drained within 5 s")
    ax.set_xlabel("seconds after T (when every job fell due)")
    ax.set_ylabel("jobs recorded dispatched")
    ax.set_title(f"Burst: {burst['jobs']:,} jobs due at T, W={burst['workers']} worker "
                 "processes per system")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=9, loc="lower right")
    m, s = meta["machine"], meta["server"]
    fig.suptitle(f"PostgreSQL {s['server_version']}, {m['nproc']} cores — {meta['finished_at']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None
