"""What each page of the console shows, read through the store's functions.

Plain Python, no web framework: each ``read_*`` coroutine makes the store calls of one
page (each one SQL function call) and returns what its template renders. Times are
epoch ms on the database clock (``now_ms()``), never this host's.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from pgstore.models import Job, JobFilter, QueueInfo, ScheduleRecord, StoreStats
from pgstore.postgres.jobs import AsyncPgJobStore
from pgstore.postgres.schedules import AsyncPgScheduleStore

__all__ = [
    "CHART_READ",
    "JOB_STATES",
    "READ_LIMIT",
    "Holder",
    "Minute",
    "Overview",
    "format_instant",
    "format_span",
    "job_state",
    "relative",
    "time_zone",
]

#: The most jobs one page reads with ``job_list`` (earliest ``dispatch_at`` first); a page
#: that read fewer than match says so.
READ_LIMIT = 5000
#: The most dispatched jobs the overview's chart reads; beyond it, no chart (job_list has
#: no time window, and reads the earliest first).
CHART_READ = 20_000
#: The chart's span and its buckets.
CHART_MINUTES = 60
MINUTE_MS = 60_000

#: The states the jobs page filters by, in the order it offers them.
JOB_STATES = (
    "all", "waiting", "pending", "due", "leased", "lease expired",
    "dispatched", "recalled", "cancelled", "failed",
)
_WAITING = ("pending", "due", "leased", "lease expired")


def format_instant(ms: int | None) -> str:
    """``2024-05-01 12:00:00.123Z``; ``-`` for None."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def format_span(ms: int) -> str:
    """A length of time in the largest units that say it: ``850 ms``, ``4.2 s``,
    ``3 min 5 s``, ``1 min``, ``2 h 10 min``, ``3 d 4 h``."""
    ms = abs(ms)
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        big, small = (seconds // 60, "min"), (seconds % 60, "s")
    elif seconds < 172_800:
        big, small = (seconds // 3600, "h"), (seconds % 3600 // 60, "min")
    else:
        big, small = (seconds // 86_400, "d"), (seconds % 86_400 // 3600, "h")
    text = f"{big[0]} {big[1]}"
    return f"{text} {small[0]} {small[1]}" if small[0] else text


def relative(ms: int | None, now: int) -> str:
    """``in 4.2 s``, ``3 min 5 s ago``, ``now``; empty for None."""
    if ms is None:
        return ""
    if ms == now:
        return "now"
    return f"in {format_span(ms - now)}" if ms > now else f"{format_span(now - ms)} ago"


def job_state(job: Job, now: int) -> str:
    """Where ``job`` stands at ``now``: ``pending`` (not due), ``due``, ``leased`` (live
    lease), ``lease expired`` (its holder's lease ran out, not released), ``dispatched``,
    ``recalled`` (dispatched, then cancelled: the bot was told to leave), ``cancelled``
    (never dispatched) or ``failed`` (out of attempts)."""
    if job.dispatched:
        return "recalled" if job.cancelled else "dispatched"
    if job.cancelled:
        return "cancelled"
    if job.failed:
        return "failed"
    if job.lease_holder is not None and job.lease_until is not None:
        return "leased" if job.lease_until > now else "lease expired"
    return "due" if job.dispatch_at <= now else "pending"


def _matches(state: str, wanted: str) -> bool:
    return wanted == "all" or state == wanted or (wanted == "waiting" and state in _WAITING)


def time_zone(record: ScheduleRecord) -> str | None:
    """The zone of a cron spec written ``TZ=<zone> <cron>`` (or ``CRON_TZ=``); None."""
    if record.kind != "cron":
        return None
    first = record.spec.split(maxsplit=1)[0] if record.spec.strip() else ""
    for prefix in ("TZ=", "CRON_TZ="):
        if first.startswith(prefix):
            return first[len(prefix):]
    return None


# --- the overview -----------------------------------------------------------------


@dataclass(frozen=True)
class Minute:
    """One minute of the chart: jobs marked dispatched in it, and how late they were
    (from ``dispatch_at`` to ``finished_at``, the mark), median and worst."""

    start: int
    dispatched: int
    late_median: int | None
    late_max: int | None


@dataclass(frozen=True)
class Overview:
    now: int
    stats: StoreStats
    minutes: list[Minute] | None
    #: Why there is no chart, when there is none.
    no_chart: str | None
    dispatched_kept: int


def minutes(jobs: Iterable[Job], now: int) -> list[Minute]:
    """The last ``CHART_MINUTES`` whole minutes before ``now`` and the one running,
    oldest first, from the dispatched jobs' ``finished_at``."""
    first = (now // MINUTE_MS - CHART_MINUTES + 1) * MINUTE_MS
    late: list[list[int]] = [[] for _ in range(CHART_MINUTES)]
    for job in jobs:
        if not job.dispatched or job.finished_at is None or job.finished_at < first:
            continue
        index = (job.finished_at - first) // MINUTE_MS
        if 0 <= index < CHART_MINUTES:
            late[index].append(max(0, job.finished_at - job.dispatch_at))
    return [
        Minute(
            start=first + i * MINUTE_MS,
            dispatched=len(values),
            late_median=int(statistics.median(values)) if values else None,
            late_max=max(values) if values else None,
        )
        for i, values in enumerate(late)
    ]


async def read_overview(jobs: AsyncPgJobStore) -> Overview:
    """``store_stats`` and, when few enough are kept, the dispatched jobs for the chart."""
    now = await jobs.now_ms()
    stats = await jobs.stats(now)
    page = await jobs.list_jobs("dispatched", now, CHART_READ)
    if page.matching > CHART_READ:
        return Overview(
            now, stats, None,
            f"{page.matching:,} dispatched jobs are kept and the chart reads at most "
            f"{CHART_READ:,} (job_list reads the earliest first): purge finished jobs "
            "(pgstore purge --older-than 1d) to see it",
            page.matching,
        )
    return Overview(now, stats, minutes(page.jobs, now), None, page.matching)


# --- jobs, failed jobs, leases ----------------------------------------------------


@dataclass(frozen=True)
class JobListing:
    now: int
    jobs: list[tuple[Job, str]]
    #: How many jobs ``job_list`` matched, and how many of those this page read.
    matching: int
    read: int
    shown_limit: int
    more: int = 0


def _sql_filter(state: str) -> JobFilter:
    if state in ("dispatched", "recalled"):
        return "dispatched"
    if state == "failed":
        return "failed"
    if state in ("due", "leased", "lease expired"):
        return "due"  # waiting and due, leased or not: the pending index
    return "all"


async def read_jobs(
    jobs: AsyncPgJobStore, state: str, run_id: str, holder: str, limit: int, queue: str = ""
) -> JobListing:
    """The jobs in ``state`` of the queue named ``queue`` (exactly; empty: every queue)
    whose run id contains ``run_id`` and whose lease holder contains ``holder`` (empty:
    any), at most ``limit`` shown, from one ``job_list`` call of at most ``READ_LIMIT``
    rows (the queue is its ``p_queues``: the rows read are that queue's)."""
    now = await jobs.now_ms()
    page = await jobs.list_jobs(_sql_filter(state), now, READ_LIMIT, [queue] if queue else None)
    selected = []
    for job in page.jobs:
        current = job_state(job, now)
        if not _matches(current, state):
            continue
        if run_id and run_id not in job.run_id:
            continue
        if holder and holder not in (job.lease_holder or ""):
            continue
        selected.append((job, current))
    shown = selected[:limit]
    return JobListing(now, shown, page.matching, len(page.jobs), limit,
                      more=len(selected) - len(shown))


async def read_failed(jobs: AsyncPgJobStore) -> JobListing:
    """The failed jobs (out of attempts, not cancelled): ``job_list('failed')``."""
    now = await jobs.now_ms()
    page = await jobs.list_jobs("failed", now, READ_LIMIT)
    return JobListing(now, [(j, "failed") for j in page.jobs], page.matching, len(page.jobs),
                      READ_LIMIT)


@dataclass(frozen=True)
class Leases:
    now: int
    jobs: list[tuple[Job, str]]
    schedules: list[ScheduleRecord]
    matching: int
    read: int


async def read_leases(jobs: AsyncPgJobStore, schedules: AsyncPgScheduleStore) -> Leases:
    """The job leases held now (live, or expired and not yet taken again: due jobs with
    a holder, from ``job_list('due')``) and the schedule claims (``schedule_list``)."""
    now = await jobs.now_ms()
    page = await jobs.list_jobs("due", now, READ_LIMIT)
    held = [(j, job_state(j, now)) for j in page.jobs if j.lease_holder is not None]
    held.sort(key=lambda pair: (pair[0].lease_until or 0, pair[0].run_id))
    claims = [r for r in await schedules.list() if r.lease_owner is not None]
    return Leases(now, held, claims, page.matching, len(page.jobs))


# --- queues -----------------------------------------------------------------------


@dataclass(frozen=True)
class Queues:
    now: int
    queues: list[QueueInfo]


async def read_queues(jobs: AsyncPgJobStore) -> Queues:
    """Every queue that holds waiting jobs or was ever paused (``queue_list``)."""
    now = await jobs.now_ms()
    return Queues(now, await jobs.list_queues(now))


# --- schedules, workers -----------------------------------------------------------


@dataclass(frozen=True)
class Schedules:
    now: int
    records: list[ScheduleRecord]


async def read_schedules(schedules: AsyncPgScheduleStore) -> Schedules:
    """Every schedule record (``schedule_list``)."""
    now = await schedules.now_ms()
    return Schedules(now, await schedules.list())


@dataclass
class Holder:
    """One lease holder seen in the store: a dispatcher's holder name or a scheduler's
    owner, what it holds now, and its latest lease (the one that ends last)."""

    name: str
    live: int = 0
    expired: int = 0
    dispatched: int = 0
    claims: int = 0
    latest: Job | None = None
    latest_claim: ScheduleRecord | None = None
    kinds: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Workers:
    now: int
    holders: list[Holder]
    matching: int
    read: int


def holders(jobs: Sequence[Job], records: Sequence[ScheduleRecord], now: int) -> list[Holder]:
    """Every holder named by a job's ``lease_holder`` (a dispatched job keeps the holder
    that marked it) or a schedule's ``lease_owner``, by name."""
    seen: dict[str, Holder] = {}
    for job in jobs:
        if job.lease_holder is None:
            continue
        holder = seen.setdefault(job.lease_holder, Holder(job.lease_holder))
        holder.kinds.add("dispatcher")
        state = job_state(job, now)
        if state == "leased":
            holder.live += 1
        elif state == "lease expired":
            holder.expired += 1
        elif job.dispatched:
            holder.dispatched += 1
        if job.lease_until is not None and (
            holder.latest is None or (holder.latest.lease_until or 0) < job.lease_until
        ):
            holder.latest = job
    for record in records:
        if record.lease_owner is None:
            continue
        holder = seen.setdefault(record.lease_owner, Holder(record.lease_owner))
        holder.kinds.add("scheduler")
        holder.claims += 1
        if holder.latest_claim is None or (holder.latest_claim.lease_until or 0) < (
            record.lease_until or 0
        ):
            holder.latest_claim = record
    return [seen[name] for name in sorted(seen)]


async def read_workers(jobs: AsyncPgJobStore, schedules: AsyncPgScheduleStore) -> Workers:
    """The holders seen in ``job_list('all')`` (at most ``READ_LIMIT`` jobs) and in
    ``schedule_list``."""
    now = await jobs.now_ms()
    page = await jobs.list_jobs("all", now, READ_LIMIT)
    records = await schedules.list()
    return Workers(now, holders(page.jobs, records, now), page.matching, len(page.jobs))
