"""A schema's catalog as plain data, for comparing two schemas."""

from __future__ import annotations

from typing import Any

import psycopg

QUERIES = {
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid), co.collname,
               col_description(c.oid, a.attnum)
          FROM pg_class c
          JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
          LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
          LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100
         WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
           AND c.relname <> 'alembic_version'
         ORDER BY 1, 2""",
    "relations": """
        SELECT relname, relkind, reloptions, obj_description(oid, 'pg_class'),
               ARRAY(SELECT unnest(coalesce(relacl, acldefault('r', relowner)))::text ORDER BY 1)
          FROM pg_class
         WHERE relnamespace = %(schema)s::regnamespace AND relname NOT LIKE 'alembic_version%%'
         ORDER BY 1""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
          FROM pg_constraint
         WHERE connamespace = %(schema)s::regnamespace
           AND conrelid::regclass::text NOT LIKE '%%alembic_version'
         ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
         WHERE schemaname = %(schema)s AND tablename <> 'alembic_version'
         ORDER BY 1, 2""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
               obj_description(p.oid, 'pg_proc'), p.proconfig, p.prosecdef,
               ARRAY(SELECT unnest(coalesce(p.proacl, acldefault('f', p.proowner)))::text ORDER BY 1)
          FROM pg_proc p
         WHERE p.pronamespace = %(schema)s::regnamespace
         ORDER BY 1, 2""",
    "schema": """
        SELECT ARRAY(SELECT unnest(coalesce(nspacl, acldefault('n', nspowner)))::text ORDER BY 1)
          FROM pg_namespace WHERE oid = %(schema)s::regnamespace""",
}


def catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every column, relation, constraint, index and function of ``schema``, with
    comments, options and privileges (sorted ACLs; NULL read as the default), the
    schema's own name replaced by ``<schema>``."""

    def scrub(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(f'"{schema}"', "<schema>").replace(schema, "<schema>")
        if isinstance(value, list):
            return [scrub(v) for v in value]
        return value

    return {
        name: [tuple(scrub(v) for v in row) for row in conn.execute(query, {"schema": schema})]
        for name, query in QUERIES.items()
    }


def without_marks(found: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """``found`` (a ``catalog``) without the ``downgrade_marks`` table, its columns, key and
    index: what a downgrade keeps for the upgrade back (``pgstore.schema.marks``)."""

    def marks(row: tuple[Any, ...]) -> bool:
        first = row[0] if row else None
        return isinstance(first, str) and first.removeprefix("<schema>.").startswith(
            "downgrade_marks"
        )

    return {name: [row for row in rows if not marks(row)] for name, rows in found.items()}


#: The store's helpers, which run as their caller (an API function) on its pinned
#: path, neither SECURITY DEFINER nor with a SET clause: the plain SQL ones the API
#: functions inline (token_floor_at and check_primary among them), the plpgsql
#: raise_invalid, raise_standby and raise_no_epoch they call, check_now (plpgsql: it
#: reads store_settings, and only for a p_now that is given) and check_lease (plpgsql: it
#: reads store_settings on every call that sets a lease end), and the batch calls' checks
#: (batch_max, and the plpgsql check_run_ids, check_same_length, check_lease_sequences),
#: and store_stats' job_history_advance and job_history_move (plpgsql: they write job_history)
#: and store_stats_read (plpgsql: its one statement, planned once per session),
#: schedule_due_at (immutable SQL: the expression of the generated schedules.due_at),
#: and the queues' check_payload, check_queues and the lease's job_lease_groups,
#: job_lease_due, job_lease_take and job_lease_default (plpgsql and sql: job_lease and
#: job_lease_many call them).
INLINED_HELPERS = frozenset(
    {"now_ms", "raise_invalid", "check_name", "check_positive", "check_present",
     "check_one_of", "check_length", "check_now", "check_lease", "check_sequence",
     "check_primary", "raise_standby", "token_floor_at", "raise_no_epoch", "batch_max",
     "check_run_ids", "check_same_length", "check_lease_sequences", "job_history_advance",
     "job_history_move", "store_stats_read", "schedule_due_at", "check_payload", "check_queues", "job_lease_groups",
     "job_lease_due", "job_lease_take", "job_lease_default", "queue_limit_max", "queue_slot_free",
     "check_queue_limit", "queue_limits_reserve", "queue_limits_fill", "queue_limits_keep",
     "queue_limits_caps", "queue_limits_wants", "queue_lane_free", "queue_lane_usable",
     "queue_slots_layout", "queue_slots_sweep"}
)

#: The helpers with a SET clause (a helper runs as its caller, on the caller's pinned
#: path): job_lease_due, plpgsql, whose LIMIT 1 probes are planned once per session, and
#: job_lease_default, plpgsql, job_lease_many's walk of the default group, likewise, and
#: store_stats_read, plpgsql, store_stats' statement, whose planning cost several runs
#: (and never in parallel: its workers cost more than the count).
HELPER_CONFIG: dict[str, list[str]] = {
    "job_lease_due": ["plan_cache_mode=force_generic_plan"],
    "job_lease_default": ["plan_cache_mode=force_generic_plan"],
    "store_stats_read": ["plan_cache_mode=force_generic_plan",
                         "max_parallel_workers_per_gather=0"]}

