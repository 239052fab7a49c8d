"""Partly bound gangs: who may claim precedence, refused bindings back off,
and a gang left partly bound too long starts over (issue 11, points 4 and 8)."""
from dataclasses import replace

import pytest

from batchsched.api.podgroup import MAX_RECORDED_BINDINGS
from batchsched.core.config import CoreConfig
from batchsched.core.cycle import REASON_PARTIAL_TIMEOUT, schedule_cycle
from batchsched.core.gangs import bindings_to_record, build_gangs
from batchsched.core.readers import recorded_bindings
from batchsched.core.queueing.queue import GangQueue
from tests.unit.helpers import T0, gang_pods, group, node, snapshot

CONFIG = CoreConfig(initial_backoff=1, max_backoff=60, reservation_after_seconds=600, partial_gang_timeout=300)


def partly_bound(name: str, bound: int, size: int, by_us: bool, **kwargs):
    pods = gang_pods(name, size, cpu=1, **kwargs)
    return [replace(p, node_name="n0", phase="Running", bound_by_scheduler=by_us) if i < bound else p
            for i, p in enumerate(pods)]


def first_tried(pods, groups) -> str:
    queue = GangQueue.from_config(CONFIG)
    # one node with room for one pod: the first gang in queue order takes it
    plan = schedule_cycle(snapshot([node("n0", cpu="4"), node("n1", cpu="1")], pods, groups), queue, CONFIG)
    return next(iter(b.gang_key for b in plan.bindings))


def test_only_members_this_scheduler_bound_give_a_gang_precedence():
    groups = [group("old", min_member=2, created=0), group("tenant", min_member=2, created=10)]
    waiting = gang_pods("old", 2, cpu=1)
    # a tenant creates one member already bound (spec.nodeName): no precedence
    forged = partly_bound("tenant", 1, 2, by_us=False, created=10)
    assert first_tried(waiting + forged, groups) == "default/old"
    # a member we bound (a refused binding left the gang partial): first in line
    ours = partly_bound("tenant", 1, 2, by_us=True, created=10)
    assert first_tried(waiting + ours, groups) == "default/tenant"


def recording(spec, *uids: str):
    """The PodGroup as batchsched's status write left it: naming ``uids`` bound by it."""
    return replace(spec, recorded_bindings=recorded_bindings({"status": {"boundByScheduler": list(uids)}}))


def test_after_a_start_only_the_podgroups_status_proves_a_member_ours():
    # Found bound at a start, no member is known to be ours (bound_by_scheduler
    # is what this process saw): the PodGroup's status, which tenants cannot
    # write, is the only proof.
    old, tenant = group("old", min_member=2, created=0), group("tenant", min_member=2, created=10)
    waiting = gang_pods("old", 2, cpu=1)
    found = partly_bound("tenant", 1, 2, by_us=False, created=10)
    bound_uid, pending_uid = found[0].uid, found[1].uid
    assert first_tried(waiting + found, [old, tenant]) == "default/old"  # a pod created with spec.nodeName
    assert first_tried(waiting + found, [old, recording(tenant, bound_uid)]) == "default/tenant"
    # a record naming only a member not bound (a binding that failed) proves nothing
    assert first_tried(waiting + found, [old, recording(tenant, pending_uid)]) == "default/old"
    # nor does one of another gang's PodGroup
    other = gang_pods("old", 2, cpu=1)
    assert first_tried(other + found, [recording(old, bound_uid), tenant]) == "default/old"


def test_a_gang_partly_bound_by_anyone_starts_over_but_only_ours_goes_first():
    # Unproven bound members (a tenant's pod created with spec.nodeName, or a
    # binding made just before a crash, before its status was written) give
    # no precedence, yet a gang that cannot complete holds nothing for long.
    groups = [group("g", min_member=3)]
    pods = partly_bound("g", 2, 3, by_us=False)
    gang = build_gangs(snapshot([node("n0", cpu="2")], pods, groups))["default/g"]
    assert gang.partly_bound and not gang.first_in_line
    queue = GangQueue.from_config(CONFIG)
    schedule_cycle(snapshot([node("n0", cpu="2")], pods, groups, now=0), queue, CONFIG)
    plan = schedule_cycle(snapshot([node("n0", cpu="2")], pods, groups, now=301), queue, CONFIG)
    assert [r.gang_key for r in plan.resets] == ["default/g"]


def test_the_record_names_the_bound_members_we_bound_at_most_sixteen():
    spec = group("g", min_member=40)
    pods = partly_bound("g", 30, 40, by_us=True)
    forged = replace(pods[0], bound_by_scheduler=False)  # found bound, not in the record
    recorded = replace(pods[1], bound_by_scheduler=False)  # found bound, in the record
    done = replace(pods[2], phase="Succeeded")
    members = [forged, recorded, done, *pods[3:]]
    written = bindings_to_record(members, frozenset({recorded.uid, "uid-of-a-pod-gone"}))
    assert len(written) == MAX_RECORDED_BINDINGS == 16 and written == sorted(written)
    assert written == sorted(p.uid for p in [recorded, *pods[3:]])[:16]
    assert bindings_to_record(partly_bound("g", 0, 3, by_us=True), frozenset()) == []


@pytest.mark.parametrize("status", [None, "x", {"boundByScheduler": "u1"}, {"boundByScheduler": [1, None]}])
def test_a_record_that_is_not_a_list_of_uids_names_none(status):
    assert recorded_bindings({"status": status}) == frozenset()


def test_a_refused_binding_backs_the_gang_off_and_freed_capacity_does_not_clear_it():
    queue = GangQueue.from_config(CONFIG)
    queue.upsert("ns/g", 0, 0.0, now=0.0)
    queue.record_success("ns/g")  # planned fine...
    queue.record_bind_refused("ns/g", now=100.0)  # ...but the API refused a binding
    assert not queue.ready("ns/g", 100.5) and queue.ready("ns/g", 101.0)
    queue.record_bind_refused("ns/g", now=101.0)
    queue.record_bind_refused("ns/g", now=103.0)
    assert not queue.ready("ns/g", 106.9) and queue.ready("ns/g", 107.0)  # 1, 2, 4 s
    queue.capacity_freed()  # a pod ended elsewhere: no reason to hammer the webhook again
    assert not queue.ready("ns/g", 106.9)
    assert queue.next_retry_at() == 107.0
    queue.record_bound("ns/g")  # a binding went through
    assert queue.ready("ns/g", 103.5)


def test_a_gang_partly_bound_too_long_starts_over():
    groups = [group("g", min_member=3)]
    pods = partly_bound("g", 2, 3, by_us=True)
    cluster = [node("n0", cpu="2")]  # full: the third member never fits
    queue = GangQueue.from_config(CONFIG)
    plan = schedule_cycle(snapshot(cluster, pods, groups, now=0), queue, CONFIG)
    assert not plan.resets and plan.verdicts["default/g"].reason == "Unschedulable"
    plan = schedule_cycle(snapshot(cluster, pods, groups, now=299), queue, CONFIG)
    assert not plan.resets
    plan = schedule_cycle(snapshot(cluster, pods, groups, now=301), queue, CONFIG)
    assert [r.gang_key for r in plan.resets] == ["default/g"]
    assert sorted(p.name for p in plan.resets[0].pods) == ["g-0", "g-1"]
    verdict = plan.verdicts["default/g"]
    assert verdict.reason == REASON_PARTIAL_TIMEOUT and "2/3" in verdict.message
    # not every cycle: the clock restarts with the start-over
    plan = schedule_cycle(snapshot(cluster, pods, groups, now=302), queue, CONFIG)
    assert not plan.resets


def test_a_gang_that_completes_or_loses_its_bound_members_is_no_longer_partial():
    groups = [group("g", min_member=3)]
    queue = GangQueue.from_config(CONFIG)
    cluster = [node("n0", cpu="2")]
    schedule_cycle(snapshot(cluster, partly_bound("g", 2, 3, by_us=True), groups, now=0), queue, CONFIG)
    # its bound members end (evicted): nothing bound, the clock stops
    schedule_cycle(snapshot(cluster, gang_pods("g", 3, cpu=1), groups, now=200), queue, CONFIG)
    plan = schedule_cycle(snapshot(cluster, partly_bound("g", 2, 3, by_us=True), groups, now=400), queue, CONFIG)
    assert not plan.resets  # partial again only since 400


def test_a_started_over_gang_keeps_saying_why_until_it_is_placed():
    groups = [group("g", min_member=3)]
    queue = GangQueue.from_config(CONFIG)
    cluster = [node("n0", cpu="2")]
    schedule_cycle(snapshot(cluster, partly_bound("g", 2, 3, by_us=True), groups, now=0), queue, CONFIG)
    schedule_cycle(snapshot(cluster, partly_bound("g", 2, 3, by_us=True), groups, now=301), queue, CONFIG)
    # its bound members are gone, the third waits for them to come back
    plan = schedule_cycle(snapshot(cluster, gang_pods("g", 3, cpu=1)[2:], groups, now=302), queue, CONFIG)
    verdict = plan.verdicts["default/g"]
    assert verdict.reason == REASON_PARTIAL_TIMEOUT
    assert "stayed partly bound" in verdict.message and "1/3 members exist" in verdict.message
    # back, and room for all: placed, and the story ends
    plan = schedule_cycle(snapshot([node("n0", cpu="3")], gang_pods("g", 3, cpu=1), groups, now=303), queue, CONFIG)
    assert plan.verdicts["default/g"].scheduled and "default/g" not in queue.started_over


def test_refusals_and_the_partial_clock_outlive_the_gang_leaving_the_queue_while_bindings_fly():
    # While its remaining members' bindings are in flight (assumed), a gang
    # has no pending pod and leaves the queue; when a refusal brings the pod
    # back, neither its backoff nor its partial clock may start from scratch.
    groups = [group("g", min_member=3)]
    queue = GangQueue.from_config(CONFIG)
    cluster = [node("n0", cpu="3")]
    partial = partly_bound("g", 2, 3, by_us=True)
    all_assumed = [replace(p, node_name="n0", bound_by_scheduler=True) for p in partial]
    schedule_cycle(snapshot(cluster, partial, groups, now=0), queue, CONFIG)
    for t in range(1, 320, 10):
        schedule_cycle(snapshot(cluster, all_assumed, groups, now=t), queue, CONFIG)  # in flight
        queue.record_bind_refused("default/g", now=T0 + t + 1)  # refused
        plan = schedule_cycle(snapshot(cluster, partial, groups, now=t + 1.5), queue, CONFIG)
        assert not plan.bindings, f"retried at once at {t + 1.5}"
        if plan.resets:
            break
    assert plan.resets and 300 < t + 1.5 <= 320


def test_a_gang_whose_bindings_are_refused_holds_no_reservation():
    # The API refuses it whatever room it gets: reserving nodes for it would
    # only idle them (and it leaves the queue while its bindings fly, which
    # would restart a reservation's clock every time).
    queue = GangQueue.from_config(CONFIG)
    queue.upsert("ns/g", 0, 0.0, now=0.0)
    assert list(queue.reservation_candidates(700.0)) == ["ns/g"]
    queue.record_bind_refused("ns/g", now=700.0)
    assert list(queue.reservation_candidates(701.0)) == []
    queue.record_bound("ns/g")
    assert list(queue.reservation_candidates(702.0)) == ["ns/g"]
