"""The verifier's comparison of what the kubelet gave each pod with its gpu-ids."""
from __future__ import annotations

from batchsched.api import constants
from batchsched.core.dra.inventory import gpu_selection, node_dra
from batchsched.core.dra.model import slice_from_json
from batchsched.core.topology.parse import parse_topo
from batchsched.nodeagent.agent import held_devices
from batchsched.nodeagent.backends import with_identities
from batchsched.nodeagent.podresources import api_pb2
from batchsched.nodeagent.verify import Held, verify
from tests.support.nvml import query_xml, uuid_of
from tests.unit.topology_support import FIXTURES

TOPOLOGY = parse_topo((FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt").read_text())
TOPOLOGY = with_identities(TOPOLOGY, query_xml(TOPOLOGY))


def pod_json(name: str, ids: str | None, actual: str | None = None) -> dict:
    annotations = {}
    if ids is not None:
        annotations[constants.GPU_IDS_ANNOTATION] = ids
    if actual is not None:
        annotations[constants.GPU_IDS_ACTUAL_ANNOTATION] = actual
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "annotations": annotations}}


def test_uuids_replicas_and_indices_map_to_the_topology():
    held = {("ns", "right"): Held((uuid_of(0), uuid_of(1))),
            ("ns", "moved"): Held((uuid_of(4) + "::3", "5")),  # a time-sliced replica, the index id strategy
            ("ns", "alien"): Held((uuid_of(2), "GPU-not-on-this-node"))}
    pods = [pod_json("right", "0,1"), pod_json("moved", "2,3", actual="4,5"), pod_json("alien", "2,3"),
            pod_json("other-scheduler", None), pod_json("not-reported", "6")]
    findings = {f.name: f for f in verify(pods, held, TOPOLOGY)}
    assert set(findings) == {"right", "moved", "alien"}
    assert not findings["right"].mismatch
    moved = findings["moved"]
    assert moved.mismatch and moved.actual == (4, 5) and moved.actual_text == moved.recorded == "4,5"
    assert moved.message() == ("batchsched chose GPUs 2,3 but the kubelet gave 4,5 "
                               "(recorded in scheduling.batchsched.io/gpu-ids-actual)")
    alien = findings["alien"]
    assert alien.mismatch and alien.actual == (2,) and alien.unknown == ("GPU-not-on-this-node",)
    assert "no GPU of the node's topology: GPU-not-on-this-node" in alien.message()


def test_dra_devices_map_through_the_node_slices():
    slices = [slice_from_json({"metadata": {"name": "s"}, "spec": {
        "nodeName": "n", "driver": "gpu.nvidia.com", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": uuid_of(7 - i)}}} for i in range(8)]}})]
    dra = node_dra(slices, gpu_selection(()), TOPOLOGY)
    held = {("ns", "claimed"): Held(dra_devices=(("gpu.nvidia.com", "n", "gpu-0"), ("gpu.nvidia.com", "n", "gpu-1")))}
    [finding] = verify([pod_json("claimed", "6,7")], held, TOPOLOGY, dra)
    assert finding.actual == (6, 7) and not finding.mismatch


def test_a_list_answer_is_read_per_pod_over_all_containers():
    response = api_pb2.ListPodResourcesResponse(pod_resources=[api_pb2.PodResources(
        namespace="ns", name="p", containers=[
            api_pb2.ContainerResources(name="a", devices=[
                api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[uuid_of(0)]),
                api_pb2.ContainerDevices(resource_name="example.com/nic", device_ids=["nic0"])]),
            api_pb2.ContainerResources(name="b", devices=[
                api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[uuid_of(1)])],
                dynamic_resources=[api_pb2.DynamicResource(claim_name="c", claim_resources=[
                    api_pb2.ClaimResource(driver_name="gpu.nvidia.com", pool_name="n", device_name="gpu-2")])])])])
    assert held_devices(response) == {("ns", "p"): Held((uuid_of(0), uuid_of(1)), (("gpu.nvidia.com", "n", "gpu-2"),))}


def test_the_committed_stubs_are_what_the_tool_generates_from_the_kubelets_api_proto():
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    from tests.unit.topology_support import ROOT

    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) generates the stubs")
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain: the kubelet's api.proto comes from the Go module cache")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_podresources
    finally:
        sys.path.pop(0)
    version = gen_podresources.kubelet_version()
    cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    if not (Path(cache) / f"k8s.io/kubelet@{version}").is_dir():
        pytest.skip(f"k8s.io/kubelet@{version} is not in the module cache "
                    f"(go mod download -json k8s.io/kubelet@{version})")
    assert gen_podresources.main(["--check"]) == 0
