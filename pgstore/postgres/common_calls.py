"""Calls of the functions every schema has: the clock, the revision, the gauges, the
fence after a restore (the owner's)."""

from __future__ import annotations

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.models import Fence, StoreStats
from pgstore.postgres import _functions as _sql
from pgstore.postgres import rows as _rows
from pgstore.postgres.call import Call

# The functions called here, as sql/ declares them (generated: ``_functions``).
NOW_MS = _sql.NOW_MS
SCHEMA_REVISION = _sql.SCHEMA_REVISION
STORE_STATS = _sql.STORE_STATS
FENCE_AFTER_RESTORE = _sql.FENCE_AFTER_RESTORE
TOKEN_FLOOR = _sql.TOKEN_FLOOR

#: How many promotions (or fences) after the copy ``fence_after_restore`` allows for
#: unless told: one failover the copy did not see. The SQL function's default too.
DEFAULT_PROMOTIONS = 1
#: The most it takes (``sql/40_restore.sql``): each one spends a band of 2^40.
PROMOTIONS_MAX = 1024


def now_ms() -> Call[int]:
    return Call(NOW_MS, (), _rows.integer_value)


def schema_revision() -> Call[str]:
    return Call(SCHEMA_REVISION, (), _rows.text_value)


def store_stats(now: int | None) -> Call[StoreStats]:
    v.integer("now", now)
    return Call(STORE_STATS, (now,), _rows.store_stats)


def fence_after_restore(promotions: int) -> Call[Fence]:
    v.integer("promotions", promotions, maximum=v.INTEGER_MAX)
    if promotions is None or not 0 <= promotions <= PROMOTIONS_MAX:
        raise InvalidArgument(f"promotions must be an integer from 0 to {PROMOTIONS_MAX}")
    return Call(FENCE_AFTER_RESTORE, (promotions,), _rows.fence)
