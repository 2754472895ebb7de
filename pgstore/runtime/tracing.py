"""OpenTelemetry spans around each handler run and each dispatch, when it is installed.

With ``opentelemetry-api`` importable (the ``otel`` extra), the Scheduler opens a
span ``pgstore.schedule.run`` around each handler run and the Dispatcher a span
``pgstore.dispatch`` around each dispatch (``dispatch(job)``, its mark and any
recall), through the tracer the application configured (``opentelemetry-sdk``
and an exporter are the application's choice; without them the API's tracer is
a no-op). Attributes name the work and its lease:

* ``pgstore.owner``, the runtime's owner / holder;
* schedule runs: ``pgstore.task_id``, ``pgstore.fencing_token``,
  ``pgstore.scheduled_at``;
* dispatches: ``pgstore.run_id``, ``pgstore.lease_sequence``,
  ``pgstore.dispatch_at``, ``pgstore.lateness_ms``;
* at the end: ``pgstore.outcome``: a run's ``ok``, ``error`` or ``lease_lost``;
  a dispatch's ``completed``, ``cancelled``, ``rejected``, ``failed`` (as the
  ``Complete`` event) or ``released`` (``dispatch`` raised). Every outcome but
  ``ok``, ``completed`` and ``cancelled`` sets the span's status to error.

The Dispatcher asks ``recording()`` once per lease call, not once a job: jobs
leased before the application set its provider run without a span.

A plain (thread-pool) handler runs in the span's context, so spans it opens are
children of the run's. Without the package, ``span()`` is a context manager
that does nothing (no import, no allocation beyond one shared object). With the
API but no tracer provider set (``ProxyTracerProvider``: nothing would be
recorded), no span is started, and a tracer's span that carries no trace (the
API's no-op) is not made current: a burst of dispatches pays about a
microsecond a job for tracing, not the fifteen a current span costs.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
except ImportError:  # the otel extra is not installed: spans cost nothing
    _trace = None  # type: ignore[assignment]

__all__ = ["ENABLED", "Opened", "SpanLike", "finish", "open_span", "recording", "span"]

#: The outcomes that leave a span's status unset (all others set it to error).
_FINE = frozenset({"ok", "completed", "cancelled"})

#: True when ``opentelemetry-api`` was importable: spans are opened.
ENABLED = _trace is not None

#: The instrumentation scope the spans are created under.
TRACER_NAME = "pgstore"


class SpanLike(Protocol):
    """What the runtime does with a span: set attributes on it."""

    def set_attribute(self, key: str, value: Any) -> object: ...


class _NoSpan:
    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        return None


_NO_SPAN = _NoSpan()
_NOTHING: AbstractContextManager[SpanLike] = nullcontext(_NO_SPAN)

#: The tracer, got once: ``get_tracer`` reads the environment on every call. Got before
#: the application sets its provider, it is the API's proxy, which follows it there.
_tracer: Any = None


def recording() -> bool:
    """Whether ``span`` may record now: opentelemetry-api is there and the application
    has set a tracer provider (the API's proxy records nothing). False means ``span``
    would return the no-op, so a caller may skip building its attributes. Checked once
    for many spans (the Dispatcher's: once per lease call), since while no provider is
    set the API looks at the environment each time."""
    return _trace is not None and not isinstance(_trace.get_tracer_provider(),
                                                 _trace.ProxyTracerProvider)


def span(name: str, attributes: Mapping[str, str | int]) -> AbstractContextManager[SpanLike]:
    """A span ``name`` with ``attributes``, current while the block runs (exceptions
    recorded on it and re-raised); a no-op without opentelemetry-api, and without a
    tracer that records or carries a trace (the API's own no-op tracer)."""
    current = _started(name, attributes)
    return _NOTHING if current is None else _trace.use_span(current, end_on_exit=True)


def _started(name: str, attributes: Mapping[str, str | int]) -> Any | None:
    """A span ``name`` started (not current, not ended); None when it would record
    nothing: no provider set up (yet: the API's tracers would record nothing), or the
    no-op tracer's invalid span (nothing to record or propagate)."""
    global _tracer
    if not recording():
        return None
    if _tracer is None:
        _tracer = _trace.get_tracer(TRACER_NAME)
    current = _tracer.start_span(name, attributes=dict(attributes))
    return current if current.get_span_context().is_valid else None


class Opened:
    """A span opened by ``open_span`` and the context to run its work in (a copy of the
    opener's, with the span current): ``context.run(f, *args)`` calls ``f`` there, so a
    task created through it (``context.run(loop.create_task, coro)``) runs in it.
    ``close`` ends it."""

    __slots__ = ("context", "current")

    def __init__(self, current: Any, context: contextvars.Context) -> None:
        self.current = current
        self.context = context

    def close(self, outcome: str | None, exc: BaseException | None = None) -> None:
        """End the span: with ``outcome`` (``finish``) when the work ended with one, else
        with ``exc`` recorded and an error status, as ``span``'s block does (neither:
        the work was cut short, and the span just ends)."""
        current = self.current
        if outcome is not None:
            finish(current, outcome)
        elif exc is not None:
            current.record_exception(exc)
            current.set_status(_trace.Status(_trace.StatusCode.ERROR,
                                             f"{type(exc).__name__}: {exc}"))
        current.end()


def open_span(name: str, attributes: Mapping[str, str | int]) -> Opened | None:
    """``span`` for work that outlives the block that starts it (the Dispatcher's runs,
    which go on in tasks and in the batch's answers): the span started, not ended, and a
    context with it current; None when ``span`` would be the no-op."""
    current = _started(name, attributes)
    if current is None:
        return None
    context = contextvars.copy_context()
    context.run(_context.attach, _trace.set_span_in_context(current))
    return Opened(current, context)


def finish(current: SpanLike, outcome: str) -> None:
    """Record ``outcome`` on the span (and an error status unless it is a fine one)."""
    current.set_attribute("pgstore.outcome", outcome)
    if _trace is not None and outcome not in _FINE and isinstance(current, _trace.Span):
        current.set_status(_trace.Status(_trace.StatusCode.ERROR, outcome))
