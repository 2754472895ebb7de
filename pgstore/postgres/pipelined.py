"""Calls pipelined on an asyncio store's own connection: sent at once, answered in order.

Without it, a connection carries one call at a time: the next is sent only once the
event loop has read the answer of the last, and a loop busy with the runs of the last
batch reads it late, so the server idles between calls while the client works, and
the client idles while the server works. A Dispatcher on one connection lost half its
time that way (docs/performance.md, the overlap). Here a call is sent as soon as it
is made, in libpq's pipeline mode, each with its own Sync: the server runs it right
after the calls before it, in a transaction of its own (autocommit, as before), and
its answer is read whenever the loop gets to it.

Used by ``pgstore.postgres.runner_async`` for the store's own connection only when it
is in autocommit and idle, prepares (``pgstore.postgres.preparing``) and reaches
PostgreSQL itself (``direct``: a pooler such as PgBouncer, even one that keeps
prepared statements, gets the calls one at a time, as before). While calls are out
it holds the connection's ``lock``, so psycopg's own calls on it (anyone else's
``execute``) wait until they are answered; it then leaves pipeline mode and gives
the connection back.

Each statement is prepared once per connection and argument types (as psycopg's
cursors prepare, named ``pgstore_pN``; one that went missing, a ``DEALLOCATE`` by someone
else, is prepared again); psycopg's adapters dump the arguments and load the rows, with
the same formats as its cursors (``%s``, ``%b``).
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections import deque
from typing import Any

import psycopg
from psycopg import errors, pq
from psycopg.adapt import PyFormat, Transformer

from pgstore.postgres.call import Columns, Row
from pgstore.postgres.preparing import BACKEND_PID

__all__ = ["Pipeline", "can_pipeline", "direct"]

_NAMES = itertools.count(1)
_PLACEHOLDER = re.compile(rb"%%|%s|%b")
_TEXT = 0
_IDLE = pq.TransactionStatus.IDLE
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_ABORTED = pq.ExecStatus.PIPELINE_ABORTED
_FATAL = pq.ExecStatus.FATAL_ERROR


def can_pipeline(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether calls on ``conn`` may be pipelined now: autocommit, open, not in a
    transaction, and this libpq has pipeline mode."""
    return (conn.autocommit and not conn.closed
            and conn.pgconn.transaction_status == _IDLE and pq.version() >= 140000)


async def direct(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether ``conn`` reaches PostgreSQL itself, with no pooler between (its backend is
    the one it says it is connected to); asked once per connection, a round trip."""
    try:
        cur = await conn.execute(BACKEND_PID, prepare=False)
        row = await cur.fetchone()
    except psycopg.Error:
        return False
    return row is not None and row[0] == conn.info.backend_pid


class _Statement:
    """A store statement as libpq takes it: ``$n`` placeholders, their formats, and one
    Transformer (dumping and loading are synchronous, so calls in flight share it)."""

    __slots__ = ("formats", "query", "tx")

    def __init__(self, conn: psycopg.AsyncConnection[Any], query: str) -> None:
        formats: list[PyFormat] = []

        def number(m: re.Match[bytes]) -> bytes:
            if m.group() == b"%%":
                return b"%"
            formats.append(PyFormat.BINARY if m.group() == b"%b" else PyFormat.AUTO)
            return b"$%d" % len(formats)

        self.query = _PLACEHOLDER.sub(number, query.encode(conn.info.encoding))
        self.formats = formats
        self.tx = Transformer.from_context(conn)


class _Out:
    """A call sent and not answered yet."""

    __slots__ = ("error", "future", "prepared", "result", "statement")

    def __init__(self, statement: _Statement, future: asyncio.Future[Any]) -> None:
        self.statement = statement
        self.future = future
        self.result: pq.abc.PGresult | None = None
        self.error: BaseException | None = None
        self.prepared: tuple[bytes, Any] | None = None  # prepared by this call


class Pipeline:
    """The pipelined calls of one connection (see the module's doc)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn
        self._statements: dict[str, _Statement] = {}
        self._out: deque[_Out] = deque()
        self._entering: asyncio.Future[None] | None = None
        self._holding = False  # pipeline mode on, the connection's lock held
        self._reader: asyncio.Task[None] | None = None
        #: The statements prepared on the connection, by query and argument types.
        self._prepared: dict[tuple[bytes, Any], bytes] = {}

    @property
    def out(self) -> int:
        """How many calls are out (sent, not answered yet)."""
        return len(self._out)

    @property
    def busy(self) -> bool:
        """True while it holds the connection (calls out, or about to be)."""
        return self._holding or self._entering is not None

    async def run(self, query: str, args: tuple[Any, ...]) -> tuple[list[Row], Columns]:
        """Send ``query`` with ``args`` now (behind the calls still out) and wait for its
        rows and their column names. Raises what psycopg would (``psycopg.Error``)."""
        st = self._statements.get(query)
        if st is None:
            st = self._statements[query] = _Statement(self._conn, query)
        for attempt in (1, 2):
            while not self._holding:
                if self._entering is None:
                    await self._enter()
                else:
                    await asyncio.shield(self._entering)
            try:
                return await self._send(st, args)
            except errors.InvalidSqlStatementName:  # 26000: deallocated behind our back
                if attempt == 2:
                    raise
                self._prepared.clear()
        raise AssertionError("unreachable")

    async def _send(self, st: _Statement, args: tuple[Any, ...]) -> tuple[list[Row], Columns]:
        tx = st.tx
        params = tx.dump_sequence(args, st.formats)
        pgconn = self._conn.pgconn
        key = (st.query, tx.types)
        name = self._prepared.get(key)
        future: asyncio.Future[tuple[list[Row], Columns]]
        future = asyncio.get_running_loop().create_future()
        out = _Out(st, future)
        try:
            if name is None:
                # Unique in the process: stores sharing a connection never collide, and
                # a name dropped here may still exist there.
                name = self._prepared[key] = b"pgstore_p%d" % next(_NAMES)
                out.prepared = key
                pgconn.send_prepare(name, st.query, tx.types)
            pgconn.send_query_prepared(name, params, tx.formats, _TEXT)
            pgconn.pipeline_sync()
        except psycopg.Error:
            self._prepared.pop(key, None)
            self._fail(psycopg.OperationalError(pgconn.get_error_message()))
            raise
        self._out.append(out)
        await self._flush()
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read())
        return await future

    async def _enter(self) -> None:
        loop = asyncio.get_running_loop()
        entering = self._entering = loop.create_future()
        try:
            await self._conn.lock.acquire()
            try:
                self._conn.pgconn.enter_pipeline_mode()
            except BaseException:
                self._conn.lock.release()
                raise
            self._holding = True
        finally:
            self._entering = None
            if not entering.done():
                entering.set_result(None)

    def _leave(self) -> None:
        """Nothing out: back to normal mode, the connection to whoever waits for it."""
        self._holding = False
        try:
            if self._conn.pgconn.status == pq.ConnStatus.OK:
                self._conn.pgconn.exit_pipeline_mode()
        finally:
            self._conn.lock.release()

    async def _flush(self) -> None:
        pgconn = self._conn.pgconn
        while pgconn.flush():
            await self._wait(writable=True)

    async def _wait(self, *, writable: bool = False) -> None:
        loop = asyncio.get_running_loop()
        fd = self._conn.pgconn.socket
        future: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not future.done():
                future.set_result(None)

        if writable:
            loop.add_writer(fd, ready)
        else:
            loop.add_reader(fd, ready)
        try:
            await future
        finally:
            if writable:
                loop.remove_writer(fd)
            else:
                loop.remove_reader(fd)

    async def _read(self) -> None:
        """Read answers while calls are out, each call's up to its Sync; then leave."""
        pgconn = self._conn.pgconn
        try:
            while self._out:
                await self._wait()
                pgconn.consume_input()
                while self._out and not pgconn.is_busy():
                    res = pgconn.get_result()
                    out = self._out[0]
                    if res is None:
                        continue  # the end of a query's results; its Sync follows
                    status = res.status
                    if status == _SYNC:
                        self._out.popleft()
                        self._answer(out)
                    elif status == _FATAL and out.error is None:
                        out.error = errors.error_from_result(
                            res, encoding=self._conn.info.encoding)
                    elif status == _ABORTED and out.error is None:
                        out.error = errors.PipelineAborted("pipeline aborted")
                    elif status in (_TUPLES_OK, _COMMAND_OK):
                        out.result = res
        except BaseException as exc:
            error = exc if isinstance(exc, psycopg.Error) else psycopg.OperationalError(
                f"the pipeline's reader failed: {type(exc).__name__}: {exc}")
            self._fail(error)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._reader = None
            if self._holding and not self._out:
                self._leave()

    def _answer(self, out: _Out) -> None:
        if out.error is not None and out.prepared is not None:
            self._prepared.pop(out.prepared, None)  # its prepare may have failed
        if out.future.done():  # its caller was cancelled: the answer goes unread
            return
        if out.error is not None:
            out.future.set_exception(out.error)
            return
        res = out.result
        if res is None:
            out.future.set_result(([], ()))
            return
        tx = out.statement.tx
        tx.set_pgresult(res)
        rows = tx.load_rows(0, res.ntuples, tuple)
        encoding = self._conn.info.encoding
        columns = tuple((res.fname(i) or b"").decode(encoding, "replace")
                        for i in range(res.nfields))
        out.future.set_result((rows, columns))

    def _fail(self, error: BaseException) -> None:
        """The connection failed: every call out gets ``error``."""
        while self._out:
            out = self._out.popleft()
            if not out.future.done():
                out.future.set_exception(error)
