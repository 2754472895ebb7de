"""Calls of the helpers every schema has (sql/00_common.sql)."""

from __future__ import annotations

from . import _rows
from ._call import Call, Function

NOW_MS = Function("now_ms", ())
SCHEMA_REVISION = Function("schema_revision", ())


def now_ms() -> Call[int]:
    return Call(NOW_MS, (), _rows.integer_value)


def schema_revision() -> Call[str]:
    return Call(SCHEMA_REVISION, (), _rows.text_value)
