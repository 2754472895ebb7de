"""``Dispatcher``: sends each due job once, over a job store, and never leaves a bot
in a cancelled meeting.

For each leased job the dispatcher calls the user's ``dispatch(job)``, which
sends the bot and returns its worker id (or None). Then ``mark_dispatched``:
when the answer is ``cancelled`` (a cancel arrived meanwhile) or not
``recorded`` (the lease was lost and another holder took the job), the user's
``recall(job, worker_id)`` is called so the bot leaves at once. When
``dispatch`` raises, the job is released, with the error's text (through
``redact_error``, ``pgstore.runtime.redact``), for a retry at
a time given by ``backoff`` for the job's **stored** attempt count (the lease
counted it: a restarted dispatcher continues from it, it does not start over).
The release of a job's last attempt (``attempts >= max_attempts``) fails the job
for good instead; ``retry`` (``pgstore retry RUN_ID``) revives it.

The lease is renewed every third of ``ttl_ms`` (by the keeper the Scheduler
uses too) from the lease until the mark has an answer: through ``dispatch``
and through the retries of a failed ``mark_dispatched``. That call is safe to
repeat for the same holder, so a failed one (a lost connection, a server
outage) is retried for up to ``mark_timeout`` seconds; when no attempt has
answered by then, the bot is recalled (it may be sent again once the lease
expires, and must not stay twice). ``release`` is not retried (the lease
expires instead). A refusal for a bad argument (``InvalidArgument``, 22023) is
never retried: it changed nothing and would be refused again. The worker id
``dispatch`` returned is checked (``pgstore._validate.worker_id``, the SQL's
rule: at most 1024 characters, no NUL) before its mark is sent, alone or in a
batch; a bad one, or any mark refused with ``InvalidArgument``, is handled the
same on both paths: the bot is recalled (``Recall`` reason ``unrecorded``,
``Complete`` outcome ``failed``) and the job released with the refusal's text
like a dispatch that raised (a retry at its backoff, or failed for good on its
last attempt). A batch refused as a whole is split until only the bad job gets
the refusal, so the others are marked once and never recalled.

The ``Job`` handed to ``dispatch`` carries its ``lease_sequence``, which grows
with every lease of the job and never goes backwards, even across a failover:
``(job.run_id, job.lease_sequence)`` is an idempotency key for the provider
call. The dispatcher fences its renew, mark_dispatched and release with it, so
a lease lost in a failover cannot record a dispatch made under the next one.

Retention (off by default): with ``purge_after`` (a ``timedelta``, or ms), the
dispatcher deletes the jobs that finished (dispatched, or cancelled) more than
that long ago, through the store's ``purge`` (``job_purge``): a round at start
and then every ``purge_interval`` seconds, in calls of ``purge_batch`` jobs
(one transaction each) until a call deletes fewer. ``job_purge`` is the schema
owner's alone, so a store connected as the client role fails ``start()`` with
``NotPermitted`` (checked by a purge that can delete nothing). A failed round
is logged and retried at the next interval; it never stops the dispatching.

Wake-ups: with a PostgreSQL store, an idle dispatcher LISTENs on the store's
``job_channel()``, which ``job_schedule`` notifies at commit, so a job
scheduled due-now is leased within a fraction of a second while the poll
interval stays long. A notification is only a hint: leasing always goes
through ``job_lease`` (``job_lease_many``), and polling remains the fallback (a memory store, a
lost listening connection). Payloads that are not a dispatch time are ignored
(anyone who can connect can NOTIFY), and bursts are coalesced into a few
wake-ups; see ``pgstore.runtime.wake``.

Bursts (every bot of the 10:00 meetings due in the same second): the
dispatcher leases one job per call while idle (``lease``: a wake-up costs what
it always did) and, while every call comes back full, with ``lease_many``
twice as many with each call up to ``batch_size``; the first short answer
brings it back to one. Each leased job is a run of its own
(``pgstore.runtime.run``: its ``dispatch`` in an asyncio task of its own), at most
``concurrency`` at once, and waits for its own mark and renew answers, which
are sent together (``mark_dispatched_many``, ``renew_many``, see
``pgstore.runtime.batcher``; one alone goes as ``mark_dispatched`` or
``renew``): a burst pays one round trip and one commit for many jobs, and
every rule above holds per job as before. A job's keeper starts only when its
dispatch outlasts a third of the lease, so short dispatches cost no renew and
no keeper task.

The Dispatcher composes one part per job, each in its own module:
``pgstore.runtime.lease`` (leasing, in growing calls), ``run`` (one job's run
through the parts below), ``keep`` (renews, batched,
and each job's keeper), ``dispatch`` (the provider call), ``mark`` (record, and
recall), ``release`` (a failed dispatch back for a retry, ``Backoff``), ``purge``
(retention) and ``wake`` (wake-ups, through the store's ``WakeupSource``). It
reaches the database only through the protocols of ``pgstore.protocols``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pgstore import _validate as v
from pgstore.errors import InvalidArgument
from pgstore.protocols import AsyncJobStore, JobStore
from pgstore.runtime import tracing
from pgstore.runtime.base import Clock, Runtime, default_owner, positive_seconds
from pgstore.runtime.dispatch import DispatchFn, ProviderCall
from pgstore.runtime.events import Subscriber
from pgstore.runtime.keep import LeaseKeepers, Renewals
from pgstore.runtime.lease import Leaser
from pgstore.runtime.mark import Marker, RecallFn
from pgstore.runtime.purge import PURGE_BATCH, PURGE_INTERVAL, Purger
from pgstore.runtime.redact import RedactError, redact_secrets
from pgstore.runtime.release import Backoff, Releaser
from pgstore.runtime.run import JobRun, Parts
from pgstore.runtime.stores import as_async_job_store
from pgstore.runtime.wake import Wake

__all__ = ["Backoff", "Dispatcher"]

log = logging.getLogger("pgstore.dispatcher")

#: How long (seconds) a failing ``mark_dispatched`` is retried before the bot is recalled.
MARK_TIMEOUT = 300.0
#: The most jobs one lease, mark or renew call carries unless ``batch_size`` says otherwise.
BATCH_SIZE = 500


class Dispatcher(Runtime):
    """Leases due jobs and dispatches them, over any job store.

    ``holder`` names this process in leases (default ``dispatcher@host:pid``).
    ``clock`` (epoch ms) defaults to the store's clock. ``poll_interval`` and
    ``grace_period`` are seconds. ``mark_timeout`` (seconds, default 300) bounds the
    retries of a failing ``mark_dispatched``; past it the bot is recalled.
    ``listen=False`` turns wake-ups off; a conninfo string
    LISTENs there instead of on the store's database (behind PgBouncer in transaction
    mode, give it a direct connection to the server: LISTEN needs a session).
    ``on_event`` is called with each event (``pgstore.runtime.events``; more with
    ``subscribe``). ``purge_after`` (a ``timedelta`` or ms; None, the default: never)
    turns retention on, ``purge_interval`` (seconds, default an hour) and
    ``purge_batch`` (jobs per call, default 1000) shape it; see the module's doc.
    ``batch_size`` (default 500, at most 10000) caps the jobs one lease, mark or renew
    call carries; ``concurrency`` caps the dispatches running at once (for a burst of
    ``async def`` provider calls, hundreds). ``redact_error`` turns the exception a
    dispatch raised into the text the release stores as the job's ``last_error``
    (readable by whoever reads the jobs): by default ``redact_secrets`` (credential-like
    values such as ``api_key=...`` replaced by ``***``), None keeps it verbatim; see
    ``pgstore.runtime.redact``. ``queues`` (a non-empty list of queue names) leases only
    their jobs; None (the default) leases from every queue (docs/queues.md).
    """

    log = log
    kind = "dispatcher"

    def __init__(
        self,
        store: JobStore | AsyncJobStore,
        dispatch: DispatchFn,
        recall: RecallFn | None = None,
        *,
        holder: str | None = None,
        ttl_ms: int = 30_000,
        concurrency: int = 4,
        poll_interval: float = 1.0,
        grace_period: float = 10.0,
        backoff: Backoff | None = None,
        clock: Clock | None = None,
        listen: bool | str = True,
        mark_timeout: float = MARK_TIMEOUT,
        on_event: Subscriber | None = None,
        purge_after: timedelta | int | None = None,
        purge_interval: float = PURGE_INTERVAL,
        purge_batch: int = PURGE_BATCH,
        batch_size: int = BATCH_SIZE,
        redact_error: RedactError | None = redact_secrets,
        queues: Sequence[str] | None = None,
    ) -> None:
        if not callable(dispatch):
            raise InvalidArgument("dispatch must be callable")
        if recall is not None and not callable(recall):
            raise InvalidArgument("recall must be callable")
        if redact_error is not None and not callable(redact_error):
            raise InvalidArgument("redact_error must be callable or None")
        jobs = as_async_job_store(store)
        super().__init__(
            store,
            jobs,
            owner=holder or default_owner("dispatcher"),
            lease_ms=ttl_ms,
            concurrency=concurrency,
            poll_interval=poll_interval,
            grace_period=grace_period,
            clock=clock,
            on_event=on_event,
        )
        self.dispatch = dispatch
        self.recall = recall
        self.backoff = backoff or Backoff()
        #: The exception -> ``last_error`` text hook (None: verbatim); see ``redact``.
        self.redact_error = redact_error
        self.mark_timeout = positive_seconds("mark_timeout", mark_timeout)
        self._purger = Purger(jobs, self, purge_after, purge_interval, purge_batch)
        #: Retention: jobs finished this many ms ago are purged (None: never).
        self.purge_after_ms = self._purger.after_ms
        self.purge_interval = self._purger.interval
        self.purge_batch = self._purger.batch
        self.batch_size = v.positive("batch_size", batch_size, maximum=v.BATCH_MAX)
        #: The queues this dispatcher leases from (None: every queue).
        self.queues = v.queues("queues", queues)
        # The parts, one job each (see the module's doc).
        self._leaser = Leaser(jobs, self, self.batch_size, self.queues)
        self._renewals = Renewals(jobs, self, self.batch_size)
        self._provider = ProviderCall(dispatch, self)
        self._releaser = Releaser(jobs, self, self.backoff, redact_error)
        self._marker = Marker(jobs, self, recall=recall, releaser=self._releaser,
                              batch_size=self.batch_size, mark_timeout=self.mark_timeout)
        self._wakeups = Wake(store, listen, self.wake, self.poll_interval, self)
        self._parts = Parts(self, self._provider, self._marker, self._releaser, self._ended)

    @property
    def holder(self) -> str:
        return self.owner

    async def _prepare(self) -> None:
        await super()._prepare()
        await self._purger.start()
        self._wakeups.start()

    async def purge_round(self) -> int:
        """One retention round: purge, ``purge_batch`` jobs per call, what finished more
        than ``purge_after`` before now, until a call deletes fewer (or stop); returns
        how many went. A failure is logged (and reported), never raised."""
        return await self._purger.round()

    async def _shutdown(self) -> None:
        await self._purger.stop()
        await self._wakeups.stop()
        await super()._shutdown()

    def _refill(self) -> int:
        """It leases again once a lease call's worth of slots is free (the size its next
        call asks, at most half of ``concurrency``): a burst is leased in whole batches,
        never in the slivers that single runs ending free; idle, one slot."""
        return max(1, min(self._leaser.batch, self.concurrency // 2))

    async def _claim(self, free: int) -> list[Any]:
        """Lease up to ``free`` jobs (``pgstore.runtime.lease``): one run each."""
        anchor = time.monotonic()  # every lease below runs from no earlier than this
        # Without a clock of its own the lease reads the store's (``now=None``) instead of
        # a round trip for ``now_ms()`` first: the lease goes out at once, before the runs
        # of the previous one take the loop (docs/performance.md, the overlap).
        at = None if self._clock is None else self._clock()
        keepers = LeaseKeepers(self._renewals.keeper, anchor, self.lease_ms)
        jobs = await self._leaser.lease(at, free)
        if not jobs:
            return []
        if at is not None:
            times = [at] * len(jobs)
        else:  # each job's lease time, read back from its lease's end
            leased_at = self._leaser.leased_at
            read = [leased_at(job) for job in jobs]
            now = await self.now() if None in read else 0  # a store with no lease end
            times = [now if t is None else t for t in read]
        parts, loop = self._parts, asyncio.get_running_loop()
        runs = [JobRun(parts, job, t, keepers, loop) for job, t in zip(jobs, times, strict=True)]
        if tracing.recording():  # once for the call: a span a run
            for run in runs:
                run.trace()
        return runs

    def _start(self, pieces: list[Any]) -> None:
        """Start the runs ``_claim`` made (``pgstore.runtime.run``: each ends itself)."""
        running = self._running
        direct = asyncio.get_running_loop().get_task_factory() is None
        for run in pieces:
            running.add(run)
            run.start(direct)
