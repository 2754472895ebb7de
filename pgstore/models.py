"""The records the stores read and write (SPEC §3, §7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "LAST_STATUSES",
    "SCHEDULE_KINDS",
    "ClaimResult",
    "CompletePatch",
    "LastStatus",
    "ScheduleKind",
    "ScheduleRecord",
]

ScheduleKind = Literal["cron", "interval", "once"]
LastStatus = Literal["ok", "error"]

SCHEDULE_KINDS: tuple[ScheduleKind, ...] = ("cron", "interval", "once")
LAST_STATUSES: tuple[LastStatus, ...] = ("ok", "error")


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """Persisted state of one durable task; all times are epoch ms.

    ``next_run_at`` is ``None`` once a one-shot task has run (a tombstone).
    ``fencing_token`` is bumped by every successful claim and never goes
    backwards for an id, even across delete and a new register.
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
