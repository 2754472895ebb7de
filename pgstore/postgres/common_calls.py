"""Calls of the functions every schema has: the clock, the revision, the gauges."""

from __future__ import annotations

from pgstore import _validate as v
from pgstore.models import StoreStats
from pgstore.postgres import rows as _rows
from pgstore.postgres.call import Call, Function

NOW_MS = Function("now_ms", ())
SCHEMA_REVISION = Function("schema_revision", ())
STORE_STATS = Function("store_stats", ("bigint",))


def now_ms() -> Call[int]:
    return Call(NOW_MS, (), _rows.integer_value)


def schema_revision() -> Call[str]:
    return Call(SCHEMA_REVISION, (), _rows.text_value)


def store_stats(now: int | None) -> Call[StoreStats]:
    v.integer("now", now)
    return Call(STORE_STATS, (now,), _rows.store_stats)
