"""Preemption in the pure core: victim choice, cost order, claims while victims go."""
from dataclasses import replace

from batchsched.core.cycle import schedule_cycle
from batchsched.core.preemption.policy import PreemptionPolicy, PreemptionState
from batchsched.core.queueing.queue import GangQueue
from tests.unit.helpers import gang_pods, group, node, pod, snapshot
from tests.unit.test_cycle import CONFIG

POLICY = PreemptionPolicy(enabled=True)


def inference(node_name: str, count: int, priority: int = 10, start: int = 0, **kwargs):
    return [pod(f"inf-{node_name}-{i}", gpu=1, node_name=node_name, phase="Running", priority=priority,
                scheduler="default-scheduler", **kwargs) for i in range(start, start + count)]


def cycle(snap, policy=POLICY, state=PreemptionState(), queue=None):
    return schedule_cycle(snap, queue if queue is not None else GangQueue.from_config(CONFIG), CONFIG, policy, state)


def test_evicts_just_enough_and_nominates_the_room():
    nodes = [node("a", gpu=8), node("b", gpu=8)]
    pods = inference("a", 8) + inference("b", 8) + gang_pods("train", 2, gpu=4, priority=100)
    plan = cycle(snapshot(nodes, pods, [group("train", min_member=2)]))
    assert plan.bindings == []
    assert len(plan.evictions) == 8
    assert {e.preemptor for e in plan.evictions} == {"default/train"}
    assert len(plan.nominations) == 2
    # victims come off the nodes the gang is nominated to, and nowhere else
    assert {e.pod.node_name for e in plan.evictions} == {n.node_name for n in plan.nominations}
    assert "preempting 8 pod(s)" in plan.verdicts["default/train"].message


def test_prefers_free_room_and_the_lowest_priority_victims():
    nodes = [node("a", gpu=8)]
    pods = (inference("a", 2, priority=50) + inference("a", 4, priority=5, start=2)
            + [pod("solo", gpu=4, priority=100)])
    plan = cycle(snapshot(nodes, pods))
    # 2 GPUs are free; two more are needed: the priority-5 pods go, the priority-50 ones stay
    assert sorted(e.pod.priority for e in plan.evictions) == [5, 5]


def test_no_victim_of_equal_or_higher_priority():
    pods = inference("a", 8, priority=100) + [pod("solo", gpu=4, priority=100)]
    plan = cycle(snapshot([node("a", gpu=8)], pods))
    assert plan.evictions == []
    assert "would not fit even after evicting" in plan.verdicts["default/pod:solo"].message


def test_nothing_is_evicted_when_the_gang_would_still_not_fit():
    nodes = [node("a", gpu=8), node("b", gpu=8)]
    pods = inference("a", 8) + inference("b", 8) + gang_pods("huge", 3, gpu=8, priority=100)
    plan = cycle(snapshot(nodes, pods, [group("huge", min_member=3)]))
    assert plan.evictions == [] and plan.nominations == []


def test_a_victim_gang_goes_whole_or_not_at_all():
    members = gang_pods("old", 4, gpu=2, priority=50, node_name="a", phase="Running")
    preemptor = [pod("new", gpu=2, priority=100)]
    snap = snapshot([node("a", gpu=8)], members + preemptor, [group("old", min_member=4)])
    whole = cycle(snap)
    assert sorted(e.pod.name for e in whole.evictions) == [f"old-{i}" for i in range(4)]
    never = cycle(snap, replace(POLICY, gang_victims="never"))
    assert never.evictions == []


def test_spare_members_of_a_victim_gang_go_one_by_one():
    members = gang_pods("old", 4, gpu=2, priority=50, node_name="a", phase="Running")
    snap = snapshot([node("a", gpu=8)], members + [pod("new", gpu=2, priority=100)],
                    [group("old", min_member=3)])
    plan = cycle(snap)
    assert len(plan.evictions) == 1  # one spare member: the gang keeps its quorum


def test_elastic_members_are_the_first_victims_at_their_priority():
    """A lone pod and a gang's elastic member (beyond its minMember) of the
    same priority, each on 2 GPUs: the elastic member goes, though the lone
    pod ran for less time (least work lost comes after)."""
    members = gang_pods("elastic", 3, gpu=2, priority=50, node_name="a", phase="Running", started=1.0)
    lone = pod("lone", gpu=2, priority=50, node_name="a", phase="Running", started=3000.0)
    pods = members + [lone, pod("new", gpu=2, priority=100)]
    elastic = snapshot([node("a", gpu=8)], pods, [group("elastic", min_member=2)], now=3600.0)
    assert [e.pod.name for e in cycle(elastic).evictions] == ["elastic-0"]
    # No member beyond minMember: the lone pod, which lost the least work, goes.
    whole = snapshot([node("a", gpu=8)], pods, [group("elastic", min_member=3)], now=3600.0)
    assert [e.pod.name for e in cycle(whole).evictions] == ["lone"]


def test_policy_narrows_victims_and_preemptors():
    pods = inference("a", 8) + [pod("solo", gpu=2, priority=100)]
    snap = snapshot([node("a", gpu=8)], pods)
    assert cycle(snap, replace(POLICY, victim_labels=(("workload", "inference"),))).evictions == []
    assert cycle(snap, replace(POLICY, preemptor_min_priority=1000)).evictions == []
    assert cycle(snap, replace(POLICY, victim_namespaces=frozenset({"other"}))).evictions == []
    assert cycle(snap, replace(POLICY, enabled=False)).evictions == []
    assert len(cycle(snap).evictions) == 2


def test_limits_cooldown_and_in_flight_stop_new_evictions():
    pods = inference("a", 8) + gang_pods("train", 2, gpu=4, priority=100)
    snap = snapshot([node("a", gpu=8)], pods, [group("train", min_member=2)])
    assert cycle(snap, replace(POLICY, max_victims_per_cycle=7)).evictions == []
    assert cycle(snap, state=PreemptionState(cooling_nodes=frozenset({"a"}))).evictions == []
    waiting = cycle(snap, state=PreemptionState(in_flight=frozenset({"default/train"})))
    assert waiting.evictions == []
    assert "waiting for the pods it preempted" in waiting.verdicts["default/train"].message


def test_refused_victims_are_avoided_and_named():
    pods = inference("a", 8) + [pod("solo", gpu=8, priority=100)]
    refused = {p.uid: "429 Cannot evict pod as it would violate the pod's disruption budget."
               for p in pods[:1]}
    plan = cycle(snapshot([node("a", gpu=8)], pods), state=PreemptionState(refused=refused))
    assert plan.evictions == []
    assert "disruption budget" in plan.verdicts["default/pod:solo"].message


def test_claimed_room_is_not_taken_by_others_while_victims_go():
    """A preemptor nominated to node a with two of its victims still
    terminating: a lower gang may not take the two GPUs already free, and
    the preemptor binds once the rest are gone."""
    big = replace(pod("big", gpu=4, priority=100), nominated_node="a")
    terminating = inference("a", 2, deleting=True)
    running = inference("a", 4, start=2)
    small = pod("small", gpu=2, priority=10)
    snap = snapshot([node("a", gpu=8)], terminating + running + [big, small])
    plan = cycle(snap, state=PreemptionState(in_flight=frozenset({"default/pod:big"})))
    assert plan.bindings == [] and plan.evictions == []
    gone = snapshot([node("a", gpu=8)], running + [big, small])
    plan = cycle(gone)
    assert [b.pod_name for b in plan.bindings] == ["big"]


def test_terminating_room_already_claimed_is_not_counted_twice():
    """Two claimants on one node: each may count only the terminating room
    beyond the other's claim, so nobody is nominated room that is not there."""
    big = replace(pod("big", gpu=4, priority=100), nominated_node="a")
    going = inference("a", 4, deleting=True)
    running = inference("a", 4, start=4)
    mid = pod("mid", gpu=2, priority=50)
    plan = cycle(snapshot([node("a", gpu=8)], going + running + [big, mid]),
                 state=PreemptionState(in_flight=frozenset({"default/pod:big"})))
    # "mid" must evict two running pods for itself: the four going GPUs are big's
    assert len(plan.evictions) == 2
    assert all(not e.pod.terminating for e in plan.evictions)


# --- with GPU topology ---------------------------------------------------------

def _dgx1_with_inference(gpu_ids_per_pod, priority=10):
    from tests.unit.topology_support import fixture, topology_node
    node_a = topology_node("a", fixture("dgx1-hybrid-cube-mesh-8gpu.txt"))
    pods = [pod(f"inf-{i}", gpu=1, node_name="a", phase="Running", priority=priority,
                scheduler="default-scheduler", gpu_ids=str(g)) for i, g in enumerate(gpu_ids_per_pod)]
    return node_a, pods


def test_victims_free_an_aligned_quad_rather_than_scattered_gpus():
    """All eight GPUs of a DGX-1 are held by single-GPU pods: a 4-GPU pod
    costs four victims wherever they are, so the four chosen must be a
    fully NVLink-connected quad."""
    from batchsched.core.topology.choose import choose_gpus, mask_of
    from tests.unit.topology_support import fixture

    # named so that the cheapest-first order alone would free GPUs 0, 5, 2, 7: no NVLink quad
    node_a, pods = _dgx1_with_inference([0, 5, 2, 7, 1, 4, 3, 6])
    plan = cycle(snapshot([node_a], pods + [pod("quad", gpu=4, priority=100)]))
    freed = sorted(g for e in plan.evictions for g in e.pod.gpu_ids)
    assert len(freed) == 4
    topology = fixture("dgx1-hybrid-cube-mesh-8gpu.txt")
    best = choose_gpus(topology, mask_of(range(8)), 4)
    # worst link, bandwidth and NUMA spread of the best quad (what it leaves behind differs)
    assert choose_gpus(topology, mask_of(freed), 4).objective[:3] == best.objective[:3]


def test_a_topology_policy_the_counts_alone_would_break_is_kept():
    """Two GPUs are free but not NVLink-joined; require-nvlink makes the
    preemptor evict a pod that frees an NVLink partner instead of nothing."""
    from batchsched.core.model import TopologyPolicy
    from batchsched.core.topology.choose import mask_of
    from tests.unit.topology_support import fixture

    topology = fixture("dgx1-hybrid-cube-mesh-8gpu.txt")
    pairs = [(a, b) for a in range(8) for b in range(a + 1, 8) if topology.link(a, b).is_nvlink]
    unjoined = next((a, b) for a in range(8) for b in range(a + 1, 8) if (a, b) not in pairs)
    node_a, pods = _dgx1_with_inference([g for g in range(8) if g not in unjoined])
    preemptor = pod("pair-0", gpu=2, priority=100, group="pair")
    spec = replace(group("pair", min_member=1), topology=TopologyPolicy(gpu_link="require-nvlink"))
    plan = cycle(snapshot([node_a], pods + [preemptor], [spec]))
    assert plan.evictions, "the free pair is not NVLink-joined: someone must go"
    freed = {g for e in plan.evictions for g in e.pod.gpu_ids} | set(unjoined)
    assert any(mask_of(p) & ~mask_of(freed) == 0 for p in pairs)


# --- each victim counted once; the victim budget is per cycle --------------------

def _gang_with_a_spare_member(node_names=("a",) * 4, **request):
    """Gang "old": four members (member i on node_names[i]), minMember 3, so
    the youngest member (old-3) is a spare, a unit of its own, and also in
    the whole-gang unit."""
    members = gang_pods("old", 4, priority=50, phase="Running", **request)
    members = [replace(p, started=float(1 + i), node_name=n) for i, (p, n) in enumerate(zip(members, node_names))]
    return members, group("old", min_member=3)


def test_a_spare_member_taken_alone_and_again_with_its_gang_counts_once():
    members, old = _gang_with_a_spare_member(gpu=2)
    # four 2-GPU pods: the first takes the spare, the next ones need the whole gang
    preemptor = gang_pods("train", 4, gpu=2, priority=100)
    plan = cycle(snapshot([node("a", gpu=8)], members + preemptor, [old, group("train", min_member=4)]))
    victims = [e.pod.name for e in plan.evictions]
    assert sorted(victims) == [f"old-{i}" for i in range(4)], victims
    assert "preempting 4 pod(s)" in plan.verdicts["default/train"].message
    assert len(plan.nominations) == 4


def test_room_a_spare_member_frees_is_not_counted_twice():
    members, old = _gang_with_a_spare_member(cpu=2)
    # five 2-CPU pods need 10 CPUs: node a has 8 however its victims are
    # counted; node b's 2 are held by a pod of higher priority
    preemptor = gang_pods("train", 5, cpu=2, priority=100)
    blocker = pod("blocker", cpu=2, node_name="b", phase="Running", priority=1000)
    plan = cycle(snapshot([node("a", cpu="8"), node("b", cpu="2")], members + preemptor + [blocker],
                          [old, group("train", min_member=5)]))
    assert plan.evictions == [] and plan.nominations == []
    assert "would not fit even after evicting" in plan.verdicts["default/train"].message


def test_a_spare_member_taken_earlier_in_the_cycle_leaves_no_spare():
    """Two preemptors in one cycle: the first takes the only spare member of
    "old" (on node a); the second may not take another one from node b, which
    would leave the gang below minMember."""
    members, old = _gang_with_a_spare_member(("b", "b", "b", "a"), cpu=2)
    first, second = pod("first", cpu=2, priority=100, created=0), pod("second", cpu=2, priority=90, created=1)
    plan = cycle(snapshot([node("a", cpu="2"), node("b", cpu="6")], members + [first, second], [old]))
    assert [(e.preemptor, e.pod.name) for e in plan.evictions] == [("default/pod:first", "old-3")]
    assert "would not fit even after evicting" in plan.verdicts["default/pod:second"].message


def test_max_victims_per_cycle_is_shared_by_every_preemptor_of_the_cycle():
    nodes = [node("a", gpu=8), node("b", gpu=8)]
    pods = (inference("a", 8) + inference("b", 8)
            + [pod("first", gpu=4, priority=100, created=0), pod("second", gpu=4, priority=100, created=1)])
    snap = snapshot(nodes, pods)
    assert len(cycle(snap, replace(POLICY, max_victims_per_cycle=8)).evictions) == 8
    plan = cycle(snap, replace(POLICY, max_victims_per_cycle=6))
    assert [e.preemptor for e in plan.evictions] == ["default/pod:first"] * 4
    message = plan.verdicts["default/pod:second"].message
    assert "2 left of maxVictimsPerCycle=6" in message, message


def test_a_preemptor_class_with_a_wait_evicts_only_after_waiting_that_long():
    """waitSeconds by PriorityClass: a "training" gang waits 600 s for room
    to free by itself, saying so, then evicts; the same gang of a class not
    named evicts at once."""
    policy = replace(POLICY, preemptor_wait_seconds=(("training", 600.0),))
    members = [replace(p, priority_class="training") for p in gang_pods("train", 2, gpu=4, priority=100)]
    groups = [group("train", min_member=2)]
    queue = GangQueue.from_config(CONFIG)
    snap = snapshot([node("a", gpu=8)], inference("a", 8) + members, groups)
    first = cycle(snap, policy, queue=queue)
    assert first.evictions == []
    message = first.verdicts["default/train"].message
    assert "once it has waited 600s" in message and "PriorityClass training" in message
    assert cycle(replace(snap, now=snap.now + 590), policy, queue=queue).evictions == []
    assert len(cycle(replace(snap, now=snap.now + 601), policy, queue=queue).evictions) == 8
    critical = [replace(p, priority_class="training-critical") for p in members]
    at_once = cycle(snapshot([node("a", gpu=8)], inference("a", 8) + critical, groups), policy)
    assert len(at_once.evictions) == 8


def test_the_least_wait_among_a_gangs_pod_classes_counts():
    policy = replace(POLICY, preemptor_wait_seconds=(("a", 60.0), ("b", 30.0)))
    pods = [replace(pod("x"), priority_class="a"), replace(pod("y"), priority_class="b")]
    assert policy.wait_before_evicting(tuple(pods)) == (30.0, "b")
    assert policy.wait_before_evicting((replace(pod("z"), priority_class="other"),)) == (0.0, "other")
    assert POLICY.wait_before_evicting(tuple(pods)) == (0.0, "")
