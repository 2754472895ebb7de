"""``pgstore fence --after-restore [--promotions N]``: what it prints.

The command is one call of ``fence_after_restore()`` (``SyncStore.fence_after_restore``);
this module says what that did in plain words: the floor before and after, as a
number and in bands of 2^40, and what it means for the next claim and lease.
"""

from __future__ import annotations

from pgstore.models import Fence

__all__ = ["BAND", "fence_text"]

#: One timeline's (or one epoch's) share of the tokens: 2^40.
BAND = 2**40


def _bands(floor: int) -> str:
    count = floor // BAND
    return f"{count} band{'' if count == 1 else 's'} of 2^40"


def fence_text(schema: str, fence: Fence, promotions: int) -> str:
    """The lines ``pgstore fence --after-restore`` prints for ``fence``."""
    allowed = f"{promotions} promotion{'' if promotions == 1 else 's'}"
    return "\n".join([
        f"schema {schema!r}: fenced after a restore, allowing for {allowed} "
        "the copy does not show",
        f"token floor before: {fence.floor_before} ({_bands(fence.floor_before)})",
        f"token floor after:  {fence.floor_after} ({_bands(fence.floor_after)})",
        "every claim and lease from now on hands out a fencing token or lease sequence of "
        f"at least {fence.floor_after}, above any the lost server can have handed out",
    ])
