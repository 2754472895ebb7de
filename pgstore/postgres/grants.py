"""What the current schema grants its client role: one list, derived from the calls.

Every function a store method calls is granted, and nothing else (the
``check_*`` helpers are not): a test checks this list against ``pg_proc``.
Revisions keep frozen lists of their own.
"""

from __future__ import annotations

from pgstore.postgres import common_calls as common
from pgstore.postgres import job_calls as jobs
from pgstore.postgres import schedule_calls as schedules
from pgstore.schema.function import Function

__all__ = ["CLIENT_FUNCTIONS"]

#: The functions the current schema grants the client role, in sql/ order: every
#: SECURITY DEFINER function of the store plus ``now_ms`` (the store's clock).
CLIENT_FUNCTIONS: tuple[Function, ...] = (
    common.SCHEMA_REVISION,
    common.NOW_MS,
    schedules.GET,
    schedules.REGISTER,
    schedules.CLAIM_DUE,
    schedules.RENEW,
    schedules.COMPLETE,
    schedules.DELETE,
    schedules.LIST,
    schedules.CLAIM_NEXT,
    jobs.CHANNEL,
    jobs.SCHEDULE,
    jobs.LEASE,
    jobs.RENEW,
    jobs.MARK_DISPATCHED,
    jobs.RELEASE,
    jobs.CANCEL,
    jobs.GET,
    jobs.LIST_DISPATCHED,
    jobs.REMOVE,
    common.STORE_STATS,
    jobs.LIST,
)
