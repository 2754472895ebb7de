"""``Function``: a SQL function of the store, named with its argument types.

What the grants, the revisions and the wrapper's calls all name a function by.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Function"]


@dataclass(frozen=True, slots=True)
class Function:
    """A SQL function of the store and the SQL types of its arguments."""

    name: str
    arg_types: tuple[str, ...]
