"""The job store's calls (docs/contract.md), shared by the sync and async stores.

Each builder checks what SQL cannot (Python types, NUL, bigint range) and
leaves the value rules (docs/contract.md, bad input) to the SQL function.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.models import (
    CancelResult,
    Job,
    JobFilter,
    JobPage,
    MarkResult,
    QueueInfo,
    RetryResult,
)
from pgstore.postgres import _functions as _sql
from pgstore.postgres import rows as _rows
from pgstore.postgres.call import Call

# The functions called here, as sql/ declares them (generated: ``_functions``).
#: The NOTIFY channel of job_schedule (the dispatcher's listener calls it directly).
CHANNEL = _sql.JOB_CHANNEL
SCHEDULE = _sql.JOB_SCHEDULE
LEASE = _sql.JOB_LEASE
RENEW = _sql.JOB_RENEW
MARK_DISPATCHED = _sql.JOB_MARK_DISPATCHED
RELEASE = _sql.JOB_RELEASE
RETRY = _sql.JOB_RETRY
CANCEL = _sql.JOB_CANCEL
RESCHEDULE = _sql.JOB_RESCHEDULE
GET = _sql.JOB_GET
LIST_DISPATCHED = _sql.JOB_LIST_DISPATCHED
REMOVE = _sql.JOB_REMOVE
LIST = _sql.JOB_LIST
PURGE = _sql.JOB_PURGE
SCHEDULE_MANY = _sql.JOB_SCHEDULE_MANY
LEASE_MANY = _sql.JOB_LEASE_MANY
MARK_DISPATCHED_MANY = _sql.JOB_MARK_DISPATCHED_MANY
RENEW_MANY = _sql.JOB_RENEW_MANY
QUEUE_PAUSE = _sql.QUEUE_PAUSE
QUEUE_RESUME = _sql.QUEUE_RESUME
QUEUE_LIST = _sql.QUEUE_LIST
QUEUE_SET_CONCURRENCY = _sql.QUEUE_SET_CONCURRENCY
QUEUE_SET_RATE = _sql.QUEUE_SET_RATE


def _integer_count(param: str, value: object) -> None:
    """An integer argument (limit, max_attempts): SQL's integer range, and below it 22023,
    as SQL says for a value that is not positive."""
    v.integer(param, value, maximum=v.INTEGER_MAX)
    if isinstance(value, int) and value <= 0:
        v.positive(param, value)


def schedule(
    run_id: str, dispatch_at: int, max_attempts: int | None, queue: str | None,
    priority: int | None, payload: object,
) -> Call[None]:
    v.text("run_id", run_id)
    v.integer("dispatch_at", dispatch_at)
    _integer_count("max_attempts", max_attempts)
    v.text("queue", queue)
    v.priority("priority", priority)
    encoded = v.payload("payload", payload)
    args = (run_id, dispatch_at, max_attempts, queue, priority, encoded)
    return Call(SCHEDULE, args, _rows.nothing)


def _queues(queues: Sequence[str] | None) -> list[str] | None:
    v.text_list("queues", queues)
    return None if queues is None else list(queues)


def lease(
    holder: str, now: int | None, ttl_ms: int, queues: Sequence[str] | None
) -> Call[Job | None]:
    v.text("holder", holder)
    v.integer("now", now)
    v.integer("ttl_ms", ttl_ms)
    return Call(LEASE, (holder, now, ttl_ms, _queues(queues)), _rows.optional_job)


def renew(
    run_id: str, holder: str, now: int | None, ttl_ms: int, lease_sequence: int | None
) -> Call[bool]:
    v.text("run_id", run_id)
    v.text("holder", holder)
    v.integer("now", now)
    v.integer("ttl_ms", ttl_ms)
    v.integer("lease_sequence", lease_sequence)
    return Call(RENEW, (run_id, holder, now, ttl_ms, lease_sequence), _rows.boolean)


def mark_dispatched(
    run_id: str, holder: str, worker_id: str | None, lease_sequence: int | None
) -> Call[MarkResult]:
    v.text("run_id", run_id)
    v.text("holder", holder)
    v.text("worker_id", worker_id)
    v.integer("lease_sequence", lease_sequence)
    args = (run_id, holder, worker_id, lease_sequence)
    return Call(MARK_DISPATCHED, args, _rows.mark_result)


def release(
    run_id: str, holder: str, retry_at: int, lease_sequence: int | None, error: str | None
) -> Call[bool]:
    v.text("run_id", run_id)
    v.text("holder", holder)
    v.integer("retry_at", retry_at)
    v.integer("lease_sequence", lease_sequence)
    v.text("error", error)
    return Call(RELEASE, (run_id, holder, retry_at, lease_sequence, error), _rows.boolean)


def retry(run_id: str, dispatch_at: int | None) -> Call[RetryResult]:
    v.text("run_id", run_id)
    v.integer("dispatch_at", dispatch_at)
    return Call(RETRY, (run_id, dispatch_at), _rows.retry_result)


def cancel(run_id: str) -> Call[CancelResult]:
    v.text("run_id", run_id)
    return Call(CANCEL, (run_id,), _rows.cancel_result)


def reschedule(run_id: str, dispatch_at: int, now: int | None) -> Call[Job | None]:
    v.text("run_id", run_id)
    v.integer("dispatch_at", dispatch_at)
    v.integer("now", now)
    return Call(RESCHEDULE, (run_id, dispatch_at, now), _rows.optional_job)


def get(run_id: str) -> Call[Job | None]:
    v.text("run_id", run_id)
    return Call(GET, (run_id,), _rows.optional_job)


def list_dispatched() -> Call[list[Job]]:
    return Call(LIST_DISPATCHED, (), _rows.jobs)


def remove(run_id: str) -> Call[None]:
    v.text("run_id", run_id)
    return Call(REMOVE, (run_id,), _rows.nothing)


def list_jobs(
    filter: JobFilter, now: int | None, limit: int | None, queues: Sequence[str] | None
) -> Call[JobPage]:
    v.text("filter", filter)
    v.integer("now", now)
    _integer_count("limit", limit)
    return Call(LIST, (filter, now, limit, _queues(queues)), _rows.job_page)


def list_failed(limit: int | None) -> Call[list[Job]]:
    _integer_count("limit", limit)
    return Call(LIST, ("failed", None, limit, None), _rows.jobs)


def purge(before: int, limit: int) -> Call[int]:
    v.integer("before", before)
    _integer_count("limit", limit)
    return Call(PURGE, (before, limit), _rows.integer_value)


def _list(value: Sequence[object] | None) -> list[object] | None:
    """A batch's array as psycopg sends it (a list; None stays NULL)."""
    return None if value is None else list(value)


def _limit(limit: int) -> None:
    v.integer("limit", limit, maximum=v.INTEGER_MAX)
    if isinstance(limit, int) and limit <= 0:
        v.positive("limit", limit)  # below integer's range too: 22023, as SQL says for <= 0


def _payloads(payloads: Sequence[object] | None) -> list[str | None] | None:
    if payloads is None:
        return None
    if not isinstance(payloads, (list, tuple)):
        raise InvalidArgument(f"payloads must be a list, not {type(payloads).__name__}")
    return [v.payload("payloads", p) for p in payloads]


def schedule_many(
    run_ids: Sequence[str], dispatch_at: Sequence[int], queue: str | None,
    priority: int | None, payloads: Sequence[object] | None,
) -> Call[None]:
    v.text_list("run_ids", run_ids)
    v.integer_list("dispatch_at", dispatch_at)
    v.text("queue", queue)
    v.priority("priority", priority)
    args = (_list(run_ids), _list(dispatch_at), queue, priority, _payloads(payloads))
    return Call(SCHEDULE_MANY, args, _rows.nothing)


def lease_many(
    holder: str, now: int | None, ttl_ms: int, limit: int, queues: Sequence[str] | None
) -> Call[list[Job]]:
    v.text("holder", holder)
    v.integer("now", now)
    v.integer("ttl_ms", ttl_ms)
    _limit(limit)
    return Call(LEASE_MANY, (holder, now, ttl_ms, limit, _queues(queues)), _rows.jobs)


def mark_dispatched_many(
    run_ids: Sequence[str], holder: str, worker_ids: Sequence[str | None],
    lease_sequences: Sequence[int | None] | None,
) -> Call[list[MarkResult]]:
    v.text_list("run_ids", run_ids)
    v.text("holder", holder)
    v.text_list("worker_ids", worker_ids)
    v.integer_list("lease_sequences", lease_sequences)
    args = (_list(run_ids), holder, _list(worker_ids), _list(lease_sequences))
    return Call(MARK_DISPATCHED_MANY, args, _rows.mark_results)


def renew_many(
    run_ids: Sequence[str], holder: str, now: int | None, ttl_ms: int,
    lease_sequences: Sequence[int | None] | None,
) -> Call[list[bool]]:
    v.text_list("run_ids", run_ids)
    v.text("holder", holder)
    v.integer("now", now)
    v.integer("ttl_ms", ttl_ms)
    v.integer_list("lease_sequences", lease_sequences)
    args = (_list(run_ids), holder, now, ttl_ms, _list(lease_sequences))
    return Call(RENEW_MANY, args, _rows.renewed)


def pause_queue(queue: str) -> Call[bool]:
    v.text("queue", queue)
    return Call(QUEUE_PAUSE, (queue,), _rows.boolean_value)


def resume_queue(queue: str) -> Call[bool]:
    v.text("queue", queue)
    return Call(QUEUE_RESUME, (queue,), _rows.boolean_value)


def set_queue_concurrency(queue: str, limit: int | None) -> Call[bool]:
    v.text("queue", queue)
    v.integer("limit", limit, maximum=v.INTEGER_MAX)
    return Call(QUEUE_SET_CONCURRENCY, (queue, limit), _rows.boolean_value)


def set_queue_rate(queue: str, limit: int | None, period_ms: int | None) -> Call[bool]:
    v.text("queue", queue)
    v.integer("limit", limit, maximum=v.INTEGER_MAX)
    v.integer("period_ms", period_ms)
    return Call(QUEUE_SET_RATE, (queue, limit, period_ms), _rows.boolean_value)


def list_queues(now: int | None) -> Call[list[QueueInfo]]:
    v.integer("now", now)
    return Call(QUEUE_LIST, (now,), _rows.queue_infos)
