"""``pgstore purge --older-than AGE [--batch N]``: delete old finished jobs in batches.

The cutoff is judged once, at the start, on the database clock: jobs that
finished (dispatched, or cancelled before their dispatch) more than ``AGE``
before it are deleted by repeated calls of ``job_purge`` of ``N`` jobs each,
one transaction per batch, so no batch holds many locks or a long snapshot.
It stops at the first batch that deletes fewer than ``N``: rows that leases,
marks or cancels held locked at that moment are left for the next run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TextIO

from pgstore import _validate as v
from pgstore.cli.format import format_instant

__all__ = ["DEFAULT_BATCH", "age_ms", "batch_size", "purge_in_batches"]

#: How many jobs one ``job_purge`` call deletes unless ``--batch`` says otherwise.
DEFAULT_BATCH = 1000

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_AGE = re.compile(r"([0-9]{1,12})(ms|s|m|h|d|w)")


def age_ms(text: str) -> int:
    """An age such as ``7d``, ``12h``, ``30m``, ``90s``, ``500ms`` or ``2w`` in ms; a
    positive count and one unit. ``ValueError`` otherwise."""
    match = _AGE.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(
            f"not an age: {text!r} (a positive count and a unit: ms, s, m, h, d or w; e.g. 7d)"
        )
    return int(match.group(1)) * _UNITS_MS[match.group(2)]


def batch_size(text: str) -> int:
    """A batch size: a positive integer of at most 2^31 - 1 (``job_purge``'s integer)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value <= v.INTEGER_MAX:
        raise ValueError(f"not a batch size (1 to {v.INTEGER_MAX}): {text!r}")
    return value


def purge_in_batches(
    purge: Callable[[int, int], int], before: int, batch: int, progress: TextIO
) -> int:
    """Call ``purge(before, batch)`` until it deletes fewer than ``batch``, writing one
    progress line per batch to ``progress``; how many jobs were deleted in all."""
    total = 0
    batches = 0
    while True:
        deleted = purge(before, batch)
        total += deleted
        batches += 1
        print(
            f"purge: batch {batches}: {deleted} deleted, {total} in all "
            f"(finished before {format_instant(before)})",
            file=progress,
            flush=True,
        )
        if deleted < batch:
            return total
