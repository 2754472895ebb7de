"""Queues, priorities and payloads on jobs, and the queue controls (docs/queues.md), on
every job store kind.

Lease order among due jobs is priority (highest first), then dispatch_at, then run_id;
``queues`` restricts a lease to the queues named. ``schedule`` of an existing run_id
replaces queue, priority and payload only where given (None keeps the job's own).
A paused queue's jobs are not leased (leases held run on); ``list_queues`` counts each
queue. Bad input raises ``InvalidArgument`` (22023 in SQL, naming the parameter) and
changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from pgstore import CancelResult, InvalidArgument, QueueInfo
from tests.conftest import JobStoreUnderTest

TTL = 1_000
NOW = 10_000


def _leased_ids(jobs: JobStoreUnderTest, holder: str = "h") -> list[str]:
    out = []
    while (job := jobs.store.lease(holder, NOW, TTL)) is not None:
        out.append(job.run_id)
    return out


def test_defaults_mean_todays_job(jobs: JobStoreUnderTest) -> None:
    jobs.store.schedule("r1", 100)
    job = jobs.store.get("r1")
    assert job is not None
    assert (job.queue, job.priority, job.payload) == ("default", 0, None)


def test_schedule_keeps_queue_priority_and_payload(jobs: JobStoreUnderTest) -> None:
    payload = {"meeting": "R", "seats": [1, 2, {"x": None}], "ok": True, "n": 1.5, "é": "ü"}
    jobs.store.schedule("r1", 100, queue="bots", priority=7, payload=payload)
    job = jobs.store.get("r1")
    assert job is not None
    assert (job.queue, job.priority, job.payload) == ("bots", 7, payload)
    leased = jobs.store.lease("h", NOW, TTL)
    assert leased is not None and leased.run_id == "r1"
    assert (leased.queue, leased.priority, leased.payload) == ("bots", 7, payload)


def test_lease_order_is_priority_then_dispatch_at_then_run_id(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("low-early", 1, priority=-5)
    s.schedule("mid-b", 50)
    s.schedule("mid-a", 50)
    s.schedule("mid-early", 10)
    s.schedule("high-late", 900, priority=3, queue="other")
    s.schedule("high-future", NOW + 1, priority=100)  # not due: never in the way
    s.schedule("top", 5000, priority=9)
    assert _leased_ids(jobs) == ["top", "high-late", "mid-early", "mid-a", "mid-b", "low-early"]


def test_lease_many_follows_the_same_order_across_queues(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    for i in range(4):
        s.schedule(f"a{i}", 10 + i, queue="a", priority=1)
        s.schedule(f"b{i}", 20 + i, queue="b", priority=1)
        s.schedule(f"c{i}", i, queue="c")
    s.schedule("future", NOW + 5, queue="a", priority=50)
    got = [j.run_id for j in s.lease_many("h", NOW, TTL, 6)]
    assert got == ["a0", "a1", "a2", "a3", "b0", "b1"]
    got = [j.run_id for j in s.lease_many("h", NOW, TTL, 10)]
    assert got == ["b2", "b3", "c0", "c1", "c2", "c3"]
    assert s.lease_many("h", NOW, TTL, 10) == []


def test_lease_takes_only_the_queues_named(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("d1", 1)
    s.schedule("p1", 2, queue="python", priority=5)
    s.schedule("n1", 3, queue="node", priority=9)
    s.schedule("p2", 4, queue="python")
    job = s.lease("py", NOW, TTL, queues=["python", "nowhere"])
    assert job is not None and job.run_id == "p1"
    assert [j.run_id for j in s.lease_many("py", NOW, TTL, 5, queues=["python"])] == ["p2"]
    assert s.lease("py", NOW, TTL, queues=["python"]) is None
    assert [j.run_id for j in s.lease_many("any", NOW, TTL, 5)] == ["n1", "d1"]


@pytest.mark.parametrize("queues", [[], [""], ["ok", "x" * 1025], ["q"] * 1025])
def test_bad_queues_are_refused_and_change_nothing(
    jobs: JobStoreUnderTest, queues: list[str]
) -> None:
    jobs.store.schedule("r1", 1)
    before = jobs.state()
    with pytest.raises(InvalidArgument, match="queues"):
        jobs.store.lease("h", NOW, TTL, queues=queues)
    with pytest.raises(InvalidArgument, match="queues"):
        jobs.store.lease_many("h", NOW, TTL, 3, queues=queues)
    assert jobs.state() == before


def test_rescheduling_keeps_what_is_not_given(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("r1", 100, queue="bots", priority=4, payload={"v": 1})
    s.schedule("r1", 200)  # only moves it: queue, priority and payload kept
    job = s.get("r1")
    assert job is not None
    assert (job.dispatch_at, job.queue, job.priority, job.payload) == (200, "bots", 4, {"v": 1})
    s.schedule("r1", 300, priority=0)  # given: replaced, even to the default's value
    s.schedule("r1", 300, queue="default", payload=[2])
    job = s.get("r1")
    assert job is not None
    assert (job.queue, job.priority, job.payload) == ("default", 0, [2])
    s.schedule_many(["r1", "r2"], [400, 400])
    job = s.get("r1")
    assert job is not None and (job.queue, job.priority, job.payload) == ("default", 0, [2])
    s.schedule_many(["r1", "r2"], [500, 500], queue="q", priority=2, payloads=[None, {"b": 2}])
    r1, r2 = s.get("r1"), s.get("r2")
    assert r1 is not None and (r1.queue, r1.priority, r1.payload) == ("q", 2, [2])
    assert r2 is not None and (r2.queue, r2.priority, r2.payload) == ("q", 2, {"b": 2})


def test_schedule_many_sets_queue_priority_and_payloads(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule_many(["a", "b", "c"], [3, 2, 1], queue="batch", priority=-1,
                    payloads=[{"i": 0}, None, "text"])
    s.schedule("first", 5, priority=0)
    got = s.lease_many("h", NOW, TTL, 10)
    assert [(j.run_id, j.queue, j.priority, j.payload) for j in got] == [
        ("first", "default", 0, None), ("c", "batch", -1, "text"),
        ("b", "batch", -1, None), ("a", "batch", -1, {"i": 0}),
    ]


BAD_SCHEDULES: list[tuple[dict[str, Any], str]] = [
    ({"queue": ""}, "queue"),
    ({"queue": "x" * 1025}, "queue"),
    ({"payload": {"big": "x" * 70_000}}, "payload"),
    ({"payload": {1, 2}}, "payload"),
    ({"payload": float("nan")}, "payload"),
    ({"payload": {"nul": "a\x00b"}}, "payload"),
    ({"priority": 2**31}, "priority"),
    ({"priority": -(2**31) - 1}, "priority"),
    ({"priority": "high"}, "priority"),
]


@pytest.mark.parametrize(("changes", "param"), BAD_SCHEDULES)
def test_bad_schedules_are_refused_and_change_nothing(
    jobs: JobStoreUnderTest, changes: dict[str, Any], param: str
) -> None:
    jobs.store.schedule("r1", 1, queue="kept", priority=3, payload={"kept": True})
    before = jobs.state()
    with pytest.raises(InvalidArgument, match=param):
        jobs.store.schedule("r1", 99, **changes)
    with pytest.raises(InvalidArgument, match=param):
        jobs.store.schedule("new", 99, **changes)
    assert jobs.state() == before


@pytest.mark.parametrize(("changes", "param"), [
    ({"queue": ""}, "queue"),
    ({"payloads": [None]}, "payloads"),
    ({"payloads": [None, {"big": "x" * 70_000}]}, "payloads"),
    ({"payloads": [None, float("inf")]}, "payloads"),
    ({"priority": 2**31}, "priority"),
])
def test_bad_batches_are_refused_and_change_nothing(
    jobs: JobStoreUnderTest, changes: dict[str, Any], param: str
) -> None:
    jobs.store.schedule("r1", 1, queue="kept")
    before = jobs.state()
    with pytest.raises(InvalidArgument, match=param):
        jobs.store.schedule_many(["r1", "r2"], [5, 6], **changes)
    assert jobs.state() == before


def test_a_payload_at_the_cap_is_taken(jobs: JobStoreUnderTest) -> None:
    """65536 bytes of JSON text (the default cap) pass; one more does not."""
    at_cap = "x" * (65536 - 2)  # the two quotes make 65536
    jobs.store.schedule("r1", 1, payload=at_cap)
    job = jobs.store.get("r1")
    assert job is not None and job.payload == at_cap
    with pytest.raises(InvalidArgument, match="payload"):
        jobs.store.schedule("r2", 1, payload=at_cap + "x")
    assert jobs.store.get("r2") is None


# --- queue controls: pause, resume, list ------------------------------------------------


def test_a_paused_queue_is_not_leased_and_held_leases_run_on(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    s.schedule("p1", 1, queue="provider", priority=9)
    s.schedule("p2", 2, queue="provider", priority=9)
    s.schedule("d1", 3)
    held = s.lease("h", NOW, TTL, queues=["provider"])
    assert held is not None and held.run_id == "p1"
    assert s.pause_queue("provider") is True
    assert s.pause_queue("provider") is False  # already paused: nothing changes
    # Nothing of the paused queue is leased, named or not; the others are.
    assert s.lease("h", NOW, TTL, queues=["provider"]) is None
    assert s.lease_many("h", NOW, TTL, 5, queues=["provider"]) == []
    got = s.lease("h", NOW, TTL)
    assert got is not None and got.run_id == "d1"
    # The lease already held runs on: renew and mark work.
    assert s.renew("p1", "h", NOW + 10, TTL) is True
    assert s.mark_dispatched("p1", "h", "bot").recorded is True
    assert s.resume_queue("provider") is True
    assert s.resume_queue("provider") is False
    got = s.lease("h", NOW, TTL)
    assert got is not None and got.run_id == "p2"


def test_list_queues_counts_depth_due_leased_and_paused(jobs: JobStoreUnderTest) -> None:
    s = jobs.store
    assert s.list_queues(NOW) == []
    s.schedule("a1", 1, queue="a")
    s.schedule("a2", 2, queue="a")
    s.schedule("a3", NOW + 1, queue="a")  # waiting, not due
    s.schedule("b1", 1, queue="b")
    s.schedule("d1", 1)
    s.schedule("gone", 1, queue="a")
    assert s.cancel("gone") == CancelResult.CANCELLED
    leased = s.lease("h", NOW, TTL, queues=["a"])
    assert leased is not None and leased.run_id == "a1"
    assert s.pause_queue("b") is True
    assert s.pause_queue("empty") is True
    assert s.list_queues(NOW) == [
        QueueInfo(queue="a", depth=3, due=1, leased=1, paused=False),
        QueueInfo(queue="b", depth=1, due=1, leased=0, paused=True),
        QueueInfo(queue="default", depth=1, due=1, leased=0, paused=False),
        QueueInfo(queue="empty", depth=0, due=0, leased=0, paused=True),
    ]
    # At the lease's end it is no longer live: the job counts as due again (and a3 is
    # due by then).
    assert s.list_queues(NOW + TTL)[0] == QueueInfo("a", 3, 3, 0, False)


@pytest.mark.parametrize("queue", ["", "x" * 1025])
def test_bad_queue_controls_are_refused_and_change_nothing(
    jobs: JobStoreUnderTest, queue: str
) -> None:
    s = jobs.store
    s.schedule("r1", 1, queue="q")
    assert s.pause_queue("q") is True
    before, listed = jobs.state(), s.list_queues(NOW)
    with pytest.raises(InvalidArgument, match="queue"):
        s.pause_queue(queue)
    with pytest.raises(InvalidArgument, match="queue"):
        s.resume_queue(queue)
    assert jobs.state() == before and s.list_queues(NOW) == listed


def test_pausing_the_default_queue_stops_the_plain_lease(jobs: JobStoreUnderTest) -> None:
    # Every job in the default group: job_lease and job_lease_many take their common
    # path (pgstore_0018's statement), which must honour a pause of 'default' too.
    s = jobs.store
    for i in range(3):
        s.schedule(f"d{i}", i + 1)
    assert s.pause_queue("default") is True
    assert s.lease("h", NOW, TTL) is None
    assert s.lease_many("h", NOW, TTL, 5) == []
    assert s.lease("h", NOW, TTL, queues=["default"]) is None
    assert s.resume_queue("default") is True
    assert [j.run_id for j in s.lease_many("h", NOW, TTL, 2)] == ["d0", "d1"]
    assert _leased_ids(jobs) == ["d2"]


def test_a_job_moved_in_and_out_of_the_default_group_is_leased_once_in_order(
    jobs: JobStoreUnderTest,
) -> None:
    # In PostgreSQL the default group (queue 'default', priority 0) and every other job
    # wait in two indexes: a re-schedule that changes queue or priority moves the job
    # between them, and the lease order holds across both.
    s = jobs.store
    s.schedule("a", 1)
    s.schedule("b", 2)
    s.schedule("c", 3)
    s.schedule("b", 2, priority=5)  # out of the default group
    s.schedule("c", 3, queue="other")  # out, to another queue
    s.schedule("c", 3, queue="default")  # and back (priority kept: 0)
    assert [(j.run_id, j.queue, j.priority) for j in s.lease_many("h", NOW, TTL, 10)] == [
        ("b", "default", 5), ("a", "default", 0), ("c", "default", 0)]
    assert s.lease("h", NOW, TTL) is None


def test_a_job_outside_the_default_group_due_exactly_now_is_leased_first(
    jobs: JobStoreUnderTest,
) -> None:
    # In PostgreSQL one probe of the earliest dispatch_at outside the default group tells
    # the lease whether to look beyond that group: a job due exactly now counts as due,
    # one due a millisecond later does not, named queues or not.
    s = jobs.store
    s.schedule("d1", 1)
    s.schedule("d2", 2)
    s.schedule("d3", 3)
    s.schedule("p-now", NOW, priority=5)
    s.schedule("q-later", NOW + 1, queue="q", priority=9)
    got = s.lease("h", NOW, TTL)
    assert got is not None and got.run_id == "p-now"
    got = s.lease("h", NOW, TTL, queues=["default", "q"])
    assert got is not None and got.run_id == "d1"
    assert s.lease("h", NOW, TTL, queues=["q"]) is None
    assert s.lease_many("h", NOW, TTL, 5, queues=["q"]) == []
    assert [j.run_id for j in s.lease_many("h", NOW + 1, TTL, 2, queues=["q", "default"])] == [
        "q-later", "d2"]
    assert [j.run_id for j in s.lease_many("h", NOW + 1, TTL, 5)] == ["d3"]


def test_future_jobs_of_a_higher_priority_leave_the_default_groups_order_alone(
    jobs: JobStoreUnderTest,
) -> None:
    # Future jobs outside the default group, in its queue and in others: the lease takes
    # the default group's due jobs in order, then, once they are due, the others first.
    s = jobs.store
    for i in range(4):
        s.schedule(f"d{i}", 10 - i)  # due at 10, 9, 8, 7: d3 first
    s.schedule("f-prio", NOW + 100, priority=50)
    s.schedule("f-queue", NOW + 50, queue="other", priority=-1)
    assert s.lease("h", NOW, TTL, queues=["other"]) is None
    assert [j.run_id for j in s.lease_many("h", NOW, TTL, 2)] == ["d3", "d2"]
    got = s.lease("h", NOW, TTL, queues=["other", "default"])
    assert got is not None and got.run_id == "d1"
    assert [j.run_id for j in s.lease_many("h", NOW + 100, TTL, 5)] == ["f-prio", "d0",
                                                                       "f-queue"]


def test_a_live_lease_outside_the_default_group_keeps_the_order_and_the_pause(
    jobs: JobStoreUnderTest,
) -> None:
    # A due job outside the default group under a live lease is not leasable, but it is
    # due: the lease looks past the default group, and still honours a paused default
    # queue and the lease order.
    s = jobs.store
    s.schedule("p1", 1, queue="q", priority=3)
    held = s.lease("h", NOW, TTL)
    assert held is not None and held.run_id == "p1"
    s.schedule("d1", 2)
    s.schedule("d2", 3)
    s.schedule("p2", NOW + 10, queue="q", priority=3)
    assert s.pause_queue("default") is True
    assert s.lease("h", NOW, TTL) is None
    assert s.lease_many("h", NOW, TTL, 5, queues=["default", "q"]) == []
    assert s.resume_queue("default") is True
    got = s.lease("h", NOW, TTL, queues=["default"])
    assert got is not None and got.run_id == "d1"
    assert [j.run_id for j in s.lease_many("h", NOW + 10, TTL, 5)] == ["p2", "d2"]


def test_a_limited_default_queue_holds_beside_future_priority_jobs(
    jobs: JobStoreUnderTest,
) -> None:
    # A concurrency limit on 'default' with no job outside the default group due: every
    # lease naming 'default' keeps the limit; one naming other queues only takes none of
    # the default queue's jobs.
    s = jobs.store
    for i in range(3):
        s.schedule(f"d{i}", i + 1)
    s.schedule("f1", NOW + 1, priority=7)
    s.schedule("g1", NOW + 1, queue="g")
    assert s.set_queue_concurrency("default", 1) is True
    got = s.lease("h", NOW, TTL, queues=["default", "g"])
    assert got is not None and got.run_id == "d0"
    assert s.lease("h", NOW, TTL) is None
    assert s.lease_many("h", NOW, TTL, 5) == []
    assert s.lease_many("h", NOW, TTL, 5, queues=["g"]) == []
    assert s.mark_dispatched("d0", "h", "bot").recorded is True
    assert [j.run_id for j in s.lease_many("h", NOW, TTL, 5, queues=["default"])] == ["d1"]
    assert [j.run_id for j in s.lease_many("h", NOW + 1, TTL, 5, queues=["g", "default"])] == [
        "g1"]
