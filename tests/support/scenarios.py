"""The shared conformance scenarios (tests/conformance/*.json): loading, and the
matching rules both runners apply (tests/conformance/README.md)."""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from pathlib import Path
from typing import Any

#: Where the scenario files live; clients/typescript/test/conformance.test.ts reads them too.
SCENARIOS = Path(__file__).resolve().parent.parent / "conformance"


def load(store: str) -> list[dict[str, Any]]:
    """The scenarios of ``store`` ("jobs" or "schedules")."""
    data = json.loads((SCENARIOS / f"{store}.json").read_text())
    assert data["store"] == store
    scenarios: list[dict[str, Any]] = data["scenarios"]
    return scenarios


def expanded(value: Any) -> Any:
    """A step's arguments as the call takes them: ``{"$repeat": s, "times": n}`` is ``s``
    ``n`` times (a payload past the size cap, without a 70 kB line in the file)."""
    if isinstance(value, dict):
        if "$repeat" in value:
            repeated: str = value["$repeat"] * value["times"]
            return repeated
        return {key: expanded(v) for key, v in value.items()}
    if isinstance(value, list):
        return [expanded(v) for v in value]
    return value


def plain(value: Any) -> Any:
    """An answer or a state as the scenarios write it: snake_case JSON values."""
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        fields.pop("finished_at", None)  # the database clock's: not in the scenarios
        return fields
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def mismatch(expected: Any, actual: Any, where: str = "answer") -> str | None:
    """Why ``actual`` does not match ``expected`` (partially, for objects), or None."""
    if isinstance(expected, dict) and set(expected) == {"$contains"}:
        if isinstance(actual, str) and expected["$contains"] in actual:
            return None
        return f"{where}: {actual!r} does not contain {expected['$contains']!r}"
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{where}: expected an object, got {actual!r}"
        for key, value in expected.items():
            if key not in actual:
                return f"{where}.{key}: missing from {actual!r}"
            why = mismatch(value, actual[key], f"{where}.{key}")
            if why is not None:
                return why
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{where}: expected {len(expected)} items, got {actual!r}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            why = mismatch(e, a, f"{where}[{i}]")
            if why is not None:
                return why
        return None
    # bool is an int in Python: compare the types too.
    if type(expected) is not type(actual) or expected != actual:
        return f"{where}: expected {expected!r}, got {actual!r}"
    return None


def state_mismatch(expected: dict[str, Any], actual: dict[str, Any]) -> str | None:
    """Why the whole state ``actual`` ({"jobs": ...} or {"schedules": ..., "fences": ...})
    does not match ``expected``: the ids listed are exactly those present."""
    for table, rows in expected.items():
        if table == "fences":
            if actual["fences"] != rows:
                return f"fences: expected {rows!r}, got {actual['fences']!r}"
            continue
        present = actual[table]
        if sorted(present) != sorted(rows):
            return f"{table}: expected ids {sorted(rows)}, got {sorted(present)}"
        for key, row in rows.items():
            why = mismatch(row, present[key], f"{table}[{key!r}]")
            if why is not None:
                return why
    return None
