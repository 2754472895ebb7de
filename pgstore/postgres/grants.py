"""What the current schema grants its client role: one list, derived from the calls.

Every function a store method calls is granted, and nothing else (the
``check_*`` helpers are not), except those that only the owner runs
(``OWNER_FUNCTIONS``: ``job_purge`` deletes history, ``fence_after_restore`` lifts every
future token, ``token_floor`` reads the floor): a test checks both lists
against ``pg_proc``.
Revisions keep frozen lists of their own.
"""

from __future__ import annotations

from pgstore.postgres import common_calls as common
from pgstore.postgres import job_calls as jobs
from pgstore.postgres import schedule_calls as schedules
from pgstore.schema.function import Function

__all__ = ["CLIENT_FUNCTIONS", "MONITOR_FUNCTIONS", "OWNER_FUNCTIONS"]

#: SECURITY DEFINER functions granted to no client: only the owner (or a role the DBA
#: grants EXECUTE) runs them.
OWNER_FUNCTIONS: tuple[Function, ...] = (
    common.TOKEN_FLOOR, jobs.PURGE, common.FENCE_AFTER_RESTORE
)

#: The functions the current schema grants the client role, in sql/ order: every
#: SECURITY DEFINER function of the store but OWNER_FUNCTIONS, plus ``now_ms`` (the store's clock).
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
    jobs.RETRY,
    jobs.CANCEL,
    jobs.GET,
    jobs.LIST_DISPATCHED,
    jobs.REMOVE,
    jobs.SCHEDULE_MANY,
    jobs.LEASE_MANY,
    jobs.MARK_DISPATCHED_MANY,
    jobs.RENEW_MANY,
    common.STORE_STATS,
    jobs.LIST,
)

#: What a read-only monitoring role needs (docs/privileges.md gives the GRANT, and a test
#: runs it): every function ``pgstore status``, ``schedules`` and ``jobs`` and a dashboard
#: call, none that writes, and no table privilege. Each reads the tables as their owner.
MONITOR_FUNCTIONS: tuple[Function, ...] = (
    common.SCHEMA_REVISION,
    common.NOW_MS,
    common.STORE_STATS,
    schedules.LIST,
    schedules.GET,
    jobs.LIST,
    jobs.GET,
    jobs.LIST_DISPATCHED,
)
