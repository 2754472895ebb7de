"""The exceptions pgstore raises."""

from __future__ import annotations

__all__ = [
    "InvalidArgument",
    "JobNotRemovable",
    "NotPermitted",
    "PgStoreError",
    "ReadOnlyServer",
    "SchemaNotReady",
]


class PgStoreError(Exception):
    """Base class of pgstore's own errors."""


class InvalidArgument(PgStoreError, ValueError):
    """A bad argument: the call changed nothing.

    ``sqlstate`` is ``22023`` (invalid_parameter_value) for a value outside the
    contract, or ``22003`` (numeric_value_out_of_range) for arithmetic that
    would overflow a bigint; the message names the parameter.
    """

    def __init__(self, message: str, *, sqlstate: str = "22023") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class ReadOnlyServer(PgStoreError):
    """The call reached a server that cannot write: a standby (in recovery), or a
    read-only transaction. Nothing changed; the call fails at once, never waits.

    ``sqlstate`` is ``25006`` (read_only_sql_transaction). Connect to the primary:
    a conninfo listing every server with ``target_session_attrs=read-write`` finds
    it again after a failover.
    """

    sqlstate = "25006"


class NotPermitted(PgStoreError):
    """The store's role may not do what was asked (``42501``, insufficient_privilege):
    ``job_purge``, for one, is the schema owner's alone, so a Dispatcher with
    ``purge_after`` over a client-role store raises it from ``start()``
    (docs/retention.md). The message says what to use."""

    sqlstate = "42501"


class JobNotRemovable(PgStoreError):
    """``remove`` refused a job that does not wait unleased: it was dispatched,
    cancelled or failed (history, which only the schema's owner deletes, with
    ``purge``), or it has a lease holder (a dispatch may be running, even past
    an expired lease). Nothing changed; the message names the job's state.

    ``sqlstate`` is ``55000`` (object_not_in_prerequisite_state). To stop a job
    being dispatched, ``cancel`` it instead. Every store kind raises it,
    ``MemoryJobStore`` included.
    """

    sqlstate = "55000"


class SchemaNotReady(PgStoreError):
    """The store's schema is missing or not at the migration head (``start()``).

    The message says what to run: ``pgstore migrate --dsn DSN --schema NAME``,
    ``pgstore.migrate()``, or a store made with ``auto_migrate=True``; or "upgrade the
    pgstore package" when the schema is newer than the package.
    """
