"""The store's functions as the catalog (``pg_proc``) has them, and which of them the
client role may execute.

A function's signature is written once, in its sql/ file. Everything else that names
it is read from ``pg_proc``: the call bindings (``make generate`` writes
``pgstore/postgres/_functions.py`` from ``definitions`` after a fresh load of sql/),
the client role's grants (``client_functions``, applied to that generated list or, in a
migration or a fresh load, to ``pg_proc`` there and then), and the revocation from
``PUBLIC`` (``pgstore.schema.files.REVOKE_FROM_PUBLIC``). Why: each signature used to
be typed four or five times (the SQL file, its ``REVOKE``, its call binding, the
grant list, a revision's list), and a list that missed a new function failed only
where a test happened to look.

What stays a list of names is a privilege decision, not a signature: the functions
only the owner runs (``OWNER_ONLY``) and the one plain function granted anyway
(``GRANTED_PLAIN``).

The store's schema is taken to hold only the store's functions: every function in it
is revoked from ``PUBLIC``, and every ``SECURITY DEFINER`` one but ``OWNER_ONLY`` is
granted to the client role (docs/privileges.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

from pgstore.schema.function import Definition, Function, Volatility

__all__ = [
    "GRANTED_PLAIN",
    "OWNER_ONLY",
    "client_functions",
    "definitions",
    "is_client",
    "owner_functions",
]

#: SECURITY DEFINER functions granted to no client: only the owner (or a role the DBA
#: grants EXECUTE) runs them. ``job_purge`` deletes history, ``fence_after_restore``
#: lifts every future token, ``token_floor`` reads the floor.
OWNER_ONLY = frozenset({"job_purge", "fence_after_restore", "token_floor"})

#: Not SECURITY DEFINER (the planner inlines it into the API functions) and granted all
#: the same: ``now_ms``, the store's clock.
GRANTED_PLAIN = frozenset({"now_ms"})

_VOLATILITY: dict[str, Volatility] = {"i": "immutable", "s": "stable", "v": "volatile"}

#: Each function of a schema: name, input argument types in order (as ``GRANT`` and a
#: cast spell them), SECURITY DEFINER, volatility. Sorted in Python, not by the
#: database's collation, so the order is the same on every server.
_DEFINITIONS = """
SELECT p.proname::text,
       ARRAY(SELECT format_type(a.type, NULL)
               FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(type, n)
              ORDER BY a.n),
       p.prosecdef,
       p.provolatile::text
  FROM pg_proc p
 WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = %s)
"""


def definitions(conn: psycopg.Connection[Any], schema: str) -> list[Definition]:
    """Every function of ``schema``, sorted by name then argument types."""
    found = [
        Definition(
            Function(str(name), tuple(str(t) for t in arg_types)),
            bool(secdef),
            _VOLATILITY[str(volatility)],
        )
        for name, arg_types, secdef, volatility in conn.execute(_DEFINITIONS, (schema,))
    ]
    return sorted(found, key=lambda d: (d.function.name, d.function.arg_types))


def is_client(definition: Definition) -> bool:
    """Whether the client role may execute ``definition``: every SECURITY DEFINER function
    but ``OWNER_ONLY``, and ``GRANTED_PLAIN``."""
    name = definition.function.name
    if name in GRANTED_PLAIN:
        return True
    return definition.security_definer and name not in OWNER_ONLY


def client_functions(found: Iterable[Definition]) -> tuple[Function, ...]:
    """The functions of ``found`` the client role may execute (``is_client``), in order."""
    return tuple(d.function for d in found if is_client(d))


def owner_functions(found: Iterable[Definition]) -> tuple[Function, ...]:
    """The functions of ``found`` named in ``OWNER_ONLY``, in order."""
    return tuple(d.function for d in found if d.function.name in OWNER_ONLY)
