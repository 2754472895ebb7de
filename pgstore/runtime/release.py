"""The Dispatcher's releases: a job whose dispatch failed goes back for a retry.

The job is released with the error's text (through ``redact_error``,
``pgstore.runtime.redact``) for a retry at a time given by ``Backoff`` for the
job's **stored** attempt count (the lease counted it: a restarted dispatcher
continues from it, it does not start over). The release of a job's last
attempt (``attempts >= max_attempts``) fails the job for good instead.
``release`` is not retried (the lease expires instead). Each release is
reported (``Release``; a refusal also as ``Refused``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.models import Job
from pgstore.protocols import AsyncJobStore
from pgstore.runtime.base import Host
from pgstore.runtime.events import Refused, Release
from pgstore.runtime.lease import sequence
from pgstore.runtime.redact import RedactError, error_text

__all__ = ["Backoff", "Releaser"]

log = logging.getLogger("pgstore.dispatcher")


@dataclass(frozen=True)
class Backoff:
    """Retry delays: ``base_ms * factor ** (attempt - 1)``, at most ``max_ms``, times a
    random factor in ``[1 - jitter, 1 + jitter]`` so failed jobs do not retry in step."""

    base_ms: int = 1_000
    factor: float = 2.0
    max_ms: int = 300_000
    jitter: float = 0.2
    random: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        v.positive("base_ms", self.base_ms)
        v.positive("max_ms", self.max_ms)
        if not self.factor >= 1:
            raise InvalidArgument("factor must be at least 1")
        if not 0 <= self.jitter < 1:
            raise InvalidArgument("jitter must be in [0, 1)")

    def delay_ms(self, attempt: int) -> int:
        """The delay before retry number ``attempt`` (1 for the first retry: the
        dispatcher passes the job's stored attempts, the failed lease included)."""
        exponent = max(attempt, 1) - 1
        raw = min(float(self.max_ms), self.base_ms * self.factor ** min(exponent, 64))
        spread = 1 + self.jitter * (2 * self.random() - 1)
        return max(1, int(raw * spread))


class Releaser:
    """Releases ``host``'s failed jobs for a retry at ``backoff``, their error's text
    through ``redact_error`` (None: verbatim)."""

    def __init__(self, jobs: AsyncJobStore, host: Host, backoff: Backoff,
                 redact_error: RedactError | None) -> None:
        self._release = jobs.release
        self._host = host
        self.backoff = backoff
        self.redact_error = redact_error

    async def retry_later(self, job: Job, exc: Exception, what: str = "dispatch") -> None:
        """Release ``job`` with ``exc``'s text after its ``what`` (dispatch, or a refused
        mark_dispatched) failed: for a retry at the backoff of its stored attempts (what
        the lease counted, this one included), or, when this lease was its last, to fail
        it for good."""
        holder = self._host.owner
        attempt = max(job.attempts, 1)
        log.error("%s: %s of %s failed (attempt %d of %d)", holder, what,
                  job.run_id, attempt, job.max_attempts, exc_info=exc)
        # Through redact_error before it leaves the process (a failing hook falls back
        # to a text without the message: the release is never lost to it).
        error = error_text(exc, self.redact_error)
        retry_at: int | None = None
        try:
            retry_at = await self._host.now() + self.backoff.delay_ms(attempt)
            released = await self._release(job.run_id, holder, retry_at, sequence(job), error)
        except Exception:
            log.exception("%s: release of %s failed; its lease will expire", holder,
                          job.run_id)
            self._released(job, attempt, None, "error")
            return
        if not released:
            log.warning("%s: release of %s refused: no longer held", holder, job.run_id)
            self._released(job, attempt, retry_at, "refused")
            self._host.emit(Refused(runtime="dispatcher", owner=holder, operation="release",
                                    subject=job.run_id, token=job.lease_sequence))
        elif job.last_attempt:
            log.error("%s: %s failed for good after %d attempt(s): %s", holder,
                      job.run_id, attempt, error)
            self._released(job, attempt, None, "failed")
        else:
            log.info("%s: released %s for a retry at %s", holder, job.run_id, retry_at)
            self._released(job, attempt, retry_at, "released")

    def _released(
        self, job: Job, attempt: int, retry_at: int | None,
        outcome: Literal["released", "failed", "refused", "error"],
    ) -> None:
        self._host.emit(Release(runtime="dispatcher", owner=self._host.owner,
                                subject=job.run_id, token=job.lease_sequence,
                                attempt=attempt, retry_at=retry_at, outcome=outcome))
