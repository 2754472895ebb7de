"""The one place where rows of the SQL functions become dataclasses.

Rows are mapped by column name, not position: a function may return more
columns than a dataclass has (a later revision adding one), in any order.
Scalar answers (a boolean, a count, a text) are a function's only column.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, TypeVar

from pgstore.errors import PgStoreError
from pgstore.models import (
    CancelResult,
    ClaimResult,
    Job,
    JobPage,
    MarkResult,
    RetryResult,
    ScheduleRecord,
    StoreStats,
)
from pgstore.postgres.call import Columns, Row

D = TypeVar("D")


#: Pickers by dataclass and columns: a store meets only a handful of column lists.
_PICKERS: dict[tuple[type[Any], Columns], Callable[[Row], tuple[Any, ...]]] = {}


def _picker(cls: type[Any], columns: Columns) -> Callable[[Row], tuple[Any, ...]]:
    """Picks ``cls``'s fields, in their order, out of a row with these ``columns``."""
    found = _PICKERS.get((cls, columns))
    if found is None:
        found = _PICKERS[(cls, columns)] = _new_picker(cls, columns)
    return found


def _new_picker(cls: type[Any], columns: Columns) -> Callable[[Row], tuple[Any, ...]]:
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [name for name in names if name not in columns]
    if missing:
        raise PgStoreError(
            f"the store's function returned no column {', '.join(missing)} for "
            f"{cls.__name__}: is the schema at this pgstore's revision?"
        )
    indices = [columns.index(name) for name in names]
    if len(indices) == 1:
        (only,) = indices
        return lambda row: (row[only],)
    getter: Callable[[Row], tuple[Any, ...]] = itemgetter(*indices)
    return getter


def _one(cls: type[D], row: Row, columns: Columns) -> D:
    return cls(*_picker(cls, columns)(row))


def _all(cls: type[D], rows: Sequence[Row], columns: Columns) -> list[D]:
    pick = _picker(cls, columns)
    return [cls(*pick(row)) for row in rows]


def schedule_record(row: Row, columns: Columns) -> ScheduleRecord:
    return _one(ScheduleRecord, row, columns)


def first_schedule_record(rows: Sequence[Row], columns: Columns) -> ScheduleRecord:
    return schedule_record(rows[0], columns)


def optional_schedule_record(rows: Sequence[Row], columns: Columns) -> ScheduleRecord | None:
    return schedule_record(rows[0], columns) if rows else None


def schedule_records(rows: Sequence[Row], columns: Columns) -> list[ScheduleRecord]:
    return _all(ScheduleRecord, rows, columns)


def optional_claim_result(rows: Sequence[Row], columns: Columns) -> ClaimResult | None:
    if not rows:
        return None
    record = schedule_record(rows[0], columns)
    return ClaimResult(record, record.fencing_token)


def claim_results(rows: Sequence[Row], columns: Columns) -> list[ClaimResult]:
    return [ClaimResult(record=r, fencing_token=r.fencing_token) for r in
            schedule_records(rows, columns)]


def job(row: Row, columns: Columns) -> Job:
    return _one(Job, row, columns)


def optional_job(rows: Sequence[Row], columns: Columns) -> Job | None:
    return job(rows[0], columns) if rows else None


def jobs(rows: Sequence[Row], columns: Columns) -> list[Job]:
    return _all(Job, rows, columns)


def job_page(rows: Sequence[Row], columns: Columns) -> JobPage:
    """``job_list``'s rows: the jobs, and ``matching`` (carried by every row; 0 when none)."""
    matching = int(rows[0][columns.index("matching")]) if rows else 0
    return JobPage(jobs=jobs(rows, columns), matching=matching)


def mark_result(rows: Sequence[Row], columns: Columns) -> MarkResult:
    cancelled, recorded = _picker(MarkResult, columns)(rows[0])
    return MarkResult(bool(cancelled), bool(recorded))


def mark_results(rows: Sequence[Row], columns: Columns) -> list[MarkResult]:
    """``job_mark_dispatched_many``'s rows, one per job in the order given."""
    cancelled, recorded = columns.index("cancelled"), columns.index("recorded")
    return [MarkResult(cancelled=bool(r[cancelled]), recorded=bool(r[recorded])) for r in rows]


def renewed(rows: Sequence[Row], columns: Columns) -> list[bool]:
    """``job_renew_many``'s rows, one per job in the order given."""
    at = columns.index("renewed")
    return [bool(r[at]) for r in rows]


def store_stats(rows: Sequence[Row], columns: Columns) -> StoreStats:
    return _one(StoreStats, rows[0], columns)


#: The enums' members by value (calling the enum looks its value up in Python code); an
#: answer not among them still raises as the enum's call does.
_CANCEL_RESULTS = {str(m.value): m for m in CancelResult}
_RETRY_RESULTS = {str(m.value): m for m in RetryResult}


def cancel_result(rows: Sequence[Row], columns: Columns) -> CancelResult:
    answer = rows[0][0]
    return _CANCEL_RESULTS.get(answer) or CancelResult(answer)


def retry_result(rows: Sequence[Row], columns: Columns) -> RetryResult:
    answer = rows[0][0]
    return _RETRY_RESULTS.get(answer) or RetryResult(answer)


def integer_value(rows: Sequence[Row], columns: Columns) -> int:
    return int(rows[0][0])


def boolean(rows: Sequence[Row], columns: Columns) -> bool:
    return bool(rows[0][0])


def text_value(rows: Sequence[Row], columns: Columns) -> str:
    return str(rows[0][0])


def nothing(rows: Sequence[Row], columns: Columns) -> None:
    return None


#: The decoders that read a function's only column by position (a scalar answer): the
#: runner does not read the column names of their rows (it passes none).
BY_POSITION: frozenset[Callable[[Sequence[Row], Columns], object]] = frozenset(
    {cancel_result, retry_result, integer_value, boolean, text_value, nothing}
)
