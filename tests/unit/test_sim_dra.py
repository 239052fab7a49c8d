"""Simulated nodes whose GPUs NVIDIA's DRA driver serves (``gpuSource:
dra``): their slices feed the same core as the scheduler's cache, a pod
placed there is bound with its extended-resource claim, allocated with the
devices of the GPU ids chosen, and those devices count as in use until the
pod is gone; mixed clusters count both kinds."""
from collections import Counter
from pathlib import Path

import pytest

from batchsched.api import constants
from batchsched.core.dra.extended import ExtendedClaim
from batchsched.core.dra.model import AllocatedDevice
from batchsched.sim.baselines import baseline
from batchsched.sim.cluster import DEVICE_PLUGIN, DRA, DraObjects, build_dra, build_nodes, load_cluster
from batchsched.sim.engine import SimCluster, Simulation, SimulationError
from batchsched.sim.files import InputError
from batchsched.sim.policies import BatchschedPolicy
from batchsched.sim.report import summary
from batchsched.sim.scenario import DEFAULTS, Scenario, default_config, run_scenario
from batchsched.sim.workload import Job, pod_object

GPU = constants.GPU_RESOURCE
DRIVER = "gpu.nvidia.com"
EXAMPLE = DEFAULTS / "dra-cluster.yaml"


def cluster_file(tmp_path: Path, *groups: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes:\n" + "".join(f"  - {g}\n" for g in groups))
    return path


def dgx1(tmp_path: Path, count: int = 2, source: str = DRA) -> tuple[dict, DraObjects]:
    groups = load_cluster(cluster_file(tmp_path, f"{{name: dgx, count: {count}, gpus: 8, cpu: 80, "
                                                 f"topology: dgx1-v100, gpuSource: {source}}}"))
    return build_nodes(groups), build_dra(groups)


def gang(name: str, arrival: float, duration: float, pods: int, gpus: int) -> Job:
    return Job(name, arrival, duration, pods=pods, min_member=pods, gpus=gpus, cpu="4", memory="16Gi",
               priority=1000, priority_class="training")


def device_uuids(cluster: SimCluster) -> dict[tuple, str]:
    """Each published device's uuid attribute, by (driver, pool, device)."""
    return {(s.driver, s.pool, d.name): d.attributes["uuid"] for s in cluster.state.dra.slices.values()
            for d in s.devices}


def assert_claims_match_bindings(cluster: SimCluster) -> int:
    """Every pod bound where DRA serves GPUs has one claim, reserved for it,
    whose devices are, by uuid, the topology's GPUs of its ids; no device is
    in two claims.  Returns how many such pods."""
    uuids, held = device_uuids(cluster), Counter()
    bound = [p for p in cluster.pods.values() if p.node_name and cluster.nodes[p.node_name].gpus_by_dra]
    for pod in bound:
        claims = [c for c in cluster.state.dra.claims.values() if pod.uid in c.reserved_for]
        assert len(claims) == 1 and claims[0].owner_pod == pod.uid and claims[0].extended
        topology = cluster.nodes[pod.node_name].topology
        expected = [topology.gpus[i].uuid if topology else uuids[(DRIVER, pod.node_name, f"gpu-{i}")]
                    for i in pod.gpu_ids]  # flat GPUs: ids by position, in minor order
        assert sorted(uuids[d.key] for d in claims[0].allocated) == sorted(expected)
        held.update(d.key for d in claims[0].allocated)
    assert all(n == 1 for n in held.values()), [k for k, n in held.items() if n > 1]
    assert len(cluster.state.dra.claims) == len(bound)  # none left behind by pods gone
    return len(bound)


def test_a_dra_cluster_file_gives_nodes_no_device_plugin_gpus_and_a_slice_each(tmp_path):
    nodes, dra = dgx1(tmp_path)
    assert sorted(nodes) == ["dgx-0", "dgx-1"] and GPU not in nodes["dgx-0"].allocatable
    assert [c.name for c in dra.classes] == ["gpu.nvidia.com"]
    assert dra.classes[0].extended_resource_name == GPU
    assert sorted(s.node for s in dra.slices) == ["dgx-0", "dgx-1"]
    cluster = SimCluster(nodes, dra=dra)
    node = cluster.nodes["dgx-1"]
    assert node.gpus_by_dra and node.allocatable[GPU] == 8 and cluster.total_gpus == cluster.dra_gpus == 16
    assert {g.mapped_by for g in node.dra.gpus} == {"uuid"}  # the annotation and the slice agree
    uuids = device_uuids(cluster)
    assert all(uuids[g.key] == node.topology.gpus[g.index].uuid for g in node.dra.gpus)
    assert uuids[("gpu.nvidia.com", "dgx-0", "gpu-0")] != uuids[("gpu.nvidia.com", "dgx-1", "gpu-0")]


def test_gangs_on_dra_nodes_get_claims_of_nvlink_quads_and_no_device_twice(tmp_path):
    nodes, dra = dgx1(tmp_path)
    jobs = [gang("quads", 0, 100, pods=4, gpus=4), gang("pairs", 10, 100, pods=2, gpus=2),
            gang("later", 20, 50, pods=2, gpus=4)]
    simulation = Simulation(nodes, jobs, BatchschedPolicy(), dra=dra)
    simulation.run(until=50)
    cluster = simulation.cluster
    assert assert_claims_match_bindings(cluster) == 4  # the quads fill both nodes; the rest waits
    assert cluster.state.free("dgx-0")[GPU] == cluster.state.free("dgx-1")[GPU] == 0
    result = simulation.run()
    assert result.jobs_finished == 3 and result.pods_with_claims == 8
    assert result.aligned_pods == result.multi_gpu_pods == 8  # NVLink quads and pairs, through DRA
    assert cluster.state.dra.claims == {} and cluster.state.free("dgx-0")[GPU] == 8  # deleted with their pods


def test_the_same_cluster_through_dra_or_the_device_plugin_is_placed_alike(tmp_path):
    jobs = [gang(f"g{i}", 5 * i, 40 + 7 * i, pods=1 + i % 3, gpus=(1, 2, 4, 8)[i % 4]) for i in range(24)]
    results, placements = {}, {}
    for source in (DRA, DEVICE_PLUGIN):
        nodes, dra = dgx1(tmp_path, count=3, source=source)
        simulation = Simulation(nodes, jobs, BatchschedPolicy(), dra=dra)
        bound = []
        bind = simulation.cluster.bind
        simulation.cluster.bind = lambda uid, node, ids, now, claim=None: bound.append((uid, node, tuple(ids))) \
            or bind(uid, node, ids, now, claim)
        results[source], placements[source] = simulation.run(), bound
    assert placements[DRA] == placements[DEVICE_PLUGIN] and len(placements[DRA]) > 24
    assert results[DRA].pods_with_claims == sum(1 for job in jobs for _ in range(job.pods))
    assert results[DEVICE_PLUGIN].pods_with_claims == 0


@pytest.mark.parametrize("policy", ["batchsched", "binpack", "spread"])
def test_a_mixed_cluster_counts_both_kinds(tmp_path, policy):
    groups = load_cluster(cluster_file(
        tmp_path, "{name: dra, gpus: 8, topology: dgx1-v100, gpuSource: dra}",
        "{name: plugin, gpus: 8, topology: dgx1-v100}", "{name: flat, gpus: 4, gpuSource: dra}"))
    nodes, dra = build_nodes(groups), build_dra(groups)
    jobs = [gang("big", 0, 100, pods=4, gpus=4), gang("small", 1, 100, pods=2, gpus=2)]
    chosen = BatchschedPolicy() if policy == "batchsched" else baseline(policy, seed=2)
    simulation = Simulation(nodes, jobs, chosen, dra=dra)
    simulation.run(until=50)
    cluster = simulation.cluster
    assert (cluster.total_gpus, cluster.dra_gpus, cluster.allocated_gpus) == (20, 12, 20)
    on_dra = assert_claims_match_bindings(cluster)
    on_plugin = sum(1 for p in cluster.pods.values() if p.node_name == "plugin")
    assert on_dra + on_plugin == 6 and on_plugin >= 1 and on_dra >= 3
    assert cluster.pods_with_claims == on_dra
    assert not cluster.nodes["plugin"].gpus_by_dra and cluster.nodes["flat"].gpus_by_dra
    for name in cluster.nodes:  # the core's count and the simulator's agree, each GPU counted once
        assert cluster.state.free(name)[GPU] == cluster.free[name][GPU] == 0


def test_the_cluster_refuses_a_binding_without_its_claim_or_with_devices_in_use(tmp_path):
    nodes, dra = dgx1(tmp_path, count=1)
    cluster = SimCluster(nodes, dra=dra)
    job = gang("a", 0, 10, pods=3, gpus=2)
    pods = [cluster.add_pod(pod_object(job, i, 0, 0, "batchsched")) for i in range(3)]

    def claim(*devices: str) -> ExtendedClaim:
        return ExtendedClaim("dgx", "gpu.nvidia.com", (), tuple(
            AllocatedDevice("container-0-request-0", "gpu.nvidia.com", "dgx", d) for d in devices))

    with pytest.raises(SimulationError, match="without its claim"):
        cluster.bind(pods[0].uid, "dgx", (0, 1), 0)
    with pytest.raises(SimulationError, match="not the devices of its GPU ids"):
        cluster.bind(pods[0].uid, "dgx", (0, 1), 0, claim("gpu-0", "gpu-2"))
    cluster.bind(pods[0].uid, "dgx", (0, 1), 0, claim("gpu-0", "gpu-1"))
    cluster.free_ids["dgx"] |= 0b11  # a policy bug the ids alone would miss: the devices still catch it
    with pytest.raises(SimulationError, match="already in another claim"):
        cluster.bind(pods[1].uid, "dgx", (0, 1), 0, claim("gpu-0", "gpu-1"))


def test_the_summary_counts_pods_bound_with_claims_only_where_dra_serves_gpus(tmp_path):
    jobs = [gang("g", 0, 100, pods=2, gpus=4), gang("one", 0, 100, pods=1, gpus=1)]
    nodes, dra = dgx1(tmp_path)
    results = [Simulation(nodes, jobs, policy, dra=dra).run() for policy in (BatchschedPolicy(), baseline("binpack"))]
    row = next(line for line in summary(results).splitlines() if line.startswith("pods bound with DRA claims"))
    assert row.split()[-2:] == ["3", "3"]
    nodes, _ = dgx1(tmp_path, source=DEVICE_PLUGIN)
    assert "DRA" not in summary([Simulation(nodes, jobs, BatchschedPolicy()).run()])


def test_the_example_cluster_serves_two_kinds_of_nodes_through_dra():
    scenario = Scenario(load_cluster(EXAMPLE), [gang("g", 0, 100, pods=2, gpus=8)], default_config(),
                        str(EXAMPLE), "one gang")
    assert "40 nodes, 320 GPUs, 128 through DRA: 8 dgx1-v100, 12 dgx-a100, 8 dgx-h100" in scenario.describe()
    (result,) = run_scenario(scenario, ["batchsched"])
    assert result.dra_gpus == 128 and result.jobs_finished == 1


@pytest.mark.parametrize("text, message", [
    ("nodes:\n  - {name: a, gpus: 8, gpuSource: nvidia}\n",
     "line 2: nodes[0].gpuSource: must be one of device-plugin, dra, got 'nvidia'"),
    ("nodes:\n  - {name: a, gpus: 200, gpuSource: dra}\n",
     "line 2: nodes[0].gpus: a DRA node's slice holds at most 128 devices, got 200"),
])
def test_a_bad_gpu_source_is_refused_with_its_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        load_cluster(path)
    assert message in str(caught.value)


def test_a_csv_cluster_marks_dra_nodes_by_column(tmp_path):
    path = tmp_path / "cluster.csv"
    path.write_text("name,count,gpus,topology,gpuSource\ndra,2,8,dgx-a100,dra\nplugin,1,8,dgx-a100,\n")
    groups = load_cluster(path)
    cluster = SimCluster(build_nodes(groups), dra=build_dra(groups))
    assert [n for n, node in sorted(cluster.nodes.items()) if node.gpus_by_dra] == ["dra-0", "dra-1"]
    assert cluster.total_gpus == 24 and cluster.dra_gpus == 16
