"""OpenTelemetry spans (pgstore.runtime.tracing) on PostgreSQL: one span per handler run and
per dispatch, carrying the lease's fencing token / lease sequence; and nothing at all
(no import) without opentelemetry-api."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pgstore import Job, PgJobStore, PgScheduleStore, RunContext
from pgstore.runtime import events as ev
from pgstore.runtime import tracing
from pgstore.runtime.dispatcher import Backoff, Dispatcher
from pgstore.runtime.scheduler import Scheduler
from tests.support.waiting import until

REPO = Path(__file__).resolve().parents[1]
_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def provider() -> Iterator[None]:
    """The process's tracer provider (set once: OpenTelemetry allows no second one),
    exporting to memory; shut down after this module, so later spans are dropped."""
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(sdk)
    yield
    _EXPORTER.clear()
    sdk.shutdown()


@pytest.fixture
def spans(provider: None) -> Callable[[str], list[ReadableSpan]]:
    _EXPORTER.clear()

    def named(name: str) -> list[ReadableSpan]:
        return [s for s in _EXPORTER.get_finished_spans() if s.name == name]

    return named



def test_each_handler_run_is_a_span_with_its_fencing_token(
    pgstore_database: str, pgstore_schema: str, spans: Callable[[str], list[ReadableSpan]]
) -> None:
    assert tracing.ENABLED
    claims: list[ev.Claim] = []
    tracer = trace.get_tracer("the-app")
    store = PgScheduleStore(pgstore_database, schema=pgstore_schema)
    s = Scheduler(store, owner="s1", lease_ms=5_000, poll_interval=0.02,
                  on_event=lambda e: claims.append(e) if isinstance(e, ev.Claim)
                  and e.outcome == "claimed" else None)

    def work(ctx: RunContext) -> None:
        with tracer.start_as_current_span("the-app.work") as inner:
            inner.set_attribute("token", ctx.fencing_token)

    def boom() -> None:
        raise RuntimeError("boom")

    s.every("work", 100, work)
    s.every("boom", 150, boom)

    async def main() -> None:
        task = asyncio.ensure_future(s.run(handle_signals=False))
        await until("runs", lambda: len(spans("pgstore.schedule.run")) >= 6)
        s.stop()
        await task

    asyncio.run(main())
    store.close()
    runs = spans("pgstore.schedule.run")
    claimed = {(c.subject, c.token, c.due_at) for c in claims}
    got = {(r.attributes["pgstore.task_id"], r.attributes["pgstore.fencing_token"],
            r.attributes["pgstore.scheduled_at"]) for r in runs if r.attributes}
    assert got <= claimed and len(got) == len(runs)  # one span per claimed run
    for r in runs:
        assert r.attributes is not None and r.attributes["pgstore.owner"] == "s1"
        fine = r.attributes["pgstore.task_id"] == "work"
        assert r.attributes["pgstore.outcome"] == ("ok" if fine else "error")
        assert r.status.status_code == (trace.StatusCode.UNSET if fine
                                        else trace.StatusCode.ERROR)
    # A plain handler runs in its thread inside the run's span: its spans are children.
    inner = spans("the-app.work")
    by_id = {r.context.span_id: r for r in runs if r.context is not None}
    assert inner
    for child in inner:
        assert child.parent is not None and child.parent.span_id in by_id
        parent = by_id[child.parent.span_id]
        assert parent.attributes is not None and child.attributes is not None
        assert child.attributes["token"] == parent.attributes["pgstore.fencing_token"]


def test_each_dispatch_is_a_span_with_its_lease_sequence_and_outcome(
    pgstore_database: str, pgstore_schema: str, spans: Callable[[str], list[ReadableSpan]]
) -> None:
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    other = PgJobStore(pgstore_database, schema=pgstore_schema)
    now = store.now_ms()
    store.schedule("ok", now - 4_000)
    store.schedule("cancel", now - 3_000)
    store.schedule("flaky", now - 2_000)

    def dispatch(job: Job) -> str:
        if job.run_id == "flaky" and job.lease_sequence == 1:
            raise ConnectionError("provider down")
        if job.run_id == "cancel":
            other.cancel("cancel")
        return "bot"

    d = Dispatcher(store, dispatch, holder="d1", poll_interval=0.02, listen=False,
                   backoff=Backoff(base_ms=1, max_ms=1, jitter=0))

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await until("four dispatches", lambda: len(spans("pgstore.dispatch")) >= 4)
        d.stop()
        await task

    asyncio.run(main())
    store.close()
    other.close()
    got = {}
    for span in spans("pgstore.dispatch"):
        a = span.attributes
        assert a is not None and a["pgstore.owner"] == "d1"
        assert isinstance(a["pgstore.lateness_ms"], int)
        got[a["pgstore.run_id"], a["pgstore.lease_sequence"]] = (
            a["pgstore.outcome"], span.status.status_code, a["pgstore.lateness_ms"])
    assert {k: v[:2] for k, v in got.items()} == {
        ("ok", 1): ("completed", trace.StatusCode.UNSET),
        ("cancel", 1): ("cancelled", trace.StatusCode.UNSET),
        ("flaky", 1): ("released", trace.StatusCode.ERROR),
        ("flaky", 2): ("completed", trace.StatusCode.UNSET)}
    assert got["ok", 1][2] >= 4_000 and got["cancel", 1][2] >= 3_000


def test_what_dispatch_and_recall_open_are_children_of_the_dispatch_span(
    pgstore_database: str, pgstore_schema: str, spans: Callable[[str], list[ReadableSpan]]
) -> None:
    """A run's tasks run in its span's context: the provider call's spans (a plain
    function, in the thread pool) and the recall's (``async def``, in the task that
    settles a mark answered cancelled) are children of the job's ``pgstore.dispatch``."""
    store = PgJobStore(pgstore_database, schema=pgstore_schema)
    other = PgJobStore(pgstore_database, schema=pgstore_schema)
    tracer = trace.get_tracer("provider")
    store.schedule("stays", store.now_ms() - 2_000)
    store.schedule("leaves", store.now_ms() - 1_000)

    def dispatch(job: Job) -> str:
        with tracer.start_as_current_span("provider.send"):
            if job.run_id == "leaves":
                other.cancel("leaves")
            return "bot-" + job.run_id

    async def recall(job: Job, worker_id: str | None) -> None:
        with tracer.start_as_current_span("provider.recall"):
            await asyncio.sleep(0)

    d = Dispatcher(store, dispatch, recall, holder="d1", poll_interval=0.02, listen=False)

    async def main() -> None:
        task = asyncio.ensure_future(d.run(handle_signals=False))
        await until("two dispatches", lambda: len(spans("pgstore.dispatch")) >= 2)
        d.stop()
        await task

    asyncio.run(main())
    store.close()
    other.close()
    runs = {str((s.attributes or {})["pgstore.run_id"]): s for s in spans("pgstore.dispatch")}
    assert {k: (v.attributes or {})["pgstore.outcome"] for k, v in runs.items()} == {
        "stays": "completed", "leaves": "cancelled"}

    def parent(child: ReadableSpan) -> str:
        assert child.parent is not None
        (of,) = [k for k, v in runs.items() if v.context.span_id == child.parent.span_id]
        return of

    assert sorted(parent(s) for s in spans("provider.send")) == ["leaves", "stays"]
    assert [parent(s) for s in spans("provider.recall")] == ["leaves"]


def test_without_opentelemetry_nothing_is_imported_and_the_runtime_runs() -> None:
    """A process where ``import opentelemetry`` fails, as when the extra is not installed."""
    script = textwrap.dedent("""
        import asyncio, sys
        sys.modules["opentelemetry"] = None  # the package is not there
        from pgstore import MemoryScheduleStore, Scheduler
        from pgstore.runtime import tracing
        assert not tracing.ENABLED
        ran = []
        s = Scheduler(MemoryScheduleStore(), poll_interval=0.01)
        s.every("t", 20, lambda: ran.append(1))
        async def main():
            task = asyncio.ensure_future(s.run(handle_signals=False))
            while len(ran) < 3:
                await asyncio.sleep(0.01)
            s.stop()
            await task
        asyncio.run(main())
        assert not any(m.startswith("opentelemetry") and sys.modules[m] is not None
                       for m in sys.modules), "opentelemetry imported"
        with tracing.span("x", {"a": 1}) as span:
            span.set_attribute("b", 2)
            tracing.finish(span, "error")
        print("ran", len(ran))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ran ")


def test_with_the_api_but_no_provider_yet_no_span_is_started_until_one_is_set() -> None:
    """A process with opentelemetry-api and no tracer provider set: ``span`` is the
    shared no-op (nothing started, nothing made current); once the application sets a
    provider, the next span is recorded by it (the proxy's tracer follows it)."""
    script = textwrap.dedent("""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter)
        from pgstore.runtime import tracing
        assert tracing.ENABLED
        with tracing.span("pgstore.dispatch", {"pgstore.run_id": "before"}) as span:
            assert span is tracing._NO_SPAN
            assert not trace.get_current_span().get_span_context().is_valid
        exporter = InMemorySpanExporter()
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(sdk)
        with tracing.span("pgstore.dispatch", {"pgstore.run_id": "after"}) as span:
            assert trace.get_current_span() is span
            tracing.finish(span, "completed")
        names = [(s.name, s.attributes["pgstore.run_id"]) for s in
                 exporter.get_finished_spans()]
        assert names == [("pgstore.dispatch", "after")], names
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_disabled_span_costs_about_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Side by side in one process: the disabled path against a bare ``with`` of a
    no-op context manager (the floor), median of several repeats."""
    import contextlib
    import statistics

    null = contextlib.nullcontext()
    monkeypatch.setattr(tracing, "_trace", None)
    ratios = []
    for _ in range(7):
        started = time.perf_counter()
        for _ in range(20_000):
            with tracing.span("pgstore.dispatch", {"pgstore.run_id": "r"}) as s:
                tracing.finish(s, "completed")
        disabled = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(20_000):
            with null:
                pass
        floor = time.perf_counter() - started
        ratios.append(disabled / floor)
    per_call_us = disabled / 20_000 * 1e6
    print(f"disabled span: {statistics.median(ratios):.1f}x a bare with "
          f"(spread {min(ratios):.1f}-{max(ratios):.1f}), {per_call_us:.2f} us per span")
    assert per_call_us < 50  # microseconds, against a dispatch's milliseconds
