"""``--json``: what the listings print for scripts, one JSON document on stdout.

The keys are stable: new keys may be added, none is renamed or removed without a
note in docs/cli.md. Every instant appears twice, as epoch ms (``*_ms``, an integer,
or null) and as ISO-8601 UTC (the same name without ``_ms``, or null), both on the
database clock; ``now_ms``/``now`` is the reading every relative state was judged
against. A value is never cut and control characters are kept as they are (JSON
escapes them).

* ``pgstore jobs --json`` (``jobs_json``): ``{"schema", "now_ms", "now", "filter",
  "matching", "jobs": [job, ...]}``, ``matching`` how many jobs the filter selects
  (the list may be shorter: ``--limit``).
* a job (``job_json``): ``run_id``, ``state`` (pending, due, leased, dispatched,
  cancelled, failed: ``format.job_phase``), ``dispatch_at[_ms]``, ``lease_holder``,
  ``lease_until[_ms]``, ``lease_live``, ``lease_sequence``, ``attempts``,
  ``max_attempts``, ``worker_id``, ``dispatched``, ``cancelled``, ``failed``,
  ``finished_at[_ms]``, ``last_error``.
* ``pgstore schedules --json``: ``{"schema", "now_ms", "now", "schedules": [...]}``,
  each ``schedule_json``.
* ``pgstore status --json`` (``status_json``): the schedules (each with
  ``unclaimed_ms`` and ``spec_problem``), ``jobs`` (a count per state and ``total``,
  ``due_expired_lease``, ``recalled``) and ``oldest_due_job`` (or null).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pgstore.cli.format import iso_utc, job_phase
from pgstore.models import Job, ScheduleRecord, StoreStats

__all__ = ["dumps", "instant", "job_json", "jobs_json", "schedule_json", "status_json"]


def instant(name: str, ms: int | None) -> dict[str, Any]:
    """``{name + "_ms": ms, name: ISO}`` (both null for NULL)."""
    return {f"{name}_ms": ms, name: None if ms is None else iso_utc(ms)}


def _header(schema: str, now_ms: int) -> dict[str, Any]:
    return {"schema": schema, **instant("now", now_ms)}


def job_json(job: Job, now_ms: int) -> dict[str, Any]:
    """One job, with its state at ``now_ms``."""
    return {
        "run_id": job.run_id,
        "queue": job.queue,
        "priority": job.priority,
        "state": job_phase(job, now_ms),
        **instant("dispatch_at", job.dispatch_at),
        "lease_holder": job.lease_holder,
        **instant("lease_until", job.lease_until),
        "lease_live": job.lease_until is not None and job.lease_until > now_ms,
        "lease_sequence": job.lease_sequence,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "worker_id": job.worker_id,
        "dispatched": job.dispatched,
        "cancelled": job.cancelled,
        "failed": job.failed,
        **instant("finished_at", job.finished_at),
        "last_error": job.last_error,
        "payload": job.payload,
    }


def jobs_json(
    schema: str, now_ms: int, selected: str, jobs: Sequence[Job], matching: int,
    queues: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``pgstore jobs --json``; ``queues`` the ``--queue`` filter (None: every queue)."""
    return {
        **_header(schema, now_ms),
        "filter": selected,
        "queues": None if queues is None else list(queues),
        "matching": matching,
        "jobs": [job_json(j, now_ms) for j in jobs],
    }


def schedule_json(record: ScheduleRecord, now_ms: int) -> dict[str, Any]:
    """One schedule record, with whether its lease is live at ``now_ms``."""
    return {
        "id": record.id,
        "kind": record.kind,
        "spec": record.spec,
        **instant("next_run_at", record.next_run_at),
        **instant("last_run_at", record.last_run_at),
        "last_status": record.last_status,
        "consecutive_failures": record.consecutive_failures,
        "catch_up": record.catch_up,
        "fencing_token": record.fencing_token,
        "lease_owner": record.lease_owner,
        **instant("lease_until", record.lease_until),
        "lease_live": record.lease_until is not None and record.lease_until > now_ms,
        "paused": record.paused,
        "jitter_ms": record.jitter_ms,
        **instant("due_at", record.due_at),
        **instant("triggered_at", record.triggered_at),
    }


def schedules_json(
    schema: str, now_ms: int, records: Sequence[ScheduleRecord]
) -> dict[str, Any]:
    """``pgstore schedules --json``."""
    return {**_header(schema, now_ms), "schedules": [schedule_json(r, now_ms) for r in records]}


def status_json(
    schema: str, now_ms: int, records: Sequence[ScheduleRecord], stats: StoreStats
) -> dict[str, Any]:
    """``pgstore status --json``: what ``status_text`` shows, as data."""
    from pgstore.cli.status import spec_problem, unclaimed_for

    schedules = [
        {**schedule_json(r, now_ms), "unclaimed_ms": unclaimed_for(r, now_ms),
         "spec_problem": spec_problem(r)}
        for r in records
    ]
    oldest = None
    if stats.oldest_due_job_id is not None and stats.oldest_due_job_at is not None:
        oldest = {
            "run_id": stats.oldest_due_job_id,
            **instant("dispatch_at", stats.oldest_due_job_at),
            "late_ms": max(0, now_ms - stats.oldest_due_job_at),
        }
    return {
        **_header(schema, now_ms),
        "schedules": schedules,
        "jobs": {
            "total": stats.jobs,
            "pending": stats.jobs_pending,
            "due": stats.jobs_due,
            "leased": stats.jobs_leased,
            "dispatched": stats.jobs_dispatched,
            "cancelled": stats.jobs_cancelled,
            "failed": stats.jobs_failed,
            "due_expired_lease": stats.jobs_due_expired_lease,
            "recalled": stats.jobs_recalled,
        },
        "oldest_due_job": oldest,
    }


def dumps(document: Any) -> str:
    """``document`` as indented JSON (keys in the order above)."""
    return json.dumps(document, indent=2, ensure_ascii=False)
