"""One store call: which SQL function, with which arguments, decoded how.

The sync and async stores share these objects; each store method builds one
``Call`` and hands it to its runner, which sends exactly one statement,
``SELECT * FROM <schema>.<function>(<args>)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Generic, TypeVar

from pgstore.schema.function import Function
from pgstore.schema.objects import identifier_for_params

__all__ = ["Call", "Columns", "Function", "Row", "statement"]

T = TypeVar("T")
Row = tuple[Any, ...]
#: The column names of a call's rows, in order (``cursor.description``).
Columns = tuple[str, ...]


@dataclass(slots=True)
class Call(Generic[T]):
    """A call of ``function`` with ``args``; ``decode`` turns its rows (and their column
    names, which the row mapping goes by) into the answer.

    One is built per store call and read once: not frozen, since a frozen dataclass
    sets each field through ``object.__setattr__`` (0.6 µs a Call, against 0.2)."""

    function: Function
    args: tuple[object, ...]
    decode: Callable[[Sequence[Row], Columns], T]


@lru_cache(maxsize=256)
def statement(schema: str, function: Function) -> str:
    """``SELECT * FROM "schema".function(%s::type, ...)``, with explicit casts.

    The casts pin the argument types (psycopg would otherwise send small
    Python ints as int2 and an empty list untyped) and keep plans stable.
    Arrays go in binary (``%b``): psycopg's text format searches every element
    with a regular expression for the characters that need quoting, 1.2-1.8 µs
    an element against 0.3-0.4 µs in binary, which a batch of 500 marks pays
    three times over (run ids, worker ids, lease sequences).
    Composed once per schema and function: rendering a ``sql.Composed`` at
    every call cost up to 30 µs. The text is run with parameters, so a ``%``
    in the schema's name is doubled (psycopg reads the text's ``%`` as
    placeholder marks, quoted identifiers included).
    """
    target = identifier_for_params(schema, function.name).as_string(None)
    casts = ", ".join(f"%b::{arg_type}" if arg_type.endswith("[]") else f"%s::{arg_type}"
                      for arg_type in function.arg_types)
    return f"SELECT * FROM {target}({casts})"
