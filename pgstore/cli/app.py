"""``pgstore run MODULE:OBJECT [MODULE:OBJECT ...]``: find the app's Scheduler and/or
Dispatcher, log, and run them in one process (one event loop).

``MODULE`` is imported with the current directory first on ``sys.path`` (as
``python -m`` does); ``OBJECT`` is an attribute path in it (``scheduler``,
``app.dispatcher``). It must be a ``pgstore.Scheduler`` or ``pgstore.Dispatcher``,
or a zero-argument callable returning one (a factory, called once). Anything
else is an ``AppError`` whose message is one line.

The runtime runs until SIGTERM or SIGINT: it stops claiming, gives running work
its grace period, and abandons the rest (their leases expire). Then the
runtime's store is closed (only a pool the store opened itself; borrowed
connections and pools stay open) in the same event loop, which an asyncio
store's pool needs.

The command owns both signals from its first line to its last (``StopSignals``,
installed before the app's module is imported), not the runtimes
(``run(handle_signals=False)``): a signal before the runtimes start (while the
app's module is imported, say) is kept, and they are not started at all; one
after they start (while the store starts, before the first claim) stops them
gracefully at once; one while the stores close is kept. Either way the exit
status is 0. Only a signal before that first line (the interpreter starting and
importing pgstore, 0.2 to 0.5 s on the test machine) meets Python's default:
SIGTERM ends the process (-15), SIGINT raises KeyboardInterrupt (status 130).

Several targets (a Scheduler and a Dispatcher, say) run side by side on one
loop: one SIGTERM or SIGINT stops them all, and when one of them fails the
others are stopped too.

With ``metrics_port`` (``--metrics-port N``), the runtimes' events are counted
(``pgstore.runtime.metrics``) into the default Prometheus registry, served at
``http://ADDR:N/metrics`` (ADDR: 127.0.0.1 unless ``--metrics-addr`` asks for
another) while they run. The store-wide gauges (``store_stats()``: jobs per
state, the oldest due job, ...) are read only with ``store_gauges``
(``--store-gauges``): they describe the store, not the process, so one process
of the fleet reads them (or ``pgstore exporter``, which runs no runtime), not
every one. They are read every ``stats_interval`` seconds (15 by default) by a
thread of their own, on a connection of their own (never a runtime store's
pool), for a sync and an asyncio store alike: a scrape serves the last reading
and never reaches the database. At the end the HTTP server and that reader are
closed first, then the stores, so a late scrape never meets a closed pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pgstore.errors import PgStoreError
from pgstore.runtime.dispatcher import Dispatcher
from pgstore.runtime.scheduler import Scheduler

__all__ = ["LOG_FORMAT", "AppError", "MetricsOptions", "StopSignals", "load_runtime",
           "logging_to_stderr", "serve", "serve_gauges"]

#: The interval of the store's gauges when ``--stats-interval`` is not given.
STATS_INTERVAL = 15.0

#: The address the metrics are served on when ``--metrics-addr`` is not given: this
#: host only. Another (``0.0.0.0``: every interface) must be asked for.
METRICS_ADDR = "127.0.0.1"

#: One line per event: ``2024-05-01T12:00:00.123Z INFO pgstore.scheduler: message``.
LOG_FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"

WANTED = "a pgstore.Scheduler or pgstore.Dispatcher (or a zero-argument callable returning one)"

log = logging.getLogger("pgstore.run")

AppRuntime = Scheduler | Dispatcher


class AppError(PgStoreError):
    """``MODULE:OBJECT`` does not name a runtime; the message says why, on one line."""


#: The signals that stop ``pgstore run`` gracefully (taken in this order: SIGTERM's
#: handler in says both are).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """SIGTERM and SIGINT for the whole of one ``pgstore run``, in the main thread.

    ``install()`` (the command's first step) makes each signal a note (``received``,
    the first one) instead of Python's default, which would end the process (SIGTERM)
    or raise KeyboardInterrupt anywhere (SIGINT). While the runtimes' loop runs,
    ``attach(loop, stop)`` also has each signal call ``stop(signum)`` on that loop (a
    signal noted before: at once), and wakes the loop whichever thread the signal
    reached (``signal.set_wakeup_fd``, as ``loop.add_signal_handler`` does); ``detach()``
    ends that before the loop closes. The handler stays the same throughout, so there
    is no moment with Python's default in between. ``restore()`` puts back the
    handlers found."""

    def __init__(self) -> None:
        #: The first signal received, None before one.
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._target: tuple[asyncio.AbstractEventLoop, Callable[[int], None]] | None = None
        self._wakeup: tuple[asyncio.AbstractEventLoop, socket.socket, socket.socket, int] | None
        self._wakeup = None

    def _note(self, signum: int, frame: object = None) -> None:
        if self.received is None:
            self.received = signum
        target = self._target  # one read: detach() may clear it at any point
        if target is not None:
            target[0].call_soon_threadsafe(target[1], signum)

    def install(self) -> StopSignals:
        """Take both signals (the main thread only); returns itself."""
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._note)
        return self

    def attach(self, loop: asyncio.AbstractEventLoop, stop: Callable[[int], None]) -> None:
        """From now on each signal calls ``stop(signum)`` on ``loop`` (running, in this
        thread); one noted before is handed over at once, after what is queued."""
        rsock, wsock = socket.socketpair()
        rsock.setblocking(False)
        wsock.setblocking(False)
        previous_fd = signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        self._wakeup = (loop, rsock, wsock, previous_fd)

        def drain() -> None:  # the wakeup bytes; the handler itself runs on its own
            with contextlib.suppress(OSError):
                while rsock.recv(512):
                    pass

        loop.add_reader(rsock.fileno(), drain)
        self._target = (loop, stop)
        if self.received is not None:
            loop.call_soon(stop, self.received)

    def detach(self) -> None:
        """Signals are notes again (the loop is about to close)."""
        self._target = None
        wakeup, self._wakeup = self._wakeup, None
        if wakeup is None:
            return
        loop, rsock, wsock, previous_fd = wakeup
        signal.set_wakeup_fd(previous_fd)
        if not loop.is_closed():
            loop.remove_reader(rsock.fileno())
        rsock.close()
        wsock.close()

    def restore(self) -> None:
        """Put back the handlers ``install()`` found."""
        self.detach()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def _dotted(text: str) -> bool:
    return text != "" and all(part.isidentifier() for part in text.split("."))


def _where(exc: BaseException) -> str:
    """`` (file.py:12)``: the innermost frame of the app's own code that raised."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")
    ]
    if not frames:
        return ""
    frame = frames[-1]
    return f" ({os.path.basename(frame.filename)}:{frame.lineno})"


def _a(obj: object) -> str:
    name = type(obj).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def _raised(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    name = type(exc).__name__
    return f"{name}: {message}{_where(exc)}" if message else f"{name}{_where(exc)}"


def _import(module_name: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            raise AppError(f"no module named {missing!r} (searched {cwd} and sys.path)") from exc
        raise AppError(f"importing {module_name!r} raised {_raised(exc)}") from exc
    except Exception as exc:
        raise AppError(f"importing {module_name!r} raised {_raised(exc)}") from exc


def load_runtime(target: str) -> AppRuntime:
    """The ``Scheduler`` or ``Dispatcher`` that ``MODULE:OBJECT`` names (see the module
    docstring); ``AppError`` otherwise. Importing the module runs its code."""
    module_name, colon, path = target.partition(":")
    if not colon or not _dotted(module_name) or not _dotted(path):
        raise AppError(
            f"{target!r} is not MODULE:OBJECT (dotted names, e.g. myapp.tasks:scheduler)"
        )
    obj = _import(module_name)
    parts = path.split(".")
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppError(
                f"module {module_name!r} has no attribute {'.'.join(parts[: i + 1])!r}"
            ) from None
        except Exception as exc:
            raise AppError(f"reading {target!r} raised {_raised(exc)}") from exc
    if isinstance(obj, (Scheduler, Dispatcher)):
        return obj
    if not callable(obj):
        raise AppError(f"{target} is {_a(obj)}, not {WANTED}")
    try:
        inspect.signature(obj).bind()
    except TypeError:
        raise AppError(f"{target} needs arguments; expected {WANTED}") from None
    except ValueError:
        pass  # no signature to read (some builtins): just call it
    try:
        made = obj()
    except Exception as exc:
        raise AppError(f"{target}() raised {_raised(exc)}") from exc
    if isinstance(made, (Scheduler, Dispatcher)):
        return made
    if inspect.iscoroutine(made):
        made.close()  # never awaited: say so here, not in a RuntimeWarning at exit
    raise AppError(f"{target}() returned {_a(made)}, not {WANTED}")


@contextmanager
def logging_to_stderr(level: str) -> Iterator[None]:
    """Log every logger at ``level`` and above to stderr, one line per event, with a UTC
    timestamp (``LOG_FORMAT``); tracebacks follow their line. Undone on exit."""
    formatter = logging.Formatter(LOG_FORMAT, datefmt=LOG_DATE_FORMAT)
    formatter.converter = time.gmtime
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    saved = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)


def _describe(runtime: AppRuntime) -> str:
    if isinstance(runtime, Scheduler):
        tasks = ", ".join(sorted(runtime.tasks)) or "none"
        return f"scheduler {runtime.owner} (tasks: {tasks})"
    return f"dispatcher {runtime.holder}"


async def _close(store: object) -> None:
    close = getattr(store, "close", None)
    if close is None:
        return
    if inspect.iscoroutinefunction(close):
        await close()
    else:
        await asyncio.to_thread(close)


@dataclass(frozen=True)
class MetricsOptions:
    """``--metrics-port``, ``--metrics-addr`` (``METRICS_ADDR``: this host only),
    ``--stats-interval`` (None: ``STATS_INTERVAL``), ``--store-gauges`` (read
    ``store_stats()`` in this process)."""

    port: int
    addr: str = METRICS_ADDR
    stats_interval: float | None = None
    store_gauges: bool = False


class _Metrics:
    """The metrics of one ``pgstore run``: counters subscribed, gauges registered and
    read by their own reader (its own thread and connection), the HTTP server
    started; ``close()`` undoes it all, the server first."""

    def __init__(self, runtimes: list[AppRuntime], options: MetricsOptions,
                 gauges_from: tuple[str, str] | None = None) -> None:
        try:
            from prometheus_client import REGISTRY, start_http_server

            from pgstore.runtime import metrics
        except ImportError as exc:
            raise AppError(f"--metrics-port needs prometheus_client ({exc}): "
                           "pip install 'pgstore[metrics]'") from None
        self._registry = REGISTRY
        self._server: Any = None
        self._counters: metrics.RuntimeMetrics | None = None
        self._unsubscribe: list[Any] = []
        if runtimes:
            counters = metrics.RuntimeMetrics(REGISTRY)
            self._counters = counters
            self._unsubscribe = [counters.observe(runtime) for runtime in runtimes]
        self._collector: metrics.StoreStatsCollector | None = None
        self._reader: metrics.StoreStatsReader | None = None
        source = gauges_from
        if source is None and options.store_gauges:
            source = _gauge_source(runtimes)
        if source is not None:
            self._collector = metrics.StoreStatsCollector()
            REGISTRY.register(self._collector)
            interval = STATS_INTERVAL if options.stats_interval is None else options.stats_interval
            self._reader = metrics.StoreStatsReader(source[0], source[1], self._collector,
                                                    interval)
            self._reader.start()
        try:
            self._server, _ = start_http_server(options.port, options.addr, REGISTRY)
        except OSError as exc:
            self.close()
            raise AppError(f"--metrics-port {options.port}: {exc}") from None
        host, port = self._server.server_address[:2]
        log.info("metrics at http://%s:%d/metrics%s", host, port,
                 " (with the store's gauges)" if source is not None else "")

    def close(self) -> None:
        """Stop serving (a scrape under way finishes), then stop the gauges' reader and
        close its connection, then unregister. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
        if self._collector is not None:
            self._registry.unregister(self._collector)
            self._collector = None
        if self._counters is not None:
            for unsubscribe in self._unsubscribe:
                unsubscribe()
            self._counters.unregister()
            self._counters = None


def _gauge_source(runtimes: list[AppRuntime]) -> tuple[str, str]:
    """The conninfo and schema of the first runtime's store that can be read for
    ``store_stats()`` (a PostgreSQL store); ``AppError`` when none can."""
    for runtime in runtimes:
        store = runtime.store
        conninfo = getattr(store, "conninfo", None)
        schema = getattr(store, "schema", None)
        if callable(conninfo) and isinstance(schema, str) and hasattr(store, "stats"):
            return conninfo(), schema
    raise AppError("--store-gauges needs a runtime on a PostgreSQL store (none has one)")


async def _run_then_close(runtimes: list[AppRuntime], metrics: _Metrics | None,
                          signals: StopSignals) -> None:
    if signals.received is not None:  # before the loop: nothing is started
        log.info("%s before the runtimes started: not starting them",
                 signal.Signals(signals.received).name)
        runtimes_run: list[AppRuntime] = []
    else:
        runtimes_run = runtimes
    # The command has the signals (StopSignals), not the runtimes: each binds to the
    # loop at its first step, queued here before any signal's stop.
    tasks = [asyncio.create_task(r.run(handle_signals=False)) for r in runtimes_run]
    said: list[int] = []

    def stop(signum: int) -> None:
        if not said:
            said.append(signum)
            log.info("%s: stopping", signal.Signals(signum).name)
        for runtime in runtimes_run:
            runtime.stop()

    signals.attach(asyncio.get_running_loop(), stop)
    try:
        if tasks:
            # One failing stops the others (gracefully); the first failure is raised.
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if any(not t.cancelled() and t.exception() is not None for t in done):
                for runtime in runtimes:
                    runtime.stop()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
    finally:
        # The metrics first: a scrape (or a read) after the store's close would meet a
        # closed pool.
        try:
            if metrics is not None:
                await asyncio.to_thread(metrics.close)
            closed: set[int] = set()
            for runtime in runtimes:
                if id(runtime.store) not in closed:
                    closed.add(id(runtime.store))
                    await _close(runtime.store)
        finally:
            signals.detach()  # notes again, before the loop closes


def serve(runtimes: AppRuntime | list[AppRuntime], target: str,
          metrics: MetricsOptions | None = None, signals: StopSignals | None = None) -> None:
    """Run ``runtimes`` (one, or several side by side on one loop) until SIGTERM /
    SIGINT, then close their stores; with ``metrics``, serve their Prometheus metrics
    meanwhile (and the store's gauges with ``metrics.store_gauges``).

    ``signals``: the ``StopSignals`` the command installed at its start (a signal it
    noted already: the runtimes are not started, their stores closed); None: installed
    here, for the time of the call (the main thread only)."""
    listed = runtimes if isinstance(runtimes, list) else [runtimes]
    own = signals is None
    taken = StopSignals().install() if signals is None else signals
    try:
        served = None
        if taken.received is None:
            for runtime in listed:
                log.info("running %s from %s until SIGTERM or SIGINT", _describe(runtime),
                         target)
            if metrics is not None:
                served = _Metrics(listed, metrics)
        try:
            asyncio.run(_run_then_close(listed, served, taken))
        finally:
            if served is not None:
                served.close()
    finally:
        if own:
            taken.restore()
    if any(runtime.abandoned for runtime in listed):
        log.warning("stopped; work that outlived the grace period was abandoned")
    else:
        log.info("stopped")


def serve_gauges(conninfo: str, schema: str, options: MetricsOptions) -> None:
    """``pgstore exporter``: serve only the store's gauges (``store_stats()`` every
    ``options.stats_interval`` seconds, on a connection of their own) until SIGTERM or
    SIGINT. The schema must be at the migration head."""
    import signal

    from pgstore.postgres.schedules import PgScheduleStore

    conn: Any
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        probe = PgScheduleStore(conn, schema=schema)
        try:
            probe.start()  # SchemaNotReady, saying what to run, when not at head
        finally:
            probe.close()
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    served = _Metrics([], options, gauges_from=(conninfo, schema))
    log.info("serving the store gauges of schema %r until SIGTERM or SIGINT", schema)
    try:
        stop.wait()
    finally:
        served.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("stopped")
