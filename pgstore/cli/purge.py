"""``pgstore purge --older-than AGE``: delete old finished jobs in batches, safely.

The cutoff is judged once, at the start, on the database clock: a job is old
enough when it finished (``finished_at``: dispatched, cancelled, or failed) more
than ``AGE`` before it, and no live lease holds it.

**Failed jobs are kept unless ``--include-failed``.** ``job_purge`` deletes every
finished job, failed ones (out of attempts, not cancelled: dead letters that
``pgstore jobs retry`` revives) included, and has no argument to spare them; a new
revision would be needed for one. So the command counts first (``purge_counts``):
when a failed job finished before the cutoff and ``--include-failed`` was not
given, it stops, deletes nothing and says so (exit status 1). That count cannot
go stale while the batches run: a job fails with ``finished_at`` set to the
database clock's now (``job_lease``, ``job_release``), which is after the cutoff,
so no failed job older than the cutoff can appear once the count found none.

**What it would delete is said first.** ``purge_counts`` reads, as the schema's
owner (whom ``job_purge`` needs anyway), how many jobs per state the cutoff
selects, with ``job_purge``'s own predicate; ``--dry-run`` prints that and stops.
Otherwise, as ``pgstore downgrade`` does, it asks on a terminal (type the schema's
name) and off a terminal needs ``--yes``; without it, exit status 2 and nothing
deleted. Nothing old enough: nothing to ask, nothing deleted.

Then ``job_purge`` is called with ``N`` jobs at a time (``--batch``), one
transaction per batch, so no batch holds many locks or a long snapshot. It stops
at the first batch that deletes fewer than ``N``: rows that leases, marks or
cancels held locked at that moment are left for the next run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import psycopg
from psycopg import sql

from pgstore import _validate as v
from pgstore.cli.format import format_duration, iso_utc, span_ms

__all__ = [
    "DEFAULT_BATCH",
    "PurgeCounts",
    "age_ms",
    "batch_size",
    "confirm_purge",
    "purge_counts",
    "purge_in_batches",
]

#: How many jobs one ``job_purge`` call deletes unless ``--batch`` says otherwise.
DEFAULT_BATCH = 1000


def age_ms(text: str) -> int:
    """An age such as ``7d``, ``12h``, ``30m``, ``90s``, ``500ms`` or ``2w`` in ms; a
    positive count and one unit. ``ValueError`` otherwise (``format.span_ms``)."""
    return span_ms(text)


def batch_size(text: str) -> int:
    """A batch size: a positive integer of at most 2^31 - 1 (``job_purge``'s integer)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value <= v.INTEGER_MAX:
        raise ValueError(f"not a batch size (1 to {v.INTEGER_MAX}): {text!r}")
    return value


@dataclass(frozen=True)
class PurgeCounts:
    """The jobs that finished before a cutoff, per state (``dispatched``: cancelled
    meanwhile or not; ``cancelled``: never dispatched; ``failed``: out of attempts, not
    cancelled), those of them a live lease still holds (``job_purge`` keeps them), and
    when the oldest failed one finished (None: none)."""

    before: int
    dispatched: int
    cancelled: int
    failed: int
    leased: int
    oldest_failed_at: int | None

    def deletable(self, include_failed: bool) -> int:
        """How many the purge deletes (unleased; failed ones only when included)."""
        return self.dispatched + self.cancelled + (self.failed if include_failed else 0)

    def text(self, include_failed: bool) -> str:
        """``12 dispatched, 3 cancelled, 0 failed (kept: ...)``."""
        failed = f"{self.failed} failed" if include_failed else f"{self.failed} failed (kept)"
        leased = f"; {self.leased} more under a live lease (kept)" if self.leased else ""
        return f"{self.dispatched} dispatched, {self.cancelled} cancelled, {failed}{leased}"


def purge_counts(
    conn: psycopg.Connection[Any], schema: str, before: int, now: int
) -> PurgeCounts:
    """How many jobs ``job_purge(before, ...)`` at ``now`` would delete, per state: its
    predicate (finished_at < before; dispatched, cancelled or failed; no live lease),
    read from the table through its finished-jobs index. Needs SELECT on the jobs
    table: the schema's owner, whom ``job_purge`` needs anyway."""
    query = sql.SQL(
        "SELECT count(*) FILTER (WHERE j.dispatched AND NOT j.live),"
        "       count(*) FILTER (WHERE j.cancelled AND NOT j.dispatched AND NOT j.live),"
        "       count(*) FILTER (WHERE j.failed AND NOT j.cancelled AND NOT j.dispatched"
        "                          AND NOT j.live),"
        "       count(*) FILTER (WHERE j.live),"
        "       min(j.finished_at) FILTER (WHERE j.failed AND NOT j.cancelled"
        "                                    AND NOT j.dispatched AND NOT j.live)"
        "  FROM (SELECT c.dispatched, c.cancelled, c.failed, c.finished_at,"
        "               coalesce(c.lease_until > %(now)s, false) AS live"
        "          FROM {}.jobs c"
        "         WHERE c.finished_at IS NOT NULL AND c.finished_at < %(before)s"
        "           AND (c.dispatched OR c.cancelled OR c.failed)) j"
    ).format(sql.Identifier(schema))
    row = conn.execute(query, {"now": now, "before": before}).fetchone()
    assert row is not None  # an aggregate
    return PurgeCounts(before, int(row[0]), int(row[1]), int(row[2]), int(row[3]),
                       None if row[4] is None else int(row[4]))


def jobs_count(count: int) -> str:
    """``1 job``, ``5 jobs``."""
    return f"{count} job" if count == 1 else f"{count} jobs"


def refusal(schema: str, counts: PurgeCounts, now: int) -> str:
    """Why a purge without ``--include-failed`` stops: failed jobs finished before the
    cutoff, which ``job_purge`` would delete with the rest."""
    assert counts.oldest_failed_at is not None
    oldest = format_duration(max(0, now - counts.oldest_failed_at))
    return (
        f"schema {schema!r}: {counts.failed} failed "
        f"{'job' if counts.failed == 1 else 'jobs'} finished before "
        f"{iso_utc(counts.before)} (the oldest {oldest} ago) and job_purge cannot spare "
        "them: nothing deleted. Retry them (pgstore jobs retry RUN_ID; pgstore jobs "
        "--failed lists them), purge with a longer --older-than, or pass --include-failed "
        "to delete them too"
    )


def confirm_purge(what: str, schema: str, stdin: TextIO, stderr: TextIO) -> None:
    """Ask on ``stderr`` for the schema's name and read one line of ``stdin`` (a
    terminal); ``NotConfirmed`` unless the line is exactly ``schema``."""
    from pgstore.cli.downgrade import NotConfirmed

    stderr.write(f"{what}.\nType the schema name ({schema}) to go ahead; anything else stops: ")
    stderr.flush()
    answer = stdin.readline()
    if not answer.endswith("\n"):
        stderr.write("\n")  # end of input: the error goes on a line of its own
    if answer.rstrip("\r\n") != schema:
        raise NotConfirmed(f"purge not confirmed, nothing deleted: {what}")


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
            f"(finished before {iso_utc(before)})",
            file=progress,
            flush=True,
        )
        if deleted < batch:
            return total
