import random
from collections import Counter

import batchsched.core.placement.fit as fit
from batchsched.core.placement.capacity import CapacityIndex
from batchsched.core.placement.fit import REASON_RESERVED
from batchsched.core.placement.gang import GangPlan, PlanFailure, explain, plan_gang
from tests.unit.helpers import gang_pods, node, pod

GPU = "nvidia.com/gpu"
GPU_TAINT = ("nvidia.com/gpu", "present", "NoSchedule")


def plan(pods, need, nodes, free=None, **kwargs):
    nodes = {n.name: n for n in nodes}
    free = free if free is not None else {name: dict(n.allocatable) for name, n in nodes.items()}
    return plan_gang(pods, need, CapacityIndex(nodes, free), **kwargs), free


def placement(result: GangPlan) -> dict[str, str]:
    return {a.pod.name: a.node_name for a in result.assignments}


def gpu_nodes(count, gpus=8):
    return [node(f"gpu-{i}", cpu="64", memory="512Gi", gpu=gpus) for i in range(count)]


def test_explain_counts_reasons_by_count_then_name():
    assert explain({"b": 4, "a": 4, "c": 8}, 12) == "0/12 nodes are available: 8 c, 4 a, 4 b."
    assert explain({}, 0) == "0/0 nodes are available."


def test_four_whole_node_pods_take_one_node_each():
    result, free = plan(gang_pods("g", 4, gpu=8), 4, gpu_nodes(4))
    assert isinstance(result, GangPlan)
    assert sorted(placement(result).values()) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert all(f[GPU] == 0 for f in free.values())


def test_a_gang_too_big_for_the_room_left_places_nothing_and_its_counts_add_up():
    free_before = {n.name: dict(n.allocatable) for n in gpu_nodes(3)}
    free_before["gpu-2"][GPU] = 4  # other pods hold half of it
    result, free = plan(gang_pods("g", 6, gpu=4), 6, gpu_nodes(3), free={k: dict(v) for k, v in free_before.items()})
    assert isinstance(result, PlanFailure) and not result.never_fits
    assert result.placed == 5
    assert result.message == (
        "Gang default/g needs 6 pods placed at once; the best plan found places 5 (gpu-0: 2, gpu-1: 2, gpu-2: 1); "
        "with 5 of them placed, 0/3 nodes are available for pod g-5: 3 Insufficient nvidia.com/gpu.")
    assert free == free_before  # a failed plan takes nothing


def test_a_gang_too_big_for_the_cluster_even_empty_says_so_without_planning():
    for cluster_total in (None, dict(sum((Counter(n.allocatable) for n in gpu_nodes(4)), Counter()))):
        free_before = {n.name: {**n.allocatable, GPU: 0} for n in gpu_nodes(4)}  # all busy now
        result, free = plan(gang_pods("g", 5, gpu=8), 5, gpu_nodes(4), free={k: dict(v) for k, v in free_before.items()},
                            cluster_total=cluster_total)
        assert isinstance(result, PlanFailure) and result.never_fits and result.placed == 0
        assert result.message == ("Exceeds cluster capacity: gang default/g needs 5 pods placed at once; " + (
            "even with every node empty at most 4 fit: 5 pods like g-0: room for 4 on empty nodes." if cluster_total is None
            else "they ask 40 nvidia.com/gpu, the cluster has 32 allocatable."))
        assert free == free_before


def test_a_pod_no_node_holds_even_empty_is_named_with_every_node_counted():
    nodes = gpu_nodes(2) + [node("t", gpu=16, taints=[GPU_TAINT])]
    result, _ = plan([pod("big", group="g", gpu=16), pod("w", group="g", gpu=1)], 2, nodes)
    assert result.never_fits
    assert result.message == (
        "Exceeds cluster capacity: gang default/g needs 2 pods placed at once; even with every node empty at most "
        "1 fit: pod big: 0/3 nodes could hold one even empty: 2 Insufficient nvidia.com/gpu, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: present}.")
    # a gang that may do without the big pod is not refused
    assert isinstance(plan([pod("big", group="g", gpu=16), pod("w", group="g", gpu=1)], 1, nodes)[0], GangPlan)


def test_failure_counts_every_node_by_its_first_reason():
    nodes = gpu_nodes(8) + [node(f"t-{i}", gpu=8, taints=[GPU_TAINT]) for i in range(4)]
    free = {n.name: dict(n.allocatable) for n in nodes}
    for name in list(free)[:8]:
        free[name][GPU] = 4  # other pods hold half of each untainted node
    result, _ = plan(gang_pods("g", 2, gpu=8), 2, nodes, free)
    assert result.message == (
        "Gang default/g needs 2 pods placed at once; 0/12 nodes are available for pod g-0: "
        "8 Insufficient nvidia.com/gpu, 4 node(s) had untolerated taint {nvidia.com/gpu: present}.")


def test_small_gpu_pods_pack_onto_as_few_nodes_as_possible():
    result, _ = plan(gang_pods("g", 16, gpu=1), 16, gpu_nodes(4))
    assert len(set(placement(result).values())) == 2


def test_the_tightest_node_wins():
    nodes = gpu_nodes(3)
    free = {n.name: dict(n.allocatable) for n in nodes}
    free["gpu-2"][GPU] = 3  # partly used: a 2-GPU pod leaves 1 there
    result, _ = plan([pod("p", gpu=2)], 1, nodes, free)
    assert placement(result) == {"p": "gpu-2"}


def test_a_cpu_heavy_pod_does_not_leave_gpus_without_cpu_behind():
    """gpu-1 is the tighter fit by GPUs (2 left against 3), but this pod
    would leave it 1 core for those 2 GPUs: no pod like it could use them."""
    nodes = gpu_nodes(2)
    free = {n.name: dict(n.allocatable) for n in nodes}
    free["gpu-0"].update({GPU: 4, "cpu": 60_000})
    free["gpu-1"].update({GPU: 3, "cpu": 13_000})
    result, _ = plan([pod("heavy", gpu=1, cpu=12)], 1, nodes, free)
    assert placement(result) == {"heavy": "gpu-0"}
    light, _ = plan([pod("light", gpu=1, cpu=2)], 1, nodes, free)  # leaves 11 cores for 2 GPUs: tightest wins
    assert placement(light) == {"light": "gpu-1"}


def test_cpu_pods_keep_off_gpu_nodes_when_they_can():
    nodes = gpu_nodes(2) + [node("cpu-0", cpu="16")]
    result, _ = plan(gang_pods("g", 3, cpu=2), 3, nodes)
    assert set(placement(result).values()) == {"cpu-0"}


def test_larger_pods_are_placed_first():
    # 4+2+2 GPUs on nodes of 4 and 4: placing a 2 first on either node
    # would leave no room for the 4
    pods = [pod("small-a", group="g", gpu=2), pod("small-b", group="g", gpu=2), pod("big", group="g", gpu=4)]
    result, _ = plan(pods, 3, [node("a", gpu=4), node("b", gpu=4)])
    assert isinstance(result, GangPlan)
    where = placement(result)
    assert where["small-a"] == where["small-b"] != where["big"]


def test_tainted_gpu_nodes_with_toleration_and_node_selector():
    nodes = [node("cpu-0", cpu="64")] + [
        node(f"gpu-{i}", gpu=8, labels={"pool": "gpu"}, taints=[GPU_TAINT]) for i in range(2)]
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    good = gang_pods("g", 2, gpu=8, tolerations=tolerations, node_selector={"pool": "gpu"})
    result, _ = plan(good, 2, nodes)
    assert sorted(placement(result).values()) == ["gpu-0", "gpu-1"]

    intolerant = gang_pods("h", 2, gpu=8, node_selector={"pool": "gpu"})
    free = {n.name: {**n.allocatable, GPU: 0} for n in nodes}  # fits no node now, would fit one empty
    failure, _ = plan(gang_pods("i", 2, gpu=8, tolerations=tolerations, node_selector={"pool": "gpu"}), 2, nodes, free)
    assert failure.reason_counts == {"Insufficient nvidia.com/gpu": 2,
                                     "node(s) didn't match Pod's node affinity/selector": 1}
    never, _ = plan(intolerant, 2, nodes)
    assert never.never_fits and never.message.endswith(
        "2 pods like h-0: 0/3 nodes could hold one even empty: 2 node(s) had untolerated taint "
        "{nvidia.com/gpu: present}, 1 node(s) didn't match Pod's node affinity/selector.")


def test_members_beyond_need_are_added_when_they_fit():
    result, _ = plan(gang_pods("g", 5, cpu=4), 2, [node("a", cpu="8"), node("b", cpu="4")])
    assert isinstance(result, GangPlan)
    assert len(result.assignments) == 3
    assert len(result.unplaced) == 2
    assert "Insufficient cpu" in result.unplaced_message


def test_need_zero_places_what_fits():
    result, _ = plan(gang_pods("g", 2, cpu=100), 0, [node("a")])
    assert isinstance(result, GangPlan) and result.assignments == () and len(result.unplaced) == 2


def test_fewer_pending_than_needed_fails_at_once():
    result, _ = plan(gang_pods("g", 2, cpu=1), 3, [node("a")])
    assert isinstance(result, PlanFailure)
    assert "only 2 are pending" in result.message


def test_reserved_nodes_are_not_used_and_are_explained():
    result, _ = plan(gang_pods("g", 2, gpu=8), 2, gpu_nodes(2), reserved={"gpu-0"})
    assert isinstance(result, PlanFailure)
    assert result.reason_counts == {REASON_RESERVED: 1, "Insufficient nvidia.com/gpu": 1}
    ok, _ = plan(gang_pods("g", 1, gpu=8), 1, gpu_nodes(2), reserved={"gpu-0"})
    assert placement(ok) == {"g-0": "gpu-1"}


def test_earlier_members_taking_a_node_count_as_insufficient():
    nodes = [node("a"), node("b")]
    result, _ = plan(gang_pods("g", 3, cpu=4), 3, nodes, {"a": dict(nodes[0].allocatable),
                                                         "b": {**nodes[1].allocatable, "cpu": 2000}})
    assert not result.never_fits and result.reason_counts == {"Insufficient cpu": 2}


def test_smallest_first_retry_reaches_a_quorum_that_largest_first_misses():
    # need 2 of {8, 3, 3} cpu on one 10-cpu node: only the two small ones fit together
    pods = [pod("big", group="g", cpu=8), pod("s1", group="g", cpu=3), pod("s2", group="g", cpu=3)]
    result, _ = plan(pods, 2, [node("a", cpu="10")])
    assert isinstance(result, GangPlan)
    assert set(placement(result)) == {"s1", "s2"}


def test_identical_pods_run_the_static_filter_once_per_node(monkeypatch):
    calls = Counter()
    original = fit.static_reasons

    def counting(pod, node):
        calls[node.name] += 1
        return original(pod, node)

    monkeypatch.setattr(fit, "static_reasons", counting)
    result, _ = plan(gang_pods("g", 64, gpu=1), 64, gpu_nodes(10))
    assert isinstance(result, GangPlan) and len(result.assignments) == 64
    assert set(calls.values()) == {1}


def test_plans_are_deterministic():
    nodes = gpu_nodes(6)
    first, _ = plan(gang_pods("g", 20, gpu=2, cpu=3), 20, nodes)
    second, _ = plan(list(reversed(gang_pods("g", 20, gpu=2, cpu=3))), 20, list(reversed(nodes)))
    assert placement(first) == placement(second)


def test_random_plans_never_overcommit():
    rng = random.Random(20240101)
    for case in range(150):
        nodes = [node(f"n{i}", cpu=str(rng.randint(1, 16)), memory=str(rng.randint(1, 64) * 2**30),
                      gpu=rng.choice([0, 0, 4, 8]), pods=rng.randint(1, 6),
                      taints=[GPU_TAINT] if rng.random() < 0.2 else [])
                 for i in range(rng.randint(1, 8))]
        shapes = [dict(cpu=rng.randint(1, 8), memory=f"{rng.randint(1, 16)}Gi", gpu=rng.choice([0, 1, 2, 4, 8]))
                  for _ in range(rng.randint(1, 3))]
        pods = [pod(f"p{j}", group="g", **rng.choice(shapes)) for j in range(rng.randint(1, 12))]
        free = {n.name: dict(n.allocatable) for n in nodes}
        for n in nodes:  # other tenants already use some of each node
            free[n.name]["cpu"] -= rng.randint(0, 1000)
        before = {k: dict(v) for k, v in free.items()}
        need = rng.randint(0, len(pods))
        result, after = plan(pods, need, nodes, free)
        if isinstance(result, PlanFailure):
            assert after == before, case
            continue
        assert len(result.assignments) >= need, case
        assert len({a.pod.uid for a in result.assignments}) == len(result.assignments), case
        used: dict[str, Counter] = {n.name: Counter() for n in nodes}
        for a in result.assignments:
            assert not fit.static_reasons(a.pod, next(n for n in nodes if n.name == a.node_name)), case
            used[a.node_name].update(a.pod.requests)
        for name, amounts in used.items():
            for resource, amount in amounts.items():
                assert amount <= max(before[name].get(resource, 0), 0), (case, name, resource)
                assert after[name].get(resource, 0) == before[name].get(resource, 0) - amount, case


def brute_force_counts(pod, nodes, free, reserved) -> Counter:
    counts = Counter()
    for n in nodes:
        static = fit.static_reasons(pod, n)
        counts.update(static or ([REASON_RESERVED] if n.name in reserved else
                                 fit.resource_reasons(pod.requests, free[n.name])))
    return counts


def test_one_index_across_many_gangs_matches_a_fresh_index_every_time():
    rng = random.Random(7)
    for case in range(40):
        nodes = [node(f"n{i}", cpu=str(rng.randint(2, 16)), gpu=rng.choice([0, 4, 8]), pods=rng.randint(1, 8),
                      taints=[GPU_TAINT] if rng.random() < 0.2 else [])
                 for i in range(rng.randint(1, 10))]
        by_name = {n.name: n for n in nodes}
        free = {n.name: dict(n.allocatable) for n in nodes}
        capacity = CapacityIndex(by_name, free)
        for g in range(8):
            shapes = [dict(cpu=rng.randint(1, 6), gpu=rng.choice([0, 1, 2, 4])) for _ in range(rng.randint(1, 2))]
            pods = [pod(f"g{g}-{j}", group=f"g{g}", **rng.choice(shapes)) for j in range(rng.randint(1, 6))]
            need = rng.randint(0, len(pods))
            reserved = {n.name for n in nodes if rng.random() < 0.2}
            before = {k: dict(v) for k, v in free.items()}
            expected = plan_gang(pods, need, CapacityIndex(by_name, {k: dict(v) for k, v in free.items()}),
                                 reserved=reserved)
            result = plan_gang(pods, need, capacity, reserved=reserved)
            assert result == expected, (case, g)
            if isinstance(result, PlanFailure):
                assert free == before, (case, g)
                if len(shapes) == 1 and result.placed == 0 and not result.never_fits:
                    assert result.reason_counts == brute_force_counts(pods[0], nodes, free, reserved)
                continue
            for a in result.assignments:
                assert a.node_name not in reserved
            for name in free:
                for resource, amount in free[name].items():
                    assert amount >= min(before[name].get(resource, 0), 0), (case, g, name, resource)


def test_failure_counts_kept_for_a_reservation_follow_every_commit():
    """Gangs failing one after another against the same reserved set share
    a view's counts; a plan committed between them changes the counts."""
    rng = random.Random(11)
    for case in range(40):
        nodes = [node(f"n{i}", cpu=str(rng.randint(2, 16)), gpu=rng.choice([0, 4, 8]), pods=rng.randint(1, 8))
                 for i in range(rng.randint(2, 10))]
        by_name = {n.name: n for n in nodes}
        free = {n.name: dict(n.allocatable) for n in nodes}
        capacity = CapacityIndex(by_name, free)
        reservations = [frozenset(n.name for n in nodes if rng.random() < 0.3) for _ in range(2)]
        for g in range(12):
            gang = [pod(f"g{g}-{j}", group=f"g{g}", cpu=rng.randint(1, 4), gpu=rng.choice([1, 2, 4]))
                    for j in range(rng.randint(1, 3))]
            probe = [pod(f"probe{g}", group=f"probe{g}", cpu=2, gpu=4)]  # often fits nowhere: counts asked
            for pods in (gang, probe):
                reserved = rng.choice(reservations)
                fresh = CapacityIndex(by_name, {k: dict(v) for k, v in free.items()})
                expected = plan_gang(pods, len(pods), fresh, reserved=reserved)
                assert plan_gang(pods, len(pods), capacity, reserved=reserved) == expected, (case, g)


def test_cordoned_or_not_ready_nodes_still_count_as_room_a_gang_may_get_back():
    nodes = [node("a", gpu=8, unschedulable=True), node("b", gpu=8, ready=False)]
    result, _ = plan(gang_pods("g", 2, gpu=8), 2, nodes)
    assert isinstance(result, PlanFailure) and not result.never_fits
    assert result.reason_counts == {"node(s) were unschedulable": 1, "node(s) were not ready": 1}
    too_big, _ = plan(gang_pods("g", 3, gpu=8), 3, nodes)
    assert too_big.never_fits and too_big.message.endswith("at most 2 fit: 3 pods like g-0: room for 2 on empty nodes.")
