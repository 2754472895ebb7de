"""Which errors are transient: worth retrying, as opposed to failing fast."""

from __future__ import annotations

import psycopg
from psycopg import errors

#: Server answers a retry can get past: lock_timeout (55P03), statement_timeout or a
#: cancel (57014), a serialization failure (40001), a deadlock (40P01).
TRANSIENT_SQLSTATES = frozenset({"55P03", "57014", "40001", "40P01"})


def is_transient(exc: BaseException) -> bool:
    """True for the transient SQLSTATEs above and for a lost or refused connection
    (``psycopg.OperationalError``, a pool's ``PoolTimeout`` included); False for the
    rest (``SchemaNotReady``, ``InvalidArgument``, a bug)."""
    if isinstance(exc, errors.Error) and exc.sqlstate in TRANSIENT_SQLSTATES:
        return True
    return isinstance(exc, psycopg.OperationalError)
