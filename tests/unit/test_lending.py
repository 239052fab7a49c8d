"""Reserved room lent to the pods its holder may evict (docs/queueing.md,
"Lending to the holder's victims"; batchsched.core.queueing.lending)."""
from dataclasses import replace

import pytest

from batchsched.core.cycle import schedule_cycle
from batchsched.core.preemption.policy import PreemptionPolicy, PreemptionState
from tests.unit.helpers import T0, gang_pods, group, pod
from tests.unit.test_backfill import CONFIG, JOB, later, reserved_scene

INFERENCE = {"workload": "inference"}
# big (priority 0) may evict inference pods that have run 100 s.
POLICY = PreemptionPolicy(enabled=True, victim_labels=tuple(INFERENCE.items()), min_runtime_seconds=100)
READY = T0 + 230  # when big is expected to fit on its reserved gpu-0 and gpu-1 (reserved_scene)


def inference(name, gpu=4, priority=-5, labels=INFERENCE, **kwargs):
    """A Deployment's pod: it never ends by itself, so it never backfills."""
    return replace(pod(name, gpu=gpu, priority=priority, created=61, owner="ReplicaSet", **kwargs),
                   labels=dict(labels))


def placed(candidate, policy=POLICY, config=CONFIG, state=PreemptionState()):
    """Where ``candidate`` goes at t=61, when big takes its reservation
    (gpu-2 has 3 GPUs free, too few for it)."""
    queue, snap = reserved_scene()
    plan = schedule_cycle(later(snap, 0, candidate), queue, config, policy, state)
    assert queue.reservation.gang_key == "default/big" and queue.reservation.nodes == {"gpu-0", "gpu-1"}
    return {b.pod_name: b.node_name for b in plan.bindings}


def test_a_pod_its_holder_may_evict_borrows_the_reserved_room():
    queue, snap = reserved_scene()
    plan = schedule_cycle(later(snap, 0, inference("borrower")), queue, CONFIG, POLICY)
    assert [b.node_name in {"gpu-0", "gpu-1"} for b in plan.bindings] == [True]
    assert ("borrowed room on nodes reserved for gang default/big, which may evict it"
            in plan.verdicts["default/pod:borrower"].message)


@pytest.mark.parametrize("why", ["lending off", "preemption off", "not a victim by label",
                                 "not of lower priority", "evictable too late", "holder must wait to evict",
                                 "eviction budget spent", "a gang of two"])
def test_no_room_is_lent_to_a_pod_the_holder_could_not_evict_in_time(why):
    candidate, policy, config, state = inference("borrower"), POLICY, CONFIG, PreemptionState()
    if why == "lending off":
        config = replace(CONFIG, lend_reserved=False)
    elif why == "preemption off":
        policy = replace(POLICY, enabled=False)
    elif why == "not a victim by label":
        candidate = inference("borrower", labels={"workload": "batch"})
    elif why == "not of lower priority":
        candidate = inference("borrower", priority=0)
    elif why == "evictable too late":  # it may be evicted at 61 + 170 = 231, after big fits (230)
        policy = replace(POLICY, min_runtime_seconds=170)
    elif why == "holder must wait to evict":  # big has waited since 0; it may evict from 1000 on
        policy = replace(POLICY, preemptor_wait_seconds=(("", 1000.0),))
    elif why == "eviction budget spent":
        policy = replace(POLICY, namespace_evictions_per_hour=2)
        state = PreemptionState(evicted_last_hour={"default": 2})
    if why == "a gang of two":  # evicted whole or not at all: it does not borrow
        queue, snap = reserved_scene()
        members = [replace(p, labels=dict(INFERENCE))
                   for p in gang_pods("pair", 2, gpu=4, created=61, priority=-5, owner="ReplicaSet")]
        plan = schedule_cycle(later(snap, 0, *members, groups=[group("pair", min_member=2, created=61)]),
                              queue, CONFIG, POLICY)
        assert plan.bindings == []
        return
    assert placed(candidate, policy, config, state) == {}
    # The limits are sharp: just within each, it borrows.
    if why == "evictable too late":
        assert placed(candidate, replace(POLICY, min_runtime_seconds=169))
    if why == "holder must wait to evict":
        assert placed(candidate, replace(POLICY, preemptor_wait_seconds=(("", 169.0),)))


def borrowed_scene():
    """The reserved scene at t=61 once the borrower is bound to gpu-0 and
    running."""
    queue, snap = reserved_scene()
    borrower = inference("borrower")
    plan = schedule_cycle(later(snap, 0, borrower), queue, CONFIG, POLICY)
    (binding,) = plan.bindings
    running = replace(borrower, node_name=binding.node_name, phase="Running", started=snap.now)
    return queue, later(snap, 0, running), running


def test_the_reservation_stays_where_it_lent_room_and_its_holder_evicts_the_borrower_when_drained():
    queue, snap, borrower = borrowed_scene()
    # Counted as gone once evictable (t=161), the borrower moves nothing:
    # without that, no node would be left for big to wait for.
    plan = schedule_cycle(later(snap, 1), queue, CONFIG, POLICY)
    assert queue.reservation.gang_key == "default/big" and queue.reservation.nodes == {"gpu-0", "gpu-1"}
    assert queue.reservation.ready_at == READY
    assert plan.evictions == []
    # Once the Job pods are gone, big evicts the borrower and waits for it.
    plan = schedule_cycle(later(snap, 170, *drained(snap)), queue, CONFIG, POLICY)
    assert [e.pod.name for e in plan.evictions] == ["borrower"]
    assert {n.node_name for n in plan.nominations} == {"gpu-0", "gpu-1"}


@pytest.mark.parametrize("before", [100, 0.5])  # a simulated start is exact, not in whole seconds
def test_a_borrower_that_started_before_the_reservation_is_not_counted_as_gone(before):
    """Pods that were there before the nodes were reserved are planned
    around, as before lending: only those that came since are the
    holder's to evict when it is ready."""
    queue, snap, borrower = borrowed_scene()
    earlier = replace(borrower, started=snap.now - before)
    schedule_cycle(later(snap, 1, earlier), queue, CONFIG, POLICY)
    assert queue.reservation is None  # nothing left to wait for: gpu-2 and gpu-0 hold inference for good


def drained(snap):
    """The Job pods big waits for on gpu-0 and gpu-1, ended."""
    return [replace(snap.pods[f"uid-default-job-{i}"], phase="Succeeded") for i in range(2)]


def two_borrowers(policy, state):
    """At t=61 two victims ask for room; those placed are bound and running."""
    queue, snap = reserved_scene()
    pods = inference("borrower-a"), inference("borrower-b")
    plan = schedule_cycle(later(snap, 0, *pods), queue, CONFIG, policy, state)
    placed = {b.pod_name: b.node_name for b in plan.bindings}
    bound = [replace(p, node_name=placed[p.name], phase="Running", started=snap.now) for p in pods if p.name in placed]
    return queue, later(snap, 0, *bound), placed


def test_two_victims_borrow_and_their_holder_evicts_both_when_drained():
    queue, snap, placed = two_borrowers(POLICY, PreemptionState())
    assert set(placed) == {"borrower-a", "borrower-b"} and set(placed.values()) <= {"gpu-0", "gpu-1"}
    plan = schedule_cycle(later(snap, 170, *drained(snap)), queue, CONFIG, POLICY)
    assert sorted(e.pod.name for e in plan.evictions) == ["borrower-a", "borrower-b"]


@pytest.mark.parametrize("limit", ["namespace budget", "victims per cycle"])
def test_no_more_borrow_than_their_holder_may_evict_at_once(limit):
    """Each alone is within the limit, both are not: the second would keep
    its holder off its nodes for good."""
    if limit == "namespace budget":  # one eviction left in the hour
        policy = replace(POLICY, namespace_evictions_per_hour=2)
        state = PreemptionState(evicted_last_hour={"default": 1})
    else:
        policy, state = replace(POLICY, max_victims_per_cycle=1), PreemptionState()
    queue, snap, placed = two_borrowers(policy, state)
    assert list(placed) == ["borrower-a"]
    plan = schedule_cycle(later(snap, 170, *drained(snap)), queue, CONFIG, policy, state)
    assert [e.pod.name for e in plan.evictions] == ["borrower-a"], plan.verdicts["default/big"].message


@pytest.mark.parametrize("why", ["eviction budget spent since", "refused by a PodDisruptionBudget"])
def test_borrowers_their_holder_may_not_evict_for_now_keep_it_waiting_there(why):
    """Both borrowed; since then the hour's budget was spent down to one
    eviction, or a PodDisruptionBudget refused one: the holder keeps its
    nodes, says why it waits, and evicts them once it may (the budget and
    refusals are of the moment; maxReservationSeconds bounds the wait)."""
    queue, snap, placed = two_borrowers(POLICY, PreemptionState())
    if why == "eviction budget spent since":
        policy = replace(POLICY, namespace_evictions_per_hour=2)
        state, says = PreemptionState(evicted_last_hour={"default": 1}), "the 1 left of its eviction budget"
    else:
        policy, says = POLICY, "could not be evicted lately, e.g. default/borrower-a: Cannot evict pod"
        state = PreemptionState(refused={"uid-default-borrower-a": "Cannot evict pod as it would violate the pod's "
                                                                   "disruption budget."})
    messages = []
    for t in range(170, 300, 5):  # its verdict stays the same while it waits: it is written once
        plan = schedule_cycle(later(snap, t, *drained(snap)), queue, CONFIG, policy, state)
        assert queue.reservation.gang_key == "default/big" and queue.reservation.nodes == {"gpu-0", "gpu-1"}
        assert plan.evictions == []
        if "default/big" in plan.verdicts:  # tried (not backing off)
            messages.append(plan.verdicts["default/big"].message)
    assert len(messages) >= 3 and len(set(messages)) == 1, messages
    assert says in messages[0] and "it was expected to fit there by now." in messages[0], messages[0]
    plan = schedule_cycle(later(snap, 300, *drained(snap)), queue, CONFIG, POLICY, PreemptionState())
    assert sorted(e.pod.name for e in plan.evictions) == ["borrower-a", "borrower-b"]


def test_no_more_are_counted_gone_than_their_holder_may_evict_at_once():
    """More pods on its nodes than maxVictimsPerCycle (the limit lowered
    since they borrowed): it could never clear them in one eviction, so
    they are not waited for."""
    queue, snap, placed = two_borrowers(POLICY, PreemptionState())
    assert len(placed) == 2
    schedule_cycle(later(snap, 1), queue, CONFIG, replace(POLICY, max_victims_per_cycle=1))
    assert queue.reservation is None


def test_a_borrower_bound_but_not_yet_started_is_counted_as_lent():
    """Until the kubelet reports its startTime, a pod's ``started`` is 0:
    it came after the reservation all the same."""
    queue, snap = reserved_scene()
    borrower = inference("borrower")
    (binding,) = schedule_cycle(later(snap, 0, borrower), queue, CONFIG, POLICY).bindings
    bound = replace(borrower, node_name=binding.node_name)
    assert bound.started == 0
    schedule_cycle(later(snap, 1, bound), queue, CONFIG, POLICY)
    assert queue.reservation.gang_key == "default/big" and queue.reservation.nodes == {"gpu-0", "gpu-1"}
    assert queue.reservation.ready_at == READY


def test_a_borrower_that_started_in_the_second_the_reservation_began_is_counted_as_lent():
    """big gets its reservation at t=61.4 and the borrower starts then: its
    startTime, in whole seconds, reads t=61. It still came after."""
    queue, snap = reserved_scene()
    borrower = inference("borrower")
    (binding,) = schedule_cycle(later(snap, 0.4, borrower), queue, CONFIG, POLICY).bindings
    assert queue.reservation.since == snap.now + 0.4
    running = replace(borrower, node_name=binding.node_name, phase="Running", started=snap.now)
    schedule_cycle(later(snap, 1, running), queue, CONFIG, POLICY)
    assert queue.reservation.gang_key == "default/big" and queue.reservation.nodes == {"gpu-0", "gpu-1"}


def backfill(name):
    """A Job pod its holder may also evict (a victim by label and priority)
    that ends by itself by t=200: it backfills."""
    return replace(pod(name, gpu=4, created=61, priority=-5, deadline=139, **JOB), labels=dict(INFERENCE))


@pytest.mark.parametrize("first_by", ["name", "start"])
def test_pods_that_end_by_themselves_take_no_place_among_those_lent(first_by):
    """maxVictimsPerCycle=1: the borrower takes the one place, a Job pod
    backfills the other reserved node. The Job pod is waited out to its
    end; counted among those lent (soonest evictable first: by its uid, or
    having started before the borrower), it would push the borrower out,
    and big would lose its nodes."""
    policy = replace(POLICY, max_victims_per_cycle=1)
    queue, snap = reserved_scene()
    name = "a-fill" if first_by == "name" else "z-fill"
    pods = inference("borrower"), backfill(name)
    placed = {b.pod_name: b.node_name for b in schedule_cycle(later(snap, 0, *pods), queue, CONFIG, policy).bindings}
    assert set(placed) == {"borrower", name} and set(placed.values()) == {"gpu-0", "gpu-1"}, placed
    started = snap.now + (10 if first_by == "start" else 0)
    borrower = replace(pods[0], node_name=placed["borrower"], phase="Running", started=started)
    job = replace(pods[1], node_name=placed[name], phase="Running", started=snap.now)
    schedule_cycle(later(snap, 11, borrower, job), queue, CONFIG, policy)
    assert queue.reservation.gang_key == "default/big" and queue.reservation.nodes == {"gpu-0", "gpu-1"}


def test_a_borrower_that_never_starts_leaves_its_holders_plan_still():
    """Its startTime never reported (a kubelet down): it is counted from its
    creation, not from each cycle's now, so the holder's expected time and
    verdict do not move on every attempt."""
    queue, snap = reserved_scene()
    borrower = inference("borrower")
    (binding,) = schedule_cycle(later(snap, 0, borrower), queue, CONFIG, POLICY).bindings
    bound = replace(borrower, node_name=binding.node_name)
    late, messages = [], set()
    for t in range(170, 260, 5):  # evictable from t=161 by its creation; not by now + 100
        plan = schedule_cycle(later(snap, t, bound, *drained(snap)), queue, CONFIG, POLICY)
        late.append(queue.reservation.ready_at - snap.now - t)
        if "default/big" in plan.verdicts:
            messages.add(plan.verdicts["default/big"].message)
    assert set(late) == {0} and len(messages) == 1, (late, messages)
    assert "it was expected to fit there by now" in messages.pop()


def test_the_holders_verdict_names_its_reserved_nodes_and_when_it_expects_to_fit():
    queue, snap = reserved_scene()
    message = schedule_cycle(snap, queue, CONFIG).verdicts["default/big"].message
    assert message.endswith("It holds a reservation of 2 node(s) while they drain (gpu-0, gpu-1); it is "
                            "expected to fit there by 2024-01-01T00:03:50Z."), message


@pytest.mark.parametrize("deadline", [2**62, 2**63 - 1])
def test_a_deadline_too_far_to_write_as_a_date_still_gives_a_verdict(deadline):
    """activeDeadlineSeconds is any positive int64 in the API."""
    queue, snap = reserved_scene()
    far = replace(snap.pods["uid-default-job-0"], active_deadline_seconds=deadline)
    verdict = schedule_cycle(later(snap, 0, far), queue, CONFIG).verdicts["default/big"]
    assert verdict.reason == "Unschedulable", verdict.message
    assert "it is expected to fit there by a time past the year 9999." in verdict.message
