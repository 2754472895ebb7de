"""The records the stores read and write (docs/contract.md).

docs/reference/records.md is generated from this module's docstrings.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

__all__ = [
    "CATCH_UPS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_QUEUE",
    "ERROR_MAX_CHARS",
    "LAST_STATUSES",
    "MAX_JITTER_MS",
    "SCHEDULE_KINDS",
    "CancelResult",
    "CatchUp",
    "ClaimResult",
    "CompletePatch",
    "Fence",
    "Job",
    "JobState",
    "LastStatus",
    "MarkResult",
    "QueueInfo",
    "RetryResult",
    "ScheduleKind",
    "ScheduleRecord",
    "jitter_due_at",
]

ScheduleKind = Literal["cron", "interval", "once"]
"""A schedule's kind (``ScheduleRecord.kind``): its ``spec`` is a cron expression
(``TZ=<zone> <cron>`` with a zone), an interval in ms, or a one-shot delay in ms, opaque
to the store (docs/contract.md)."""
LastStatus = Literal["ok", "error", "skipped"]
"""How a schedule's last occurrence ended (``ScheduleRecord.last_status``): ``skipped`` is
a missed occurrence not run."""
CatchUp = Literal["skip", "once", "all"]
"""What a scheduler does with the occurrences missed while none ran (docs/catch-up.md)."""

SCHEDULE_KINDS: tuple[ScheduleKind, ...] = ("cron", "interval", "once")
LAST_STATUSES: tuple[LastStatus, ...] = ("ok", "error", "skipped")
CATCH_UPS: tuple[CatchUp, ...] = ("skip", "once", "all")

MAX_JITTER_MS = 86_400_000
"""The largest per-schedule jitter (a day), in ms."""
_BIGINT_MAX = 2**63 - 1


def jitter_due_at(id: str, next_run_at: int | None, jitter_ms: int) -> int | None:
    """When the occurrence of schedule ``id`` at ``next_run_at`` (its nominal time) may be
    claimed: ``next_run_at`` plus a deterministic offset in ``[0, jitter_ms)``, the first
    48 bits of ``md5(id + " " + str(next_run_at))`` modulo ``jitter_ms``; ``next_run_at``
    itself when ``jitter_ms`` is 0, None for None, at most the bigint maximum.
    ``ScheduleRecord.due_at`` with no trigger pending; the SQL function
    ``schedule_due_at`` computes the same."""
    if next_run_at is None or jitter_ms <= 0:
        return next_run_at
    digest = hashlib.md5(f"{id} {next_run_at}".encode(), usedforsecurity=False).hexdigest()
    offset = int(digest[:12], 16) % jitter_ms
    return _BIGINT_MAX if next_run_at > _BIGINT_MAX - offset else next_run_at + offset

DEFAULT_MAX_ATTEMPTS = 25
#: The queue of a job scheduled without one.
DEFAULT_QUEUE = "default"
#: The largest payload, in bytes of its JSON text, unless the owner changes
#: ``store_settings.max_payload_bytes`` (64 KiB).
DEFAULT_MAX_PAYLOAD_BYTES = 65536
"""How many leases a job scheduled without ``max_attempts`` may have: the store default
(``store_settings.default_max_attempts`` in PostgreSQL, which the owner may change)."""
ERROR_MAX_CHARS = 4096
"""The longest error text ``release`` keeps (characters); a longer one is bad input."""

JobState = Literal["waiting", "dispatched", "cancelled", "failed"]
"""Where a job stands (``Job.state``): waiting (to be leased, or leased), or finished
as dispatched, cancelled (never dispatched) or failed (out of attempts)."""


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """Persisted state of one durable task; all times are epoch ms.

    ``next_run_at`` is ``None`` once a one-shot task has run (a tombstone).
    ``fencing_token`` is bumped by every successful claim and never goes
    backwards for an id, even across delete and a new register.
    ``consecutive_failures`` counts the completions in a row whose ``last_status``
    was ``"error"`` (reset to 0 by an ``"ok"`` one).
    ``last_status`` ``skipped`` means the last occurrence was missed and not run
    (``catch_up`` ``skip``). ``catch_up`` is the schedule's policy for missed
    occurrences: the store keeps it, the scheduler applies it (docs/catch-up.md).

    ``next_run_at`` is the nominal time of the next occurrence (what cron or the interval
    grid says); ``due_at`` is when the schedule may be claimed next: ``next_run_at`` plus
    the schedule's deterministic jitter in ``[0, jitter_ms)`` (``jitter_due_at``), the
    same as ``next_run_at`` when ``jitter_ms`` is 0, or a pending trigger's
    ``triggered_at`` when that is earlier. ``paused``: no claim takes it
    (docs/schedule-controls.md). ``triggered_at``: a run out of turn asked for by
    ``trigger`` (the next claim takes it) or held (the claim is that run, and its
    ``complete`` keeps ``next_run_at``).
    """

    id: str
    kind: ScheduleKind
    spec: str
    next_run_at: int | None
    last_run_at: int | None
    last_status: LastStatus | None
    fencing_token: int
    lease_owner: str | None
    lease_until: int | None
    updated_at: int
    consecutive_failures: int = 0
    catch_up: CatchUp = "once"
    paused: bool = False
    jitter_ms: int = 0
    triggered_at: int | None = None
    due_at: int | None = None


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """A successful claim: the claimed record and the token to renew and complete with."""

    record: ScheduleRecord
    fencing_token: int


@dataclass(frozen=True, slots=True)
class CompletePatch:
    """What ``complete`` writes: the next occurrence (``None``: tombstone) and the run's outcome."""

    next_run_at: int | None
    last_run_at: int
    last_status: LastStatus


@dataclass(frozen=True, slots=True)
class Job:
    """One delayed dispatch ("send a bot into meeting R at 10:00"); times are epoch ms.

    The lease is live while ``lease_until > now``. ``worker_id`` is set by
    ``mark_dispatched``. Dispatched and cancelled jobs are kept.

    ``lease_sequence`` grows with every lease of the job (0 before the first) and
    never goes backwards, even across a failover: ``(run_id, lease_sequence)``
    names one lease, an idempotency key for the provider call, and passing it to
    ``renew``, ``mark_dispatched`` and ``release`` fences them to that lease.

    ``attempts`` counts the leases since the job was scheduled (or retried): the
    lease just taken included. A job is leased at most ``max_attempts`` times: once
    ``attempts >= max_attempts``, the ``release`` of that last lease fails the job, and
    so does the ``lease`` that finds that lease expired without a release (``failed``:
    terminal, never leased again, ``retry`` revives it); ``last_error`` is the error
    text of the latest release that gave one, or what the lease that failed it says.

    ``lease_sequence`` never repeats for a run_id either when the job is purged or
    removed and scheduled again: every lease is numbered above the sequences of
    every deleted job.

    ``queue`` (``"default"`` unless scheduled with one), ``priority`` (higher is leased
    first among due jobs, then earliest ``dispatch_at``, then ``run_id``; 0) and
    ``payload`` (any JSON value the job was scheduled with, decoded; None: none) are
    what ``schedule`` gave; a ``schedule`` of an existing run_id replaces each only
    when given (not None).

    ``finished_at`` is when the job finished (dispatched, cancelled or failed: the
    store's clock, epoch ms), once; None while it waits (``retry`` clears it). What
    ``purge`` compares with its ``before``. Left out of ``==``: a clock reading, on
    which two stores (or two runs) never agree.
    """

    run_id: str
    dispatch_at: int
    lease_holder: str | None
    lease_until: int | None
    worker_id: str | None
    dispatched: bool
    cancelled: bool
    lease_sequence: int = 0
    attempts: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    last_error: str | None = None
    failed: bool = False
    finished_at: int | None = field(default=None, compare=False)
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    payload: Any = None

    @property
    def state(self) -> JobState:
        """``"dispatched"``, ``"cancelled"`` (never dispatched), ``"failed"`` (out of
        attempts, not cancelled) or ``"waiting"``, in that order of precedence."""
        if self.dispatched:
            return "dispatched"
        if self.cancelled:
            return "cancelled"
        if self.failed:
            return "failed"
        return "waiting"

    @property
    def last_attempt(self) -> bool:
        """Whether the lease this row was read under is the job's last: its release
        fails the job instead of retrying it, and so does the next lease if it expires
        without one."""
        return self.attempts >= self.max_attempts


@dataclass(frozen=True, slots=True)
class MarkResult:
    """What ``mark_dispatched`` answers.

    ``recorded``: the caller still held the lease and the dispatch was
    recorded. ``cancelled``: a cancel arrived, so the bot must leave at once
    (when nothing was recorded: the stored flag, False for a missing job).
    """

    cancelled: bool
    recorded: bool


class RetryResult(str, Enum):
    """What ``retry`` answers; the values are the SQL function's text answers."""

    RETRIED = "retried"
    """The failed job waits again, attempts reset."""
    NOT_FAILED = "not_failed"
    """The job is not failed (it waits, was dispatched or was cancelled): nothing changed."""
    MISSING = "missing"
    """No such job."""

    def __str__(self) -> str:
        return self.value


class CancelResult(str, Enum):
    """What ``cancel`` answers; the values are the SQL function's text answers."""

    CANCELLED = "cancelled"
    """Cancelled now, or already was; a live lease's holder learns it from mark_dispatched."""
    ALREADY_DISPATCHED = "already_dispatched"
    """The bot is out: nothing changed, tell it to leave instead."""
    MISSING = "missing"
    """No such job."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Fence:
    """What ``fence_after_restore`` did: ``token_floor()`` before it and after it, the
    least fencing token and lease sequence a claim or lease hands out from now on."""

    floor_before: int
    floor_after: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    """One reading of a store's gauges (``store_stats()``), all at the instant ``now``.

    Schedules: how many there are, how many are due and unclaimed (not paused, ``due_at
    <= now``, no live lease: what a claim would take), under a live lease, and one-shots
    done; the one claimable longest and since when (the later of its ``due_at`` and an
    expired lease's end). Jobs, each in exactly one state: pending (waiting, no live
    lease, not due or its queue paused), due (waiting, due, no live lease, queue not
    paused: what a lease would take; ``jobs_due_expired_lease``
    of them after an expired lease), leased (waiting, live lease), dispatched
    (``jobs_recalled`` of them cancelled meanwhile), cancelled (never dispatched), failed
    (out of attempts, not cancelled); and the oldest due job.
    """

    now: int
    schedules: int
    schedules_due: int
    schedules_leased: int
    schedules_done: int
    oldest_due_schedule_id: str | None
    oldest_due_schedule_since: int | None
    jobs_pending: int
    jobs_due: int
    jobs_due_expired_lease: int
    jobs_leased: int
    jobs_dispatched: int
    jobs_recalled: int
    jobs_cancelled: int
    jobs_failed: int
    oldest_due_job_id: str | None
    oldest_due_job_at: int | None

    @property
    def jobs(self) -> int:
        """Every job, in whatever state."""
        return (
            self.jobs_pending
            + self.jobs_due
            + self.jobs_leased
            + self.jobs_dispatched
            + self.jobs_cancelled
            + self.jobs_failed
        )


JobFilter = Literal["all", "due", "dispatched", "failed"]
"""What ``PgJobStore.list_jobs`` selects: every job, the due ones, the dispatched ones,
the failed ones."""


@dataclass(frozen=True, slots=True)
class JobPage:
    """The first jobs of a listing (by ``dispatch_at``, then ``run_id``), and how many
    jobs match in all."""

    jobs: list[Job]
    matching: int


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """One queue as ``list_queues`` answers it (SQL ``queue_list``): its jobs waiting
    (``depth``: not dispatched, cancelled or failed), of those the ``due`` ones no live
    lease holds (what a lease could take unless a limit holds it back), those ``leased``
    (a live lease), whether it is ``paused`` (``pause_queue``: none of its jobs are
    leased), its limits (``set_queue_concurrency``, ``set_queue_rate``; None: none) and
    ``rate_used``, the leases counted against its rate limit in the period up to now
    (None without one)."""

    queue: str
    depth: int
    due: int
    leased: int
    paused: bool
    concurrency_limit: int | None = None
    rate_limit: int | None = None
    rate_period_ms: int | None = None
    rate_used: int | None = None
