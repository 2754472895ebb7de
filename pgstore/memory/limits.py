"""The queue limits of the in-process job store, as sql/24_queue_limits.sql keeps them.

The same rows and rules as PostgreSQL's ``queue_slots``, so that both stores answer alike
call for call: a concurrency limit of C is C places, each busy while its own
``lease_until`` lies ahead unless the job shows that very lease ended (dispatched,
released, failed, or leased again); a rate limit of R per period is R places, each usable
once its ``taken_at`` is a period old. They lie in L lanes (L the smaller limit): lane i
holds the places i, i + L, ... of each kind. A lease takes the lowest usable lanes, one
a job, and there the first free place of each kind; a renew extends the place its lease
holds (or takes a free one, or the lease ends); a change of the limits lays the lanes out
again, and each retired place left (a busy one above a lowered limit) holds back one more
lane from a lease. The caller, ``MemoryJobStore``, holds its lock around every call.
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
class _Place:
    """One concurrency place: the last lease it served (None: none yet)."""

    run_id: str | None = None
    lease_sequence: int | None = None
    lease_until: int | None = None


@dataclass
class _Lane:
    """One ``queue_slots`` row: its concurrency places (None: no such limit) and rate
    places (their taken_at; None: no such limit)."""

    places: list[_Place] | None
    stamps: list[int | None] | None


@dataclass
class _Queue:
    """One queue's limits (SQL's ``queues`` columns) and rows: lanes 1..L, and retired
    concurrency places by minus their number."""

    concurrency: int | None = None
    rate: int | None = None
    period_ms: int | None = None
    lanes: dict[int, _Lane] = field(default_factory=dict)


#: What a lease reserved in a queue: (lane, concurrency place, rate place) a job, the
#: places 0-based, None for a limit the queue has not.
Reserved = list[tuple[int, int | None, int | None]]


class QueueLimits:
    """Every queue ever limited, with its rows; ``jobs`` is the store's job table, read
    for the evidence that a lease ended."""

    def __init__(self, jobs: Mapping[str, Job]) -> None:
        self._jobs = jobs
        self._queues: dict[str, _Queue] = {}
        #: What the last ``reserve`` locked past each queue's cap, for ``take`` to clear.
        self._extras: dict[str, Reserved] = {}

    # --- setters ------------------------------------------------------------------------

    def set_concurrency(self, queue: str, limit: int | None) -> bool:
        q = self._queues.get(queue)
        if (q is None and limit is None) or (q is not None and q.concurrency == limit):
            return False
        q = self._queues.setdefault(queue, _Queue())
        q.concurrency = limit
        self._layout(q)
        return True

    def set_rate(self, queue: str, limit: int | None, period_ms: int | None) -> bool:
        q = self._queues.get(queue)
        if (q is None and limit is None) or (
            q is not None and (q.rate, q.period_ms) == (limit, period_ms)
        ):
            return False
        q = self._queues.setdefault(queue, _Queue())
        q.rate, q.period_ms = limit, period_ms
        self._layout(q)
        return True

    def _layout(self, q: _Queue) -> None:
        """SQL's ``queue_slots_layout``: each place up to the new limits keeps what it
        held, in the new lanes (of the rate places, the newest uses, moved below a lowered
        limit); a concurrency place above a lowered limit whose lease may live (no clock
        decides it) is retired."""
        old = q.lanes.items()
        n = sum(1 for slot in q.lanes if slot > 0)
        places: dict[int, _Place] = {}
        stamps: dict[int, int] = {}
        for slot, lane in old:
            if lane.places is not None and q.concurrency is not None:
                for k, place in enumerate(lane.places):
                    if place.run_id is not None:
                        places[k * n + slot if slot > 0 else -slot] = place
            if lane.stamps is not None and q.rate is not None and slot > 0:
                for k, stamp in enumerate(lane.stamps):
                    if stamp is not None:
                        stamps[k * n + slot] = stamp
        if q.rate is not None:
            # The newest q.rate uses (SQL's kept): those above the limit move into the
            # free places below, in order.
            kept = sorted(stamps.items(), key=lambda item: (-item[1], item[0]))[:q.rate]
            stay = {g: t for g, t in kept if g <= q.rate}
            movers = [t for g, t in sorted(kept) if g > q.rate]
            holes = [g for g in range(1, q.rate + 1) if g not in stay]
            stamps = stay | dict(zip(holes, movers, strict=False))
        q.lanes = {}
        limits = [x for x in (q.concurrency, q.rate) if x is not None]
        if not limits:
            return
        lanes = min(limits)
        for i in range(1, lanes + 1):
            q.lanes[i] = _Lane(
                None if q.concurrency is None else [
                    places.get(g, _Place()) for g in range(i, q.concurrency + 1, lanes)],
                None if q.rate is None else [
                    stamps.get(g) for g in range(i, q.rate + 1, lanes)])
        if q.concurrency is not None:
            for g, place in sorted(places.items()):
                if g > q.concurrency and not self._free(place, None):
                    q.lanes[-g] = _Lane([place], None)

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
                1 for slot, lane in q.lanes.items() if slot > 0
                for t in lane.stamps or [] if t is not None and t > at - period
            )
        return q.concurrency, q.rate, q.period_ms, used

    def _free(self, place: _Place, at: int | None) -> bool:
        """SQL's ``queue_slot_free``: busy by its own lease_until, freed early only by the
        job of that very lease showing that it ended (``at`` None: only by that)."""
        if place.lease_until is None or (at is not None and place.lease_until <= at):
            return True
        job = self._jobs.get(place.run_id or "")
        if job is None or place.lease_sequence is None:
            return False
        return job.lease_sequence > place.lease_sequence or (
            job.lease_sequence == place.lease_sequence
            and (job.dispatched or job.failed or job.lease_holder is None)
        )

    def _free_place(self, lane: _Lane, at: int) -> int | None:
        """SQL's ``queue_lane_free`` (0-based)."""
        assert lane.places is not None
        return next((k for k, p in enumerate(lane.places) if self._free(p, at)), None)

    @staticmethod
    def _usable_stamp(lane: _Lane, period: int, at: int) -> int | None:
        """SQL's ``queue_lane_usable`` (0-based)."""
        assert lane.stamps is not None
        return next((k for k, t in enumerate(lane.stamps) if t is None or t <= at - period),
                    None)

    # --- the lease and the renew ------------------------------------------------------------

    def reserve(self, queues: set[str], at: int, want: int) -> dict[str, Reserved]:
        """The lanes (and places in them) a lease of ``want`` jobs at ``at`` may fill in
        each limited queue of ``queues``, as queue_limits_reserve answers: the lowest
        usable lanes, one a job and one more for each retired place left (kept for
        ``take``, which clears their free place); its length is the queue's cap.
        Unlimited queues are left out."""
        self._extras = {}
        out: dict[str, Reserved] = {}
        for name in sorted(queues):
            q = self._queues.get(name)
            if q is None or (q.concurrency is None and q.rate is None):
                continue
            got: Reserved = []
            held = self._retired(q, at)
            for slot in sorted(s for s in q.lanes if s > 0):
                if len(got) == want + held:
                    break
                lane = q.lanes[slot]
                cpos = None if lane.places is None else self._free_place(lane, at)
                rpos = None
                if lane.stamps is not None:
                    assert q.period_ms is not None
                    rpos = self._usable_stamp(lane, q.period_ms, at)
                if (lane.places is None or cpos is not None) and (
                    lane.stamps is None or rpos is not None
                ):
                    got.append((slot, cpos, rpos))
            cap = max(len(got) - held, 0)
            out[name] = got[:cap]
            self._extras[name] = got[cap:]
        return out

    def _retired(self, q: _Queue, at: int) -> int:
        """SQL's ``queue_slots_sweep``, then how many retired places are left: the retired
        places whose lease ended at ``at`` go; each one left (its lease may live) takes a
        lane of a lease's, and while one is left no renew without a place takes one."""
        for slot in [s for s in q.lanes if s < 0]:
            places = q.lanes[slot].places
            if places is not None and self._free(places[0], at):
                del q.lanes[slot]
        return sum(1 for s in q.lanes if s < 0)

    def take(self, leased: list[Job], at: int, reserved: dict[str, Reserved]) -> None:
        """Write the leases ``leased`` (of limited queues, within their caps) into the
        lanes ``reserved`` for them, as queue_limits_fill does: the i-th of a queue by
        run_id into its i-th lane."""
        # The lanes that stand for retired places (SQL's lanes past the cap): the place
        # each was found to have free is cleared.
        for name, extras in self._extras.items():
            for slot, cpos, _ in extras:
                places = self._queues[name].lanes[slot].places
                if cpos is not None and places is not None:
                    places[cpos] = _Place()
        self._extras = {}
        by_queue: dict[str, list[Job]] = {}
        for job in sorted(leased, key=lambda j: j.run_id):
            if job.queue in reserved:
                by_queue.setdefault(job.queue, []).append(job)
        for name, jobs in by_queue.items():
            q = self._queues[name]
            for job, (slot, cpos, rpos) in zip(jobs, reserved[name], strict=False):
                lane = q.lanes[slot]
                if cpos is not None and lane.places is not None:
                    lane.places[cpos] = _Place(job.run_id, job.lease_sequence, job.lease_until)
                if rpos is not None and lane.stamps is not None:
                    lane.stamps[rpos] = at

    def keep(self, job: Job, at: int, until: int) -> bool:
        """After a renew of ``job`` to ``until``: False when its queue has a concurrency
        limit and its lease holds no place and finds no free one (the lease must end), as
        queue_limits_keep answers."""
        q = self._queues.get(job.queue)
        if q is None or q.concurrency is None:
            return True
        kept = False
        for lane in q.lanes.values():
            for place in lane.places or []:
                if place.run_id == job.run_id and place.lease_sequence == job.lease_sequence:
                    place.lease_until = max(place.lease_until or until, until)
                    kept = True
        if kept:
            return True
        if self._retired(q, at):
            return False
        for slot in sorted(s for s in q.lanes if s > 0):
            lane = q.lanes[slot]
            if lane.places is None:
                continue
            k = self._free_place(lane, at)
            if k is not None:
                lane.places[k] = _Place(job.run_id, job.lease_sequence, until)
                return True
        return False
