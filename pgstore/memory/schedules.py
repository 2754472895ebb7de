"""The in-process reference schedule store (docs/contract.md): nothing survives the process.

It is the model the PostgreSQL stores are tested against, so it states the
contract in plain Python: same answers, same state, same bad-input rules.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.models import (
    CATCH_UPS,
    LAST_STATUSES,
    MAX_JITTER_MS,
    SCHEDULE_KINDS,
    CatchUp,
    ClaimResult,
    CompletePatch,
    ScheduleKind,
    ScheduleRecord,
    jitter_due_at,
)

__all__ = ["MemoryScheduleStore", "wall_clock_ms"]


def wall_clock_ms() -> int:
    """This process's clock in epoch ms: the memory stores' ``now=None``."""
    return time.time_ns() // 1_000_000


def _due(id: str, next_run_at: int | None, jitter_ms: int, triggered_at: int | None) -> int | None:
    """``due_at``: the jittered occurrence, or a pending trigger's time when earlier."""
    due = jitter_due_at(id, next_run_at, jitter_ms)
    if triggered_at is None:
        return due
    return triggered_at if due is None else min(due, triggered_at)


class MemoryScheduleStore:
    """Reference, in-process schedule store; thread-safe."""

    def __init__(self) -> None:
        self._records: dict[str, ScheduleRecord] = {}
        self._fences: dict[str, int] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        """Nothing to set up."""

    def get(self, id: str) -> ScheduleRecord | None:
        v.name("id", id)
        with self._lock:
            return self._records.get(id)

    def register(
        self,
        id: str,
        kind: ScheduleKind,
        spec: str,
        next_run_at: int | None,
        now: int | None = None,
        catch_up: CatchUp = "once",
        jitter_ms: int = 0,
    ) -> ScheduleRecord:
        v.name("id", id)
        kind = v.one_of("kind", kind, SCHEDULE_KINDS)
        v.spec("spec", spec)
        v.integer("next_run_at", next_run_at)
        v.integer("now", now)
        catch_up = v.one_of("catch_up", catch_up, CATCH_UPS)
        v.integer("jitter_ms", jitter_ms)
        if jitter_ms is None or not 0 <= jitter_ms <= MAX_JITTER_MS:
            raise InvalidArgument(
                f"jitter_ms must be an integer from 0 to {MAX_JITTER_MS} (a day)"
            )
        at = wall_clock_ms() if now is None else now
        with self._lock:
            current = self._records.get(id)
            if current is None:
                stored = ScheduleRecord(
                    id=id, kind=kind, spec=spec, next_run_at=next_run_at,
                    last_run_at=None, last_status=None,
                    fencing_token=self._fences.get(id, 0),
                    lease_owner=None, lease_until=None, updated_at=at, catch_up=catch_up,
                    jitter_ms=jitter_ms, due_at=jitter_due_at(id, next_run_at, jitter_ms),
                )
            elif (current.kind, current.spec) != (kind, spec):
                stored = replace(
                    current, kind=kind, spec=spec, next_run_at=next_run_at, updated_at=at,
                    catch_up=catch_up, jitter_ms=jitter_ms,
                    due_at=_due(id, next_run_at, jitter_ms, current.triggered_at),
                )
            elif (current.catch_up, current.jitter_ms) != (catch_up, jitter_ms):
                # A new policy or jitter alone keeps the occurrence: the grid is the same.
                stored = replace(
                    current, catch_up=catch_up, jitter_ms=jitter_ms, updated_at=at,
                    due_at=_due(id, current.next_run_at, jitter_ms, current.triggered_at),
                )
            else:
                return current
            self._records[id] = stored
            return stored

    def claim_due(
        self, id: str, owner: str, now: int | None, lease_ms: int
    ) -> ClaimResult | None:
        v.name("id", id)
        v.name("owner", owner)
        v.positive("lease_ms", lease_ms)
        v.integer("now", now)
        at = wall_clock_ms() if now is None else now
        until = v.add(at, lease_ms)
        with self._lock:
            current = self._records.get(id)
            if current is None or not self._claimable(current, at):
                return None
            claimed = self._claim(current, owner, until)
            return ClaimResult(record=claimed, fencing_token=claimed.fencing_token)

    def renew(self, id: str, fencing_token: int, lease_until: int) -> bool:
        v.name("id", id)
        v.present_int("fencing_token", fencing_token)
        v.present_int("lease_until", lease_until)
        with self._lock:
            current = self._held(id, fencing_token)
            if current is None:
                return False
            self._records[id] = replace(current, lease_until=lease_until)
            return True

    def complete(
        self, id: str, fencing_token: int, patch: CompletePatch, now: int | None = None
    ) -> bool:
        v.name("id", id)
        v.present_int("fencing_token", fencing_token)
        if not isinstance(patch, CompletePatch):
            raise InvalidArgument(f"patch must be a CompletePatch, not {type(patch).__name__}")
        v.integer("next_run_at", patch.next_run_at)
        v.present_int("last_run_at", patch.last_run_at)
        status = v.one_of("last_status", patch.last_status, LAST_STATUSES)
        v.integer("now", now)
        at = wall_clock_ms() if now is None else now
        with self._lock:
            current = self._held(id, fencing_token)
            if current is None:
                return False
            # A triggered run (triggered_at set) leaves the regular occurrence as it was.
            upcoming = patch.next_run_at if current.triggered_at is None else current.next_run_at
            self._records[id] = replace(
                current,
                next_run_at=upcoming,
                due_at=jitter_due_at(id, upcoming, current.jitter_ms),
                triggered_at=None,
                last_run_at=patch.last_run_at,
                last_status=status,
                consecutive_failures=(
                    0 if status == "ok"
                    else min(current.consecutive_failures + 1, v.INTEGER_MAX) if status == "error"
                    else current.consecutive_failures  # skipped: not run, so neither
                ),
                lease_owner=None,
                lease_until=None,
                updated_at=at,
            )
            return True

    def delete(self, id: str) -> None:
        v.name("id", id)
        with self._lock:
            gone = self._records.pop(id, None)
            if gone is not None:
                self._fences[id] = max(self._fences.get(id, 0), gone.fencing_token)

    def list(self) -> builtins.list[ScheduleRecord]:
        with self._lock:
            return [self._records[id] for id in sorted(self._records)]

    def claim_next(
        self,
        owner: str,
        now: int | None,
        lease_ms: int,
        limit: int,
        ids: Sequence[str] | None = None,
    ) -> builtins.list[ClaimResult]:
        v.name("owner", owner)
        v.integer("now", now)
        v.positive("lease_ms", lease_ms)
        v.positive("limit", limit, maximum=v.INTEGER_MAX)
        wanted = v.names("ids", ids)
        at = wall_clock_ms() if now is None else now
        until = v.add(at, lease_ms)
        with self._lock:
            due = [
                r for r in self._records.values()
                if self._claimable(r, at) and (wanted is None or r.id in wanted)
            ]
            due.sort(key=lambda r: (self._order(r), r.id))
            claimed = [self._claim(r, owner, until) for r in due[:limit]]
            return [ClaimResult(record=r, fencing_token=r.fencing_token) for r in claimed]

    def pause(self, id: str, now: int | None = None) -> ScheduleRecord | None:
        v.name("id", id)
        v.integer("now", now)
        at = wall_clock_ms() if now is None else now
        with self._lock:
            current = self._records.get(id)
            if current is None or current.paused:
                return current
            self._records[id] = paused = replace(current, paused=True, updated_at=at)
            return paused

    def resume(self, id: str, now: int | None = None) -> ScheduleRecord | None:
        v.name("id", id)
        v.integer("now", now)
        at = wall_clock_ms() if now is None else now
        with self._lock:
            current = self._records.get(id)
            if current is None or not current.paused:
                return current
            # next_run_at stays: the claimer meets the missed occurrences with catch_up.
            self._records[id] = resumed = replace(current, paused=False, updated_at=at)
            return resumed

    def trigger(self, id: str, now: int | None = None) -> ScheduleRecord | None:
        v.name("id", id)
        v.integer("now", now)
        at = wall_clock_ms() if now is None else now
        with self._lock:
            current = self._records.get(id)
            if current is None or current.paused:
                return None
            if current.lease_until is not None and current.lease_until > at:
                return None  # a live lease: its holder's run is in progress
            # An expired holder is fenced: it can no longer renew or complete.
            token = current.fencing_token + (current.lease_owner is not None)
            asked = at if current.triggered_at is None else current.triggered_at
            triggered = replace(
                current,
                triggered_at=asked,
                due_at=_due(id, current.next_run_at, current.jitter_ms, asked),
                fencing_token=token,
                lease_owner=None,
                lease_until=None,
                updated_at=at,
            )
            self._records[id] = triggered
            return triggered

    def now_ms(self) -> int:
        """This process's clock in epoch ms."""
        return wall_clock_ms()

    # The caller holds self._lock in the helpers below.

    @staticmethod
    def _claimable(record: ScheduleRecord, at: int) -> bool:
        return (
            not record.paused
            and record.due_at is not None
            and record.due_at <= at
            and (record.lease_until is None or record.lease_until <= at)
        )

    @staticmethod
    def _order(record: ScheduleRecord) -> int:
        """The claim order: ``due_at`` (set on every claimable record)."""
        assert record.due_at is not None
        return record.due_at

    def _claim(self, record: ScheduleRecord, owner: str, until: int) -> ScheduleRecord:
        claimed = replace(
            record,
            lease_owner=owner,
            lease_until=until,
            fencing_token=record.fencing_token + 1,
        )
        self._records[record.id] = claimed
        return claimed

    def _held(self, id: str, fencing_token: int) -> ScheduleRecord | None:
        current = self._records.get(id)
        if current is None or current.fencing_token != fencing_token:
            return None
        return current if current.lease_owner is not None else None
