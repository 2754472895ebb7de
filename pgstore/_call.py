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

from psycopg import sql

T = TypeVar("T")
Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Function:
    """A SQL function of the store and the SQL types of its arguments."""

    name: str
    arg_types: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """A call of ``function`` with ``args``; ``decode`` turns its rows into the answer."""

    function: Function
    args: tuple[object, ...]
    decode: Callable[[Sequence[Row]], T]


@lru_cache(maxsize=256)
def statement(schema: str, function: Function) -> str:
    """``SELECT * FROM "schema".function(%s::type, ...)``, with explicit casts.

    The casts pin the argument types (psycopg would otherwise send small
    Python ints as int2 and an empty list untyped) and keep plans stable.
    Composed once per schema and function: rendering a ``sql.Composed`` at
    every call cost up to 30 µs.
    """
    placeholders = sql.SQL(", ").join(
        sql.SQL("%s::{}").format(sql.SQL(arg_type)) for arg_type in function.arg_types
    )
    return sql.SQL("SELECT * FROM {}.{}({})").format(
        sql.Identifier(schema), sql.Identifier(function.name), placeholders
    ).as_string(None)
