"""The Scheduler's tasks: what a declared task is (``Task``: its stored kind and spec,
its handler, how its occurrences follow) and what a handler knows of its run
(``RunContext``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pgstore import _validate as v
from pgstore.models import CatchUp, ScheduleKind
from pgstore.runtime import catch_up as _catch_up
from pgstore.runtime.occurrences import (
    CronSpec,
    cron_between,
    interval_between,
    next_cron,
    next_interval,
)

__all__ = ["Handler", "RunContext", "Task", "milliseconds"]

#: A task handler: ``handler()`` or ``handler(ctx)``, plain or ``async def``.
Handler = Callable[..., Any]


@dataclass(frozen=True)
class RunContext:
    """What a handler knows about its run.

    ``lease_lost`` is set when a renew failed: the occurrence may be running
    elsewhere, and this run will not be completed; a plain handler should
    check it and stop early (an ``async def`` handler is cancelled instead).
    ``triggered``: the run was asked for by ``trigger`` (out of turn; ``scheduled_at`` is
    when it was asked for), not a regular occurrence.
    """

    task_id: str
    fencing_token: int
    scheduled_at: int
    started_at: int
    owner: str
    lease_lost: threading.Event = field(default_factory=threading.Event)
    triggered: bool = False


@dataclass(frozen=True)
class Task:
    """A declared task: its stored kind and spec, and how its occurrences follow."""

    id: str
    kind: ScheduleKind
    spec: str
    handler: Handler
    cron: CronSpec | None = None
    period_ms: int | None = None  # the interval, or the one-shot delay
    catch_up: CatchUp = "once"  # registered with the record; the record's is applied
    jitter_ms: int = 0  # each occurrence claimable up to this much after its time

    def first_run_at(self, now: int) -> int:
        """``next_run_at`` for a new (or changed) record registered at ``now``."""
        if self.cron is not None:
            return next_cron(self.cron, now)
        assert self.period_ms is not None
        return v.add(now, self.period_ms)

    def next_run_at(
        self,
        scheduled_at: int,
        now: int,
        catch_up: CatchUp = "once",
        limit: int = _catch_up.DEFAULT_LIMIT,
    ) -> int | None:
        """The occurrence after the one scheduled at ``scheduled_at``, completed at ``now``
        under the ``catch_up`` policy (``pgstore.runtime.catch_up``)."""
        if self.kind == "once":
            return None
        occurrences = self.occurrences(scheduled_at)
        return _catch_up.next_after(catch_up, occurrences, scheduled_at, now, limit)

    def occurrences(self, scheduled_at: int) -> _catch_up.Occurrences:
        """The occurrences from ``scheduled_at`` on: the cron expression's, or the
        interval's grid through ``scheduled_at``."""
        cron, period = self.cron, self.period_ms
        if cron is not None:
            return _catch_up.Occurrences(
                lambda after: next_cron(cron, after),
                lambda after, until: cron_between(cron, after, until),
            )
        assert period is not None
        return _catch_up.Occurrences(
            lambda after: next_interval(scheduled_at, period, after),
            lambda after, until: interval_between(scheduled_at, period, after, until),
        )


def milliseconds(param: str, value: object) -> int:
    if isinstance(value, timedelta):
        value = int(value.total_seconds() * 1000)
    return v.positive(param, value)
