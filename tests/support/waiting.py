"""Waiting, in a test's event loop, for something the runtime does in the background."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: How long a test waits for the runtime before it fails (seconds).
WAIT = 20.0


async def until(what: str, done: Callable[[], bool], timeout: float = WAIT) -> None:
    """Return once ``done()`` is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
