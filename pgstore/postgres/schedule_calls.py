"""The schedule store's calls (docs/contract.md), shared by the sync and async stores.

Each builder checks what SQL cannot (Python types, NUL, bigint range) and
leaves the value rules (docs/contract.md, bad input) to the SQL function.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.models import ClaimResult, CompletePatch, ScheduleRecord
from pgstore.postgres import _functions as _sql
from pgstore.postgres import rows as _rows
from pgstore.postgres.call import Call

# The functions called here, as sql/ declares them (generated: ``_functions``).
GET = _sql.SCHEDULE_GET
REGISTER = _sql.SCHEDULE_REGISTER
CLAIM_DUE = _sql.SCHEDULE_CLAIM_DUE
RENEW = _sql.SCHEDULE_RENEW
COMPLETE = _sql.SCHEDULE_COMPLETE
DELETE = _sql.SCHEDULE_DELETE
LIST = _sql.SCHEDULE_LIST
CLAIM_NEXT = _sql.SCHEDULE_CLAIM_NEXT
PAUSE = _sql.SCHEDULE_PAUSE
RESUME = _sql.SCHEDULE_RESUME
TRIGGER = _sql.SCHEDULE_TRIGGER


def get(id: str) -> Call[ScheduleRecord | None]:
    v.text("id", id)
    return Call(GET, (id,), _rows.optional_schedule_record)


def register(
    id: str,
    kind: str,
    spec: str,
    next_run_at: int | None,
    now: int | None,
    catch_up: str,
    jitter_ms: int = 0,
) -> Call[ScheduleRecord]:
    v.text("id", id)
    v.text("kind", kind)
    v.text("spec", spec)
    v.integer("next_run_at", next_run_at)
    v.integer("now", now)
    v.text("catch_up", catch_up)
    v.integer("jitter_ms", jitter_ms)
    args = (id, kind, spec, next_run_at, now, catch_up, jitter_ms)
    return Call(REGISTER, args, _rows.first_schedule_record)


def claim_due(id: str, owner: str, now: int | None, lease_ms: int) -> Call[ClaimResult | None]:
    v.text("id", id)
    v.text("owner", owner)
    v.integer("now", now)
    v.integer("lease_ms", lease_ms)
    return Call(CLAIM_DUE, (id, owner, now, lease_ms), _rows.optional_claim_result)


def renew(id: str, fencing_token: int, lease_until: int) -> Call[bool]:
    v.text("id", id)
    v.integer("fencing_token", fencing_token)
    v.integer("lease_until", lease_until)
    return Call(RENEW, (id, fencing_token, lease_until), _rows.boolean)


def complete(id: str, fencing_token: int, patch: CompletePatch, now: int | None) -> Call[bool]:
    v.text("id", id)
    v.integer("fencing_token", fencing_token)
    if not isinstance(patch, CompletePatch):
        raise InvalidArgument(f"patch must be a CompletePatch, not {type(patch).__name__}")
    v.integer("next_run_at", patch.next_run_at)
    v.integer("last_run_at", patch.last_run_at)
    v.text("last_status", patch.last_status)
    v.integer("now", now)
    args = (id, fencing_token, patch.next_run_at, patch.last_run_at, patch.last_status, now)
    return Call(COMPLETE, args, _rows.boolean)


def delete(id: str) -> Call[None]:
    v.text("id", id)
    return Call(DELETE, (id,), _rows.nothing)


def list_all() -> Call[list[ScheduleRecord]]:
    return Call(LIST, (), _rows.schedule_records)


def claim_next(
    owner: str, now: int | None, lease_ms: int, limit: int, ids: Sequence[str] | None
) -> Call[list[ClaimResult]]:
    v.text("owner", owner)
    v.integer("now", now)
    v.integer("lease_ms", lease_ms)
    v.integer("limit", limit, maximum=v.INTEGER_MAX)
    if isinstance(limit, int) and limit <= 0:
        v.positive("limit", limit)  # below integer's range too: 22023, as SQL says for <= 0
    v.text_list("ids", ids)
    args = (owner, now, lease_ms, limit, None if ids is None else list(ids))
    return Call(CLAIM_NEXT, args, _rows.claim_results)


def pause(id: str, now: int | None) -> Call[ScheduleRecord | None]:
    v.text("id", id)
    v.integer("now", now)
    return Call(PAUSE, (id, now), _rows.optional_schedule_record)


def resume(id: str, now: int | None) -> Call[ScheduleRecord | None]:
    v.text("id", id)
    v.integer("now", now)
    return Call(RESUME, (id, now), _rows.optional_schedule_record)


def trigger(id: str, now: int | None) -> Call[ScheduleRecord | None]:
    v.text("id", id)
    v.integer("now", now)
    return Call(TRIGGER, (id, now), _rows.optional_schedule_record)
