"""The one place where rows of the SQL functions become dataclasses.

Functions return the columns of SPEC §3 first, in order; later columns, if a
future revision adds any, are ignored here.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._call import Row
from .models import CancelResult, ClaimResult, Job, MarkResult, ScheduleRecord


def schedule_record(row: Row) -> ScheduleRecord:
    return ScheduleRecord(*row[:10])


def first_schedule_record(rows: Sequence[Row]) -> ScheduleRecord:
    return schedule_record(rows[0])


def optional_schedule_record(rows: Sequence[Row]) -> ScheduleRecord | None:
    return schedule_record(rows[0]) if rows else None


def schedule_records(rows: Sequence[Row]) -> list[ScheduleRecord]:
    return [schedule_record(row) for row in rows]


def claim_result(row: Row) -> ClaimResult:
    record = schedule_record(row)
    return ClaimResult(record=record, fencing_token=record.fencing_token)


def optional_claim_result(rows: Sequence[Row]) -> ClaimResult | None:
    return claim_result(rows[0]) if rows else None


def claim_results(rows: Sequence[Row]) -> list[ClaimResult]:
    return [claim_result(row) for row in rows]


def job(row: Row) -> Job:
    return Job(*row[:8])


def optional_job(rows: Sequence[Row]) -> Job | None:
    return job(rows[0]) if rows else None


def jobs(rows: Sequence[Row]) -> list[Job]:
    return [job(row) for row in rows]


def mark_result(rows: Sequence[Row]) -> MarkResult:
    cancelled, recorded = rows[0][:2]
    return MarkResult(cancelled=bool(cancelled), recorded=bool(recorded))


def cancel_result(rows: Sequence[Row]) -> CancelResult:
    return CancelResult(rows[0][0])


def integer_value(rows: Sequence[Row]) -> int:
    return int(rows[0][0])


def boolean(rows: Sequence[Row]) -> bool:
    return bool(rows[0][0])


def text_value(rows: Sequence[Row]) -> str:
    return str(rows[0][0])


def nothing(rows: Sequence[Row]) -> None:
    return None
