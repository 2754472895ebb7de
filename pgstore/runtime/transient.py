"""Which errors are transient (worth retrying) and which are permanent (never retried)."""

from __future__ import annotations

import psycopg
from psycopg import errors

from pgstore.errors import InvalidArgument

#: Server answers a retry can get past: lock_timeout (55P03), statement_timeout or a
#: cancel (57014), a serialization failure (40001), a deadlock (40P01).
TRANSIENT_SQLSTATES = frozenset({"55P03", "57014", "40001", "40P01"})

#: Server answers no retry can get past: a bad argument (22023, invalid_parameter_value;
#: 22003, numeric_value_out_of_range). The wrapper raises them as ``InvalidArgument``.
PERMANENT_SQLSTATES = frozenset({"22023", "22003"})


def is_transient(exc: BaseException) -> bool:
    """True for the transient SQLSTATEs above and for a lost or refused connection
    (``psycopg.OperationalError``, a pool's ``PoolTimeout`` included); False for the
    rest (``SchemaNotReady``, ``InvalidArgument``, a bug)."""
    if is_permanent(exc):
        return False
    if isinstance(exc, errors.Error) and exc.sqlstate in TRANSIENT_SQLSTATES:
        return True
    return isinstance(exc, psycopg.OperationalError)


def is_permanent(exc: BaseException) -> bool:
    """True for an error the same call can never get past: ``InvalidArgument`` (the
    call changed nothing, and the same arguments are refused again), or a psycopg
    error carrying one of ``PERMANENT_SQLSTATES``. The runtimes never retry these:
    not ``start()``, not the Dispatcher's ``mark_dispatched`` (whose batches are split
    instead, see ``pgstore.runtime.batcher``), not a keeper's renew, not the
    Scheduler's ``complete``."""
    if isinstance(exc, InvalidArgument):
        return True
    return isinstance(exc, errors.Error) and exc.sqlstate in PERMANENT_SQLSTATES
