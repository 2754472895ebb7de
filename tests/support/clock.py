"""A clock the tests move by hand (epoch ms), for the runtimes' ``clock=``."""

from __future__ import annotations

import threading
from datetime import datetime, timezone


class FakeClock:
    def __init__(self, now: int = 0) -> None:
        self._now = now
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now

    def set(self, now: int) -> None:
        with self._lock:
            self._now = now

    def advance(self, ms: int) -> int:
        with self._lock:
            self._now += ms
            return self._now


def utc_ms(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> int:
    """``utc_ms(2026, 10, 25, 0, 30)``: that UTC wall time in epoch ms."""
    return int(
        datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc).timestamp() * 1000
    )
