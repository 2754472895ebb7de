"""The in-process reference job store (docs/contract.md): nothing survives the process.

It is the model the PostgreSQL job stores are tested against, so it states the
contract in plain Python: same answers, same state, same bad-input rules.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pgstore import _validate as v
from pgstore.errors import InvalidArgument, JobNotRemovable
from pgstore.memory.limits import QueueLimits, check_concurrency, check_rate
from pgstore.memory.schedules import wall_clock_ms
from pgstore.models import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_QUEUE,
    ERROR_MAX_CHARS,
    CancelResult,
    Job,
    MarkResult,
    QueueInfo,
    RetryResult,
)

__all__ = ["MemoryJobStore"]


def _check_sequence(lease_sequence: object) -> None:
    """None (no fence) or a positive integer, as SQL's check_sequence says."""
    v.integer("lease_sequence", lease_sequence)
    if isinstance(lease_sequence, int) and lease_sequence <= 0:
        raise InvalidArgument("lease_sequence must be a positive integer or null")


def _same_lease(job: Job, lease_sequence: int | None) -> bool:
    """No fence, or the job's current lease is the one numbered ``lease_sequence``."""
    return lease_sequence is None or job.lease_sequence == lease_sequence


def _lease_live(job: Job, at: int) -> bool:
    """Someone holds ``job`` at ``at`` (lease_until > now)."""
    return job.lease_until is not None and job.lease_until > at


def _out_of_attempts(job: Job) -> bool:
    """A due job whose last lease was taken (and expired without a release): the lease
    that finds it fails it instead (SQL's job_lease)."""
    return job.attempts >= job.max_attempts


def _exhausted_error(job: Job) -> str:
    """The last_error job_lease writes when it fails a job out of attempts."""
    return (
        f"out of attempts: leased {job.attempts} times (max_attempts {job.max_attempts}),"
        " the last lease expired without a release"
    )


def _not_removable(job: Job) -> str | None:
    """Why ``remove`` refuses ``job`` (SQL's job_remove message), or None: it waits with
    no lease holder."""
    if job.state == "waiting" and job.lease_holder is None:
        return None
    quoted = "'" + job.run_id.replace("'", "''") + "'"
    state: str
    if job.state != "waiting":
        state = job.state
    else:
        holder = "'" + job.lease_holder.replace("'", "''") + "'" if job.lease_holder else ""
        state = (f"leased by {holder} (lease_sequence {job.lease_sequence};"
                 " a dispatch may be running)")
    return f"job {quoted} is {state}: job_remove deletes only a waiting job that holds no lease"


def _lease_order(job: Job) -> tuple[int, int, str]:
    """Lease order: highest priority first, then earliest dispatch_at, then run_id."""
    return (-job.priority, job.dispatch_at, job.run_id)


def _decoded(encoded: str | None) -> Any:
    """The payload as a PostgreSQL store answers it: its JSON text decoded again (a
    fresh copy, tuples as lists), None for none."""
    return None if encoded is None else json.loads(encoded)


def _check_max_attempts(max_attempts: object) -> None:
    """None (the store default) or a positive integer within SQL's integer."""
    if max_attempts is not None:
        v.positive("max_attempts", max_attempts, maximum=v.INTEGER_MAX)


class MemoryJobStore:
    """Reference, in-process job store; thread-safe. Has ``forget`` for in-memory hosts.

    ``default_max_attempts`` is what ``schedule`` stores for a job given no
    ``max_attempts`` (PostgreSQL's ``store_settings.default_max_attempts``). Like
    PostgreSQL's ``job_fences``, it keeps the greatest lease sequence of the jobs it
    deleted (``remove``, ``purge``, ``forget``) and leases above it, so a run_id that
    comes back never repeats a lease sequence. It has no bound on leases (nor on
    ``now``): one process, one clock. ``max_payload_bytes`` bounds a payload's JSON text
    (PostgreSQL's ``store_settings.max_payload_bytes``)."""

    def __init__(
        self, default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.default_max_attempts = v.positive(
            "default_max_attempts", default_max_attempts, maximum=v.INTEGER_MAX
        )
        self.max_payload_bytes = v.positive(
            "max_payload_bytes", max_payload_bytes, maximum=v.INTEGER_MAX
        )
        self._jobs: dict[str, Job] = {}
        #: finished_at by run_id (this process's clock), also on each finished ``Job``:
        #: what purge walks, oldest first.
        self._finished: dict[str, int] = {}
        #: The greatest lease_sequence of any job deleted (SQL's job_fences.lease_sequence).
        self._fence = 0
        #: Every queue ever paused, and whether it is now (SQL's queues table).
        self._queues: dict[str, bool] = {}
        #: The queue limits and their lanes (SQL's queues columns and queue_slots).
        self._limits = QueueLimits(self._jobs)
        self._lock = threading.Lock()

    def _finish(self, run_id: str, job: Job) -> None:
        """Store ``job``, which just finished (dispatched, cancelled or failed): its
        ``finished_at`` is the first finish's time, as the SQL's coalesce keeps it."""
        at = self._finished.setdefault(run_id, wall_clock_ms())
        self._jobs[run_id] = job if job.finished_at == at else replace(job, finished_at=at)

    def start(self) -> None:
        """Nothing to set up."""

    def schedule(
        self, run_id: str, dispatch_at: int, max_attempts: int | None = None,
        queue: str | None = None, priority: int | None = None, payload: Any = None,
    ) -> None:
        v.name("run_id", run_id)
        v.present_int("dispatch_at", dispatch_at)
        _check_max_attempts(max_attempts)
        if queue is not None:
            v.name("queue", queue)
        v.priority("priority", priority)
        encoded = v.payload("payload", payload)
        v.payload_size("payload", encoded, self.max_payload_bytes)
        with self._lock:
            current = self._jobs.get(run_id)
            if current is None:
                self._jobs[run_id] = Job(
                    run_id=run_id, dispatch_at=dispatch_at, lease_holder=None,
                    lease_until=None, worker_id=None, dispatched=False, cancelled=False,
                    max_attempts=(
                        self.default_max_attempts if max_attempts is None else max_attempts
                    ),
                    queue=DEFAULT_QUEUE if queue is None else queue,
                    priority=0 if priority is None else priority,
                    payload=_decoded(encoded),
                )
            else:
                self._jobs[run_id] = replace(
                    current, dispatch_at=dispatch_at,
                    max_attempts=current.max_attempts if max_attempts is None else max_attempts,
                    queue=current.queue if queue is None else queue,
                    priority=current.priority if priority is None else priority,
                    payload=current.payload if encoded is None else _decoded(encoded),
                )

    def _leasable(self, at: int, queues: list[str] | None) -> list[Job]:
        """The jobs a lease at ``at`` may take from ``queues`` (None: every queue), in
        lease order (under the lock)."""
        allowed = None if queues is None else set(queues)
        return sorted(
            (job for job in self._jobs.values()
             if job.state == "waiting" and job.dispatch_at <= at
             and (job.lease_until is None or job.lease_until <= at)
             and (allowed is None or job.queue in allowed)
             and not self._queues.get(job.queue, False)),
            key=_lease_order,
        )

    def lease(
        self, holder: str, now: int | None, ttl_ms: int, queues: Sequence[str] | None = None
    ) -> Job | None:
        v.name("holder", holder)
        v.integer("now", now)
        v.positive("ttl_ms", ttl_ms)
        wanted = v.queues("queues", queues)
        at = wall_clock_ms() if now is None else now
        until = v.add(at, ttl_ms)
        with self._lock:
            taken = self._lease_up_to(1, at, wanted, holder, until)
            return taken[0] if taken else None

    def renew(
        self, run_id: str, holder: str, now: int | None, ttl_ms: int,
        lease_sequence: int | None = None,
    ) -> bool:
        v.name("run_id", run_id)
        v.name("holder", holder)
        v.integer("now", now)
        v.positive("ttl_ms", ttl_ms)
        _check_sequence(lease_sequence)
        at = wall_clock_ms() if now is None else now
        until = v.add(at, ttl_ms)
        with self._lock:
            job = self._jobs.get(run_id)
            if (
                job is None
                or job.lease_holder != holder
                or job.lease_until is None
                or job.lease_until <= at
                or not _same_lease(job, lease_sequence)
            ):
                return False
            return self._renewed(job, at, until)

    def _renewed(self, job: Job, at: int, until: int) -> bool:
        """Extend ``job``'s live lease to ``until`` (under the lock), and its row of a
        concurrency limit; a lease that holds none and finds none free ends at ``at``."""
        renewed = replace(job, lease_until=until)
        self._jobs[job.run_id] = renewed
        if self._limits.keep(renewed, at, until):
            return True
        self._jobs[job.run_id] = replace(job, lease_until=at)
        return False

    def mark_dispatched(
        self, run_id: str, holder: str, worker_id: str | None,
        lease_sequence: int | None = None,
    ) -> MarkResult:
        v.name("run_id", run_id)
        v.name("holder", holder)
        v.worker_id("worker_id", worker_id)
        _check_sequence(lease_sequence)
        with self._lock:
            job = self._jobs.get(run_id)
            if job is None:
                return MarkResult(cancelled=False, recorded=False)
            if job.lease_holder != holder or not _same_lease(job, lease_sequence):
                return MarkResult(cancelled=job.cancelled, recorded=False)
            self._finish(run_id, replace(job, dispatched=True, worker_id=worker_id))
            return MarkResult(cancelled=job.cancelled, recorded=True)

    def release(
        self, run_id: str, holder: str, retry_at: int, lease_sequence: int | None = None,
        error: str | None = None,
    ) -> bool:
        v.name("run_id", run_id)
        v.name("holder", holder)
        v.present_int("retry_at", retry_at)
        _check_sequence(lease_sequence)
        v.text("error", error)
        if error is not None and len(error) > ERROR_MAX_CHARS:
            raise InvalidArgument("error must be a string of at most 4096 characters")
        with self._lock:
            job = self._jobs.get(run_id)
            if (
                job is None
                or job.lease_holder != holder
                or job.dispatched
                or not _same_lease(job, lease_sequence)
            ):
                return False
            last_error = job.last_error if error is None else error
            if job.last_attempt:
                self._finish(run_id, replace(
                    job, lease_holder=None, lease_until=None, failed=True, last_error=last_error
                ))
            else:
                self._jobs[run_id] = replace(
                    job, lease_holder=None, lease_until=None, dispatch_at=retry_at,
                    last_error=last_error,
                )
            return True

    def retry(self, run_id: str, dispatch_at: int | None = None) -> RetryResult:
        v.name("run_id", run_id)
        v.integer("dispatch_at", dispatch_at)
        at = wall_clock_ms() if dispatch_at is None else dispatch_at
        with self._lock:
            job = self._jobs.get(run_id)
            if job is None:
                return RetryResult.MISSING
            if job.state != "failed":
                return RetryResult.NOT_FAILED
            self._jobs[run_id] = replace(job, failed=False, attempts=0, dispatch_at=at,
                                         finished_at=None)
            self._finished.pop(run_id, None)
            return RetryResult.RETRIED

    def list_failed(self, limit: int | None = None) -> list[Job]:
        if limit is not None:
            v.positive("limit", limit, maximum=v.INTEGER_MAX)
        with self._lock:
            failed = sorted(
                (job for job in self._jobs.values() if job.state == "failed"),
                key=lambda job: (job.dispatch_at, job.run_id),
            )
        return failed if limit is None else failed[:limit]

    def cancel(self, run_id: str) -> CancelResult:
        v.name("run_id", run_id)
        with self._lock:
            job = self._jobs.get(run_id)
            if job is None:
                return CancelResult.MISSING
            if job.dispatched:
                return CancelResult.ALREADY_DISPATCHED
            self._finish(run_id, replace(job, cancelled=True))
            return CancelResult.CANCELLED

    def reschedule(
        self, run_id: str, dispatch_at: int, now: int | None = None
    ) -> Job | None:
        v.name("run_id", run_id)
        v.present_int("dispatch_at", dispatch_at)
        v.integer("now", now)
        at = wall_clock_ms() if now is None else now
        with self._lock:
            job = self._jobs.get(run_id)
            if (job is None or job.dispatched or job.cancelled or job.failed
                    or _lease_live(job, at)):
                return None
            moved = replace(job, dispatch_at=dispatch_at, lease_holder=None, lease_until=None)
            self._jobs[run_id] = moved
            return moved

    def get(self, run_id: str) -> Job | None:
        v.name("run_id", run_id)
        with self._lock:
            return self._jobs.get(run_id)

    def list_dispatched(self) -> list[Job]:
        with self._lock:
            return [self._jobs[r] for r in sorted(self._jobs) if self._jobs[r].dispatched]

    def remove(self, run_id: str) -> None:
        """Delete a job that waits with no lease holder; unknown: nothing; any other:
        ``JobNotRemovable``, nothing changed (SQL's job_remove)."""
        v.name("run_id", run_id)
        with self._lock:
            job = self._jobs.get(run_id)
            if job is None:
                return
            refused = _not_removable(job)
            if refused is not None:
                raise JobNotRemovable(refused)
            self._delete(run_id)

    def _delete(self, run_id: str) -> None:
        """Drop ``run_id`` (under the lock), raising the fence to its lease sequence."""
        job = self._jobs.pop(run_id)
        self._finished.pop(run_id, None)
        self._fence = max(self._fence, job.lease_sequence)

    def purge(self, before: int, limit: int) -> int:
        """Delete at most ``limit`` finished jobs (dispatched, cancelled or failed) that finished
        before ``before``, oldest first, never one whose lease is live; how many went."""
        v.present_int("before", before)
        if before < 0:
            raise InvalidArgument("before must be a non-negative integer")
        v.positive("limit", limit, maximum=v.INTEGER_MAX)
        at = wall_clock_ms()
        with self._lock:
            finished = sorted(
                (finished_at, run_id) for run_id, finished_at in self._finished.items()
                if finished_at < before and not _lease_live(self._jobs[run_id], at)
            )[:limit]
            for _, run_id in finished:
                self._delete(run_id)
            return len(finished)

    # --- batches (sql/22_job_batches.sql): the single-job rules, for each job ----------

    def schedule_many(
        self, run_ids: Sequence[str], dispatch_at: Sequence[int], queue: str | None = None,
        priority: int | None = None, payloads: Sequence[Any] | None = None,
    ) -> None:
        ids = v.run_ids(run_ids)
        v.integer_list("dispatch_at", dispatch_at)
        times = v.same_length("dispatch_at", dispatch_at, len(ids))
        if any(t is None for t in times):
            raise InvalidArgument("dispatch_at must not hold a null")
        if queue is not None:
            v.name("queue", queue)
        v.priority("priority", priority)
        encoded: list[str | None] = [None] * len(ids)
        if payloads is not None:
            if not isinstance(payloads, (list, tuple)):
                raise InvalidArgument(
                    f"payloads must be a list, not {type(payloads).__name__}")
            encoded = [v.payload("payloads", p) for p in payloads]
            v.same_length("payloads", encoded, len(ids))
            for e in encoded:
                if e is not None and len(e.encode("utf-8")) > self.max_payload_bytes:
                    raise InvalidArgument(
                        f"payloads must hold payloads of at most {self.max_payload_bytes}"
                        " bytes as JSON text (store_settings.max_payload_bytes)")
        with self._lock:
            for run_id, at, payload in zip(ids, times, encoded, strict=True):
                assert isinstance(at, int)
                current = self._jobs.get(run_id)
                if current is None:
                    self._jobs[run_id] = Job(
                        run_id=run_id, dispatch_at=at, lease_holder=None, lease_until=None,
                        worker_id=None, dispatched=False, cancelled=False,
                        max_attempts=self.default_max_attempts,
                        queue=DEFAULT_QUEUE if queue is None else queue,
                        priority=0 if priority is None else priority,
                        payload=_decoded(payload),
                    )
                else:
                    self._jobs[run_id] = replace(
                        current, dispatch_at=at,
                        queue=current.queue if queue is None else queue,
                        priority=current.priority if priority is None else priority,
                        payload=current.payload if payload is None else _decoded(payload),
                    )

    def lease_many(
        self, holder: str, now: int | None, ttl_ms: int, limit: int,
        queues: Sequence[str] | None = None,
    ) -> list[Job]:
        v.name("holder", holder)
        v.integer("now", now)
        v.positive("ttl_ms", ttl_ms)
        v.positive("limit", limit, maximum=v.INTEGER_MAX)
        if limit > v.BATCH_MAX:
            raise InvalidArgument(f"limit must be at most {v.BATCH_MAX}")
        wanted = v.queues("queues", queues)
        at = wall_clock_ms() if now is None else now
        until = v.add(at, ttl_ms)
        with self._lock:
            return self._lease_up_to(limit, at, wanted, holder, until)

    def _lease_up_to(
        self, limit: int, at: int, queues: list[str] | None, holder: str, until: int
    ) -> list[Job]:
        """job_lease_take (under the lock): up to ``limit`` leasable jobs in lease order,
        at most its cap of each limited queue's (a job failed out of attempts counts
        against ``limit``, as its candidate does in SQL, and in a round against the cap:
        then another round, as SQL's), written into the queues' rows."""
        leasable = self._leasable(at, queues)
        reserved = self._limits.reserve({job.queue for job in leasable}, at, limit)
        caps = {queue: len(lanes) for queue, lanes in reserved.items()}
        if all(caps.get(job.queue, 1) <= 0 for job in leasable):
            return []  # every queue full: SQL's lease ends before queue_limits_fill
        taken: list[Job] = []
        left = limit
        while True:
            chosen: list[Job] = []
            rounds = dict(caps)
            for job in leasable:
                if len(chosen) == left:
                    break
                if job.queue in rounds:
                    if rounds[job.queue] <= 0:
                        continue
                    rounds[job.queue] -= 1
                chosen.append(job)
            failed: set[str] = set()
            for job in chosen:
                if leased := self._take(job, holder, until):
                    taken.append(leased)
                    if job.queue in caps:
                        caps[job.queue] -= 1
                else:
                    failed.add(job.queue)
            left -= len(chosen)
            if left <= 0 or not any(caps.get(queue, 0) > 0 for queue in failed):
                break
            leasable = self._leasable(at, queues)
        self._limits.take(taken, at, reserved)
        return sorted(taken, key=_lease_order)

    def _take(self, job: Job, holder: str, until: int) -> Job | None:
        """Lease ``job`` (under the lock), numbered above its last lease and the fence; or,
        out of attempts, fail it and answer None."""
        if _out_of_attempts(job):
            self._jobs[job.run_id] = replace(
                job, lease_holder=None, lease_until=None, failed=True,
                last_error=_exhausted_error(job),
            )
            self._finished[job.run_id] = wall_clock_ms()
            return None
        leased = replace(
            job, lease_holder=holder, lease_until=until,
            lease_sequence=max(job.lease_sequence, self._fence) + 1, attempts=job.attempts + 1,
        )
        self._jobs[job.run_id] = leased
        return leased

    def mark_dispatched_many(
        self, run_ids: Sequence[str], holder: str, worker_ids: Sequence[str | None],
        lease_sequences: Sequence[int | None] | None = None,
    ) -> list[MarkResult]:
        ids = v.run_ids(run_ids)
        v.name("holder", holder)
        v.text_list("worker_ids", worker_ids)
        workers = v.same_length("worker_ids", worker_ids, len(ids))
        if any(isinstance(w, str) and len(w) > v.NAME_MAX_CHARS for w in workers):
            raise InvalidArgument("worker_ids must hold strings of at most 1024 characters")
        fences = self._fences(lease_sequences, len(ids))
        answers = []
        with self._lock:
            for run_id, worker_id, fence in zip(ids, workers, fences, strict=True):
                assert worker_id is None or isinstance(worker_id, str)
                job = self._jobs.get(run_id)
                if job is None:
                    answers.append(MarkResult(cancelled=False, recorded=False))
                elif job.lease_holder != holder or not _same_lease(job, fence):
                    answers.append(MarkResult(cancelled=job.cancelled, recorded=False))
                else:
                    self._finish(run_id, replace(job, dispatched=True, worker_id=worker_id))
                    answers.append(MarkResult(cancelled=job.cancelled, recorded=True))
        return answers

    def renew_many(
        self, run_ids: Sequence[str], holder: str, now: int | None, ttl_ms: int,
        lease_sequences: Sequence[int | None] | None = None,
    ) -> list[bool]:
        ids = v.run_ids(run_ids)
        v.name("holder", holder)
        v.positive("ttl_ms", ttl_ms)
        fences = self._fences(lease_sequences, len(ids))
        v.integer("now", now)
        at = wall_clock_ms() if now is None else now
        until = v.add(at, ttl_ms)
        held: dict[str, Job] = {}
        with self._lock:
            for run_id, fence in zip(ids, fences, strict=True):
                job = self._jobs.get(run_id)
                if (
                    job is not None and job.lease_holder == holder
                    and _lease_live(job, at) and _same_lease(job, fence)
                ):
                    held[run_id] = job
            # By run_id, as SQL's queue_limits_keep hands out free rows.
            renewed = {run_id: self._renewed(held[run_id], at, until) for run_id in sorted(held)}
        return [renewed.get(run_id, False) for run_id in ids]

    @staticmethod
    def _fences(lease_sequences: Sequence[int | None] | None, length: int) -> list[int | None]:
        """A batch's fences (check_same_length and check_sequence for each): None for no
        fence at all."""
        v.integer_list("lease_sequences", lease_sequences)
        if lease_sequences is None:
            return [None] * length
        fences = v.same_length("lease_sequences", lease_sequences, length)
        if any(isinstance(f, int) and f <= 0 for f in fences):
            raise InvalidArgument("lease_sequences must hold positive integers or nulls")
        return [f if isinstance(f, int) else None for f in fences]

    def forget(self, run_id: str) -> None:
        """Evict everything kept for ``run_id``, in whatever state (for in-memory hosts,
        after terminal cleanup and the retention grace, once producers have stopped):
        unlike ``remove``, it refuses nothing. The fence still rises to the job's lease
        sequence, so a run_id that comes back is leased above it."""
        v.name("run_id", run_id)
        with self._lock:
            if run_id in self._jobs:
                self._delete(run_id)

    # --- queue controls (sql/23_queues.sql) ------------------------------------------

    def pause_queue(self, queue: str) -> bool:
        v.name("queue", queue)
        with self._lock:
            if self._queues.get(queue, False):
                return False
            self._queues[queue] = True
            return True

    def resume_queue(self, queue: str) -> bool:
        v.name("queue", queue)
        with self._lock:
            if not self._queues.get(queue, False):
                return False
            self._queues[queue] = False
            return True

    def set_queue_concurrency(self, queue: str, limit: int | None) -> bool:
        check_concurrency(queue, limit)
        with self._lock:
            return self._limits.set_concurrency(queue, limit)

    def set_queue_rate(self, queue: str, limit: int | None, period_ms: int | None) -> bool:
        check_rate(queue, limit, period_ms)
        with self._lock:
            return self._limits.set_rate(queue, limit, period_ms)

    def list_queues(self, now: int | None = None) -> list[QueueInfo]:
        v.integer("now", now)
        at = wall_clock_ms() if now is None else now
        with self._lock:
            counts: dict[str, list[int]] = {}
            for job in self._jobs.values():
                if job.state != "waiting":
                    continue
                c = counts.setdefault(job.queue, [0, 0, 0])
                c[0] += 1
                if _lease_live(job, at):
                    c[2] += 1
                elif job.dispatch_at <= at:
                    c[1] += 1
            names = sorted(set(counts) | set(self._queues) | self._limits.names())
            infos = []
            for q in names:
                depth, due, leased = counts.get(q, [0, 0, 0])
                concurrency, rate, period, used = self._limits.limits(q, at)
                infos.append(QueueInfo(
                    queue=q, depth=depth, due=due, leased=leased,
                    paused=self._queues.get(q, False), concurrency_limit=concurrency,
                    rate_limit=rate, rate_period_ms=period, rate_used=used))
            return infos

    def now_ms(self) -> int:
        """This process's clock in epoch ms."""
        return wall_clock_ms()

    def list_all(self) -> list[Job]:
        """Every job, ordered by run_id (for tests and tools; not part of the contract)."""
        with self._lock:
            return [self._jobs[r] for r in sorted(self._jobs)]
