"""Whether a connection may prepare the store's statements: asked once per connection.

A store built with ``prepare=None`` (the default) prepares its statements on
every connection where a prepared statement is sure to be there at the next
call, and nowhere else:

* a direct connection to PostgreSQL (or through a proxy that gives each client
  a server session of its own): the server's ``pg_backend_pid()`` is the process
  id the connection was given at startup (``BackendKeyData``);
* a pooler that keeps prepared statements for its clients (PgBouncer 1.21+
  with ``max_prepared_statements`` above 0): it hands each client out other
  process ids than the server's, and it renames every statement it forwards
  (``PGBOUNCER_<n>``), so the server does not hold the statement under the name
  psycopg gave it.

A pooler that forwards statements as they are (PgBouncer before 1.21, or with
``max_prepared_statements = 0``) shows both: another process id, and the
statement under psycopg's own name (``_pg3_<n>``). Behind transaction pooling
the next call may reach another server session, where that statement is
missing or is another client's: nothing is prepared there. So it is when the
probe cannot run (statement pooling refuses a transaction block) or the
connection prepares nothing anyway (``prepare_threshold=None``).

The probe asks the server's process id first, unprepared (one round trip: a
direct connection is told apart there, and nothing is prepared on it). Where a
pooler stands between, it sends one statement prepared, in a pipeline (Parse,
Bind, Execute, then one Sync, so a pooler keeps one server session for the
prepare and the run, and no transaction block that statement pooling would
refuse; in a savepoint inside the caller's own transaction, which a failed
probe leaves as it was) that reads the name under which the server holds that
very statement, and deallocates it before the Sync if it is psycopg's name.

A connection is probed once, whichever stores and tasks (or threads) share it:
``verdict_for`` keeps the verdict per connection, and while one caller probes, the
others wait for its verdict (a lock per connection) rather than probe beside it. Two
probes at once on one connection would share psycopg's pipeline and transaction state
(one's Sync or rollback in the middle of the other's pipeline: "another command is
already in progress", a savepoint outside any transaction), and a probe's rollback on
a connection with autocommit off would take back a call made meanwhile by a store that
already had its verdict. No store call on the connection runs while it is probed: each
needs the verdict first (but a store built with ``prepare=True`` or ``False``, which
never asks).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, cast

import psycopg
from psycopg.pq import TransactionStatus

#: psycopg's names for the statements it prepares (``_pg3_0``, ``_pg3_1``...).
PSYCOPG_PREFIX = "_pg3_"

#: The first question, never prepared: the server's process id.
BACKEND_PID = "SELECT pg_catalog.pg_backend_pid()"

_LockT = TypeVar("_LockT")

#: Each connection's verdict, once known, for as long as it lives (``verdict_for``).
_verdicts: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
#: The lock a connection's probe holds: a ``threading.Lock`` for a sync connection, an
#: ``asyncio.Lock`` for an asyncio one; made once, under ``_making``.
_probing: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_making = threading.Lock()


def pooler_probe(nonce: str) -> tuple[str, str]:
    """The pooler's probe, unique to ``nonce``: a statement (sent prepared) that reads the
    server's name for itself, found by the nonce in its comment (its LIKE pattern holds
    it too); and a ``DO`` block (sent unprepared, before the same Sync) that deallocates
    it where the server holds it under psycopg's name, so no ``_pg3_<n>`` is left behind
    on a server session that other clients share."""
    marker = f"pgstore prepare probe {nonce}"
    found = (
        f"FROM pg_catalog.pg_prepared_statements p WHERE p.statement LIKE '%{marker}%'"
    )
    probe = f"/* {marker} */ SELECT pg_catalog.pg_backend_pid(), (SELECT p.name {found} LIMIT 1)"
    cleanup = (
        "DO $$DECLARE n text; BEGIN"
        f" FOR n IN SELECT p.name {found} AND p.name LIKE '\\_pg3\\_%'"
        " LOOP EXECUTE format('DEALLOCATE %I', n); END LOOP; END$$"
    )
    return probe, cleanup


def verdict(client_pid: int, row: tuple[Any, ...] | None) -> bool:
    """True when the probe's answer ``row`` (the server's process id, and the server's
    name of the probe, if it was asked) shows prepared statements are safe on a
    connection whose startup gave it ``client_pid``."""
    if row is None:
        return False
    server_pid, name = (row[0], row[1]) if len(row) > 1 else (row[0], None)
    if server_pid == client_pid:
        return True  # one server session per client connection
    return isinstance(name, str) and not name.startswith(PSYCOPG_PREFIX)


def probe(conn: psycopg.Connection[Any]) -> bool | None:
    """The verdict for ``conn``; None when it cannot be asked now (a failed transaction,
    or a connection lost: ask again at the next call)."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        return None
    if conn.prepare_threshold is None:
        return False
    was_idle = status == TransactionStatus.IDLE
    try:
        try:
            row = conn.execute(BACKEND_PID, prepare=False).fetchone()
            if row is not None and row[0] != conn.info.backend_pid:
                statement, cleanup = pooler_probe(uuid.uuid4().hex)
                if was_idle:
                    with conn.pipeline():  # one Sync: one server session, no BEGIN
                        cur = conn.execute(statement, prepare=True)
                        conn.execute(cleanup, prepare=False)
                else:
                    with conn.transaction():  # a savepoint: a failure leaves the caller's
                        cur = conn.execute(statement, prepare=True)
                        conn.execute(cleanup, prepare=False)
                row = cur.fetchone()
        finally:
            if was_idle and not conn.autocommit and not conn.closed:
                conn.rollback()  # the transaction the probe opened, and nothing else
    except psycopg.Error:
        return None if conn.closed else False
    return verdict(conn.info.backend_pid, row)


async def probe_async(conn: psycopg.AsyncConnection[Any]) -> bool | None:
    """``probe`` for an asyncio connection."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        return None
    if conn.prepare_threshold is None:
        return False
    was_idle = status == TransactionStatus.IDLE
    try:
        try:
            cur = await conn.execute(BACKEND_PID, prepare=False)
            row = await cur.fetchone()
            if row is not None and row[0] != conn.info.backend_pid:
                statement, cleanup = pooler_probe(uuid.uuid4().hex)
                if was_idle:
                    async with conn.pipeline():
                        cur = await conn.execute(statement, prepare=True)
                        await conn.execute(cleanup, prepare=False)
                else:
                    async with conn.transaction():
                        cur = await conn.execute(statement, prepare=True)
                        await conn.execute(cleanup, prepare=False)
                row = await cur.fetchone()
        finally:
            if was_idle and not conn.autocommit and not conn.closed:
                await conn.rollback()
    except psycopg.Error:
        return None if conn.closed else False
    return verdict(conn.info.backend_pid, row)


def _lock(conn: object, make: Callable[[], _LockT]) -> _LockT:
    """The lock of ``conn``'s probe, made by ``make`` at its first use."""
    lock = _probing.get(conn)
    if lock is None:
        with _making:
            lock = _probing.get(conn)
            if lock is None:
                lock = _probing[conn] = make()
    return cast(_LockT, lock)


def verdict_for(conn: psycopg.Connection[Any]) -> bool | None:
    """``conn``'s verdict: the one kept, else ``probe``'s, one probe at a time per
    connection (a thread that finds one running waits for its verdict). None as
    ``probe`` says (not kept: asked again at the next call)."""
    found = _verdicts.get(conn)
    if found is not None:
        return found
    with _lock(conn, threading.Lock):
        found = _verdicts.get(conn)
        if found is None:
            found = probe(conn)
            if found is not None:
                _verdicts[conn] = found
    return found


async def verdict_for_async(conn: psycopg.AsyncConnection[Any]) -> bool | None:
    """``verdict_for`` for an asyncio connection: a task that finds a probe running on
    ``conn`` waits for its verdict."""
    found = _verdicts.get(conn)
    if found is not None:
        return found
    async with _lock(conn, asyncio.Lock):
        found = _verdicts.get(conn)
        if found is None:
            found = await probe_async(conn)
            if found is not None:
                _verdicts[conn] = found
    return found
