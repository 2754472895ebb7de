"""The demo's report: its story read back from the database, told, drawn and checked.

``load`` reads the trace (``pgstore.demo.trace``) and the store's own
records; ``timeline`` and ``final_table`` tell the story as text; ``draw``
pictures the leases per process over time (matplotlib, the ``demo`` extra);
``checks`` decides from those rows whether the guarantees held.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgstore.demo.trace import STORE_SCHEMA, TRACE_SCHEMA
from pgstore.models import Job, ScheduleRecord
from pgstore.postgres.jobs import PgJobStore
from pgstore.postgres.schedules import PgScheduleStore

__all__ = ["Check", "Story", "checks", "draw", "final_table", "load", "timeline", "verdict"]

SCHEDULERS = [f"scheduler-{n}" for n in (1, 2, 3)]
DISPATCHERS = [f"dispatcher-{n}" for n in (1, 2, 3)]
TASKS = ["heartbeat", "report", "minutely"]
#: What ends a schedule claim, as its holder logged it.
CLAIM_ENDS = ("complete", "rejected", "renew-refused", "not-completed", "error")
#: What ends a job lease for its holder.
LEASE_ENDS = ("dispatched", "recalling", "released", "kill")


@dataclass(frozen=True)
class Event:
    """One row of the trace's ``events`` table."""

    seq: int
    at: int
    process: str
    kind: str
    subject: str | None
    token: int | None
    scheduled_at: int | None
    until_at: int | None
    worker: str | None
    detail: str | None


@dataclass(frozen=True)
class Run:
    """One row of the trace's ``runs`` table: a schedule handler's run."""

    task: str
    token: int
    scheduled_at: int
    owner: str
    claimed_at: int
    started_at: int
    ended_at: int | None


@dataclass(frozen=True)
class Span:
    """A lease as its holder saw it: from its claim (lease) to how it ended."""

    process: str
    subject: str
    start: Event
    end: Event | None  # None: still held when the trace ends

    @property
    def outcome(self) -> str:
        return self.end.kind if self.end is not None else "open"


@dataclass
class Story:
    """Everything the demo recorded, plus the store's final records."""

    events: list[Event]
    runs: list[Run]
    schedules: list[ScheduleRecord]
    jobs: list[Job]
    t0: int = 0  # the demo's start (the migrate event), epoch ms
    end: int = 0  # the last event
    claims: dict[tuple[str, int], Event] = field(default_factory=dict)
    claim_spans: list[Span] = field(default_factory=list)
    lease_spans: list[Span] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.t0 = next((e.at for e in self.events if e.kind == "migrate"), self.events[0].at)
        self.end = self.events[-1].at
        for e in self.of("claim"):
            assert e.subject is not None and e.token is not None
            self.claims[(e.subject, e.token)] = e
            self.claim_spans.append(Span(e.process, e.subject, e, self._first_after(
                e, CLAIM_ENDS, lambda x, e=e: x.token == e.token)))
        for e in self.of("lease"):
            assert e.subject is not None
            self.lease_spans.append(Span(e.process, e.subject, e, self._first_after(
                e, LEASE_ENDS, lambda x: True)))

    def _first_after(self, start: Event, kinds: tuple[str, ...], also: Any) -> Event | None:
        for e in self.events:
            if (e.seq != start.seq and (e.at, e.seq) >= (start.at, start.seq)
                    and e.kind in kinds and e.process == start.process
                    and e.subject == start.subject and also(e)):
                return e
        return None

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    def seconds(self, at: int) -> float:
        return (at - self.t0) / 1000


def load(dsn: str, meetings: list[str]) -> Story:
    """Read the trace and the store's final state (schedules, and each of ``meetings``)."""
    conn: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as conn:
        trace = sql.Identifier(TRACE_SCHEMA)
        events = [Event(*row) for row in conn.execute(sql.SQL(
            "SELECT seq, at, process, kind, subject, token, scheduled_at, until_at, worker,"
            " detail FROM {}.events ORDER BY at, seq").format(trace))]
        runs = [Run(*row) for row in conn.execute(sql.SQL(
            "SELECT task, token, scheduled_at, owner, claimed_at, started_at, ended_at"
            " FROM {}.runs ORDER BY started_at, id").format(trace))]
    with PgScheduleStore(dsn, schema=STORE_SCHEMA) as schedules:
        records = schedules.list()
    with PgJobStore(dsn, schema=STORE_SCHEMA) as store:
        jobs = [job for job in map(store.get, meetings) if job is not None]
    return Story(events, runs, records, jobs)


# --- telling -------------------------------------------------------------------------

#: Events the timeline leaves out: the provider's own steps (``send``, ``bot``) are in
#: the picture and the checks; the rest repeats what other lines say.
_QUIET = {"send", "bot", "register", "stopping", "stopped", "sigterm", "metrics",
          "metrics-final"}


def timeline(story: Story) -> str:
    """One line per event: seconds since the start, process, what happened. Capitals mark
    the demo's acts (freeze, thaw, kill, cancel) and what they caused."""
    lines = ["timeline (seconds since the demo started, on the database clock)", "",
             f"  {'seconds':>7}  {'process':<13} {'event':<10} {'subject':<12} what happened"]
    seen_occurrences: dict[tuple[str, int], Event] = {}
    leased_by: dict[str, Event] = {}
    for e in story.events:
        label, text = _describe(story, e, seen_occurrences, leased_by)
        if label is None:
            continue
        subject = e.subject or ""
        lines.append(f"  {story.seconds(e.at):7.3f}  {e.process:<13} {label:<10} "
                     f"{subject:<12} {text}".rstrip())
    return "\n".join(lines)


def _describe(
    story: Story, e: Event, occurrences: dict[tuple[str, int], Event],
    leased_by: dict[str, Event],
) -> tuple[str | None, str]:
    if e.kind in _QUIET:
        return None, ""
    due = f"due {story.seconds(e.scheduled_at):.3f}" if e.scheduled_at is not None else ""
    if e.kind == "claim":
        assert e.subject is not None and e.scheduled_at is not None
        before = occurrences.get((e.subject, e.scheduled_at))
        occurrences[(e.subject, e.scheduled_at)] = e
        if before is not None:
            return "RE-CLAIM", (f"token {e.token}: the occurrence {due} again, token "
                                f"{before.token} of {before.process} having expired")
        return "claim", f"token {e.token} ({due})"
    if e.kind == "complete":
        return "complete", f"token {e.token} {e.detail}: accepted"
    if e.kind == "rejected":
        return "REJECTED", f"token {e.token}: complete refused, stale claim (not committed)"
    if e.kind == "renew-refused":
        why = "no renew in time" if e.detail == "expired" else "renew refused"
        return "LOST", f"token {e.token}: {why}, the lease is lost"
    if e.kind == "not-completed":
        return "GAVE UP", f"token {e.token}: not completing (not committed)"
    if e.kind == "freeze":
        return "FREEZE", f"SIGSTOP while running {e.subject} token {e.token}"
    if e.kind == "thaw":
        return "THAW", "SIGCONT"
    if e.kind == "lease":
        assert e.subject is not None
        before = leased_by.get(e.subject)
        leased_by[e.subject] = e
        until = f"until {story.seconds(e.until_at):.3f}" if e.until_at is not None else ""
        if before is not None and before.process != e.process:
            lost = (f", which ran out at {story.seconds(before.until_at):.3f}"
                    if before.until_at is not None else "")
            return "RE-LEASE", f"{until} (held by {before.process}{lost})"
        return "lease", f"{until} ({due})"
    if e.kind == "kill":
        return "KILL", "SIGKILL while holding this lease, no bot out yet"
    if e.kind == "dispatched":
        return "dispatch", f"{e.worker} is in the meeting"
    if e.kind == "recalling":
        return "recalling", f"mark_dispatched: {e.detail}; {e.worker} must leave"
    if e.kind == "recall":
        return "RECALL", f"{e.worker} left the meeting"
    if e.kind == "cancel":
        return "CANCEL", f"-> {e.detail} ({_cancel_state(story, e)})"
    if e.kind == "start":
        return "start", f"up ({e.detail})"
    if e.kind == "exit":
        how = "after SIGKILL" if e.detail == "-9" else "after SIGTERM"
        return "exit", f"exit code {e.detail} {how}"
    if e.kind == "migrate":
        return "migrate", f"a fresh store schema ({e.detail})"
    if e.kind == "schedule":
        return "schedule", e.detail or ""
    return e.kind, e.detail or ""


def _cancel_state(story: Story, cancel: Event) -> str:
    """What the meeting was doing when the cancel arrived, from its holders' events."""
    for span in story.lease_spans:
        if span.subject == cancel.subject and span.start.at <= cancel.at and (
            span.end is None or span.end.at > cancel.at
        ):
            return f"{span.process} is sending its bot"
    return "no lease yet"


def final_table(story: Story) -> str:
    """Per schedule: runs, committed and uncommitted claims, the store's last token and
    status; per meeting state, how many."""
    completes = Counter(e.subject for e in story.of("complete"))
    stale = Counter(e.subject for e in story.of("rejected", "not-completed"))
    runs = Counter(r.task for r in story.runs)
    lines = ["schedules (the store's records after the stop)", "",
             f"  {'task':<10} {'runs':>5} {'committed':>10} {'not committed':>14} "
             f"{'last token':>11}  last status"]
    for rec in story.schedules:
        lines.append(f"  {rec.id:<10} {runs[rec.id]:>5} {completes[rec.id]:>10} "
                     f"{stale[rec.id]:>14} {rec.fencing_token:>11}  {rec.last_status or '-'}")
    if runs["minutely"] == 0:
        lines.append("  (minutely runs at the top of each minute: this run crossed none)")
    states = Counter(_job_state(job) for job in story.jobs)
    relet = {s.subject for s in story.lease_spans} & {e.subject for e in story.of("kill")}
    lines += ["", f"meetings ({len(story.jobs)}, the store's records after the stop)", ""]
    for state in ("dispatched, bot in the meeting", "cancelled while leased, bot recalled",
                  "cancelled before any bot was sent", "still waiting"):
        lines.append(f"  {state:<40} {states[state]:>3}")
    lines.append(f"  {'  of those, leased again after a kill':<40} {len(relet):>3}")
    answers = Counter(e.detail for e in story.of("cancel"))
    lines.append("  cancel answers: " + ", ".join(f"{n} {a}" for a, n in sorted(answers.items())))
    return "\n".join(lines)


def _job_state(job: Job) -> str:
    if job.dispatched and not job.cancelled:
        return "dispatched, bot in the meeting"
    if job.dispatched:
        return "cancelled while leased, bot recalled"
    if job.cancelled:
        return "cancelled before any bot was sent"
    return "still waiting"


# --- drawing -------------------------------------------------------------------------

_TASK_COLOURS = {"heartbeat": "#7fb77e", "report": "#4c78a8", "minutely": "#b79a3f"}
_DISPATCHED, _RECALLED, _KILLED = "#9ecae9", "#b279a2", "#555555"


def draw(story: Story, path: Path) -> None:
    """A PNG of the leases per process over time: one row per process, one bar per lease
    (overlapping leases of one process stacked in lanes), the demo's acts marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    rows = [*SCHEDULERS, *DISPATCHERS, "demo"]
    y_of = {name: len(rows) - 1 - i for i, name in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(15, 6.8), dpi=110)
    stop = story.seconds(story.end)

    def bars(spans: list[Span], colour: Any) -> None:
        by_process: dict[str, list[Span]] = defaultdict(list)
        for s in spans:
            by_process[s.process].append(s)
        for process, mine in by_process.items():
            lanes = _lanes(mine, story.end)
            height = 0.8 / max(lanes.values(), default=0) if lanes else 0.8
            for s in mine:
                x0 = story.seconds(s.start.at)
                x1 = story.seconds(s.end.at) if s.end is not None else stop
                bottom = y_of[process] - 0.4 + (lanes[s.start.seq] - 1) * height
                bad = s.outcome in ("rejected", "renew-refused", "not-completed", "kill")
                ax.add_patch(Rectangle(
                    (x0, bottom), max(x1 - x0, 0.02), height * 0.9, facecolor=colour(s),
                    edgecolor="#c0392b" if bad else "white", linewidth=1.4 if bad else 0.5,
                    hatch="///" if bad else None,
                ))
                if bad and s.start.token is not None:
                    ax.text(x0, bottom + height * 0.45, f" {s.subject} #{s.start.token}",
                            va="center", fontsize=7, color="#7b241c")
                elif not bad and x1 - x0 > 0.35:  # room for a short name inside the bar
                    short = (f"#{s.start.token}" if s.start.token is not None
                             else s.subject.removeprefix("meeting-"))
                    ax.text((x0 + x1) / 2, bottom + height * 0.45, short, ha="center",
                            va="center", fontsize=6.5, color="#222222")

    bars(story.claim_spans, lambda s: _TASK_COLOURS.get(s.subject, "#999999"))
    bars(story.lease_spans, lambda s: {"recalling": _RECALLED, "kill": _KILLED}.get(
        s.outcome, _DISPATCHED))

    for f in story.of("freeze"):
        thaw = next((t for t in story.of("thaw") if t.process == f.process and t.at >= f.at),
                    None)
        x0, x1 = story.seconds(f.at), story.seconds(thaw.at) if thaw else stop
        ax.add_patch(Rectangle((x0, y_of[f.process] - 0.48), x1 - x0, 0.96,
                               facecolor="#bbbbbb", alpha=0.45, edgecolor="none"))
        ax.text((x0 + x1) / 2, y_of[f.process] + 0.43, "frozen (SIGSTOP)", ha="center",
                va="bottom", fontsize=8)
        # The occurrence the frozen holder lost, as its taker ran it.
        for s in story.claim_spans:
            if (s.subject == f.subject and s.process != f.process
                    and s.start.scheduled_at == f.scheduled_at):
                ax.text(story.seconds(s.start.at), y_of[s.process] + 0.42,
                        f"{s.subject} #{s.start.token} (taken over)", fontsize=7,
                        va="bottom", color="#1f3b5c")
    for e in story.of("rejected", "renew-refused"):
        ax.plot(story.seconds(e.at), y_of[e.process], marker="x", color="#c0392b",
                markersize=11, markeredgewidth=2.5)
    for e in story.of("kill"):
        ax.plot(story.seconds(e.at), y_of[e.process], marker="X", color="black",
                markersize=13)
        ax.text(story.seconds(e.at) + 0.15, y_of[e.process], f"SIGKILL, holding {e.subject}",
                fontsize=8, va="center")
        for s in story.lease_spans:
            if s.subject == e.subject and s.process != e.process and s.start.at > e.at:
                ax.text(story.seconds(s.start.at), y_of[s.process] + 0.42,
                        f"{s.subject} leased again", fontsize=7, va="bottom")
    clusters: dict[bool, list[list[Event]]] = {True: [], False: []}
    for e in story.of("cancel"):  # cancels close in time share one label
        leased = _cancel_state(story, e) != "no lease yet"
        ax.plot(story.seconds(e.at), y_of["demo"], marker="v", markersize=9,
                color=_RECALLED if leased else "#e69f00")
        mine = clusters[leased]
        if mine and e.at - mine[-1][0].at < 300:
            mine[-1].append(e)
        else:
            mine.append([e])
    for leased, groups in clusters.items():  # while leased above the marks, before below
        for group in groups:
            names = " ".join((e.subject or "").removeprefix("meeting-") for e in group)
            ax.text(story.seconds(group[0].at), y_of["demo"] + (0.2 if leased else -0.2),
                    names, ha="left", va="bottom" if leased else "top", fontsize=7,
                    color="#5b3256" if leased else "#8a5a00")
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(0, stop + 0.3)
    ax.set_yticks([y_of[r] for r in rows])
    ax.set_yticklabels([r if r != "demo" else "cancels (meeting)" for r in rows])
    ax.set_xlabel("seconds since the demo started (database clock)")
    ax.set_title("pgstore demo: leases held per process (one bar per claim or lease;"
                 " #n: fencing token, nn: meeting)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    handles = [
        *[Patch(facecolor=c, label=f"{t} run (claim to complete)")
          for t, c in _TASK_COLOURS.items()],
        Patch(facecolor=_DISPATCHED, label="meeting lease, bot dispatched"),
        Patch(facecolor=_RECALLED, label="meeting lease, cancelled: bot recalled"),
        Patch(facecolor="white", edgecolor="#c0392b", hatch="///",
              label="lease lost: not committed"),
        Patch(facecolor="#bbbbbb", alpha=0.45, label="process frozen"),
        Line2D([], [], marker="x", color="#c0392b", linestyle="none", markersize=9,
               markeredgewidth=2, label="stale renew / complete refused"),
        Line2D([], [], marker="X", color="black", linestyle="none", markersize=9,
               label="process killed"),
        Line2D([], [], marker="v", color="#e69f00", linestyle="none",
               label="cancel, no lease yet"),
        Line2D([], [], marker="v", color=_RECALLED, linestyle="none",
               label="cancel while leased"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4,
              fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _lanes(spans: list[Span], end: int) -> dict[int, int]:
    """Lane numbers (from 1) for overlapping spans of one process, keyed by start seq."""
    lanes: dict[int, int] = {}
    busy_until: list[int] = []
    for s in sorted(spans, key=lambda s: (s.start.at, s.start.seq)):
        stop = s.end.at if s.end is not None else end
        for i, until in enumerate(busy_until):
            if until <= s.start.at:
                busy_until[i] = stop
                lanes[s.start.seq] = i + 1
                break
        else:
            busy_until.append(stop)
            lanes[s.start.seq] = len(busy_until)
    return lanes


# --- checking ------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def checks(story: Story) -> list[Check]:
    """Every guarantee the demo shows, decided from the trace and the store's records."""
    return [
        _once_per_occurrence(story),
        _tokens_increase(story),
        _store_agrees(story),
        _frozen_holder(story),
        _no_bot_in_cancelled_meeting(story),
        _one_bot_per_meeting(story),
        _killed_lease_taken_over(story),
        _graceful_exits(story),
        _metrics_agree(story),
    ]


#: What each worker's last metrics page must count, against its own trace events:
#: (counter sample, its labels, the trace kinds it counts).
_COUNTED: dict[str, list[tuple[str, dict[str, str], tuple[str, ...]]]] = {
    "scheduler": [
        ("pgstore_claims_total", {"outcome": "claimed"}, ("claim",)),
        ("pgstore_completes_total", {"outcome": "completed"}, ("complete",)),
        ("pgstore_completes_total", {"outcome": "rejected"}, ("rejected",)),
        ("pgstore_leases_lost_total", {}, ("renew-refused",)),
    ],
    "dispatcher": [
        ("pgstore_claims_total", {"outcome": "claimed"}, ("lease",)),
        ("pgstore_completes_total", {"outcome": "completed"}, ("dispatched",)),
        ("pgstore_completes_total", {"outcome": "cancelled"}, ("recalling",)),
        ("pgstore_releases_total", {"outcome": "released"}, ("released",)),
    ],
}


def metric_samples(page: str) -> list[tuple[str, dict[str, str], float]]:
    """A Prometheus text page's samples: (name, labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(page) for s in family.samples]


def _metrics_agree(story: Story) -> Check:
    name = "each worker's last metrics page counts what its trace shows"
    finals = {e.process: e.detail or "" for e in story.of("metrics-final")}
    killed = {e.process for e in story.of("kill")}
    expected = sorted(set(SCHEDULERS + DISPATCHERS) - killed)
    bad = [f"{p}: no last page" for p in expected if p not in finals]
    compared = 0
    for process, page in sorted(finals.items()):
        samples = metric_samples(page)
        kind = "scheduler" if process in SCHEDULERS else "dispatcher"
        for metric, labels, kinds in _COUNTED[kind]:
            counted = sum(v for n, lab, v in samples if n == metric
                          and lab.get("runtime", kind) == kind
                          and all(lab.get(k) == want for k, want in labels.items()))
            traced = sum(1 for e in story.events if e.process == process and e.kind in kinds)
            compared += 1
            if counted != traced:
                bad.append(f"{process}: {metric}{labels or ''} {counted:g}, trace {traced}")
    return Check(name, not bad and compared > 0, "; ".join(bad) or
                 f"{len(finals)} pages, {compared} counters equal to the trace's events")


def _once_per_occurrence(story: Story) -> Check:
    name = "no occurrence committed twice"
    committed: Counter[tuple[str, int]] = Counter()
    orphans = []
    for e in story.of("complete"):
        claim = story.claims.get((e.subject or "", e.token or 0))
        if claim is None or claim.scheduled_at is None:
            orphans.append(f"{e.subject} token {e.token}")
            continue
        committed[(claim.subject or "", claim.scheduled_at)] += 1
    twice = [f"{t} due {story.seconds(at):.3f} x{n}" for (t, at), n in committed.items()
             if n > 1]
    if not committed:
        return Check(name, False, "no complete was accepted at all")
    if twice or orphans:
        return Check(name, False, f"committed more than once: {twice}; "
                                  f"accepted without a claim: {orphans}")
    return Check(name, True, f"{sum(committed.values())} accepted completes, each of "
                             "a different occurrence")


def _tokens_increase(story: Story) -> Check:
    name = "fencing tokens of accepted completes strictly increase, per task"
    bad = []
    for task in TASKS:
        tokens = [e.token or 0 for e in story.of("complete") if e.subject == task]
        if any(b <= a for a, b in itertools.pairwise(tokens)):
            bad.append(f"{task}: {tokens}")
    return Check(name, not bad, "; ".join(bad) or "in the order they were committed")


def _store_agrees(story: Story) -> Check:
    name = "the store's records agree with the trace"
    bad = []
    for rec in story.schedules:
        claimed = max((t for (task, t) in story.claims if task == rec.id), default=0)
        if rec.fencing_token != claimed:
            bad.append(f"{rec.id}: token {rec.fencing_token}, last claim seen {claimed}")
        if rec.lease_owner is not None:
            bad.append(f"{rec.id}: still leased to {rec.lease_owner} after the stop")
        done = [e for e in story.of("complete") if e.subject == rec.id]
        if done and rec.last_status != done[-1].detail:
            bad.append(f"{rec.id}: last status {rec.last_status}, last complete {done[-1].detail}")
    if {r.id for r in story.schedules} != set(TASKS):
        bad.append(f"records {sorted(r.id for r in story.schedules)}")
    return Check(name, not bad, "; ".join(bad) or
                 "last tokens are the last claims; no lease left after the graceful stop")


def _frozen_holder(story: Story) -> Check:
    name = "the frozen holder never committed; another took its occurrence over"
    freezes = story.of("freeze")
    if not freezes:
        return Check(name, False, "no scheduler was frozen")
    f = freezes[0]
    thaw = next((t for t in story.of("thaw") if t.process == f.process and t.at >= f.at), None)
    if thaw is None:
        return Check(name, False, f"{f.process} was never thawed")
    held = [s for s in story.claim_spans if s.process == f.process
            and s.start.at <= f.at and (s.end is None or s.end.at >= f.at)]
    problems, outcomes = [], []
    for s in held:
        if s.outcome == "complete":
            problems.append(f"{s.subject} token {s.start.token} was committed")
        elif s.outcome == "open":
            problems.append(f"{s.subject} token {s.start.token}: no outcome after the thaw")
        else:
            outcomes.append(f"{s.subject} token {s.start.token}: "
                            + ("complete rejected as a stale claim" if s.outcome == "rejected"
                               else "lease lost first, so it never tried to complete"))
    taken = [e for e in story.of("complete") if e.subject == f.subject and e.process != f.process
             and (e.token or 0) > (f.token or 0) and f.at < e.at < thaw.at
             and story.claims[(e.subject or "", e.token or 0)].scheduled_at == f.scheduled_at]
    if not taken:
        due = story.seconds(f.scheduled_at or 0)
        problems.append(f"nobody completed {f.subject} (due {due:.3f}) while it was frozen")
    if not any(s.subject == f.subject and s.start.token == f.token for s in held):
        problems.append(f"the frozen claim {f.subject} token {f.token} is not in the trace")
    if problems:
        return Check(name, False, "; ".join(problems))
    return Check(name, True, f"{taken[0].process} committed {f.subject} with token "
                             f"{taken[0].token} while {f.process} was frozen; after the thaw, "
                             + "; ".join(outcomes))


def _bots(story: Story) -> dict[str, Counter[str]]:
    """Per meeting, the bots sent in and not recalled."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for e in story.of("bot"):
        out[e.subject or ""][e.worker or ""] += 1
    for e in story.of("recall"):
        out[e.subject or ""][e.worker or ""] -= 1
    return {job: Counter({b: n for b, n in bots.items() if n > 0}) for job, bots in out.items()}


def _no_bot_in_cancelled_meeting(story: Story) -> Check:
    name = "no cancelled meeting kept a bot"
    bots = _bots(story)
    cancelled = [e.subject or "" for e in story.of("cancel") if e.detail == "cancelled"]
    kept = {job: sorted(bots[job]) for job in cancelled if bots.get(job)}
    recalled = len([e for e in story.of("recall") if e.subject in cancelled])
    midway = [e for e in story.of("cancel")
              if e.detail == "cancelled" and _cancel_state(story, e) != "no lease yet"]
    if kept:
        return Check(name, False, f"bots left in cancelled meetings: {kept}")
    if not midway or len(midway) == len(cancelled):
        return Check(name, False, f"{len(cancelled)} meetings cancelled, {len(midway)} of them "
                                  "while leased: the demo wants both kinds")
    return Check(name, True, f"{len(cancelled)} meetings cancelled, {len(midway)} while their "
                             f"bot was on its way; {recalled} bots recalled")


def _one_bot_per_meeting(story: Story) -> Check:
    name = "every meeting settled with at most one bot, the one the store recorded"
    bots = _bots(story)
    bad = []
    for job in story.jobs:
        staying = sorted(bots.get(job.run_id, Counter()))
        if not job.dispatched and not job.cancelled:
            bad.append(f"{job.run_id} is still waiting")
        elif job.dispatched and not job.cancelled and staying != [job.worker_id]:
            bad.append(f"{job.run_id}: bots {staying}, store says {job.worker_id}")
        elif len(staying) > 1:
            bad.append(f"{job.run_id}: bots {staying}")
    return Check(name, not bad and bool(story.jobs), "; ".join(bad) or
                 f"{len(story.jobs)} meetings: each dispatched once or cancelled")


def _killed_lease_taken_over(story: Story) -> Check:
    name = "the killed dispatcher's lease ran out, then another dispatched the meeting once"
    kills = story.of("kill")
    if not kills:
        return Check(name, False, "no dispatcher was killed")
    bots = _bots(story)
    jobs = {j.run_id: j for j in story.jobs}
    bad, good = [], []
    for k in kills:
        job = k.subject or ""
        theirs = [s for s in story.lease_spans if s.subject == job and s.process == k.process]
        until = theirs[-1].start.until_at if theirs else None
        again = [s for s in story.lease_spans if s.subject == job and s.start.at > k.at]
        if until is None or not again:
            bad.append(f"{job}: not leased again")
            continue
        if again[0].start.at < until:
            bad.append(f"{job}: leased again before the killed lease ran out")
        staying = sorted(bots.get(job, Counter()))
        if staying != [jobs[job].worker_id] or not jobs[job].dispatched:
            bad.append(f"{job}: bots {staying}, store says {jobs[job].worker_id}")
        else:
            good.append(f"{job} leased again by {again[0].process} "
                        f"{(again[0].start.at - until) / 1000:.2f} s after the killed lease "
                        f"ran out, one bot ({staying[0]})")
    return Check(name, not bad, "; ".join(bad or good))


def _graceful_exits(story: Story) -> Check:
    name = "the other workers stopped gracefully on SIGTERM"
    exits = {e.process: e.detail for e in story.of("exit")}
    killed = {e.process for e in story.of("kill")}
    bad = {p: code for p, code in exits.items() if p not in killed and code != "0"}
    missing = sorted(set(SCHEDULERS + DISPATCHERS) - set(exits))
    ok = not bad and not missing
    return Check(name, ok, f"exit codes {bad}, no exit seen: {missing}" if not ok else
                 f"{len(exits) - len(killed)} exited with code 0")


def verdict(results: list[Check]) -> str:
    lines = ["checks (from the database)", ""]
    for c in results:
        lines.append(f"  {'ok  ' if c.ok else 'FAIL'}  {c.name}")
        lines.append(f"        {c.detail}")
    failed = [c for c in results if not c.ok]
    lines.append("")
    lines.append("all checks hold" if not failed else f"{len(failed)} check(s) FAILED")
    return "\n".join(lines)
