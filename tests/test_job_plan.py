"""The job lease stays cheap however much history the jobs table holds (docs/performance.md).

The table is filled with 100,000 dispatched jobs, 5,000 jobs cancelled before
dispatch and a handful of pending ones, then analysed. The lease statement is
taken from the installed ``job_lease`` and ``job_lease_take`` functions themselves (``pg_proc.prosrc``),
so these tests follow the function if its body changes. They prove that:

* its plan, both custom (literal values) and generic (``PREPARE`` with
  ``plan_cache_mode = force_generic_plan``, as a long-lived plpgsql session
  may end up running it), scans the candidate subquery with the partial index
  of its group (``jobs_pending_by_dispatch_at`` for the default group, queue
  ``'default'`` at priority 0; ``jobs_pending_by_queue`` for the others) and
  has no sequential scan of ``jobs``;
* the candidate subquery (``SELECT … FOR UPDATE SKIP LOCKED``), run for real,
  touches fewer than 50 shared buffers (a sequential scan, or a walk of a
  plain ``dispatch_at`` index through the history, touches hundreds to
  thousands);
* ``job_lease`` on that table hands out the due jobs earliest first, ties by
  run_id in code-point order, takes a lease that ends exactly now, skips a live
  lease, cancelled, dispatched and future jobs, then answers nothing;
* a whole ``job_lease`` call past 5,000 future jobs of a higher priority and
  beside a second queue reads fewer than 100 shared buffers and leases the due
  job of the highest priority;
* the probe of ``job_lease`` and ``job_lease_many`` for a due job outside the
  default group walks ``jobs_pending_others_by_dispatch_at`` back from now and
  reads few buffers beside 5,000 future ones, and while none of them is due the
  lease calls neither ``job_lease_due`` nor ``job_lease_take`` (every queue or
  a list), as on a table without them.

Every test runs in a transaction it rolls back, so the table stays as filled.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgstore.testing import drop_schema, install_schema

PENDING_INDEX = "jobs_pending_by_dispatch_at"
#: The same jobs as GROUP_INDEX by dispatch_at: the lease's probe for a due one.
OTHERS_INDEX = "jobs_pending_others_by_dispatch_at"
#: Where the jobs outside the default group wait.
GROUP_INDEX = "jobs_pending_by_queue"
DISPATCHED = 100_000
CANCELLED = 5_000
NOW = 200_000
TTL = 30_000
MAX_BUFFERS = 50

# The pending jobs, as (run_id, dispatch_at, lease_holder, lease_until), and the order
# job_lease must hand them out at NOW.
PENDING = [
    ("live-lease", 100, "busy", NOW + 10_000),  # earliest, but its lease is live: skipped
    ("expires-now", 149_999, "gone", NOW),  # lease_until == now is expired: leasable
    ("due-a", 150_000, None, None),
    ("due-B", 150_000, None, None),  # ties with due-a: "due-B" < "due-a" in code points
    ("due-c", 150_001, None, None),
    ("due-d", NOW, None, None),  # due exactly now
    ("future", NOW + 1, None, None),  # not due yet
]
LEASE_ORDER = ["expires-now", "due-B", "due-a", "due-c", "due-d"]


@contextmanager
def pending_schema(dsn: str, dispatched: int, cancelled: int) -> Iterator[str]:
    """A schema whose jobs table holds the history (``fill``) and the pending jobs,
    analysed; dropped at the end."""
    schema = f"pgstore_plan_{uuid.uuid4().hex[:12]}"
    install_schema(dsn, schema)
    try:
        with psycopg.connect(dsn) as conn:
            fill(conn, schema, dispatched, cancelled)
            conn.cursor().executemany(
                sql.SQL(
                    "INSERT INTO {}.jobs (run_id, dispatch_at, lease_holder, lease_until)"
                    " VALUES (%s, %s, %s, %s)"
                ).format(sql.Identifier(schema)),
                PENDING,
            )
            conn.commit()
            conn.autocommit = True
            conn.execute(sql.SQL("ANALYZE {}.jobs").format(sql.Identifier(schema)))
        yield schema
    finally:
        drop_schema(dsn, schema)


@pytest.fixture(scope="module")
def filled_schema(pgstore_database: str) -> Iterator[str]:
    """A schema whose jobs table holds the history and the pending jobs, analysed."""
    with pending_schema(pgstore_database, DISPATCHED, CANCELLED) as schema:
        yield schema


def fill(conn: psycopg.Connection[Any], schema: str, dispatched: int, cancelled: int) -> None:
    """History in one statement each: dispatched jobs due at 1..n (earlier than every
    pending job, so a plain dispatch_at index would walk them first) and jobs cancelled
    before dispatch."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.jobs (run_id, dispatch_at, lease_holder, lease_until, worker_id,"
            " dispatched, cancelled)"
            " SELECT 'done-' || lpad(g::text, 7, '0'), g, 'holder-' || (g %% 7), g + 60000,"
            " 'bot-' || (g %% 50), true, false FROM generate_series(1, %s) AS g"
        ).format(sql.Identifier(schema)),
        [dispatched],
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.jobs (run_id, dispatch_at, dispatched, cancelled)"
            " SELECT 'cancelled-' || lpad(g::text, 7, '0'), g, false, true"
            " FROM generate_series(1, %s) AS g"
        ).format(sql.Identifier(schema)),
        [cancelled],
    )


@pytest.fixture
def conn(pgstore_database: str, filled_schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection in a transaction on the filled schema, rolled back after the test."""
    with rolled_back(pgstore_database, filled_schema) as connection:
        yield connection


@contextmanager
def rolled_back(dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection in a transaction on ``schema``, rolled back at the end."""
    with psycopg.connect(dsn) as connection:
        connection.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        try:
            yield connection
        finally:
            connection.rollback()


# -- the statement under test ---------------------------------------------------------


def lease_statement(conn: psycopg.Connection[Any], group: bool = False) -> str:
    """The walk that picks and locks the row to lease. Of the default group (queue
    ``'default'`` at priority 0, every job here): the scalar ``(SELECT … FOR UPDATE SKIP
    LOCKED)`` in the installed ``job_lease``'s body, its common case. Of another group
    (``group``): the first ``ARRAY(SELECT … SKIP LOCKED)`` in ``job_lease_take``'s body
    (the walk of one group other than the default one), the group's queue and priority as
    literals (``'q'``, 0)."""
    if not group:
        row = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE oid ="
            " 'job_lease(text, bigint, bigint, text[])'::regprocedure"
        ).fetchone()
        assert row is not None
        found = re.search(r"=\s*\(\s*(SELECT\s+c\.run_id\b.*?SKIP\s+LOCKED)\s*\)", row[0],
                          re.S | re.I)
        assert found, f"no `= (SELECT … SKIP LOCKED)` in job_lease's body:\n{row[0]}"
        return found.group(1)
    row = conn.execute(
        "SELECT prosrc FROM pg_proc WHERE oid ="
        " 'job_lease_take(text, bigint, bigint, integer, text[], integer[])'::regprocedure"
    ).fetchone()
    assert row is not None
    walks = re.findall(r"ARRAY\(\s*(SELECT\s+c\.run_id\b.*?SKIP\s+LOCKED)\s*\)", row[0],
                       re.S | re.I)
    assert len(walks) >= 2, f"no group walk in job_lease_take's body:\n{row[0]}"
    return (str(walks[0]).replace("p_queues[1]", "'q'").replace("p_priorities[1]", "0")
            .replace("p_now", "v_now").replace("p_limit", "1"))


def candidate_subquery(statement: str) -> str:
    """The ``SELECT … FOR UPDATE SKIP LOCKED`` that picks the row to lease (from
    pgstore_0019 the lease statement is that walk itself)."""
    return statement


# What job_lease's plpgsql variables hold when job_lease runs at NOW.
VARIABLES: dict[str, Any] = {"v_now": NOW}
#: Their types.
TYPES = {"v_now": "bigint"}


def with_literals(conn: psycopg.Connection[Any], text: str) -> str:
    """``text`` with each plpgsql variable replaced by its value as a literal."""

    def literal(found: re.Match[str]) -> str:
        name = found.group(0)
        assert name in VARIABLES, f"unexpected variable {name} in {text}"
        return sql.Literal(VARIABLES[name]).as_string(conn)

    return re.sub(r"\b[pv]_\w+\b", literal, text)


def prepare_generic(conn: psycopg.Connection[Any], name: str, text: str) -> str:
    """PREPARE ``text`` with its variables as parameters, force generic plans, and
    return the ``EXECUTE`` that runs it with the values at NOW."""
    order: list[str] = []

    def parameter(found: re.Match[str]) -> str:
        var = found.group(0)
        assert var in VARIABLES, f"unexpected variable {var} in {text}"
        if var not in order:
            order.append(var)
        return f"${order.index(var) + 1}::{TYPES[var]}"

    body = re.sub(r"\b[pv]_\w+\b", parameter, text)
    conn.execute(f"PREPARE {name} AS {body}")
    conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    values = ", ".join(sql.Literal(VARIABLES[v]).as_string(conn) for v in order)
    return f"EXECUTE {name}({values})"


def explain(conn: psycopg.Connection[Any], options: str, statement: str) -> dict[str, Any]:
    row = conn.execute(f"EXPLAIN ({options}, FORMAT JSON) {statement}").fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]
    return plan


# -- walking the JSON plan ------------------------------------------------------------


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from nodes(child)


def subplans(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The InitPlan / SubPlan subtrees (the scalar candidate subquery)."""
    return [n for n in nodes(node) if n.get("Parent Relationship") in ("InitPlan", "SubPlan")]


def seq_scans_of_jobs(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        n for n in nodes(node) if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"
    ]


def uses_pending_index(node: dict[str, Any]) -> bool:
    return any(n.get("Index Name") == PENDING_INDEX for n in nodes(node))


def shared_buffers(node: dict[str, Any]) -> int:
    """Shared buffers hit or read by the whole plan (the top node counts its children)."""
    return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])


# -- tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("group", [False, True], ids=["default-group", "other-group"])
@pytest.mark.parametrize("plan_kind", ["custom", "generic"])
def test_lease_scans_the_pending_index_not_the_table(
    conn: psycopg.Connection[Any], plan_kind: str, group: bool
) -> None:
    statement = lease_statement(conn, group)
    if plan_kind == "custom":
        to_explain = with_literals(conn, statement)
    else:
        to_explain = prepare_generic(conn, "lease_generic", statement)
    plan = explain(conn, "COSTS true", to_explain)["Plan"]

    index = GROUP_INDEX if group else PENDING_INDEX
    assert seq_scans_of_jobs(plan) == [], f"a sequential scan of jobs in\n{plan}"
    assert any(n.get("Index Name") == index for n in nodes(plan)), (
        f"the lease walk does not use {index}:\n{plan}")


@pytest.mark.parametrize("plan_kind", ["custom", "generic"])
def test_lease_candidate_query_reads_few_buffers(
    conn: psycopg.Connection[Any], plan_kind: str
) -> None:
    subquery = candidate_subquery(lease_statement(conn))
    if plan_kind == "custom":
        to_explain = with_literals(conn, subquery)
    else:
        to_explain = prepare_generic(conn, "pick_generic", subquery)
    plan = explain(conn, "ANALYZE, BUFFERS, TIMING false", to_explain)["Plan"]

    assert plan["Actual Rows"] == 1, f"the candidate query found no row:\n{plan}"
    buffers = shared_buffers(plan)
    assert buffers < MAX_BUFFERS, f"{buffers} shared buffers for one lease candidate:\n{plan}"
    assert uses_pending_index(plan), f"{PENDING_INDEX} not used:\n{plan}"
    assert seq_scans_of_jobs(plan) == [], f"a sequential scan of jobs in\n{plan}"


def test_job_lease_hands_out_due_jobs_earliest_first(conn: psycopg.Connection[Any]) -> None:
    leased: list[str] = []
    for _ in range(len(LEASE_ORDER) + 1):
        rows = conn.execute(
            "SELECT run_id, lease_holder, lease_until FROM job_lease('plan-test', %s, %s)",
            [NOW, TTL],
        ).fetchall()
        assert len(rows) <= 1
        if not rows:
            break
        run_id, holder, until = rows[0]
        assert (holder, until) == ("plan-test", NOW + TTL)
        leased.append(run_id)
    assert leased == LEASE_ORDER, f"leased {leased}, expected {LEASE_ORDER}"


def test_a_lease_reads_few_buffers_past_future_jobs_of_a_higher_priority(
    conn: psycopg.Connection[Any],
) -> None:
    """5,000 jobs at priority 10 not due yet and 2,000 due at priority 5 in another queue
    (besides the history): the whole job_lease call, run for real, reads a few buffers per
    (queue, priority) group, never the future ones' entries (an index on priority, then
    dispatch_at, would walk all 5,000 before the first due job), and leases the due job
    of the highest priority."""
    conn.execute(
        "INSERT INTO jobs (run_id, dispatch_at, priority) SELECT 'future-' || g,"
        " %s + g, 10 FROM generate_series(1, 5000) AS g", [NOW])
    conn.execute(
        "INSERT INTO jobs (run_id, dispatch_at, queue, priority) SELECT 'other-' ||"
        " lpad(g::text, 4, '0'), g, 'other', 5 FROM generate_series(1, 2000) AS g")
    # A first lease (of other-0001) plans every statement: the measured call's buffers
    # are then its reads of the table, not the catalog's.
    first = conn.execute("SELECT run_id FROM job_lease('warm-up', %s, %s)", [NOW, TTL])
    assert first.fetchall() == [("other-0001",)]
    plan = explain(conn, "ANALYZE, BUFFERS, TIMING false",
                   f"SELECT run_id FROM job_lease('plan-test', {NOW}, {TTL})")["Plan"]
    buffers = shared_buffers(plan)
    assert buffers < 2 * MAX_BUFFERS, f"{buffers} shared buffers for one lease:\n{plan}"
    leased = conn.execute(
        "SELECT run_id FROM jobs WHERE lease_holder = 'plan-test'").fetchall()
    assert leased == [("other-0002",)]


@pytest.fixture(scope="module")
def probe_schema(pgstore_database: str) -> Iterator[str]:
    """A schema of its own for the probe's tests (the same pending jobs, less history):
    the rows they add and roll back leave dead entries in the pending indexes, which
    the other tests must not meet."""
    with pending_schema(pgstore_database, 10_000, 500) as schema:
        yield schema


@pytest.fixture
def probe_conn(pgstore_database: str, probe_schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection in a transaction on the probe's schema, rolled back after the test."""
    with rolled_back(pgstore_database, probe_schema) as connection:
        yield connection


LEASERS = {"job_lease": "job_lease(text, bigint, bigint, text[])",
           "job_lease_many": "job_lease_many(text, bigint, bigint, integer, text[])"}


def probe_statement(conn: psycopg.Connection[Any], function: str) -> str:
    """The probe in the installed ``function``'s body for a due pending job outside the
    default group (a scalar subquery; its one variable, v_now)."""
    row = conn.execute("SELECT prosrc FROM pg_proc WHERE oid = %s::regprocedure",
                       [LEASERS[function]]).fetchone()
    assert row is not None
    found = re.search(r"\(\s*(SELECT\s+true\s+FROM\s+jobs\s+c\b.*?"
                      r"dispatch_at\s+DESC\s+LIMIT\s+1)\s*\)", row[0], re.S | re.I)
    assert found, f"no `(SELECT true FROM jobs c … DESC LIMIT 1)` in {function}'s body:\n{row[0]}"
    return found.group(1)


def add_future_jobs(conn: psycopg.Connection[Any]) -> None:
    """5,000 jobs at priority 10 and 500 in another queue, none due at NOW."""
    conn.execute(
        "INSERT INTO jobs (run_id, dispatch_at, priority) SELECT 'future-' || g,"
        " %s + g, 10 FROM generate_series(1, 5000) AS g", [NOW])
    conn.execute(
        "INSERT INTO jobs (run_id, dispatch_at, queue) SELECT 'later-' || g,"
        " %s + g, 'other' FROM generate_series(1, 500) AS g", [NOW])
    conn.execute("ANALYZE jobs")


@pytest.mark.parametrize("plan_kind", ["custom", "generic"])
@pytest.mark.parametrize("function", sorted(LEASERS))
def test_the_probe_for_other_due_jobs_reads_a_few_entries_of_its_index(
    probe_conn: psycopg.Connection[Any], function: str, plan_kind: str
) -> None:
    conn = probe_conn
    add_future_jobs(conn)
    probe = probe_statement(conn, function)
    for due in (False, True):
        if due:
            # One due, after 2,000 dispatched since the last vacuum: their entries, at
            # the index's oldest end, point at row versions no longer pending (a walk
            # from that end would visit each), and the probe from now never meets them.
            conn.execute(
                "INSERT INTO jobs (run_id, dispatch_at, queue) SELECT 'sent-' || g, g,"
                " 'other' FROM generate_series(1, 2000) AS g")
            conn.execute("UPDATE jobs SET dispatched = true WHERE run_id LIKE 'sent-%'")
            conn.execute("INSERT INTO jobs (run_id, dispatch_at, queue) VALUES ('due', 3000,"
                         " 'q')")
        if plan_kind == "custom":
            to_explain = with_literals(conn, probe)
        else:
            to_explain = prepare_generic(conn, f"probe_{int(due)}", probe)
        # Once untimed: the first probe after rows were rolled back or dispatched marks
        # their entries dead as it meets them (what the first lease after them does), and
        # the probes after it skip them without reading the table.
        conn.execute(to_explain)
        plan = explain(conn, "ANALYZE, BUFFERS, TIMING false", to_explain)["Plan"]
        assert plan["Actual Rows"] == int(due), f"the probe's answer, due {due}:\n{plan}"
        assert any(n.get("Index Name") == OTHERS_INDEX for n in nodes(plan)), (
            f"the probe does not use {OTHERS_INDEX}:\n{plan}")
        assert seq_scans_of_jobs(plan) == [], f"a sequential scan of jobs in\n{plan}"
        buffers = shared_buffers(plan)
        assert buffers < MAX_BUFFERS, f"{buffers} shared buffers for the probe:\n{plan}"


@pytest.mark.parametrize("plan_kind", ["custom", "generic"])
@pytest.mark.parametrize("function", sorted(LEASERS))
def test_the_probe_keeps_its_index_while_the_statistics_know_no_other_job(
    conn: psycopg.Connection[Any], function: str, plan_kind: str
) -> None:
    """Statistics taken while every pending job was in the default group, then 2,000
    due jobs in another queue (the first use of queues, before autovacuum analyses
    them): the probe still reads its own index from now backwards. With the two
    indexes' predicates alike, both plans cost the same under such statistics, and the
    planner picked jobs_pending_by_queue read whole and sorted in one ANALYZE sample of
    three or so; the probe's ``failed IS NOT TRUE`` leaves it no other index. Five
    samples of the history, each a fresh ANALYZE."""
    probe = probe_statement(conn, function)
    for sample in range(5):
        conn.execute("SAVEPOINT sample")
        conn.execute("ANALYZE jobs")
        conn.execute(
            "INSERT INTO jobs (run_id, dispatch_at, queue, priority) SELECT 'other-' || g,"
            " g, 'other', 5 FROM generate_series(1, 2000) AS g")
        if plan_kind == "custom":
            to_explain = with_literals(conn, probe)
        else:
            to_explain = prepare_generic(conn, f"probe_sample_{sample}", probe)
        plan = explain(conn, "ANALYZE, BUFFERS, TIMING false", to_explain)["Plan"]
        assert plan["Actual Rows"] == 1, f"the probe's answer:\n{plan}"
        assert any(n.get("Index Name") == OTHERS_INDEX for n in nodes(plan)), (
            f"sample {sample}: the probe does not use {OTHERS_INDEX}:\n{plan}")
        assert not any(n["Node Type"] == "Sort" for n in nodes(plan)), (
            f"sample {sample}: the probe sorts:\n{plan}")
        conn.execute("ROLLBACK TO SAVEPOINT sample")


def helper_calls(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """job_lease_due's and job_lease_take's calls so far in this transaction."""
    row = conn.execute(
        "SELECT coalesce(pg_stat_get_xact_function_calls("
        "'job_lease_due(bigint, text[])'::regprocedure), 0),"
        " coalesce(pg_stat_get_xact_function_calls("
        "'job_lease_take(text, bigint, bigint, integer, text[], integer[])'::regprocedure),"
        " 0)").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_no_other_job_due_means_the_default_groups_walk_alone(
    probe_conn: psycopg.Connection[Any],
) -> None:
    """Future jobs outside the default group only: job_lease and job_lease_many, with
    every queue or a list naming 'default', lease the default group's due jobs in order
    and never call job_lease_due or job_lease_take; a list without 'default' leases
    nothing and calls neither either. Once one of those jobs is due, the lease takes it
    first, through them."""
    conn = probe_conn
    conn.execute("SET LOCAL track_functions = 'pl'")
    add_future_jobs(conn)
    got = [conn.execute("SELECT run_id FROM job_lease('plan-test', %s, %s)",
                        [NOW, TTL]).fetchall(),
           conn.execute("SELECT run_id FROM job_lease('plan-test', %s, %s, %s)",
                        [NOW, TTL, ["other", "default"]]).fetchall(),
           conn.execute("SELECT run_id FROM job_lease_many('plan-test', %s, %s, 2)",
                        [NOW, TTL]).fetchall(),
           conn.execute("SELECT run_id FROM job_lease_many('plan-test', %s, %s, 1, %s)",
                        [NOW, TTL, ["default"]]).fetchall(),
           conn.execute("SELECT run_id FROM job_lease('plan-test', %s, %s, %s)",
                        [NOW, TTL, ["other"]]).fetchall(),
           conn.execute("SELECT run_id FROM job_lease_many('plan-test', %s, %s, 5, %s)",
                        [NOW, TTL, ["other", "nowhere"]]).fetchall()]
    assert [[r[0] for r in rows] for rows in got] == [
        [LEASE_ORDER[0]], [LEASE_ORDER[1]], LEASE_ORDER[2:4], [LEASE_ORDER[4]], [], []]
    assert helper_calls(conn) == (0, 0)
    later = conn.execute("SELECT run_id FROM job_lease('plan-test', %s, %s)",
                         [NOW + 1, TTL]).fetchall()
    assert later == [("future-1",)]
    assert helper_calls(conn) == (1, 1)
