"""Backfill and drain-aware reservation (docs/queueing.md, "Backfill" and
"Which nodes are reserved"; issue 16, points 1-2)."""
from dataclasses import replace

from batchsched.core.config import CoreConfig
from batchsched.core.cycle import schedule_cycle
from batchsched.core.preemption.policy import PreemptionPolicy
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.queueing.runtime import KILL_GRACE_SECONDS, expected_end, overran_hint, runtime_bound
from tests.unit.helpers import T0, gang_pods, group, node, pod, snapshot

CONFIG = CoreConfig(initial_backoff=1, max_backoff=4, reservation_after_seconds=60)
JOB = {"owner": "Job", "restart_policy": "Never"}  # a Job's pod: ends by itself


def later(snap, seconds, *pods, groups=()):
    return replace(snap, now=snap.now + seconds, pods={**snap.pods, **{p.uid: p for p in pods}},
                   groups={**snap.groups, **{g.key: g for g in groups}})


def running(name, node_name, gpu, started=0.0, **kwargs):
    return pod(name, gpu=gpu, node_name=node_name, phase="Running", created=-100, started=started,
               **{**JOB, **kwargs})


def reserved_scene():
    """Two 8-GPU nodes, each half held by a Job pod killed at 200 s; a third
    with 3 GPUs free (inference holds 5). ``big`` (2 whole nodes) waits
    since t=0 and, at t=61, holds the reservation of gpu-0 and gpu-1,
    expected to fit once the Job pods are gone: t = 200 + the kill's grace."""
    queue = GangQueue.from_config(CONFIG)
    pods = [running("job-0", "gpu-0", 4, deadline=200), running("job-1", "gpu-1", 4, deadline=200),
            pod("infer", gpu=5, node_name="gpu-2", phase="Running", priority=-5, owner="ReplicaSet")]
    snap = snapshot([node(f"gpu-{i}", gpu=8) for i in range(3)], pods + gang_pods("big", 2, gpu=8),
                    [group("big", min_member=2)])
    schedule_cycle(snap, queue, CONFIG)
    return queue, later(snap, 61)


def test_a_bound_that_ends_before_the_reserved_gang_fits_backfills():
    ready = T0 + 200 + KILL_GRACE_SECONDS
    # 169 s from t=61, plus the kill's grace: gone by t=260 > 230; 139 s: by 230
    for deadline, backfills in ((169, False), (139, True)):
        queue, snap = reserved_scene()
        snap = later(snap, 0, pod("short", gpu=4, created=61, deadline=deadline, **JOB))
        plan = schedule_cycle(snap, queue, CONFIG)
        assert queue.reservation.gang_key == "default/big"
        assert queue.reservation.nodes == {"gpu-0", "gpu-1"} and queue.reservation.ready_at == ready
        placed = {b.pod_name: b.node_name for b in plan.bindings}
        if backfills:
            assert placed["short"] in {"gpu-0", "gpu-1"}
        else:
            assert placed == {}
            assert "reserved for a waiting gang" in plan.verdicts["default/pod:short"].message


def hinted_fill(hint: int):
    """The reserved scene at t=61 with ``fill`` arriving: 2 x 4 GPUs, Job
    pods, its PodGroup's expectedRuntimeSeconds ``hint``."""
    queue, snap = reserved_scene()
    return queue, later(snap, 0, *gang_pods("fill", 2, gpu=4, created=61, **JOB),
                        groups=[group("fill", min_member=2, created=61, expected_runtime=hint)])


def test_a_podgroup_hint_is_a_bound_too():
    queue, snap = hinted_fill(160)
    plan = schedule_cycle(snap, queue, CONFIG)
    assert sorted(b.node_name for b in plan.bindings) == ["gpu-0", "gpu-1"]
    # A hint the reservation's expected time does not cover keeps it off.
    queue, snap = hinted_fill(170)
    assert schedule_cycle(snap, queue, CONFIG).bindings == []


def test_a_pod_without_a_bound_never_backfills():
    unbounded = [pod("no-bound", gpu=4, created=61, **JOB),  # ends by itself, but when?
                 pod("endless", gpu=4, created=61, deadline=10, owner="ReplicaSet")]  # replaced when it ends
    for candidate in unbounded:
        queue, snap = reserved_scene()
        plan = schedule_cycle(later(snap, 0, candidate), queue, CONFIG)
        assert plan.bindings == [], candidate.name
    # Nor does anything while the reserved gang's time is unknown: a pod it
    # waits for has no bound.
    queue = GangQueue.from_config(CONFIG)
    pods = [running("job-0", "gpu-0", 4), running("job-1", "gpu-1", 4, deadline=200)]
    snap = snapshot([node("gpu-0", gpu=8), node("gpu-1", gpu=8)], pods + gang_pods("big", 2, gpu=8),
                    [group("big", min_member=2)])
    schedule_cycle(snap, queue, CONFIG)
    plan = schedule_cycle(later(snap, 61, pod("short", gpu=4, created=61, deadline=10, **JOB)), queue, CONFIG)
    assert queue.reservation.gang_key == "default/big" and queue.reservation.ready_at is None
    assert plan.bindings == []


def test_a_backfilled_gang_past_its_hint_is_the_reserved_gangs_first_victim():
    queue, snap = hinted_fill(100)
    plan = schedule_cycle(snap, queue, CONFIG)
    assert sorted(b.node_name for b in plan.bindings) == ["gpu-0", "gpu-1"]
    fill = [replace(snap.pods[b.pod_uid], node_name=b.node_name, phase="Running", started=snap.now)
            for b in plan.bindings]
    done = [replace(snap.pods[f"uid-default-job-{i}"], phase="Succeeded") for i in range(2)]
    policy = PreemptionPolicy(enabled=True)
    # Within its hint (t=161) it is left alone: it is of big's priority.
    plan = schedule_cycle(later(snap, 100, *fill, *done), queue, CONFIG, policy)
    assert plan.evictions == [] and plan.bindings == []
    # Past it, big evicts it (and not the lower-priority inference, which
    # would not make big fit anyway).
    plan = schedule_cycle(later(snap, 110, *fill, *done), queue, CONFIG, policy)  # its backoff over
    assert sorted(e.pod.name for e in plan.evictions) == ["fill-0", "fill-1"]
    assert {n.node_name for n in plan.nominations} == {"gpu-0", "gpu-1"}
    assert "past their expectedRuntimeSeconds" in plan.verdicts["default/big"].message


def test_gangs_past_their_hint_are_evicted_within_the_namespaces_eviction_budget():
    def evicted(policy):
        queue, snap = hinted_fill(100)
        plan = schedule_cycle(snap, queue, CONFIG)
        fill = [replace(snap.pods[b.pod_uid], node_name=b.node_name, phase="Running", started=snap.now)
                for b in plan.bindings]
        done = [replace(snap.pods[f"uid-default-job-{i}"], phase="Succeeded") for i in range(2)]
        schedule_cycle(later(snap, 100, *fill, *done), queue, CONFIG, policy)
        return sorted(e.pod.name for e in schedule_cycle(later(snap, 110, *fill, *done), queue, CONFIG,
                                                         policy).evictions)
    assert evicted(PreemptionPolicy(enabled=True)) == ["fill-0", "fill-1"]
    assert evicted(PreemptionPolicy(enabled=True, namespace_evictions_per_hour=0)) == []


def test_the_reserved_nodes_are_those_expected_to_drain_soonest():
    # Every node is as busy as the others; what differs is when its pods end.
    queue = GangQueue.from_config(CONFIG)
    pods = [running("late", "gpu-0", 4, deadline=3000),
            running("soon", "gpu-1", 4, deadline=100),
            running("unbounded", "gpu-2", 4),  # no bound: last
            # a long hint, but it has run most of it already
            running("old", "gpu-3", 4, group="old", started=-2800),
            running("hinted", "gpu-4", 4, group="hinted", started=0)]
    groups = [group("big", min_member=2), group("old", created=-3000, expected_runtime=3000),
              group("hinted", created=-3000, expected_runtime=3000)]
    snap = snapshot([node(f"gpu-{i}", gpu=8) for i in range(5)], pods + gang_pods("big", 2, gpu=8), groups)
    schedule_cycle(snap, queue, CONFIG)
    schedule_cycle(later(snap, 61), queue, CONFIG)
    assert queue.reservation.nodes == {"gpu-1", "gpu-3"}
    assert queue.reservation.ready_at == T0 + 200  # "old" ends at -2800 + 3000


def test_runtime_bounds():
    groups = {g.key: g for g in [group("g", expected_runtime=600)]}
    deadline = pod("d", deadline=100, started=50, group="g")
    hinted = pod("h", started=50, group="g")
    assert runtime_bound(deadline, groups) == 100 + KILL_GRACE_SECONDS  # the enforced bound wins
    assert expected_end(deadline, groups) == T0 + 50 + 100 + KILL_GRACE_SECONDS
    assert runtime_bound(hinted, groups) == 600 and expected_end(hinted, groups) == T0 + 650
    assert expected_end(pod("h", group="g"), groups) is None  # not started
    assert runtime_bound(pod("x"), groups) is None
    assert not overran_hint(hinted, groups, T0 + 650) and overran_hint(hinted, groups, T0 + 651)
    assert not overran_hint(deadline, groups, T0 + 10**6)  # the kubelet's to end


def test_an_owner_jobs_deadline_bounds_its_pods_as_the_pods_own_would():
    job_gang = replace(group("j", expected_runtime=600), job_deadline_seconds=300)
    groups = {job_gang.key: job_gang}
    member = pod("j-0", started=50, group="j")
    assert runtime_bound(member, groups) == 300 + KILL_GRACE_SECONDS  # enforced: before the hint
    assert expected_end(member, groups) == T0 + 50 + 300 + KILL_GRACE_SECONDS
    assert not overran_hint(member, groups, T0 + 10**6)  # the Job controller's to end
    assert runtime_bound(replace(member, active_deadline_seconds=100), groups) == 100 + KILL_GRACE_SECONDS


def test_a_gang_bounded_by_its_jobs_deadline_backfills():
    # As the "short" pod of the first test, the deadline on its Job instead of on the pod.
    for deadline, backfills in ((169, False), (139, True)):
        queue, snap = reserved_scene()
        fill = replace(group("fill", min_member=2, created=61), job_deadline_seconds=deadline)
        snap = later(snap, 0, *gang_pods("fill", 2, gpu=4, created=61, **JOB), groups=[fill])
        placed = sorted(b.node_name for b in schedule_cycle(snap, queue, CONFIG).bindings)
        assert placed == (["gpu-0", "gpu-1"] if backfills else []), deadline


def test_a_pod_bound_but_not_started_is_expected_to_end_a_bound_from_now():
    groups = {"default/g": group("g", expected_runtime=600)}
    bound = pod("g-0", group="g", node_name="n", phase="Pending")
    assert expected_end(bound, groups) is None
    assert expected_end(bound, groups, now=T0) == T0 + 600
    assert expected_end(pod("g-1", group="g"), groups, now=T0) is None  # not bound: nothing to end


def test_one_pending_pod_backfills_exactly_when_one_alone_would():
    """The woken-gang check keeps each gang's shortest runtime bound (pods
    that end by themselves only) and compares it with the reservation's
    ready time: the same answer as asking ``_backfills`` of each pod alone,
    over deadlines, hints, restart policies and ready times."""
    import random

    from batchsched.core.cycle.order import _one_pod_backfills
    from batchsched.core.cycle.place import backfills as _backfills
    from batchsched.core.gangs import GangIndex
    from batchsched.core.queueing.queue import Reservation

    rng = random.Random(3)
    answers = set()
    for case in range(300):
        hint = rng.choice((None, 60, 600))
        pods = [pod(f"p{i}", gpu=1, group="g", deadline=rng.choice((None, 30, 300, 3000)),
                    restart_policy=rng.choice((None, "Never", "OnFailure", "Always")))
                for i in range(rng.randrange(1, 5))]
        snap = snapshot([node("n0", gpu=8)], pods, [group("g", min_member=len(pods), expected_runtime=hint)],
                        now=rng.choice((0, 100)))
        gang = GangIndex(snap)["default/g"]
        ready_at = rng.choice((None, snap.now + 50, snap.now + 500, snap.now + 5000))
        reservation = rng.choice((None, Reservation("default/other", frozenset({"n0"}), ready_at=ready_at)))
        expected = any(_backfills(snap, (p,), reservation) for p in gang.pending)
        assert _one_pod_backfills(snap, gang, reservation) == expected, case
        assert _one_pod_backfills(snap, gang, reservation) == expected, case  # kept on the gang
        answers.add(expected)
    assert answers == {True, False}
