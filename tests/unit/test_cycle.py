from dataclasses import replace

import pytest

from batchsched.core.cluster import ClusterState
from batchsched.core.config import CoreConfig
from batchsched.core.cycle import CyclePlan, schedule_cycle
from batchsched.core.preemption.policy import PreemptionPolicy
from batchsched.core.queueing.queue import GangQueue, Reservation
from batchsched.core.snapshot import Snapshot
from tests.unit.helpers import T0, gang_pods, group, node, pod, snapshot

CONFIG = CoreConfig(initial_backoff=1, max_backoff=4, reservation_after_seconds=60)
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def new_queue() -> GangQueue:
    return GangQueue.from_config(CONFIG)


def bind(snap: Snapshot, plan: CyclePlan) -> Snapshot:
    """What the shell does with a plan: the pods become bound in its cache."""
    pods = dict(snap.pods)
    for b in plan.bindings:
        pods[b.pod_uid] = replace(pods[b.pod_uid], node_name=b.node_name)
    return replace(snap, pods=pods)


def later(snap: Snapshot, seconds: float, *changed_pods) -> Snapshot:
    pods = dict(snap.pods)
    pods.update({p.uid: p for p in changed_pods})
    return replace(snap, now=snap.now + seconds, pods=pods)


def bound_names(plan: CyclePlan) -> dict[str, str]:
    return {b.pod_name: b.node_name for b in plan.bindings}


def test_the_gang_that_fits_binds_whole_and_the_other_not_at_all():
    for p2_created in (5, -5):  # whichever is tried first
        snap = snapshot([node("n", memory="300")],
                        gang_pods("p1", 3, memory=50, created=0) + gang_pods("p2", 4, memory=100, created=p2_created),
                        [group("p1", min_member=3, created=0), group("p2", min_member=4, created=p2_created)])
        plan = schedule_cycle(snap, new_queue(), CONFIG)
        assert sorted(bound_names(plan)) == ["p1-0", "p1-1", "p1-2"]
        assert plan.verdicts["default/p1"].scheduled
        p2 = plan.verdicts["default/p2"]
        assert (p2.scheduled, p2.reason) == (False, "ExceedsClusterCapacity")  # 4 x 100 of 300
        assert "needs 4 pods placed at once" in p2.message


def test_the_higher_priority_gang_goes_first():
    snap = snapshot([node("n", memory="300")],
                    gang_pods("p1", 3, memory=100, priority=1) + gang_pods("p2", 3, memory=50, priority=100),
                    [group("p1", min_member=3, created=0), group("p2", min_member=3, created=10)])
    plan = schedule_cycle(snap, new_queue(), CONFIG)
    assert sorted(bound_names(plan)) == ["p2-0", "p2-1", "p2-2"]
    assert plan.verdicts["default/p1"].reason == "Unschedulable"


def test_a_group_without_quorum_never_binds_while_plain_pods_do():
    queue = new_queue()
    snap = snapshot([node("n", cpu="64")], gang_pods("q", 3, cpu=1) + [pod("plain", cpu=1)],
                    [group("q", min_member=4)])
    plan = schedule_cycle(snap, queue, CONFIG)
    assert bound_names(plan) == {"plain": "n"}
    verdict = plan.verdicts["default/q"]
    assert (verdict.reason, verdict.message) == ("QuorumNotReached", "3/4 members exist (pods with label "
                                                 "scheduling.batchsched.io/pod-group=q and schedulerName batchsched "
                                                 "in default)")
    for step in range(1, 5):
        snap = later(bind(snap, plan), 10, pod(f"plain-{step}", cpu=1, created=10 * step))
        plan = schedule_cycle(snap, queue, CONFIG)
        assert bound_names(plan) == {f"plain-{step}": "n"}
        assert plan.verdicts["default/q"].reason == "QuorumNotReached"


def test_gated_members_do_not_count_toward_quorum():
    snap = snapshot([node("n")], gang_pods("q", 1) + [pod("q-gated", group="q", gated=True)],
                    [group("q", min_member=2)])
    plan = schedule_cycle(snap, new_queue(), CONFIG)
    assert plan.verdicts["default/q"].message.startswith("1/2 members exist (pods with label")
    assert plan.verdicts["default/q"].message.endswith("in default); 1 more held by scheduling gates")


def test_members_of_another_scheduler_are_named_and_never_count_toward_quorum():
    # The issue-17 trial: one member forgot schedulerName and default-scheduler bound it.
    taken = pod("w-2", group="w", scheduler="default-scheduler", node_name="n", phase="Running")
    waiting = pod("w-3", group="w", scheduler="default-scheduler")
    snap = snapshot([node("n")], gang_pods("w", 2) + [taken, waiting], [group("w", min_member=3)])
    plan = schedule_cycle(snap, new_queue(), CONFIG)
    verdict = plan.verdicts["default/w"]
    assert plan.bindings == [] and verdict.reason == "QuorumNotReached"
    assert verdict.message == (
        "2/3 members exist (pods with label scheduling.batchsched.io/pod-group=w and schedulerName batchsched "
        "in default); 2 pod(s) carry the gang label but schedulerName default-scheduler: w-2 (bound to n), w-3; "
        "they do not count toward minMember (set schedulerName: batchsched)")


def test_a_hopeless_gang_starves_no_one_even_after_the_reservation_delay():
    queue = new_queue()
    nodes = [node("a", cpu="6"), node("b", cpu="2"), node("c", cpu="2"), node("d", cpu="2")]
    snap = snapshot(nodes, gang_pods("hopeless", 6, cpu=4, created=0), [group("hopeless", min_member=6)])
    plan = schedule_cycle(snap, queue, CONFIG)
    assert plan.bindings == [] and plan.verdicts["default/hopeless"].reason == "ExceedsClusterCapacity"
    for t in (30, 100, 200):
        snap = later(bind(snap, plan), t - (snap.now - T0), pod(f"solo-{t}", cpu=2, created=t))
        plan = schedule_cycle(snap, queue, CONFIG)
        assert set(bound_names(plan)) == {f"solo-{t}"}
        assert queue.reservation is None


def test_whole_gpu_nodes_for_a_gang_that_fits_and_none_for_one_that_does_not():
    nodes = [node(f"gpu-{i}", cpu="64", gpu=8) for i in range(4)]
    fits = schedule_cycle(snapshot(nodes, gang_pods("four", 4, gpu=8), [group("four", min_member=4)]),
                          new_queue(), CONFIG)
    assert sorted(bound_names(fits).values()) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]

    too_big = schedule_cycle(snapshot(nodes, gang_pods("five", 5, gpu=8), [group("five", min_member=5)]),
                             new_queue(), CONFIG)
    assert too_big.bindings == []
    assert too_big.verdicts["default/five"].reason == "ExceedsClusterCapacity"
    assert too_big.verdicts["default/five"].message == (
        "Exceeds cluster capacity: gang default/five needs 5 pods placed at once; "
        "they ask 40 nvidia.com/gpu, the cluster has 32 allocatable.")


def test_tainted_gpu_nodes_take_the_tolerating_selected_gang_only():
    gpu_nodes = [node(f"gpu-{i}", gpu=8, labels={"pool": "gpu"},
                      taints=[("nvidia.com/gpu", "present", "NoSchedule")]) for i in range(2)]
    pods = (gang_pods("train", 2, gpu=8, tolerations=[TOLERATE_GPU], node_selector={"pool": "gpu"})
            + gang_pods("web", 2, cpu=1))
    snap = snapshot(gpu_nodes + [node("cpu-0")], pods, [group("train", min_member=2), group("web", min_member=2)])
    plan = schedule_cycle(snap, new_queue(), CONFIG)
    assert bound_names(plan) == {"train-0": "gpu-0", "train-1": "gpu-1", "web-0": "cpu-0", "web-1": "cpu-0"}


def test_a_succeeded_member_does_not_count_toward_quorum():
    queue = new_queue()
    done = pod("g-0", group="g", node_name="n", phase="Succeeded")
    snap = snapshot([node("n")], [done, pod("g-1", group="g")], [group("g", min_member=2)])
    plan = schedule_cycle(snap, queue, CONFIG)
    assert plan.bindings == [] and plan.verdicts["default/g"].message.startswith("1/2 members exist (")
    plan = schedule_cycle(later(snap, 1, pod("g-2", group="g")), queue, CONFIG)
    assert sorted(bound_names(plan)) == ["g-1", "g-2"]


def test_pods_of_other_schedulers_consume_capacity():
    theirs = pod("theirs", cpu=6, scheduler="default-scheduler", node_name="n", phase="Running")
    snap = snapshot([node("n", cpu="8")], [theirs] + gang_pods("g", 2, cpu=2), [group("g", min_member=2)])
    plan = schedule_cycle(snap, new_queue(), CONFIG)
    assert plan.bindings == []
    assert plan.verdicts["default/g"].message == (
        "Gang default/g needs 2 pods placed at once; the best plan found places 1 (n: 1); "
        "with 1 of them placed, 0/1 nodes are available for pod g-1: 1 Insufficient cpu.")


def test_gangs_in_one_cycle_never_share_capacity():
    snap = snapshot([node("n", cpu="8")], gang_pods("a", 2, cpu=4) + gang_pods("b", 2, cpu=4),
                    [group("a", min_member=2, created=0), group("b", min_member=2, created=1)])
    plan = schedule_cycle(snap, new_queue(), CONFIG)
    assert sorted(bound_names(plan)) == ["a-0", "a-1"]
    assert plan.verdicts["default/b"].reason == "Unschedulable"


def test_failed_gangs_back_off_and_freed_capacity_ends_the_backoff():
    queue = new_queue()
    blocker = pod("blocker", cpu=8, node_name="n", phase="Running", scheduler="other")
    snap = snapshot([node("n", cpu="8")], [blocker] + gang_pods("g", 2, cpu=4), [group("g", min_member=2)])
    assert "default/g" in schedule_cycle(snap, queue, CONFIG).verdicts
    assert "default/g" not in schedule_cycle(later(snap, 0.5), queue, CONFIG).verdicts  # backing off
    freed = later(snap, 0.6, replace(blocker, phase="Succeeded"))
    queue.capacity_freed()
    assert sorted(bound_names(schedule_cycle(freed, queue, CONFIG))) == ["g-0", "g-1"]


def test_missing_and_invalid_groups_get_their_verdicts():
    snap = snapshot([node("n")], [pod("a", group="missing"), pod("b", group="bad")],
                    invalid_groups={"default/bad": "spec.minMember must be an integer >= 1, got 0"})
    plan = schedule_cycle(snap, new_queue(), CONFIG)
    assert plan.bindings == []
    assert plan.verdicts["default/missing"].reason == "PodGroupNotFound"
    assert plan.verdicts["default/missing"].message == "PodGroup default/missing not found"
    assert plan.verdicts["default/bad"].reason == "InvalidPodGroup"


def test_schedule_timeout_stops_attempts_until_touched():
    queue = new_queue()
    blocker = pod("blocker", cpu=8, node_name="n", phase="Running", scheduler="other")
    snap = snapshot([node("n", cpu="8")], [blocker] + gang_pods("g", 2, cpu=4), [group("g", min_member=2, timeout=30)])
    assert schedule_cycle(snap, queue, CONFIG).verdicts["default/g"].reason == "Unschedulable"
    snap = later(snap, 31, replace(blocker, phase="Succeeded"))
    queue.capacity_freed()
    plan = schedule_cycle(snap, queue, CONFIG)
    assert plan.bindings == [] and plan.verdicts["default/g"].reason == "ScheduleTimeout"
    queue.touch("default/g")
    plan = schedule_cycle(later(snap, 1), queue, CONFIG)
    assert sorted(bound_names(plan)) == ["g-0", "g-1"]


def test_min_resources_beyond_the_cluster_are_rejected_without_planning():
    nodes = [node(f"gpu-{i}", gpu=8) for i in range(4)]
    snap = snapshot(nodes, gang_pods("g", 2, gpu=1), [group("g", min_member=2, min_resources={"nvidia.com/gpu": 40})])
    verdict = schedule_cycle(snap, new_queue(), CONFIG).verdicts["default/g"]
    assert verdict.reason == "ExceedsClusterCapacity"
    assert verdict.message == ("Exceeds cluster capacity: gang default/g minResources exceed the allocatable "
                               "of all nodes together: nvidia.com/gpu 40 > 32.")


def test_max_gangs_per_cycle_defers_the_rest():
    queue = new_queue()
    snap = snapshot([node("n")], [pod(f"p{i}", cpu=1, created=i) for i in range(3)])
    config = replace(CONFIG, max_gangs_per_cycle=2)
    plan = schedule_cycle(snap, queue, config)
    assert sorted(bound_names(plan)) == ["p0", "p1"]
    assert sorted(bound_names(schedule_cycle(bind(snap, plan), queue, config))) == ["p2"]


def test_extra_members_beyond_quorum_are_placed_when_they_fit():
    pods = [pod("g-0", group="g", cpu=4, node_name="n", phase="Running"), pod("g-1", group="g", cpu=4),
            pod("g-2", group="g", cpu=4)]
    plan = schedule_cycle(snapshot([node("n", cpu="8")], pods, [group("g", min_member=1)]), new_queue(), CONFIG)
    assert bound_names(plan) == {"g-1": "n"}
    verdict = plan.verdicts["default/g"]
    assert verdict.scheduled and "1 more do not fit" in verdict.message


def big_gang_behind_jobs(r2_gpus: int) -> Snapshot:
    """Three 8-GPU nodes running Jobs r0 (8 GPUs), r1 (4) and r2 (``r2_gpus``),
    and a 2 x 8-GPU gang, big, waiting."""
    nodes = [node("gpu-0", gpu=8), node("gpu-1", gpu=8), node("gpu-2", gpu=8)]
    running = [pod(name, gpu=gpu, node_name=node_name, phase="Running", created=-100, owner="Job",
                   restart_policy="Never")
               for name, gpu, node_name in (("r0", 8, "gpu-0"), ("r1", 4, "gpu-1"), ("r2", r2_gpus, "gpu-2"))]
    return snapshot(nodes, running + gang_pods("big", 2, gpu=8), [group("big", min_member=2)])


def test_a_long_waiting_gang_reserves_nodes_so_small_gangs_cannot_starve_it():
    queue = new_queue()
    snap = big_gang_behind_jobs(r2_gpus=4)
    assert schedule_cycle(snap, queue, CONFIG).bindings == []

    # before the reservation delay, a small gang slips into free capacity
    snap = later(snap, 10, pod("small-a", gpu=2, created=10, restart_policy="OnFailure"))
    plan = schedule_cycle(snap, queue, CONFIG)
    assert bound_names(plan) == {"small-a": "gpu-1"}
    snap = bind(snap, plan)

    # after it, big reserves the two nodes that are freest now (gpu-0 is
    # busier) and small gangs must stay off them
    snap = later(snap, 60, pod("small-b", gpu=2, created=70))
    plan = schedule_cycle(snap, queue, CONFIG)
    assert queue.reservation == Reservation("default/big", frozenset({"gpu-1", "gpu-2"}))
    assert plan.bindings == []
    assert plan.verdicts["default/pod:small-b"].message.startswith(
        "Gang default/pod:small-b needs 1 pod placed at once; 0/3 nodes are available for pod small-b: "
        "2 node(s) were reserved for a waiting gang, 1 Insufficient nvidia.com/gpu.")

    # the pods on the reserved nodes finish, and big binds there
    finished = [replace(snap.pods[f"uid-default-{n}"], phase="Succeeded") for n in ("r1", "r2", "small-a")]
    snap = later(snap, 30, *finished)
    queue.capacity_freed()
    plan = schedule_cycle(snap, queue, CONFIG)
    assert sorted(bound_names(plan).values()) == ["gpu-1", "gpu-2"]
    assert {b.gang_key for b in plan.bindings} == {"default/big"}
    assert queue.reservation is None


def test_no_reservation_against_higher_priority_pods():
    queue = new_queue()
    urgent = [pod(f"urgent-{i}", gpu=8, node_name=f"gpu-{i}", phase="Running", priority=100) for i in range(2)]
    snap = snapshot([node("gpu-0", gpu=8), node("gpu-1", gpu=8)], urgent + gang_pods("big", 2, gpu=8),
                    [group("big", min_member=2)])
    schedule_cycle(snap, queue, CONFIG)
    schedule_cycle(later(snap, 61), queue, CONFIG)
    assert queue.reservation is None  # it cannot expect higher-priority pods to make room


def _inference_on_every_node(priority: int = 10) -> list:
    """Deployment-owned inference: one 1-GPU pod of a ReplicaSet per node, ours, never ending."""
    return [pod(f"infer-{i}", gpu=1, node_name=f"gpu-{i}", phase="Running", priority=priority, created=-100,
                owner="ReplicaSet") for i in range(4)]


def test_no_reservation_waits_for_inference_that_never_ends():
    # Finding 6: 4 x 8 GPUs, inference holds 1 GPU per node; a 4 x 8-GPU gang
    # could only fit if it ended.  Its reservation would idle 28 GPUs forever.
    queue = new_queue()
    nodes = [node(f"gpu-{i}", gpu=8) for i in range(4)]
    snap = snapshot(nodes, _inference_on_every_node() + gang_pods("big", 4, gpu=8, priority=100),
                    [group("big", min_member=4, priority=100)])
    assert schedule_cycle(snap, queue, CONFIG).bindings == []
    snap = later(snap, 61, *gang_pods("later", 2, gpu=4, created=61))
    snap = replace(snap, groups={**snap.groups, "default/later": group("later", min_member=2, created=61)})
    plan = schedule_cycle(snap, queue, CONFIG)
    assert queue.reservation is None
    assert {b.gang_key for b in plan.bindings} == {"default/later"}


def test_no_end_pods_are_those_kept_by_controllers_or_restarted_without_a_deadline():
    # Which pods a reservation may wait out (docs/queueing.md, "Which pods drain").
    assert pod("job", owner="Job", restart_policy="Never").runs_to_completion
    assert pod("bare-batch", restart_policy="OnFailure").runs_to_completion
    assert pod("bare-deadline", deadline=600).runs_to_completion  # restartPolicy Always, but killed then
    assert not pod("bare-service").runs_to_completion  # restartPolicy Always, no deadline
    for owner in ("ReplicaSet", "StatefulSet", "DaemonSet"):
        assert not pod(f"{owner}-pod", owner=owner, restart_policy="Never", deadline=600).runs_to_completion
    assert pod("d", deadline=600, started=100).ends_by == T0 + 700
    assert pod("d", deadline=600).ends_by is None  # not started
    assert pod("h", deadline="soon").active_deadline_seconds is None  # hostile values are ignored


def test_a_hopeless_gang_still_preempts_the_endless_pods_it_outranks():
    queue = new_queue()
    nodes = [node(f"gpu-{i}", gpu=8) for i in range(4)]
    snap = snapshot(nodes, _inference_on_every_node() + gang_pods("big", 4, gpu=8, priority=100),
                    [group("big", min_member=4, priority=100)])
    schedule_cycle(snap, queue, CONFIG)  # no preemption yet: big only starts waiting
    plan = schedule_cycle(later(snap, 61), queue, CONFIG, PreemptionPolicy(enabled=True))
    assert queue.reservation is None
    assert sorted(e.pod.name for e in plan.evictions) == [f"infer-{i}" for i in range(4)]


def _deadline_scene(deadline: int | None, max_reservation: float):
    """Job pods hold half of two nodes; a gang needs both whole nodes."""
    config = replace(CONFIG, max_reservation_seconds=max_reservation)
    queue = GangQueue.from_config(config)
    running = [pod(f"job-{i}", gpu=4, node_name=f"gpu-{i}", phase="Running", created=-100, started=0,
                   owner="Job", restart_policy="Never", deadline=deadline) for i in range(2)]
    snap = snapshot([node("gpu-0", gpu=8), node("gpu-1", gpu=8)], running + gang_pods("big", 2, gpu=8),
                    [group("big", min_member=2)])
    schedule_cycle(snap, queue, config)
    snap = later(snap, 61)
    schedule_cycle(snap, queue, config)
    assert queue.reservation is not None and queue.reservation.gang_key == "default/big"
    return config, queue, snap


def test_a_reservation_is_released_once_the_pods_it_waits_for_are_past_their_deadline():
    config, queue, snap = _deadline_scene(deadline=200, max_reservation=3600)
    schedule_cycle(later(snap, 160), queue, config)  # t=221 <= 200 + the kill's grace
    assert queue.reservation is not None
    snap = later(snap, 170, pod("small", gpu=2, created=231))  # t=231: still running past 230
    plan = schedule_cycle(snap, queue, config)
    assert queue.reservation is None and queue.reservation_expired("default/big")
    assert bound_names(plan) == {"small": "gpu-0"}
    assert "reservation was released" in plan.verdicts["default/big"].message
    # It holds none again until it changes...
    plan = schedule_cycle(later(bind(snap, plan), 10), queue, config)
    assert queue.reservation is None
    queue.touch("default/big")  # ...as when its pods or PodGroup change
    schedule_cycle(later(bind(snap, plan), 20), queue, config)
    assert queue.reservation is not None


def test_a_reservation_without_a_known_end_is_released_after_max_reservation_seconds():
    config, queue, snap = _deadline_scene(deadline=None, max_reservation=100)
    schedule_cycle(later(snap, 100), queue, config)  # held 100 s: not beyond the bound
    assert queue.reservation is not None
    snap = later(snap, 101, pod("small", gpu=2, created=162))
    plan = schedule_cycle(snap, queue, config)
    assert queue.reservation is None
    assert bound_names(plan) == {"small": "gpu-0"}


def test_a_fitting_gang_behind_a_thousand_stuck_ones_is_tried_within_two_passes():
    # Finding 7: 1000 higher-priority gangs that cannot fit, a pod ending
    # every cycle, 10 attempts per cycle, and a small gang behind them all.
    config = replace(CONFIG, max_gangs_per_cycle=10, max_backoff=600)
    queue = GangQueue.from_config(config)
    nodes = [node(f"gpu-{i}", gpu=8) for i in range(4)]
    theirs = [pod(f"theirs-{i}-{j}", gpu=1, node_name=f"gpu-{i}", phase="Running", scheduler="default-scheduler")
              for i in range(4) for j in range(6)]
    stuck = [pod(f"stuck-{k}", gpu=8, priority=100, created=k) for k in range(1000)]
    cluster = ClusterState("batchsched", nodes, theirs + stuck + [pod("late", gpu=1, created=2000)])
    bound_late_at = None
    for cycle in range(2 * 101 + 1):  # the bound: 2 * ceil(1001 gangs / 10) + 1 cycles
        ended = theirs[cycle % len(theirs)]  # churn: one of their pods ends, another takes its place
        cluster.remove_pod(ended.uid)
        theirs[cycle % len(theirs)] = replace(ended, uid=f"{ended.uid}-{cycle}", name=f"{ended.name}-{cycle}")
        cluster.put_pod(theirs[cycle % len(theirs)])
        queue.capacity_freed()
        plan = schedule_cycle(Snapshot.of(cluster, {}, T0 + cycle), queue, config)
        assert len([v for v in plan.verdicts.values() if v.reason == "Unschedulable"]) <= 10
        if "late" in bound_names(plan):
            bound_late_at = cycle
            break
    assert bound_late_at is not None


def test_churn_that_cannot_help_a_gang_leaves_its_backoff_alone():
    queue = new_queue()
    theirs = [pod(f"theirs-{j}", gpu=1, node_name="gpu-0", phase="Running", scheduler="default-scheduler")
              for j in range(4)]
    cluster = ClusterState("batchsched", [node("gpu-0", gpu=8)], theirs + [pod("whole", gpu=8)])
    assert "default/pod:whole" in schedule_cycle(Snapshot.of(cluster, {}, T0), queue, CONFIG).verdicts
    cluster.remove_pod(theirs[0].uid)  # 5 GPUs free: not enough for it
    queue.capacity_freed()
    assert "default/pod:whole" not in schedule_cycle(Snapshot.of(cluster, {}, T0 + 0.5), queue, CONFIG).verdicts
    for p in theirs[1:]:  # the node frees whole: worth a try before the backoff ends
        cluster.remove_pod(p.uid)
    queue.capacity_freed()
    assert bound_names(schedule_cycle(Snapshot.of(cluster, {}, T0 + 0.6), queue, CONFIG)) == {"whole": "gpu-0"}


def test_gangs_woken_by_room_an_earlier_gang_took_are_not_tried_and_keep_their_backoff():
    """One node frees room for one pod; every backed-off gang that pod
    could be is woken, the first takes it, and the rest, finding no node
    for any of their pods at their turn, go back to their backoff untried
    (an attempt could only fail)."""
    queue = GangQueue.from_config(replace(CONFIG, max_backoff=60))
    blockers = [pod(f"theirs-{j}", gpu=8, node_name=f"gpu-{j}", phase="Running", scheduler="default-scheduler")
                for j in range(2)]
    cluster = ClusterState("batchsched", [node(f"gpu-{j}", gpu=8) for j in range(2)],
                           blockers + [pod(f"lone-{k}", gpu=8, created=k) for k in range(4)])
    for t in (0, 1.5, 4, 8.5):  # four failures each: backoff 8 s
        plan = schedule_cycle(Snapshot.of(cluster, {}, T0 + t), queue, CONFIG)
        assert len(plan.verdicts) == 4 and not plan.bindings
    cluster.remove_pod(blockers[0].uid)  # room for one of them
    queue.capacity_freed()
    plan = schedule_cycle(Snapshot.of(cluster, {}, T0 + 9), queue, CONFIG)
    assert bound_names(plan) == {"lone-0": "gpu-0"}
    assert set(plan.verdicts) == {"default/pod:lone-0"}  # the others were not tried
    for k in (1, 2, 3):  # their backoff goes on where it was
        assert not queue.ready(f"default/pod:lone-{k}", T0 + 16)
        assert queue.ready(f"default/pod:lone-{k}", T0 + 16.5)


def test_a_failure_looking_at_a_woken_gang_is_its_verdict_alone(monkeypatch):
    import batchsched.core.cycle.order as cycle_module

    queue = new_queue()
    blocker = pod("theirs", gpu=8, node_name="gpu-0", phase="Running", scheduler="default-scheduler")
    cluster = ClusterState("batchsched", [node("gpu-0", gpu=8), node("gpu-1", gpu=8)],
                           [blocker, pod("full", gpu=8, node_name="gpu-1", phase="Running"),
                            pod("lone-0", gpu=8, created=0), pod("lone-1", gpu=4, created=1)])
    schedule_cycle(Snapshot.of(cluster, {}, T0), queue, CONFIG)  # neither fits: both back off
    real = cycle_module.places_none

    def raising(pods, *args, **kwargs):
        if pods[0].name == "lone-0":
            raise ValueError("a value no check foresaw")
        return real(pods, *args, **kwargs)

    monkeypatch.setattr(cycle_module, "places_none", raising)
    cluster.remove_pod(blocker.uid)
    queue.capacity_freed()
    plan = schedule_cycle(Snapshot.of(cluster, {}, T0 + 0.5), queue, CONFIG)
    assert plan.verdicts["default/pod:lone-0"].reason == "InternalError"
    assert bound_names(plan) == {"lone-1": "gpu-0"}


def test_a_gang_woken_by_room_on_nodes_reserved_against_it_is_not_tried():
    queue = new_queue()
    snap = big_gang_behind_jobs(r2_gpus=6)
    schedule_cycle(snap, queue, CONFIG)
    snap = later(snap, 70, pod("small", gpu=2, created=70))
    plan = schedule_cycle(snap, queue, CONFIG)  # big reserves gpu-1 and gpu-2; small may not go there
    assert queue.reservation.nodes == {"gpu-1", "gpu-2"} and plan.verdicts["default/pod:small"].reason == \
        "Unschedulable"
    snap = later(snap, 0.5, replace(snap.pods["uid-default-r1"], phase="Succeeded"))  # gpu-1 all free
    queue.capacity_freed()
    plan = schedule_cycle(snap, queue, CONFIG)
    assert not plan.bindings and "default/pod:small" not in plan.verdicts  # room only where it may not go
    assert not queue.ready("default/pod:small", snap.now)


@pytest.mark.parametrize("preempting", [False, True])
def test_a_gang_is_skipped_only_when_its_attempt_would_fail(monkeypatch, preempting):
    """Over a busy simulated burst (pods ending, reservations, GPU sets;
    with preemption, lone pods are inference the gangs may evict): every
    gang put back to its backoff untried is planned as the attempt would
    have planned it, on the same index at the same moment, and fails."""
    import batchsched.core.cycle as cycle_module
    from batchsched.config import SchedulerConfig
    from batchsched.core.cycle.facts import placement_policy
    from batchsched.core.cycle.reserve import bound_on
    from batchsched.core.placement.gang import PlanFailure, plan_gang
    from batchsched.sim.cluster import NodeGroup, build_nodes, builtin_topologies
    from batchsched.sim.engine import Simulation
    from batchsched.sim.policies import BatchschedPolicy
    from batchsched.sim.workload import Job

    decided = {"skipped": 0}
    real = cycle_module.room_taken_before_its_turn

    def checked(ctx, gang):
        skipped = real(ctx, gang)
        if skipped:
            decided["skipped"] += 1
            attempt = plan_gang(gang.pending, gang.need, ctx.capacity, reserved=ctx.queue.reserved_against(gang.key),
                                policy=placement_policy(ctx.snapshot, gang, ctx.config), bound_on=bound_on(gang))
            assert isinstance(attempt, PlanFailure), gang.key  # a failure leaves the index as it was
        return skipped

    monkeypatch.setattr(cycle_module, "room_taken_before_its_turn", checked)
    boards = builtin_topologies()
    nodes = build_nodes([NodeGroup(name=b, gpus=8, cpu="256", memory="2Ti", count=6, topology=boards[b],
                                   topology_name=b) for b in ("dgx-a100", "pcie-8gpu")])
    sizes = [1, 1, 1, 2, 4, 1, 8, 2, 1, 1]
    jobs = [Job(name=f"job-{i}", arrival=i * 0.1, duration=30 + 7 * (i % 5), pods=sizes[i % len(sizes)],
                min_member=sizes[i % len(sizes)], gpus=(1, 2, 4, 8)[i % 4] if sizes[i % len(sizes)] == 1 else 8,
                cpu="2", memory="8Gi", namespace="t", priority=100 if sizes[i % len(sizes)] == 1 else 1000)
            for i in range(120)]
    # (lone pods may not preempt: they are the ones skipped then)
    config = SchedulerConfig.model_validate({"preemption": {"enabled": preempting, "preemptors": {"minPriority": 500}}})
    result = Simulation(nodes, jobs, BatchschedPolicy(config)).run()
    assert result.pods_never_placed == 0
    assert decided["skipped"] > 20  # the burst does wake gangs for room others take


def test_an_attempt_that_raises_gives_back_all_the_room_it_took(monkeypatch):
    """The attempt is a statement: gang "first" is placed (its room taken
    from the running free map) and then raises while its bindings are
    built.  Its verdict says so, and the gang after it is tried on the room
    there was before: it binds where "first" would have gone."""
    from batchsched.core.dra import claims

    real = claims.allocations

    def raising(node, pod, *args, **kwargs):
        if pod.name == "first":
            raise ValueError("a value no check foresaw")
        return real(node, pod, *args, **kwargs)

    monkeypatch.setattr(claims, "allocations", raising)
    queue = new_queue()
    plan = schedule_cycle(snapshot([node("gpu-0", gpu=8)], [pod("first", gpu=8, created=0),
                                                            pod("second", gpu=8, created=1)]), queue, CONFIG)
    assert plan.verdicts["default/pod:first"].reason == "InternalError"
    assert bound_names(plan) == {"second": "gpu-0"}


def test_a_cycle_writes_nothing_into_the_objects_it_decides_on():
    """What the cycle derives (shape keys, node kinds, GPU facts, gang
    facts, victim candidates) lives in typed caches, not in the frozen
    pods, nodes, gangs and snapshot: their ``__dict__`` holds their fields
    (and what their class declares as a cached_property)."""
    from dataclasses import fields
    from functools import cached_property

    from batchsched.core.gangs import GangIndex

    queue = new_queue()
    snap = snapshot([node("gpu-0", gpu=8), node("gpu-1", gpu=8)],
                    [replace(pod("low", gpu=8, node_name="gpu-0", phase="Running", priority=1),
                             started=T0 - 100), pod("busy", gpu=8, node_name="gpu-1", phase="Running"),
                     *gang_pods("g", 1, gpu=8, priority=100), pod("later", gpu=4, created=5)],
                    [group("g", min_member=1)])
    plan = schedule_cycle(snap, queue, CONFIG, PreemptionPolicy(enabled=True))
    assert plan.evictions  # victims were looked for: every cache was used
    gangs = GangIndex(snap)
    objects = [*snap.pods.values(), *snap.nodes.values(), *(gangs[k] for k in gangs), snap]
    for obj in objects:
        declared = {name for name, value in vars(type(obj)).items() if isinstance(value, cached_property)}
        assert set(vars(obj)) <= {f.name for f in fields(obj)} | declared, obj
