"""The GPU chooser is exactly the exhaustive optimum, on every topology."""
from __future__ import annotations

import random

import pytest

from batchsched.core.topology.choose import (
    NO_LINK, choose_exhaustive, choose_gpus, evaluate, gpus_of, has_clique, mask_of,
)
from batchsched.core.topology.parse import parse_topo
from tests.unit.topology_support import FIXTURE_NAMES, fixture


def numa_masks(topology) -> list[int]:
    return [mask_of(g.index for g in topology.gpus if g.numa in (node.id, None)) for node in topology.numa_nodes]


def free_sets(topology, rng: random.Random) -> list[int]:
    """The whole node and many random free sets (16-GPU nodes: at most 11
    free GPUs, so that the brute force stays quick)."""
    n = len(topology)
    everyone = (1 << n) - 1
    if n <= 8:
        return [everyone] + [rng.getrandbits(n) for _ in range(60)]
    return [mask_of(rng.sample(range(n), rng.randint(3, 11))) for _ in range(25)]


def check_against_exhaustive(topology, seed: int) -> int:
    rng = random.Random(seed)
    checked = 0
    for free in free_sets(topology, rng):
        for k in range(1, bin(free).count("1") + 1):
            assert choose_gpus(topology, free, k) == choose_exhaustive(topology, free, k), (gpus_of(free), k)
            checked += 1
        allowed = rng.choice(numa_masks(topology) or [free])
        for k in range(1, bin(free & allowed).count("1") + 1):
            assert choose_gpus(topology, free, k, allowed) == choose_exhaustive(topology, free, k, allowed)
            checked += 1
    return checked


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_optimal_on_every_project_fixture(name):
    assert check_against_exhaustive(fixture(name), seed=len(name)) > 50


def test_optimal_on_whole_16_gpu_nodes_for_the_hard_sizes():
    for name in FIXTURE_NAMES:
        topology = fixture(name)
        if len(topology) == 16:
            for k in (2, 5, 8, 14):
                assert choose_gpus(topology, 0xFFFF, k) == choose_exhaustive(topology, 0xFFFF, k), (name, k)


def test_optimal_on_every_shared_capture(shared_dir):
    paths = sorted((shared_dir / "data" / "topologies").glob("*.txt"))
    for seed, path in enumerate(paths):
        assert check_against_exhaustive(parse_topo(path.read_text()), seed) > 0, path.name


def test_dgx1_four_gpus_are_an_nvlink_quad_in_one_numa_node():
    topology = fixture("dgx1-hybrid-cube-mesh-8gpu.txt")
    choice = choose_gpus(topology, 0xFF, 4)
    assert choice.gpus == (0, 1, 2, 3)
    assert all(topology.link(i, j).is_nvlink for i in choice.gpus for j in choice.gpus if i < j)
    assert choice.numa_nodes == 1
    assert choose_gpus(topology, 0xFF, 2).gpus == (0, 3)  # an NV2 pair


def test_partly_used_nvlink_pairs_still_yield_an_nvlink_pair():
    topology = fixture("dgx1-hybrid-cube-mesh-8gpu.txt")
    free = mask_of([3, 5, 6, 7])  # the lowest two, 3 and 5, are joined by SYS only
    choice = choose_gpus(topology, free, 2)
    assert str(topology.link(*choice.gpus)) == "NV2"
    # of the two NV2 pairs, {5,6} leaves the NV1 pair {3,7} behind, {6,7} only SYS
    assert choice.gpus == (5, 6)


def test_what_is_left_behind_breaks_ties():
    topology = fixture("pcie-switch-pairs-8gpu.txt")
    assert choose_gpus(topology, mask_of([0, 1, 2]), 1).gpus == (2,)  # keep the PIX pair 0-1 whole
    assert choose_gpus(topology, 0xFF, 1).gpus == (0,)  # all alike: the lowest index


def test_objective_fields():
    topology = fixture("pcie-switch-pairs-8gpu.txt")
    choice = evaluate(topology, (0, 1), mask_of([0, 1, 2]))
    assert (choice.worst, choice.gbps, choice.numa_nodes, choice.leftover_gbps) == (5, 22, 1, 0)
    assert evaluate(topology, (4,), 0xFF).worst == NO_LINK


def test_nothing_to_choose():
    topology = fixture("pcie-switch-pairs-8gpu.txt")
    assert choose_gpus(topology, mask_of([0, 1]), 3) is None
    assert choose_gpus(topology, 0xFF, 2, allowed=mask_of([5])) is None
    assert choose_gpus(topology, 0xFF, 0) is None


def test_answers_are_cached_per_topology_free_set_and_size():
    topology = fixture("synthetic-2x-cube-mesh-16gpu.txt")
    first = choose_gpus(topology, 0xFFFF, 8)
    assert choose_gpus(topology, 0xFFFF, 8) is first
    assert choose_gpus(topology, 0xFFFF, 7) is not first


def test_has_clique_agrees_with_networkx_on_random_graphs():
    import networkx as nx
    rng = random.Random(17)
    for _ in range(300):
        n = rng.randint(1, 12)
        graph = nx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from((i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < rng.random())
        linked = [mask_of(graph.neighbors(i)) for i in range(n)]
        among = rng.getrandbits(n) or 1
        largest = max(len(c) for c in nx.find_cliques(graph.subgraph(gpus_of(among))))
        for k in range(1, n + 2):
            assert has_clique(linked, among, k) == (k <= largest), (n, sorted(graph.edges), among, k)
