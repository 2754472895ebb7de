"""Argument checks.

Two layers. ``text``, ``integer`` and ``text_list`` check only what SQL
cannot see (Python types, NUL characters, the bigint range); the PostgreSQL
stores run them before sending a call, and leave the value rules to the SQL
functions. The value rules (``name``, ``positive``, ``present``, ``one_of``,
``spec``, ``add``) mirror sql/00_common.sql word for word for the in-memory stores.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypeVar

from pgstore.errors import InvalidArgument

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1
INTEGER_MAX = 2**31 - 1
NAME_MAX_CHARS = 1024
#: A schedule's spec, as sql/00_common.sql's check_length says: a cron expression
#: with its zone is under 100 characters, an interval or delay under 20.
SPEC_MAX_CHARS = 1024
#: The most jobs one batch call takes, as sql/22_job_batches.sql's batch_max() says.
BATCH_MAX = 10_000

_S = TypeVar("_S", bound=str)


def text(param: str, value: object) -> None:
    """A string (or None) that PostgreSQL can store: no NUL character, and valid
    Unicode (no lone surrogate, which UTF-8 cannot encode)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidArgument(f"{param} must be a string, not {type(value).__name__}")
    if "\x00" in value:
        raise InvalidArgument(f"{param} must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{param} must not contain lone surrogates") from None


def integer(param: str, value: object, *, maximum: int = BIGINT_MAX) -> None:
    """An int (not a bool), or None, that fits the SQL type (bigint by default)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{param} must be an integer, not {type(value).__name__}")
    if not BIGINT_MIN <= value <= maximum:
        raise InvalidArgument(f"{param} is out of range", sqlstate="22003")


def text_list(param: str, value: object) -> None:
    """None, or a list or tuple of strings with no NUL character."""
    if value is None:
        return
    if not isinstance(value, (list, tuple)):
        raise InvalidArgument(f"{param} must be a list of strings, not {type(value).__name__}")
    # The common case checked at C speed (a batch's 500 run ids): every item a string,
    # all of them ASCII with no NUL. Anything else (a None, a non-ASCII string...) is
    # checked item by item, with its own error.
    try:
        joined = "".join(value)
    except TypeError:
        pass
    else:
        if joined.isascii() and "\x00" not in joined:
            return
    for item in value:
        text(param, item)


def integer_list(param: str, value: object) -> None:
    """None, or a list or tuple of integers (or Nones) that fit bigint."""
    if value is None:
        return
    if not isinstance(value, (list, tuple)):
        raise InvalidArgument(f"{param} must be a list of integers, not {type(value).__name__}")
    # The common case checked at C speed: only ints (no bool, no None) within bigint.
    if value and set(map(type, value)) == {int} and (
            min(value) >= BIGINT_MIN and max(value) <= BIGINT_MAX):
        return
    for item in value:
        integer(param, item)


def name(param: str, value: object) -> str:
    """An id, owner, holder or worker id: a non-empty string of at most 1024 characters."""
    text(param, value)
    if not isinstance(value, str) or value == "" or len(value) > NAME_MAX_CHARS:
        raise InvalidArgument(f"{param} must be a non-empty string of at most 1024 characters")
    return value


def worker_id(param: str, value: object) -> str | None:
    """A worker id, as sql/21_job_functions.sql's job_mark_dispatched and
    sql/22_job_batches.sql's job_mark_dispatched_many check it: None, or a string
    (empty allowed) of at most 1024 characters that PostgreSQL can store (``text``)."""
    text(param, value)
    if isinstance(value, str) and len(value) > NAME_MAX_CHARS:
        raise InvalidArgument(f"{param} must be a string of at most 1024 characters")
    assert value is None or isinstance(value, str)
    return value


def positive(param: str, value: object, *, maximum: int = BIGINT_MAX) -> int:
    """A positive integer (lease_ms, ttl_ms, limit)."""
    integer(param, value, maximum=maximum)
    if not isinstance(value, int) or value <= 0:
        raise InvalidArgument(f"{param} must be a positive integer")
    return value


def present_int(param: str, value: object) -> int:
    """A non-null integer."""
    integer(param, value)
    if not isinstance(value, int):
        raise InvalidArgument(f"{param} must not be null")
    return value


def present_text(param: str, value: object) -> str:
    """A non-null string."""
    text(param, value)
    if not isinstance(value, str):
        raise InvalidArgument(f"{param} must not be null")
    return value


def spec(param: str, value: object) -> str:
    """A schedule's spec: a non-null string of at most 1024 characters (empty allowed)."""
    present_text(param, value)
    assert isinstance(value, str)
    if len(value) > SPEC_MAX_CHARS:
        raise InvalidArgument(f"{param} must be a string of at most 1024 characters")
    return value


def one_of(param: str, value: object, allowed: Sequence[_S]) -> _S:
    """One of the allowed strings (kind, last_status)."""
    text(param, value)
    for candidate in allowed:
        if value == candidate:
            return candidate
    raise InvalidArgument(f"{param} must be one of {', '.join(allowed)}")


def names(param: str, value: object) -> list[str] | None:
    """None, or a list of valid names (``claim_next``'s ids)."""
    text_list(param, value)
    if value is None:
        return None
    assert isinstance(value, (list, tuple))
    if any(not isinstance(v, str) or v == "" or len(v) > NAME_MAX_CHARS for v in value):
        raise InvalidArgument(f"{param} must hold non-empty strings of at most 1024 characters")
    return list(value)


def run_ids(value: object) -> list[str]:
    """A batch's run ids, as sql/22_job_batches.sql's check_run_ids says: a list of at
    most ``BATCH_MAX`` distinct, non-empty strings of at most 1024 characters."""
    text_list("run_ids", value)
    if value is None:
        raise InvalidArgument("run_ids must not be null")
    assert isinstance(value, (list, tuple))
    if len(value) > BATCH_MAX:
        raise InvalidArgument(
            f"run_ids must be a one-dimensional array of at most {BATCH_MAX} elements")
    if any(not isinstance(r, str) or r == "" or len(r) > NAME_MAX_CHARS for r in value):
        raise InvalidArgument("run_ids must hold non-empty strings of at most 1024 characters")
    if len(set(value)) < len(value):
        raise InvalidArgument("run_ids must not repeat a run_id")
    return list(value)


def same_length(param: str, value: object, length: int) -> list[object]:
    """A batch's companion array: a list of exactly ``length`` elements (check_same_length)."""
    if not isinstance(value, (list, tuple)) or len(value) != length:
        raise InvalidArgument(f"{param} must be a one-dimensional array as long as run_ids")
    return list(value)


INTEGER_MIN = -(2**31)


def priority(param: str, value: object) -> int | None:
    """None (the default, or keep) or an int within SQL's integer (out of it: 22003)."""
    integer(param, value, maximum=INTEGER_MAX)
    if isinstance(value, int) and value < INTEGER_MIN:
        raise InvalidArgument(f"{param} is out of range", sqlstate="22003")
    assert value is None or isinstance(value, int)
    return value


def payload(param: str, value: object) -> str | None:
    """A job's payload as the JSON text sent to PostgreSQL (``jsonb``), or None: none.
    Anything ``json.dumps`` encodes, without NaN or infinities and without a NUL
    character (jsonb stores neither)."""
    if value is None:
        return None
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidArgument(f"{param} must be a JSON value: {error}") from None
    if "\\u0000" in encoded and _holds_nul(value):
        raise InvalidArgument(f"{param} must not contain NUL characters")
    text(param, encoded)
    return encoded


def _holds_nul(value: object) -> bool:
    """A NUL character in any string or key of a decoded JSON value."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_holds_nul(v) for v in value)
    return False


def payload_size(param: str, encoded: str | None, maximum: int) -> None:
    """At most ``maximum`` bytes of UTF-8 JSON text (store_settings.max_payload_bytes)."""
    if encoded is not None and len(encoded.encode("utf-8")) > maximum:
        raise InvalidArgument(
            f"{param} must be at most {maximum} bytes as JSON text"
            " (store_settings.max_payload_bytes)")


def queues(param: str, value: object) -> list[str] | None:
    """None (every queue) or a non-empty list of at most 1024 queue names (check_queues)."""
    text_list(param, value)
    if value is None:
        return None
    assert isinstance(value, (list, tuple))
    if (not value or len(value) > 1024
            or any(not isinstance(q, str) or q == "" or len(q) > NAME_MAX_CHARS for q in value)):
        raise InvalidArgument(
            f"{param} must be NULL (every queue) or a one-dimensional, non-empty array of at"
            " most 1024 non-empty strings of at most 1024 characters")
    return list(value)


def add(a: int, b: int) -> int:
    """``a + b`` as bigint arithmetic: out of range is an error, never a wrapped value."""
    total = a + b
    if not BIGINT_MIN <= total <= BIGINT_MAX:
        raise InvalidArgument("bigint out of range", sqlstate="22003")
    return total
