"""The node annotation: versioned compact JSON, read once per node change."""
from __future__ import annotations

import json

import pytest

from batchsched.api import constants
from batchsched.core.topology.annotation import from_annotation, from_document, to_annotation, to_document
from batchsched.core.topology.model import Gpu, GpuTopology, Link, Nic, NumaNode, TopologyError
from batchsched.core.topology.parse import parse_topo
from tests.unit.topology_support import FIXTURE_NAMES, fixture, topology_node


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_round_trip_of_every_fixture(name):
    topology = fixture(name)
    text = to_annotation(topology)
    assert from_annotation(text) == topology
    assert text == json.dumps(json.loads(text), separators=(",", ":"))  # compact


def test_round_trip_of_every_shared_capture(shared_dir):
    for path in sorted((shared_dir / "data" / "topologies").glob("*.txt")):
        topology = parse_topo(path.read_text(), {0: 2**38})
        assert from_annotation(to_annotation(topology)) == topology, path.name


def test_schema_version_1_by_example():
    topology = GpuTopology(
        gpus=(Gpu(0, 0, frozenset({0, 1}), uuid="GPU-a", pci_bus_id="00000000:07:00.0"), Gpu(1, 0, frozenset({0, 1})),
              Gpu(2)),
        links=((None, Link("NV", 2), Link("SYS")), (Link("NV", 2), None, Link("PIX")),
               (Link("SYS"), Link("PIX"), None)),
        nics=(Nic("mlx5_0", (Link("PIX"), None, Link("SYS"))),),
        numa_nodes=(NumaNode(0, frozenset({0, 1}), 2**30),),
    )
    document = {
        "version": 1,
        "gpus": [{"index": 0, "numa": 0, "cpus": "0-1", "uuid": "GPU-a", "pciBusId": "00000000:07:00.0"},
                 {"index": 1, "numa": 0, "cpus": "0-1"}, {"index": 2}],
        "links": ["NV2 SYS", "PIX"],
        "nics": [{"name": "mlx5_0", "links": "PIX - SYS"}],
        "numa": [{"id": 0, "cpus": "0-1", "memory": 2**30}],
    }
    assert to_document(topology) == document
    assert from_document({**document, "someFutureKey": True}) == topology
    del document["numa"]
    with pytest.raises(TopologyError, match=r"NUMA node\(s\) \[0\] of some GPU are not declared"):
        from_document(document)


def test_the_same_annotation_is_parsed_once_and_shared():
    text = to_annotation(fixture("dgx1-hybrid-cube-mesh-8gpu.txt"))
    assert from_annotation(text) is from_annotation(text)
    a, b = topology_node("a", annotation=text), topology_node("b", annotation=text)
    assert a.topology is b.topology and a.topology_error == ""


@pytest.mark.parametrize("change, problem", [
    (lambda d: "{not json", "not JSON"),
    (lambda d: [], "must be a JSON object"),
    (lambda d: {**d, "version": 2}, "version 2 is not supported (this reads version 1)"),
    (lambda d: {**d, "gpus": []}, "gpus must be a non-empty list"),
    (lambda d: {**d, "links": d["links"][:-1]}, "links must be a list of 7 strings"),
    (lambda d: {**d, "links": ["NV1"] + d["links"][1:]}, "links[0] must list 7 links"),
    (lambda d: {**d, "links": ["NV1 NV1 NV2 NV2 SYS SYS BAD"] + d["links"][1:]}, "unknown link class 'BAD'"),
    (lambda d: {**d, "gpus": [{**d["gpus"][0], "index": 3}] + d["gpus"][1:]}, "gpus[0].index must be 0"),
    (lambda d: {**d, "gpus": [{**d["gpus"][0], "numa": -1}] + d["gpus"][1:]}, "gpus[0].numa must be a non-negative"),
    (lambda d: {**d, "nics": [{"name": "mlx5_0", "links": "PIX"}]}, "nics[0].links must list 8 links"),
    (lambda d: {**d, "numa": [{"cpus": "0-3"}]}, "numa[0].id is missing"),
])
def test_a_broken_annotation_is_an_error_saying_what_is_wrong(change, problem):
    document = to_document(fixture("dgx1-hybrid-cube-mesh-8gpu.txt"))
    changed = change(document)
    text = changed if isinstance(changed, str) else json.dumps(changed)
    with pytest.raises(TopologyError) as caught:
        from_annotation(text)
    assert problem in str(caught.value)


def test_a_node_with_a_broken_annotation_is_flat_and_says_why():
    node = topology_node("n1", annotation='{"version": 9}')
    assert node.topology is None
    assert node.topology_error == (f"node n1: annotation {constants.GPU_TOPOLOGY_ANNOTATION} is invalid: "
                                   "version 9 is not supported (this reads version 1)")
    assert topology_node("n2").topology is None and topology_node("n2").topology_error == ""


def test_an_annotation_with_fewer_gpus_than_the_node_allocates_is_not_used():
    node = topology_node("n", fixture("pcie-switch-pairs-8gpu.txt"), gpus=16)
    assert node.topology is None
    assert "describes 8 GPUs but the node allocates 16 nvidia.com/gpu" in node.topology_error
    # fewer allocatable than described (a GPU fell off the bus, its capacity
    # still counts it): the topology stays usable
    assert topology_node("m", fixture("pcie-switch-pairs-8gpu.txt"), gpus=7, capacity=8).topology is not None


def test_an_annotation_with_more_gpus_than_the_node_has_is_not_used():
    for capacity in (None, 7):  # capacity absent: allocatable is all the node has
        node = topology_node("n", fixture("pcie-switch-pairs-8gpu.txt"), gpus=7, capacity=capacity)
        assert node.topology is None
        assert "describes 8 GPUs, more than the node has: 7 nvidia.com/gpu" in node.topology_error


def test_shared_gpus_are_counted_per_replica_and_mig_nodes_by_the_bounds_only():
    topology = fixture("pcie-switch-pairs-8gpu.txt")
    replicas = {constants.GPU_REPLICAS_LABEL: "4"}
    assert topology_node("r", topology, gpus=32, labels=replicas).topology_error == ""
    assert "describes 8 GPUs, more than the node has: 28 nvidia.com/gpu (4 replicas per GPU)" in \
        topology_node("r", topology, gpus=28, labels=replicas).topology_error
    time_sliced = {constants.GPU_SHARING_STRATEGY_LABEL: "time-slicing"}  # shares per GPU unknown
    assert topology_node("t", topology, gpus=80, labels=time_sliced).topology_error == ""
    mig = {constants.MIG_STRATEGY_LABEL: "single"}  # nvidia.com/gpu counts MIG devices
    assert topology_node("m", topology, gpus=56, labels=mig).topology_error == ""
