"""What a failed dispatch leaves in ``last_error``: the Dispatcher's ``redact_error``.

The text is made by the hook before it leaves the process, and stored as the hook
made it; by default credential-like values are replaced by ``***``; a hook that fails
never costs the release. On the memory store and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from pgstore import InvalidArgument, Job, MemoryJobStore, PgJobStore
from pgstore.protocols import JobStore
from pgstore.runtime.dispatcher import Backoff, Dispatcher

SECRET = "sk-live-4242"
URL = f"https://api.example.com/v1/bots?api_key={SECRET}&meeting=7"
RETRY_MS = 60_000


@pytest.fixture(params=["memory", "pg"])
def store(request: pytest.FixtureRequest) -> Iterator[JobStore]:
    if request.param == "memory":
        yield MemoryJobStore()
        return
    pg = PgJobStore(request.getfixturevalue("pgstore_database"),
                    schema=request.getfixturevalue("pgstore_schema"))
    pg.start()
    try:
        yield pg
    finally:
        pg.close()


def _fail(store: JobStore, exc: Exception, **kw: Any) -> Job:
    """Schedule a job, let one dispatch of it raise ``exc``; the job as stored then."""
    store.schedule("meeting", store.now_ms())

    def dispatch(job: Job) -> str:
        raise exc

    d = Dispatcher(store, dispatch, holder="d1", listen=False,
                   backoff=Backoff(base_ms=RETRY_MS, jitter=0), **kw)

    async def main() -> None:
        await d.start()
        assert await d.tick() == 1
        await d.wait_idle()

    asyncio.run(main())
    job = store.get("meeting")
    assert job is not None
    print(f"\nlast_error: {job.last_error!r}")
    return job


def _released(job: Job) -> None:
    """Released for a retry at its backoff: not left to its lease."""
    assert job.lease_holder is None and job.lease_until is None
    assert not job.dispatched and not job.failed and job.attempts == 1


def test_by_default_credentials_are_kept_out_of_last_error(store: JobStore) -> None:
    job = _fail(store, ConnectionError(f"POST {URL} failed: 503"))
    _released(job)
    assert job.last_error == (
        "ConnectionError: POST https://api.example.com/v1/bots?api_key=***&meeting=7 "
        "failed: 503")
    assert SECRET not in (job.last_error or "")


def test_the_hooks_text_is_what_is_stored(store: JobStore) -> None:
    job = _fail(store, ConnectionError(URL),
                redact_error=lambda exc: f"provider call failed ({type(exc).__name__})")
    _released(job)
    assert job.last_error == "provider call failed (ConnectionError)"


def test_none_keeps_the_text_verbatim(store: JobStore) -> None:
    job = _fail(store, ConnectionError(URL), redact_error=None)
    _released(job)
    assert job.last_error == f"ConnectionError: {URL}"


def test_a_failing_hook_does_not_lose_the_release(store: JobStore) -> None:
    def broken(exc: BaseException) -> str:
        raise ZeroDivisionError("oops")

    job = _fail(store, ConnectionError(URL), redact_error=broken)
    _released(job)
    assert job.last_error == (
        "ConnectionError (error text withheld: redact_error raised ZeroDivisionError)")


def test_a_hook_answering_what_text_cannot_hold_does_not_lose_the_release(
    store: JobStore,
) -> None:
    job = _fail(store, ConnectionError(URL), redact_error=lambda exc: "a\x00b\ud800c" + "x" * 5000)
    _released(job)
    assert job.last_error is not None and job.last_error.startswith("a\\x00b\\ud800c")
    assert len(job.last_error) == 4096


def test_a_hook_answering_no_string_falls_back(store: JobStore) -> None:
    job = _fail(store, ConnectionError(URL), redact_error=lambda exc: 42)
    _released(job)
    assert job.last_error == (
        "ConnectionError (error text withheld: redact_error raised TypeError)")


def test_redact_error_must_be_callable() -> None:
    with pytest.raises(InvalidArgument, match="redact_error"):
        Dispatcher(MemoryJobStore(), lambda job: None, redact_error="no")  # type: ignore[arg-type]


@pytest.mark.parametrize(("message", "expected"), [
    ("postgresql://bot:hunter2@db.internal/app refused",
     "postgresql://bot:***@db.internal/app refused"),
    ("401 for Authorization: Bearer eyJhbGciOi.x.y", "401 for Authorization: *** ***"),
    ("token=abc123; password: s3cret, user=alice", "token=***; password: ***, user=alice"),
    ("?client_secret=zz&access_token=yy&x-api-key=ww", "?client_secret=***&access_token=***&x-api-key=***"),
    ("meeting 7 is full", "meeting 7 is full"),
])
def test_redact_secrets_patterns(message: str, expected: str) -> None:
    from pgstore.runtime.redact import redact_secrets

    assert redact_secrets(RuntimeError(message)) == f"RuntimeError: {expected}"
