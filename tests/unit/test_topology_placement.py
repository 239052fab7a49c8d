"""GPU ids, NUMA, topology policies and domains in the cycle and the gang planner."""
from __future__ import annotations

import dataclasses

import pytest

from batchsched.api import constants
from batchsched.core.config import CoreConfig
from batchsched.core.cycle import schedule_cycle
from batchsched.core.explain import explain_gang, gpu_rooms
from batchsched.core.model import GroupSpec, TopologyPolicy
from batchsched.core.readers import group_from_json
from batchsched.core.placement.gpus import REASON_NO_NUMA_FIT, REASON_NO_NVLINK_SET, REASON_SHARED_GPUS
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.topology.accounting import numa_capacity, room_of
from batchsched.core.topology.choose import gpus_of
from tests.unit.helpers import gang_pods, pod, snapshot, stamp
from tests.unit.topology_support import fixture, topology_node

GPU = constants.GPU_RESOURCE
DGX1 = "dgx1-hybrid-cube-mesh-8gpu.txt"
PCIE = "pcie-switch-pairs-8gpu.txt"
NVSWITCH16 = "synthetic-nvswitch-16gpu-4numa.txt"


def dgx1(name="dgx", **kwargs):
    return topology_node(name, fixture(DGX1), **kwargs)


def pcie(name="pcie", **kwargs):
    return topology_node(name, fixture(PCIE), **kwargs)


def group(name: str, min_member: int, policy: dict | None = None) -> GroupSpec:
    return group_from_json({"metadata": {"name": name, "namespace": "default", "creationTimestamp": stamp(0),
                                         "generation": 1},
                            "spec": {"minMember": min_member, **({"topologyPolicy": policy} if policy else {})}})


def run(nodes, pods, groups=(), config=CoreConfig()):
    return schedule_cycle(snapshot(nodes, pods, groups), GangQueue.from_config(config), config)


def placed(plan) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {b.pod_name: (b.node_name, b.gpu_ids) for b in plan.bindings}


def bind(pods, plan):
    """The pods as the next cycle sees them once the plan's bindings are assumed."""
    by_uid = {b.pod_uid: b for b in plan.bindings}
    return [dataclasses.replace(p, node_name=by_uid[p.uid].node_name, gpu_ids=by_uid[p.uid].gpu_ids)
            if p.uid in by_uid else p for p in pods]


# ---- accounting -------------------------------------------------------------


def test_rooms_are_rebuilt_from_gpu_id_annotations_and_unknown_ids_only_count():
    nodes = [dgx1()]
    pods = [pod("ours", gpu=2, node_name="dgx", gpu_ids="0,3"),
            pod("theirs", gpu=2, node_name="dgx", scheduler="default-scheduler"),  # no ids: unknown identity
            pod("bogus", gpu=1, node_name="dgx", gpu_ids="9"),  # out of range: unknown identity
            pod("twice", gpu=1, node_name="dgx", gpu_ids="3"),  # already named by "ours"
            pod("greedy", gpu=1, node_name="dgx", gpu_ids="5,6"),  # names more than it asks: first one counts
            pod("done", gpu=2, node_name="dgx", gpu_ids="1,2", phase="Succeeded")]
    snap = snapshot(nodes, pods)
    assert gpus_of(gpu_rooms(snap)["dgx"].free) == (1, 2, 4, 6, 7)
    assert snap.free_by_node()["dgx"][GPU] == 1  # counts stay exact: 2 + 2 + 1 + 1 + 1 used
    gone = room_of(nodes[0], [p for p in pods if p.holds_resources and p.name != "ours"])
    assert gpus_of(gone.free) == (0, 1, 2, 4, 6, 7)  # without "ours", "twice" names GPU 3


def test_nodes_without_topology_hand_out_ids_by_count_and_shared_or_mig_nodes_none():
    shared = topology_node("shared", gpus=8, labels={constants.GPU_SHARING_STRATEGY_LABEL: "time-slicing"})
    replicas = topology_node("replicas", gpus=32, labels={constants.GPU_REPLICAS_LABEL: "4"})
    mig = topology_node("mig", gpus=0, extra={"nvidia.com/mig-1g.10gb": "14"})
    flat = topology_node("flat", gpus=4)
    rooms = gpu_rooms(snapshot([shared, replicas, mig, flat, dgx1("topo", labels={
        constants.GPU_SHARING_STRATEGY_LABEL: "mps"})]))
    assert set(rooms) == {"flat"} and gpus_of(rooms["flat"].free) == (0, 1, 2, 3)


def test_numa_cpu_and_memory_follow_the_pods_gpus():
    node = pcie(cpu="64", memory="64Gi")  # NUMA 0 and 1 own half the CPUs each
    assert numa_capacity(node) == {0: {"cpu": 32000, "memory": 32 * 2**30}, 1: {"cpu": 32000, "memory": 32 * 2**30}}
    pods = [pod("gpu-pod", cpu=4, memory="8Gi", gpu=2, node_name="pcie", gpu_ids="4,5"),
            pod("cpu-pod", cpu=2, memory="2Gi", node_name="pcie")]  # no GPUs: spread by share
    room = gpu_rooms(snapshot([node], pods))["pcie"]
    assert room.numa_free == {0: {"cpu": 31000, "memory": 31 * 2**30}, 1: {"cpu": 27000, "memory": 23 * 2**30}}


# ---- choosing GPUs in the cycle ---------------------------------------------------------


def test_a_four_gpu_pod_gets_an_nvlink_quad_in_one_numa_node():
    plan = run([pcie(), dgx1()], [pod("p", gpu=4, cpu=1)])
    assert placed(plan) == {"p": ("dgx", (0, 1, 2, 3))}


def test_a_two_gpu_pod_gets_an_nvlink_pair_on_a_partly_used_node():
    used = [pod(f"u{g}", gpu=1, node_name="dgx", gpu_ids=str(g)) for g in (0, 1, 2, 4)]
    plan = run([dgx1()], used + [pod("p", gpu=2)])
    node, gpus = placed(plan)["p"]
    assert gpus == (5, 6) and fixture(DGX1).link(*gpus).is_nvlink


def test_ids_are_never_handed_out_twice_in_a_cycle_or_across_cycles():
    nodes = [dgx1("a"), pcie("b"), topology_node("flat", gpus=8)]
    pods = ([pod("other", gpu=3, node_name="flat", scheduler="default-scheduler")]
            + [pod(f"one-{i}", gpu=1, created=i) for i in range(9)]
            + [pod(f"two-{i}", gpu=2, created=10 + i) for i in range(5)])
    taken: dict[str, list[int]] = {"a": [], "b": [], "flat": []}
    for _ in range(2):  # the second cycle places what the first left, on top of the assumed bindings
        plan = run(nodes, pods, config=CoreConfig(max_gangs_per_cycle=8))
        for b in plan.bindings:
            assert len(b.gpu_ids) == next(p.requests[GPU] for p in pods if p.uid == b.pod_uid)
            taken[b.node_name] += b.gpu_ids
        pods = bind(pods, plan)
    assert sum(len(v) for v in taken.values()) == 9 + 10
    for name, ids in taken.items():
        assert len(ids) == len(set(ids)), f"{name} handed out an id twice: {sorted(ids)}"
    assert len(taken["flat"]) <= 5  # the other scheduler's 3 GPUs count, ids unknown


def test_a_node_without_topology_gives_the_lowest_free_ids():
    pods = [pod("ours", gpu=2, node_name="flat", gpu_ids="0,2"), pod("p", gpu=3)]
    assert placed(run([topology_node("flat", gpus=8)], pods)) == {"p": ("flat", (1, 3, 4))}


def test_set_quality_comes_before_packing_and_packing_breaks_ties():
    # prefer-nvlink: a whole DGX-1 (NV2 pair) beats a partly used PCIe node (PIX pair)
    used = [pod("u", gpu=6, node_name="pcie", gpu_ids="0,1,2,3,4,5")]
    assert placed(run([dgx1(), pcie()], used + [pod("p", gpu=2)]))["p"][0] == "dgx"
    # any: packing alone
    plan = run([dgx1(), pcie()], used + [pod("p", gpu=2, group="g")], [group("g", 1, {"gpuLink": "any"})])
    assert placed(plan)["p"] == ("pcie", (6, 7))
    # equal quality (NVSwitch): the partly used node first, so whole nodes stay whole
    nvswitch = fixture(NVSWITCH16)
    nodes = [topology_node("whole", nvswitch), topology_node("part", nvswitch)]
    plan = run(nodes, [pod("u", gpu=4, node_name="part", gpu_ids="0,1,2,3"), pod("p", gpu=4)])
    assert placed(plan)["p"] == ("part", (4, 5, 6, 7))


def test_require_nvlink_refuses_pcie_and_unknown_topologies():
    pods = gang_pods("g", 1, gpu=2)
    plan = run([pcie(), topology_node("flat", gpus=8)], pods, [group("g", 1, {"gpuLink": "require-nvlink"})])
    assert plan.bindings == []
    # not even on the empty nodes: no NVLink pair on either
    assert plan.verdicts["default/g"].reason == "ExceedsClusterCapacity"
    assert plan.verdicts["default/g"].message.endswith(
        f"pod g-0: 0/2 nodes could hold one even empty: 2 {REASON_NO_NVLINK_SET}.")
    snap = snapshot([pcie(), topology_node("flat", gpus=8)], pods, [group("g", 1, {"gpuLink": "require-nvlink"})])
    assert explain_gang(snap, "default/g").verdict == plan.verdicts["default/g"].message
    plan = run([pcie(), dgx1()], pods, [group("g", 1, {"gpuLink": "require-nvlink"})])
    assert placed(plan) == {"g-0": ("dgx", (0, 3))}


def test_single_numa_node_keeps_gpus_cpu_and_memory_in_one_numa_node():
    used = [pod("u", gpu=4, node_name="pcie", gpu_ids="0,1,4,5")]  # 2 free GPUs per NUMA node
    pods = used + gang_pods("g", 1, gpu=4, cpu=1)
    plan = run([pcie()], pods, [group("g", 1, {"numa": "single-numa-node"})])
    assert plan.bindings == [] and f"1 {REASON_NO_NUMA_FIT}" in plan.verdicts["default/g"].message
    assert placed(run([pcie()], pods, [group("g", 1)]))["g-0"] == ("pcie", (2, 3, 6, 7))  # none: across NUMA
    # GPUs free in NUMA 0, but its CPUs taken: NUMA 1 it is
    busy = [pod("cpu-hog", cpu=31, gpu=1, node_name="pcie", gpu_ids="0")]
    plan = run([pcie(cpu="64")], busy + gang_pods("g", 1, gpu=2, cpu=4), [group("g", 1, {"numa": "single-numa-node"})])
    assert placed(plan)["g-0"] == ("pcie", (4, 5))


def test_a_node_declaring_the_single_numa_node_policy_enforces_it_for_every_pod():
    label = {constants.TOPOLOGY_MANAGER_POLICY_LABEL: "single-numa-node"}
    used = [pod("u", gpu=4, node_name="pcie", gpu_ids="0,1,4,5")]
    plan = run([pcie(labels=label)], used + [pod("p", gpu=4)])
    assert plan.bindings == [] and REASON_NO_NUMA_FIT in plan.verdicts["default/pod:p"].message


def test_exclusive_gangs_stay_off_shared_gpus_and_others_get_them_by_count():
    shared = pcie("shared", labels={constants.GPU_SHARING_STRATEGY_LABEL: "time-slicing"})
    plan = run([shared], gang_pods("g", 1, gpu=1), [group("g", 1, {"exclusiveGpus": True})])
    assert plan.bindings == [] and f"1 {REASON_SHARED_GPUS}" in plan.verdicts["default/g"].message
    assert placed(run([shared], gang_pods("g", 1, gpu=1), [group("g", 1)])) == {"g-0": ("shared", ())}


def test_mig_profiles_are_scheduled_by_count_per_profile():
    mig = topology_node("mig", gpus=0, extra={"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"})
    pods = [pod(f"small-{i}", extra_limits={"nvidia.com/mig-1g.10gb": "3"}, created=i) for i in range(3)]
    pods += [pod("big", extra_limits={"nvidia.com/mig-3g.40gb": "2"}, created=5)]
    plan = run([mig], pods)
    assert placed(plan) == {"small-0": ("mig", ()), "small-1": ("mig", ()), "big": ("mig", ())}
    assert "Insufficient nvidia.com/mig-1g.10gb" in plan.verdicts["default/pod:small-2"].message


# ---- domains -------------------------------------------------------------------------


def clique(name: str, domain: str, **kwargs):
    return topology_node(name, fixture(DGX1), labels={constants.GPU_CLIQUE_LABEL: domain, **kwargs})


DOMAINS = [clique("a1", "A"), clique("a2", "A"), clique("b1", "B"), clique("b2", "B"), clique("b3", "B")]


@pytest.mark.parametrize("size, domain", [(2, "a"), (3, "b")])
def test_a_required_domain_takes_the_smallest_that_fits(size, domain):
    plan = run(DOMAINS, gang_pods("g", size, gpu=8), [group("g", size, {"domain": {"mode": "required"}})])
    assert sorted(node[0] for node, _ in placed(plan).values()) == [domain] * size


def test_a_required_domain_places_the_gang_inside_one_or_not_at_all():
    plan = run(DOMAINS, gang_pods("g", 4, gpu=8), [group("g", 4, {"domain": {"mode": "required"}})])
    assert plan.bindings == []
    assert plan.verdicts["default/g"].message == (
        "Gang default/g needs 4 pods placed at once inside one domain: no domain (nvidia.com/gpu.clique) "
        "has 32 free GPUs.")
    plan = run(DOMAINS, gang_pods("g", 4, gpu=8), [group("g", 4, {"domain": {"mode": "preferred"}})])
    assert len(plan.bindings) == 4  # preferred: any nodes when no domain fits


def test_a_domain_label_of_the_podgroup_and_members_added_later_stay_in_the_domain():
    nodes = [dgx1(f"r{i}", labels={"rack": "r1" if i < 2 else "r2"}) for i in range(4)]
    spec = {"domain": {"mode": "required", "labelKey": "rack"}}
    pods = gang_pods("g", 3, gpu=4)
    bound = [dataclasses.replace(pods[0], node_name="r2", gpu_ids=(0, 1, 2, 3))]
    plan = run(nodes, bound + pods[1:], [group("g", 1, spec)])
    assert {node for node, _ in placed(plan).values()} <= {"r2", "r3"}
    no_label = run(nodes, pods, [group("g", 3, {"domain": {"mode": "required", "labelKey": "spine"}})])
    assert "no node carries the domain label spine" in no_label.verdicts["default/g"].message


def test_configured_domain_labels_are_tried_smallest_kind_first():
    nodes = [clique(f"n{i}", f"c{i // 2}", rack="r0") for i in range(4)]  # cliques of 2 nodes, one rack of 4
    config = CoreConfig(domain_labels=(constants.GPU_CLIQUE_LABEL, "rack"))
    plan = run(nodes, gang_pods("g", 3, gpu=8), [group("g", 3, {"domain": {"mode": "required"}})], config)
    assert len(plan.bindings) == 3  # no clique holds 3 whole nodes; the rack does


def test_reservations_plan_with_gpu_ids_and_domains():
    config = CoreConfig(reservation_after_seconds=0)
    spec = {"domain": {"mode": "required"}}
    hog = [pod("hog", gpu=8, node_name="a1", gpu_ids="0,1,2,3,4,5,6,7", created=-10, restart_policy="Never")]
    queue = GangQueue.from_config(config)
    for now in (5, 10):  # the second cycle finds the gang waiting
        snap = snapshot(DOMAINS[:2], hog + gang_pods("g", 2, gpu=8), [group("g", 2, spec)], now=now)
        assert schedule_cycle(snap, queue, config).bindings == []
    assert queue.reservation.gang_key == "default/g"
    assert queue.reservation.nodes == {"a1", "a2"}  # domain A, once the hog on a1 is gone


# ---- the PodGroup's policy -------------------------------------------------------------


def test_topology_policy_is_read_from_the_podgroup():
    assert group("g", 1).topology == TopologyPolicy()
    spec = {"numa": "single-numa-node", "gpuLink": "require-nvlink", "exclusiveGpus": True,
            "domain": {"mode": "preferred", "labelKey": "rack"}}
    assert group("g", 1, spec).topology == TopologyPolicy("single-numa-node", "require-nvlink", True, "preferred",
                                                          ("rack",))


@pytest.mark.parametrize("spec, problem", [
    ({"numa": "strict"}, "spec.topologyPolicy.numa: Input should be 'none', 'best-effort' or 'single-numa-node'"),
    ({"gpuLink": "nvlink"}, "spec.topologyPolicy.gpuLink: Input should be 'any', 'prefer-nvlink' or 'require-nvlink'"),
    ({"exclusiveGpus": "yes"}, "spec.topologyPolicy.exclusiveGpus: Input should be a valid boolean"),
    ({"domain": {"mode": "hard"}}, "spec.topologyPolicy.domain.mode: Input should be 'required' or 'preferred'"),
    ({"domain": {"mode": "required", "labelKey": 3}}, "spec.topologyPolicy.domain.labelKey: Input should be a valid string"),
])
def test_a_bad_topology_policy_makes_the_podgroup_invalid(spec, problem):
    with pytest.raises(ValueError, match=problem):
        group("g", 1, spec)



@pytest.mark.parametrize("kept", [None, 3], ids=["charges-kept", "charges-start-over-every-three"])
def test_a_pod_spread_over_numa_nodes_is_charged_each_share_rounded_down(monkeypatch, kept):
    """A pod naming no GPU set has its cpu and memory charged to every NUMA
    node by its share, each rounded down on its own; the kept charges (per
    capacity and request) give exactly that, for rooms taken and given back
    in any order, across nodes whose NUMA capacities differ, also where the
    kept charges start over every three."""
    import random

    from batchsched.core.topology import accounting
    from batchsched.core.topology.accounting import GpuRoom

    if kept is not None:
        monkeypatch.setattr(accounting, "SPREADS_KEPT", kept)

    rng = random.Random(13)
    capacities = [{0: {"cpu": 48_000, "memory": 256 << 30}, 1: {"cpu": 48_000, "memory": 256 << 30}},
                  {0: {"cpu": 31_000, "memory": 100 << 30}, 1: {"cpu": 33_000, "memory": 156 << 30},
                   2: {"cpu": 7, "memory": 3}},
                  {0: {"cpu": 0, "memory": 64 << 30}}]
    for capacity in capacities:
        room = expected = GpuRoom(0, capacity, capacity)
        for _ in range(200):
            request = {"cpu": rng.choice((1, 250, 1000, 3333)), "memory": rng.choice((1, 1 << 30, 12345678))}
            take = rng.random() < 0.6
            room = room.take((), request, None) if take else room.give((), request, None)
            totals = {r: sum(c[r] for c in capacity.values()) for r in ("cpu", "memory")}
            sign = -1 if take else 1
            expected = GpuRoom(0, {n: {r: expected.numa_free[n][r] + sign * (request[r] * c[r] // totals[r] if totals[r]
                                                                          else 0)
                                       for r in ("cpu", "memory")} for n, c in capacity.items()}, capacity)
            assert room == expected
