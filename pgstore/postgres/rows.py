"""The one place where rows of the SQL functions become dataclasses.

Rows are mapped by column name, not position: a function may return more
columns than a dataclass has (a later revision adding one), in any order.
Scalar answers (a boolean, a count, a text) are a function's only column.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from operator import itemgetter
from types import MemberDescriptorType
from typing import Any, TypeVar

from pgstore.errors import PgStoreError
from pgstore.models import (
    CancelResult,
    ClaimResult,
    Fence,
    Job,
    JobPage,
    MarkResult,
    QueueInfo,
    RetryResult,
    ScheduleRecord,
    StoreStats,
)
from pgstore.postgres.call import Columns, Row

D = TypeVar("D")


#: Makers by dataclass and columns: a store meets only a handful of column lists.
_MAKERS: dict[tuple[type[Any], Columns], Callable[[Row], Any]] = {}


def _maker(cls: type[D], columns: Columns) -> Callable[[Row], D]:
    """Builds a ``cls`` out of a row with these ``columns``, its fields picked by name."""
    found = _MAKERS.get((cls, columns))
    if found is None:
        found = _MAKERS[(cls, columns)] = _new_maker(cls, _indices(cls, columns))
    return found


def _indices(cls: type[Any], columns: Columns) -> list[int]:
    """Where ``cls``'s fields are, in their order, in a row with these ``columns``."""
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [name for name in names if name not in columns]
    if missing:
        raise PgStoreError(
            f"the store's function returned no column {', '.join(missing)} for "
            f"{cls.__name__}: is the schema at this pgstore's revision?"
        )
    return [columns.index(name) for name in names]


#: pgstore's own models, built by setting their slots (``_slot_maker``). Each is a
#: frozen, slotted dataclass whose generated ``__init__`` only stores its arguments: no
#: ``__post_init__``, no ``__init__`` or ``__new__`` of its own, every field an init
#: field (tests/test_runner.py builds each both ways and compares). Every other class
#: is built by calling it (``_constructor_maker``).
SLOT_BUILT: frozenset[type[Any]] = frozenset({ScheduleRecord, Job, MarkResult, StoreStats})


def _new_maker(cls: type[D], indices: list[int]) -> Callable[[Row], D]:
    """The maker of ``cls`` out of rows whose fields are at ``indices``."""
    if cls in SLOT_BUILT:
        return _slot_maker(cls, indices)
    return _constructor_maker(cls, indices)


def _constructor_maker(cls: type[D], indices: list[int]) -> Callable[[Row], D]:
    """Builds a ``cls`` by calling it with the row's fields, in their order."""
    build: Callable[..., D] = cls
    if len(indices) == 1:
        (only,) = indices
        return lambda row: build(row[only])
    pick = itemgetter(*indices)
    return lambda row: build(*pick(row))


def _slot_maker(cls: type[D], indices: list[int]) -> Callable[[Row], D]:
    """Builds a ``cls`` of ``SLOT_BUILT`` as its generated ``__init__`` does, one store a
    field, through the slots' own descriptors (``__slots__`` makes each field a member
    descriptor of the class, whose ``__set__`` stores the value).

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    which looks the name up in the type first: 1.56-1.64 µs for a 12-field ``Job``
    against 0.98-1.00 µs here, 40-60 µs more for a hundred rows (``make bench``, the
    ops section: decoding, and the ``*_init`` modes; docs/performance.md)."""
    if hasattr(cls, "__post_init__") or cls.__new__ is not object.__new__:
        raise TypeError(f"{cls.__name__} has more to its construction: leave it out of "
                        "SLOT_BUILT")
    setters = []
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        slot = cls.__dict__.get(field.name)
        if not field.init or not isinstance(slot, MemberDescriptorType):
            raise TypeError(f"{cls.__name__}.{field.name} is not a slot set by __init__")
        setters.append(slot.__set__)
    pairs = tuple(zip(setters, indices, strict=True))
    new = object.__new__

    def make(row: Row) -> D:
        obj: D = new(cls)
        for put, at in pairs:
            put(obj, row[at])
        return obj

    return make


def _one(cls: type[D], row: Row, columns: Columns) -> D:
    return _maker(cls, columns)(row)


def _all(cls: type[D], rows: Sequence[Row], columns: Columns) -> list[D]:
    make = _maker(cls, columns)
    return [make(row) for row in rows]


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
    return [ClaimResult(r, r.fencing_token) for r in schedule_records(rows, columns)]


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


#: The four answers a mark can give, built once: a ``MarkResult`` is frozen and holds two
#: flags, so every mark answers one of these (a NULL flag reads as False), and a burst of
#: marks builds no object a job.
_MARKS = {(c, r): MarkResult(cancelled=c, recorded=r) for c in (False, True)
          for r in (False, True)}


#: Where (cancelled, recorded) are in rows with these columns.
_MARK_AT: dict[Columns, tuple[int, int]] = {}


def _mark_at(columns: Columns) -> tuple[int, int]:
    found = _MARK_AT.get(columns)
    if found is None:
        cancelled, recorded = _indices(MarkResult, columns)
        found = _MARK_AT[columns] = (cancelled, recorded)
    return found


def mark_result(rows: Sequence[Row], columns: Columns) -> MarkResult:
    cancelled, recorded = _mark_at(columns)
    row = rows[0]
    return _MARKS[bool(row[cancelled]), bool(row[recorded])]


def mark_results(rows: Sequence[Row], columns: Columns) -> list[MarkResult]:
    """``job_mark_dispatched_many``'s rows, one per job in the order given."""
    cancelled, recorded = _mark_at(columns)
    marks = _MARKS
    return [marks[bool(r[cancelled]), bool(r[recorded])] for r in rows]


def renewed(rows: Sequence[Row], columns: Columns) -> list[bool]:
    """``job_renew_many``'s rows, one per job in the order given."""
    at = columns.index("renewed")
    return [bool(r[at]) for r in rows]


def store_stats(rows: Sequence[Row], columns: Columns) -> StoreStats:
    return _one(StoreStats, rows[0], columns)


def fence(rows: Sequence[Row], columns: Columns) -> Fence:
    return _one(Fence, rows[0], columns)


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


def queue_infos(rows: Sequence[Row], columns: Columns) -> list[QueueInfo]:
    """``queue_list``'s rows, one per queue by name."""
    return _all(QueueInfo, rows, columns)


def boolean_value(rows: Sequence[Row], columns: Columns) -> bool:
    """A function's one boolean (``queue_pause``, ``queue_resume``)."""
    return bool(rows[0][0])
