"""Fragmentation-aware node choice (core/placement/fragmentation.py): the
FGD-style score on hand-computed cases, the mix kept in ClusterState, and
keeping NVLink cliques' wholly free nodes for whole-node pods."""
from __future__ import annotations

import dataclasses
import sys

from batchsched.config import SchedulerConfig, validate_config
from batchsched.core.cluster import ClusterState
from batchsched.core.config import CoreConfig
from batchsched.core.cycle import schedule_cycle
from batchsched.core.placement.capacity import CapacityIndex
from batchsched.core.placement.fragmentation import (
    NodeChoice, fragmentation, node_choice, quantized_mix, settled_mix,
)
from batchsched.core.placement.gang import GangPlan, plan_gang
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.topology.accounting import room_of, topology_of
from batchsched.sim.scenario import build_scenario
from tests.unit.test_core_boundary import ROOT
from tests.unit.helpers import gang_pods, group, node, pod, snapshot
from tests.unit.topology_support import fixture, topology_node

GPU = "nvidia.com/gpu"
CLIQUE = "nvidia.com/gpu.clique"
# 3 pods asking 4 GPUs for 1 asking 1: weights 15 and 5 twentieths
MIX = ((1, 5), (4, 15))


def placed_on(nodes, free_gpus: dict[str, int], asked: int, choice: NodeChoice | None) -> str:
    """The node a lone pod asking ``asked`` GPUs goes to."""
    by_name = {n.name: n for n in nodes}
    free = {name: {**n.allocatable, GPU: free_gpus[name]} for name, n in by_name.items()}
    result = plan_gang([pod("p", cpu=1, gpu=asked)], 1, CapacityIndex(by_name, free, choice=choice))
    assert isinstance(result, GangPlan)
    return result.assignments[0].node_name


def gpu_node(name: str, labels=None):
    return node(name, cpu="64", memory="512Gi", gpu=8, labels=labels)


def test_the_mix_is_quantized_in_twentieths_and_drops_shapes_under_half_a_step():
    assert quantized_mix({4: 3, 1: 1}) == MIX
    assert quantized_mix({1: 1, 8: 99}) == ((8, 20),)  # 0.2 of a step
    assert quantized_mix({}) == ()


def test_a_kept_mix_holds_until_the_demand_moves_a_clear_step():
    assert settled_mix({1: 11, 4: 29}, MIX) is MIX  # 5.5 and 14.5 steps: within 0.75 of 5 and 15
    assert settled_mix({1: 13, 4: 27}, MIX) == ((1, 6), (4, 14))  # 6.5 steps: 1.5 away
    assert settled_mix({1: 1, 2: 1, 4: 2}, MIX) == ((1, 5), (2, 5), (4, 10))  # a new shape
    assert settled_mix({}, MIX) == ()


def test_fragment_counts_free_gpus_that_a_shape_asking_more_cannot_use():
    # free 3: the 4-GPU shape (15 steps) cannot use them: 3 x 15; the 1-GPU shape can
    assert [fragmentation(free, MIX) for free in (0, 1, 3, 4, 8)] == [0, 15, 45, 0, 0]
    choice = NodeChoice(MIX)
    assert choice.increase(4, 1) == 45  # 4 free -> 3: now useless to a 4-GPU pod
    assert choice.increase(5, 1) == 0  # 5 -> 4
    assert choice.increase(1, 1) == -15  # 1 -> 0: a useless GPU put to use
    assert choice.increase(8, 4) == 0 and choice.increase(6, 4) == 2 * 15 - 0


def test_a_one_gpu_pod_avoids_breaking_a_four_gpu_hole_that_best_fit_would_take():
    nodes = [gpu_node("a"), gpu_node("b")]
    free = {"a": 4, "b": 5}
    assert placed_on(nodes, free, 1, None) == "a"  # best fit: 3 left rather than 4
    assert placed_on(nodes, free, 1, NodeChoice(MIX)) == "b"  # 4 left still holds a 4-GPU pod
    # a node whose last GPU only a 1-GPU pod can use lowers fragmentation most
    assert placed_on(nodes + [gpu_node("c")], {**free, "c": 1}, 1, NodeChoice(MIX)) == "c"


def test_on_a_known_topology_free_gpus_without_an_aligned_set_are_a_fragment():
    dgx1 = topology_node("d", fixture("dgx1-hybrid-cube-mesh-8gpu.txt"))
    topology, fours = topology_of(dgx1), ((4, 20),)
    # GPUs 0-3 are an NVLink face of the cube in one socket; 1-4 are four free GPUs but no aligned set
    assert fragmentation(4, fours, topology, 0b00001111) == 0
    assert fragmentation(4, fours, topology, 0b00011110) == 4 * 20
    assert fragmentation(4, fours) == 0  # by count alone
    choice = NodeChoice(fours)
    # taking GPU 4 of 0-4 leaves the face: no fragment added; taking GPU 1 of 1-4 frees nothing useful
    assert choice.increase(5, 1, topology, 0b00011111, 0b00001111) == 0
    assert choice.increase(4, 1, topology, 0b00011110, 0b00011100) == 3 * 20 - 4 * 20
    assert choice.increase(4, 1) == 3 * 20  # by count alone: breaks a 4-GPU hole


def test_a_one_gpu_pod_fills_a_hole_no_aligned_set_can_use():
    fixture_text = fixture("dgx1-hybrid-cube-mesh-8gpu.txt")
    nodes = {name: topology_node(name, fixture_text) for name in ("broken", "whole")}
    masks = {"broken": 0b00011110, "whole": 0b00111111}  # 4 free but no aligned 4; 6 free
    free = {name: {**n.allocatable, GPU: bin(masks[name]).count("1")} for name, n in nodes.items()}
    rooms = {name: dataclasses.replace(room_of(n, ()), free=masks[name]) for name, n in nodes.items()}

    def placed(choice):
        index = CapacityIndex(nodes, {k: dict(v) for k, v in free.items()}, rooms=dict(rooms), choice=choice)
        result = plan_gang([pod("p", cpu=1, gpu=1)], 1, index)
        return result.assignments[0].node_name

    # by count the 4 free GPUs of "broken" are a 4-GPU hole worth keeping; they are not
    assert placed(NodeChoice(((4, 20),))) == "broken"
    assert placed(NodeChoice(((1, 1), (4, 19)))) == "broken"


def test_equal_fragmentation_falls_back_to_best_fit():
    nodes = [gpu_node("a"), gpu_node("b"), gpu_node("c")]
    # all three keep their 4-GPU room (increase 0 each); best fit takes the fullest
    assert placed_on(nodes, {"a": 8, "b": 6, "c": 7}, 1, NodeChoice(((4, 20),))) == "b"
    assert placed_on(nodes, {"a": 8, "b": 6, "c": 7}, 2, NodeChoice(())) == "b"


def test_a_partial_pod_keeps_off_wholly_free_clique_nodes_while_a_whole_node_pod_waits():
    nodes = [gpu_node("c-0", {CLIQUE: "A"}), gpu_node("c-1", {CLIQUE: "A"}), gpu_node("plain")]
    free = {"c-0": 8, "c-1": 8, "plain": 8}
    assert placed_on(nodes, free, 2, None) == "c-0"  # a tie on best fit: by name
    assert placed_on(nodes, free, 2, NodeChoice(whole_node_ask=8)) == "plain"
    # a clique node already partly used is fine (and fits best)
    assert placed_on(nodes, {**free, "c-1": 4}, 2, NodeChoice(whole_node_ask=8)) == "c-1"
    # no pod waiting for a whole node, or the pod itself takes a whole node: no preference
    assert placed_on(nodes, free, 2, NodeChoice(whole_node_ask=4)) == "c-0"
    assert placed_on(nodes, free, 8, NodeChoice(whole_node_ask=8)) == "c-0"
    # with only wholly free clique nodes left, the pod still goes
    assert placed_on(nodes[:2], {"c-0": 8, "c-1": 8}, 2, NodeChoice(whole_node_ask=8)) == "c-0"


def test_the_cluster_counts_gpu_asks_of_our_pending_and_every_bound_pod():
    state = ClusterState("batchsched", nodes=[gpu_node("n", {CLIQUE: "A"}), gpu_node("m")])
    pending = pod("pending", gpu=4)
    state.put_pod(pending)
    state.put_pod(pod("theirs-pending", gpu=2, scheduler="default-scheduler"))  # not ours: not counted
    state.put_pod(pod("theirs-bound", gpu=2, scheduler="default-scheduler", node_name="n", phase="Running"))
    state.put_pod(pod("cpu-only", cpu=1))
    state.put_pod(pod("gated", gpu=8, gated=True))
    assert (state.gpu_asks, state.pending_gpu_asks, state.clique_node_gpus) == ({4: 1, 2: 1}, {4: 1}, {8: 1})
    bound = dataclasses.replace(pending, node_name="m", phase="Running")
    state.put_pod(bound)
    assert (state.gpu_asks, state.pending_gpu_asks) == ({4: 1, 2: 1}, {})
    state.put_pod(dataclasses.replace(bound, phase="Succeeded"))
    assert state.gpu_asks == {2: 1}
    state.remove_node("n")
    assert state.clique_node_gpus == {}


def test_node_choice_follows_the_config_and_the_cluster():
    state = ClusterState("batchsched", nodes=[gpu_node("n", {CLIQUE: "A"})])
    for i in range(3):
        state.put_pod(pod(f"big{i}", gpu=8))
    state.put_pod(pod("small", gpu=1, node_name="n", phase="Running"))
    both = CoreConfig(fragmentation_aware=True)
    assert node_choice(state, both) == NodeChoice(((1, 5), (8, 15)), 8)
    assert node_choice(state, CoreConfig(fragmentation_aware=True, keep_cliques_whole=False)) == NodeChoice(
        ((1, 5), (8, 15)), 0)
    assert node_choice(state, CoreConfig()) == NodeChoice((), 8)  # the default: cliques only
    assert node_choice(state, CoreConfig(keep_cliques_whole=False)) is None
    state.remove_node("n")  # no clique: nothing to keep
    assert node_choice(state, both).whole_node_ask == 0
    assert node_choice(state, CoreConfig()) is None


def test_the_config_keys_reach_the_core():
    core = validate_config({"topology": {"fragmentationAware": True, "keepCliquesWhole": False}}).core()
    assert (core.fragmentation_aware, core.keep_cliques_whole) == (True, False)
    default = validate_config({}).core()
    assert (default.fragmentation_aware, default.keep_cliques_whole) == (False, True)


def test_in_a_cycle_a_small_pod_leaves_a_free_clique_node_to_a_waiting_whole_node_gang():
    nodes = [gpu_node("a-0", {CLIQUE: "A"}), gpu_node("a-1", {CLIQUE: "A"}), gpu_node("z")]
    # 4 whole-node pods: they wait (3 nodes), asking every GPU of a node
    pods = gang_pods("big", 4, cpu=1, gpu=8, priority=10) + [pod("small", cpu=1, gpu=2)]
    snap = snapshot(nodes, pods, [group("big", min_member=4)])
    where = {}
    for keep in (True, False):
        config = CoreConfig(keep_cliques_whole=keep, fragmentation_aware=False)
        plan = schedule_cycle(snap, GangQueue.from_config(config), config)
        where[keep] = {b.pod_name: b.node_name for b in plan.bindings}
    assert where == {True: {"small": "z"}, False: {"small": "a-0"}}


def test_the_benchmarks_clique_cluster_puts_dgx1_and_h100_nodes_in_cliques_of_four():
    sys.path.insert(0, str(ROOT / "bench"))
    import fragmentation_sim

    groups = build_scenario().cluster
    cliques = fragmentation_sim.clique_cluster(groups)
    assert sum(g.count for g in cliques) == sum(g.count for g in groups) == 40
    labelled = {g.name: (g.count, g.labels.get(CLIQUE)) for g in cliques if CLIQUE in g.labels}
    assert labelled == {name: (4, name) for name in ("dgx1-c0", "dgx1-c1", "h100-c0", "h100-c1")}
    config = fragmentation_sim.with_choice(SchedulerConfig(), True, False).core()
    assert (config.fragmentation_aware, config.keep_cliques_whole) == (True, False)


def test_the_clique_rule_keys_on_the_clique_node_sizes_a_waiting_pod_could_take():
    """Asks of 8, 9 or 999 GPUs protect 8-GPU clique nodes alike (one kept
    index); asks below every clique node's size protect nothing."""
    config = CoreConfig()
    state = ClusterState("batchsched", nodes=[gpu_node("n", {CLIQUE: "A"})])
    asks = []
    for gpus in (3, 8, 9, 999):
        state.put_pod(pod(f"p{gpus}", gpu=gpus))
        choice = node_choice(state, config)
        asks.append(choice.whole_node_ask if choice else 0)
    assert asks == [0, 8, 8, 8]
