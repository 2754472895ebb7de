"""What the current schema grants its client role, derived from the catalog.

Nothing here spells a signature. ``CLIENT_FUNCTIONS`` and ``OWNER_FUNCTIONS`` apply
``pgstore.schema.catalog``'s rule to the functions sql/ creates, as ``make
generate`` read them from ``pg_proc`` (``pgstore/postgres/_functions.py``): every
SECURITY DEFINER function of the store is granted except those only the owner runs
(``catalog.OWNER_ONLY``: ``job_purge`` deletes history, ``fence_after_restore`` lifts
every future token, ``token_floor`` reads the floor), plus ``now_ms`` (the store's
clock, ``catalog.GRANTED_PLAIN``); the ``check_*`` helpers are not. A migration and a
fresh load grant by the same rule, applied to ``pg_proc`` there and then
(``client_role.grant``). Tests check both lists against ``pg_proc``.

``MONITOR_FUNCTIONS`` is a privilege decision, so it stays a list, of names only.
Revisions up to ``pgstore_0012`` keep frozen lists of their own.
"""

from __future__ import annotations

from pgstore.postgres import _functions as _sql
from pgstore.schema import catalog
from pgstore.schema.function import Function

__all__ = ["CLIENT_FUNCTIONS", "MONITOR_FUNCTIONS", "OWNER_FUNCTIONS"]

_BY_NAME = {d.function.name: d.function for d in _sql.DEFINITIONS}

#: SECURITY DEFINER functions granted to no client: only the owner (or a role the DBA
#: grants EXECUTE) runs them (``catalog.OWNER_ONLY``).
OWNER_FUNCTIONS: tuple[Function, ...] = catalog.owner_functions(_sql.DEFINITIONS)

#: The functions the current schema grants the client role, by name: every SECURITY
#: DEFINER function of the store but OWNER_FUNCTIONS, plus ``now_ms`` (the store's clock).
CLIENT_FUNCTIONS: tuple[Function, ...] = catalog.client_functions(_sql.DEFINITIONS)

#: What a read-only monitoring role needs (docs/privileges.md gives the GRANT, and a test
#: runs it): every function ``pgstore status``, ``schedules``, ``jobs`` and ``queues`` and
#: a dashboard call, none that writes, and no table privilege. Each reads the tables as
#: their owner.
MONITOR_FUNCTIONS: tuple[Function, ...] = tuple(
    _BY_NAME[name]
    for name in (
        "schema_revision",
        "now_ms",
        "store_stats",
        "schedule_list",
        "schedule_get",
        "job_list",
        "job_get",
        "job_list_dispatched",
        "queue_list",
    )
)
