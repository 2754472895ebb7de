"""``Function``: a SQL function of the store, named with its argument types; ``Definition``:
what the catalog says about one.

What the grants, the revisions and the wrapper's calls all name a function by. The
current schema's are generated from ``pg_proc`` after a fresh load of sql/
(``make generate``, ``pgstore/postgres/_functions.py``), never typed by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Definition", "Function", "Volatility"]

#: ``pg_proc.provolatile`` in words.
Volatility = Literal["immutable", "stable", "volatile"]


@dataclass(frozen=True, slots=True)
class Function:
    """A SQL function of the store and the SQL types of its arguments."""

    name: str
    arg_types: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Definition:
    """One function of a schema as ``pg_proc`` has it: its call binding, whether it runs as
    its owner (``SECURITY DEFINER``), and its volatility."""

    function: Function
    security_definer: bool
    volatility: Volatility
