"""GPUDirect RDMA for gangs of several pods (docs/topology.md, "NICs"): on
the real captures with NICs in ../shared (skipped without it)."""
import dataclasses

import pytest

from batchsched.api import constants
from batchsched.core.explain import explain_gang
from batchsched.core.model import TopologyPolicy
from batchsched.core.placement.gpus import pick_gpus
from batchsched.core.topology.accounting import room_of
from batchsched.core.topology.parse import parse_topo
from batchsched.sim.cluster import NodeGroup, build_nodes
from batchsched.sim.engine import Simulation
from batchsched.sim.policies import BatchschedPolicy
from batchsched.sim.workload import Job
from tests.unit.helpers import gang_pods, group, pod, snapshot
from tests.unit.topology_support import SHARED_TOPOLOGIES, topology_node

GANG = TopologyPolicy(rdma=True)  # as the cycle makes it for a gang of several pods


def capture(name: str):
    path = SHARED_TOPOLOGIES / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared captures live outside the repository)")
    return parse_topo(path.read_text())


def dgx_a100():
    return capture("dgx-a100-8gpu-nv12-10nic-multinuma.txt")


def without_first_nics(topology):
    """The DGX A100 with the NICs of GPUs 0-3 gone (mlx5_0..3 not reported):
    only GPUs 4-7 keep a NIC at PXB."""
    return dataclasses.replace(topology, nics=topology.nics[4:])


def test_which_gpus_have_a_nic_at_pix_or_pxb_on_the_real_captures():
    assert dgx_a100().rdma_gpus == 0b1111_1111  # a PXB NIC pair per GPU pair
    assert capture("dgx1-v100-8gpu-nv1-nv2-mlx5-ucxpy.txt").rdma_gpus == 0b1111_1111  # PIX
    assert capture("baobab-8x-rtx-a6000-nv4-pairs-2numa.txt").rdma_gpus == 0  # PHB and NODE only
    assert capture("h100-sxm-8gpu-nv18-2numa-mlengineering.txt").rdma_gpus == 0  # no NIC in the capture
    assert without_first_nics(dgx_a100()).rdma_gpus == 0b1111_0000


@pytest.mark.parametrize("k, plain, served", [(1, (0,), (4,)), (2, (0, 1), (4, 5)), (4, (0, 1, 2, 3), (4, 5, 6, 7)),
                                              (8, tuple(range(8)), tuple(range(8)))])
def test_a_gang_pod_gets_gpus_with_rdma_when_they_are_as_well_connected(k, plain, served):
    node = topology_node("n", without_first_nics(dgx_a100()))
    request = {constants.GPU_RESOURCE: k}
    assert pick_gpus(node, room_of(node, ()), request, TopologyPolicy()).gpus == plain
    assert pick_gpus(node, room_of(node, ()), request, GANG).gpus == served


def test_rdma_never_costs_a_worse_link_or_another_numa_node():
    # GPUs 4-7 free only in part: the pair 4,6 would span two NUMA nodes (7 and 5), 0,1 do not
    node = topology_node("n", without_first_nics(dgx_a100()))
    room = room_of(node, ())
    room = room.take((5, 7), {constants.GPU_RESOURCE: 2}, None)
    assert pick_gpus(node, room, {constants.GPU_RESOURCE: 2}, GANG).gpus == (0, 1)


def test_between_nodes_alike_a_gang_pod_prefers_the_one_with_rdma():
    full, bare = topology_node("a-full", dgx_a100()), topology_node("b-bare", without_first_nics(dgx_a100()))
    request = {constants.GPU_RESOURCE: 8}
    qualities = {n.name: pick_gpus(n, room_of(n, ()), request, GANG).quality for n in (full, bare)}
    assert qualities["a-full"] < qualities["b-bare"]  # lower is better
    plain = {n.name: pick_gpus(n, room_of(n, ()), request, TopologyPolicy()).quality for n in (full, bare)}
    assert plain["a-full"] == plain["b-bare"]  # a lone pod does not care


def test_the_simulator_reports_multi_node_gang_pods_with_rdma():
    nodes = build_nodes([NodeGroup("n", gpus=8, cpu="64", count=2, topology=without_first_nics(dgx_a100()),
                                   topology_name="dgx-a100-half-nics")])
    # 40 cpu each: one pod per node, so the gang spans both nodes
    gang = Job("gang", 0, 100, pods=2, min_member=2, gpus=4, cpu="40", memory="16Gi")
    lone = Job("lone", 200, 100, gpus=4, cpu="4", memory="16Gi")
    simulation = Simulation(nodes, [gang, lone], BatchschedPolicy())
    result = simulation.run()
    assert result.multi_node_gang_pods == 2 and result.rdma_pods == 2 and result.rdma_share == 1.0
    assert result.jobs_finished == 2  # the lone pod counts in neither


def test_explain_names_the_gpus_the_gang_would_get():
    node = topology_node("n", without_first_nics(dgx_a100()))
    gang = snapshot([node], gang_pods("train", 2, gpu=4, cpu="1"), [group("train", min_member=2)])
    lone = snapshot([node], [pod("solo", gpu=4, cpu="1")])
    assert "GPUs 4,5,6,7 for the first" in str(explain_gang(gang, "default/train"))
    assert "GPUs 0,1,2,3 for the first" in str(explain_gang(lone, "default/pod:solo"))
