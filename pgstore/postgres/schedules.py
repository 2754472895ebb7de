# generated from pgstore/postgres/schedules_async.py by tools/async_to_sync.py;
# edit pgstore/postgres/schedules_async.py and run `make generate`.
"""The PostgreSQL schedule store (docs/contract.md, the schedule store), for threads.

Each method is one call of one SQL function (see ``pgstore.postgres.schedule_calls``).
Written once, in ``pgstore.postgres.schedules_async``: ``make generate`` writes the
sync store, ``pgstore.postgres.schedules``, from it.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from pgstore.models import (
    CatchUp,
    ClaimResult,
    CompletePatch,
    ScheduleKind,
    ScheduleRecord,
)
from pgstore.postgres import schedule_calls as calls
from pgstore.postgres.schedules_async import AsyncPgScheduleStore
from pgstore.postgres.store import SyncStore

__all__ = ["AsyncPgScheduleStore", "PgScheduleStore"]


class PgScheduleStore(SyncStore):
    """Durable scheduled tasks in PostgreSQL, for threads.

    Each method is one call of the SQL function it names, one round trip. Times are
    epoch ms; ``now=None`` means the database clock. Bad arguments raise
    ``InvalidArgument`` and change nothing.
    """

    def get(self, id: str) -> ScheduleRecord | None:
        """The record of ``id``, or None.
        SQL: ``schedule_get``."""
        return self._runner.run(calls.get(id))

    def register(
        self,
        id: str,
        kind: ScheduleKind,
        spec: str,
        next_run_at: int | None,
        now: int | None = None,
        catch_up: CatchUp = "once",
        jitter_ms: int = 0,
    ) -> ScheduleRecord:
        """Insert if absent; same kind, spec, ``catch_up`` and ``jitter_ms``: untouched;
        another kind or spec: overwrite kind, spec, next_run_at, catch_up and jitter_ms
        (token, lease, last_*, paused and triggered_at kept); only another ``catch_up``
        or ``jitter_ms``: just those change. Returns the stored record.
        SQL: ``schedule_register``."""
        return self._runner.run(
            calls.register(id, kind, spec, next_run_at, now, catch_up, jitter_ms)
        )

    def claim_due(
        self, id: str, owner: str, now: int | None, lease_ms: int
    ) -> ClaimResult | None:
        """Claim ``id`` if due and unleased; None: not due, leased elsewhere, or unknown.
        SQL: ``schedule_claim_due``."""
        return self._runner.run(calls.claim_due(id, owner, now, lease_ms))

    def renew(self, id: str, fencing_token: int, lease_until: int) -> bool:
        """Extend a claim still held with this token; False: the lease was lost.
        SQL: ``schedule_renew``."""
        return self._runner.run(calls.renew(id, fencing_token, lease_until))

    def complete(
        self, id: str, fencing_token: int, patch: CompletePatch, now: int | None = None
    ) -> bool:
        """Commit the occurrence of a claim still held with this token; False: stale.
        SQL: ``schedule_complete``."""
        return self._runner.run(calls.complete(id, fencing_token, patch, now))

    def delete(self, id: str) -> None:
        """Remove the record, keeping its token as the id's high-water mark.
        SQL: ``schedule_delete``."""
        return self._runner.run(calls.delete(id))

    def list(self) -> builtins.list[ScheduleRecord]:
        """Every record, orphans and tombstones included, ordered by id.
        SQL: ``schedule_list``."""
        return self._runner.run(calls.list_all())

    def claim_next(
        self,
        owner: str,
        now: int | None,
        lease_ms: int,
        limit: int,
        ids: Sequence[str] | None = None,
    ) -> builtins.list[ClaimResult]:
        """Claim up to ``limit`` due, unleased records (earliest first; only ``ids`` if given).
        SQL: ``schedule_claim_next``."""
        return self._runner.run(calls.claim_next(owner, now, lease_ms, limit, ids))

    def pause(self, id: str, now: int | None = None) -> ScheduleRecord | None:
        """Pause ``id``: no claim takes it until ``resume``; a lease already held runs on.
        The record, or None for an unknown id.
        SQL: ``schedule_pause``."""
        return self._runner.run(calls.pause(id, now))

    def resume(self, id: str, now: int | None = None) -> ScheduleRecord | None:
        """Make ``id`` claimable again with ``next_run_at`` where the pause left it: the
        occurrences missed meanwhile meet the catch-up policy, as after downtime. The
        record, or None for an unknown id.
        SQL: ``schedule_resume``."""
        return self._runner.run(calls.resume(id, now))

    def trigger(self, id: str, now: int | None = None) -> ScheduleRecord | None:
        """Ask for one run of ``id`` now, out of turn: the next claim takes it (a fresh
        token), and its complete keeps ``next_run_at``. The record, or None when refused:
        unknown, paused, or a live lease.
        SQL: ``schedule_trigger``."""
        return self._runner.run(calls.trigger(id, now))
