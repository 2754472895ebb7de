"""The queue limits of the in-process job store, as sql/24_queue_limits.sql keeps them.

The same rows and rules as PostgreSQL's ``queue_slots``, so that both stores answer alike
call for call: a concurrency limit of N is N slots, each busy while its own
``lease_until`` lies ahead unless the job shows that very lease ended (dispatched,
released, failed, or leased again); a rate limit of N per period is N slots, each usable
once its ``taken_at`` is a period old. A lease takes the lowest free slots, a renew
extends the slot its lease holds (or takes a free one, or the lease ends). The caller,
``MemoryJobStore``, holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.models import Job

__all__ = ["LIMIT_MAX", "PERIOD_MAX_MS", "QueueLimits", "check_concurrency", "check_rate"]

LIMIT_MAX = 10_000
"""The largest concurrency or rate limit (SQL's ``queue_limit_max()``)."""
PERIOD_MAX_MS = 31_622_400_000
"""The longest rate period: 366 days, in ms."""


def check_concurrency(queue: object, limit: object) -> None:
    """``queue_set_concurrency``'s bad-input rules (22023, the parameter named)."""
    v.name("queue", queue)
    _check_limit(limit)


def check_rate(queue: object, limit: object, period_ms: object) -> None:
    """``queue_set_rate``'s bad-input rules."""
    v.name("queue", queue)
    _check_limit(limit)
    v.integer("period_ms", period_ms)
    if (limit is None) != (period_ms is None) or (
        isinstance(period_ms, int) and not 1 <= period_ms <= PERIOD_MAX_MS
    ):
        raise InvalidArgument(
            "period_ms must be NULL exactly when limit is, else from 1 to 31622400000"
            " (366 days)")


def _check_limit(limit: object) -> None:
    v.integer("limit", limit, maximum=v.INTEGER_MAX)
    if isinstance(limit, int) and not 1 <= limit <= LIMIT_MAX:
        raise InvalidArgument(
            f"limit must be NULL (no limit) or an integer from 1 to {LIMIT_MAX}")


@dataclass
class _Slot:
    """One ``queue_slots`` row: the last lease it served."""

    run_id: str | None = None
    lease_sequence: int | None = None
    lease_until: int | None = None
    taken_at: int | None = None


@dataclass
class _Queue:
    """One queue's limits (SQL's ``queues`` columns) and rows."""

    concurrency: int | None = None
    rate: int | None = None
    period_ms: int | None = None
    slots: dict[int, _Slot] = field(default_factory=dict)
    tokens: dict[int, _Slot] = field(default_factory=dict)


class QueueLimits:
    """Every queue ever limited, with its rows; ``jobs`` is the store's job table, read
    for the evidence that a lease ended."""

    def __init__(self, jobs: Mapping[str, Job]) -> None:
        self._jobs = jobs
        self._queues: dict[str, _Queue] = {}

    # --- setters ------------------------------------------------------------------------

    def set_concurrency(self, queue: str, limit: int | None) -> bool:
        q = self._queues.get(queue)
        if (q is None and limit is None) or (q is not None and q.concurrency == limit):
            return False
        q = self._queues.setdefault(queue, _Queue())
        q.concurrency = limit
        if limit is None:
            q.slots.clear()
            return True
        for slot in range(1, limit + 1):
            q.slots.setdefault(slot, _Slot())
        # Lowered: the rows above it that serve no lease go (no clock decides it).
        for slot in [s for s in q.slots if s > limit and self._free(q.slots[s], None)]:
            del q.slots[slot]
        return True

    def set_rate(self, queue: str, limit: int | None, period_ms: int | None) -> bool:
        q = self._queues.get(queue)
        if (q is None and limit is None) or (
            q is not None and (q.rate, q.period_ms) == (limit, period_ms)
        ):
            return False
        q = self._queues.setdefault(queue, _Queue())
        q.rate, q.period_ms = limit, period_ms
        for slot in [s for s in q.tokens if s > (limit or 0)]:
            del q.tokens[slot]
        for slot in range(1, (limit or 0) + 1):
            q.tokens.setdefault(slot, _Slot())
        return True

    # --- reads --------------------------------------------------------------------------

    def names(self) -> set[str]:
        """Every queue ever limited (it has a row in SQL's ``queues``)."""
        return set(self._queues)

    def limits(self, queue: str, at: int) -> tuple[int | None, int | None, int | None, int | None]:
        """``queue_list``'s (concurrency_limit, rate_limit, rate_period_ms, rate_used)."""
        q = self._queues.get(queue)
        if q is None:
            return None, None, None, None
        used = None
        if q.rate is not None and q.period_ms is not None:
            period = q.period_ms
            used = sum(
                1 for s, t in q.tokens.items()
                if s <= q.rate and t.taken_at is not None and t.taken_at > at - period
            )
        return q.concurrency, q.rate, q.period_ms, used

    def _free(self, slot: _Slot, at: int | None) -> bool:
        """SQL's ``queue_slot_free``: busy by its own lease_until, freed early only by the
        job of that very lease showing that it ended (``at`` None: only by that)."""
        if slot.lease_until is None or (at is not None and slot.lease_until <= at):
            return True
        job = self._jobs.get(slot.run_id or "")
        if job is None or slot.lease_sequence is None:
            return False
        return job.lease_sequence > slot.lease_sequence or (
            job.lease_sequence == slot.lease_sequence
            and (job.dispatched or job.failed or job.lease_holder is None)
        )

    def _usable_tokens(self, q: _Queue, at: int) -> list[int]:
        assert q.rate is not None and q.period_ms is not None
        period = q.period_ms
        return sorted(
            s for s, t in q.tokens.items()
            if s <= q.rate and (t.taken_at is None or t.taken_at <= at - period)
        )

    def _free_slots(self, q: _Queue, at: int) -> list[int]:
        assert q.concurrency is not None
        return sorted(
            s for s, row in q.slots.items() if s <= q.concurrency and self._free(row, at)
        )

    # --- the lease and the renew ------------------------------------------------------------

    def caps(self, queues: set[str], at: int, want: int) -> dict[str, int]:
        """How many jobs of each limited queue of ``queues`` a lease of ``want`` jobs at
        ``at`` may take (queue_limits_reserve's cap); unlimited queues are left out."""
        caps: dict[str, int] = {}
        for name in sorted(queues):
            q = self._queues.get(name)
            if q is None or (q.concurrency is None and q.rate is None):
                continue
            cap = want
            if q.rate is not None:
                cap = min(cap, len(self._usable_tokens(q, at)))
            if q.concurrency is not None and cap > 0:
                cap = min(cap, len(self._free_slots(q, at)))
            caps[name] = cap
        return caps

    def take(self, leased: list[Job], at: int) -> None:
        """Write the leases ``leased`` (of limited queues, within their caps) into their
        queues' lowest usable rows, as queue_limits_fill does (by run_id within a
        queue)."""
        by_queue: dict[str, list[Job]] = {}
        for job in sorted(leased, key=lambda j: j.run_id):
            if job.queue in self._queues:
                by_queue.setdefault(job.queue, []).append(job)
        for name, jobs in by_queue.items():
            q = self._queues[name]
            tokens = self._usable_tokens(q, at) if q.rate is not None else []
            slots = self._free_slots(q, at) if q.concurrency is not None else []
            for i, job in enumerate(jobs):
                if q.rate is not None:
                    q.tokens[tokens[i]] = _Slot(job.run_id, job.lease_sequence, None, at)
                if q.concurrency is not None:
                    q.slots[slots[i]] = _Slot(job.run_id, job.lease_sequence, job.lease_until, at)

    def keep(self, job: Job, at: int, until: int) -> bool:
        """After a renew of ``job`` to ``until``: False when its queue has a concurrency
        limit and its lease holds no row and finds no free one (the lease must end), as
        queue_limits_keep answers."""
        q = self._queues.get(job.queue)
        if q is None or q.concurrency is None:
            return True
        for row in q.slots.values():
            if row.run_id == job.run_id and row.lease_sequence == job.lease_sequence:
                row.lease_until = max(row.lease_until or until, until)
                return True
        free = self._free_slots(q, at)
        if not free:
            return False
        q.slots[free[0]] = _Slot(job.run_id, job.lease_sequence, until, at)
        return True
