"""The DRA inventory against the real API server (resource.k8s.io/v1):
NVIDIA-style DeviceClass and ResourceSlices on kwok nodes, claims allocated
"by someone else" (status.allocation written here, as kube-scheduler
writes it), read back through `batchsched explain -o json` and the GPU pool
metrics of the running scheduler, before and after a kill -9."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from batchsched.api import constants
from batchsched.core.topology.annotation import to_annotation
from batchsched.core.topology.parse import parse_topo
from tests.support import dra
from tests.support.kube import KubeError, wait_for
from tests.support.metrics import sample
from tests.support.objects import pod

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DGX1 = ROOT / "tests" / "fixtures" / "topologies" / "dgx1-hybrid-cube-mesh-8gpu.txt"


@pytest.fixture
def gpu_class(env):
    """NVIDIA's DeviceClass (cluster-wide: removed after the test that made it)."""
    try:
        env.add_cluster_object(dra.device_class())
    except KubeError as exc:
        if exc.status != 409:  # there already (a cluster with NVIDIA's driver): used as it is
            raise
    return dra.GPU_CLASS


def dra_node(env, name: str, topology_text: str, *, device_plugin_gpus: int = 0, indices=None, **device) -> tuple:
    """A kwok node annotated with the identified topology and its slice of GPUs ``indices``."""
    full = f"{env.id}-{name}"
    topology = dra.identified(parse_topo(topology_text), full)
    env.add_node(name, gpus=device_plugin_gpus,
                 annotations={constants.GPU_TOPOLOGY_ANNOTATION: to_annotation(topology)})
    env.add_cluster_object(dra.resource_slice(full, topology, indices, **device))
    return full, topology


def allocated_claim(env, name: str, node: str, topology, indices) -> None:
    env.create(dra.claim(name, len(indices)))
    devices = [f"gpu-{dra.minor(topology, i)}" for i in indices]
    set_allocation(env, name, dra.allocation(node, devices))


def set_allocation(env, name: str, allocation: dict | None) -> None:
    env.kube.merge_patch(f"/apis/resource.k8s.io/v1/namespaces/{env.namespace}/resourceclaims/{name}/status",
                         {"status": {"allocation": allocation}})


def explain(env, tmp_path, target: str, kubeconfig: str | None = None) -> dict:
    config = tmp_path / "explain.yaml"
    config.write_text(yaml.safe_dump({"nodeSelector": env.node_label}))
    out = subprocess.run([sys.executable, "-m", "batchsched", "explain", "-o", "json", "-n", env.namespace, target,
                          "--kubeconfig", kubeconfig or env.kubeconfig, "--config", str(config)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def mapping(report: dict, node: str) -> dict[str, tuple]:
    return {m["device"]: (m["index"], m["by"], m["allocated"])
            for m in report["gpuChecklist"]["dra"]["nodes"][node]["mapping"]}


def pool_gpus(proc, state: str) -> float | None:
    return sample(proc.get("/metrics")[1], f"batchsched_gpus_{state}", 'pool="none"')


def test_dra_gpus_are_inventoried_mapped_counted_in_use_and_rebuilt_after_a_restart(
        env, gpu_class, start_scheduler, tmp_path):
    text = DGX1.read_text()
    by_uuid, topology = dra_node(env, "dgx-a", text)
    by_pci, _ = dra_node(env, "dgx-b", text, with_uuid=False)  # slices without uuid: by pciBusID
    allocated_claim(env, "two", by_uuid, topology, [0, 1])
    allocated_claim(env, "one", by_pci, topology, [5])
    env.create(pod("waiter", env.namespace, gpus=9, cpu="1"))  # more than a node has: stays pending

    report = explain(env, tmp_path, "pod/waiter")
    checklist = report["gpuChecklist"]["dra"]
    assert (len(checklist["nodes"]), checklist["devices"], checklist["allocated"]) == (2, 16, 3)
    for node, how, taken in ((by_uuid, "uuid", {0, 1}), (by_pci, "pciBusID", {5})):
        # gpu-<minor> is not the topology's index: minors run opposite to it here
        assert mapping(report, node) == {f"gpu-{7 - i}": (i, how, i in taken) for i in range(8)}
        assert checklist["nodes"][node]["extendedResource"] is True

    proc = start_scheduler()
    wait_for("DRA GPUs in the pool metrics", lambda: (pool_gpus(proc, "allocated"), pool_gpus(proc, "free")) == (3, 13))
    proc.kill()
    proc = start_scheduler()  # rebuilt from the claims alone
    wait_for("the same after a restart", lambda: (pool_gpus(proc, "allocated"), pool_gpus(proc, "free")) == (3, 13))
    set_allocation(env, "two", None)  # deallocated, as the controller does once reservedFor empties
    wait_for("the freed devices", lambda: (pool_gpus(proc, "allocated"), pool_gpus(proc, "free")) == (1, 15))
    assert "waiter" not in env.bound()


def test_a_mixed_node_counts_both_kinds_and_gives_pods_only_device_plugin_gpus(
        env, gpu_class, start_scheduler, tmp_path):
    # GPUs 0-3 (NUMA 0) through DRA, 4-7 (NUMA 1) through the device plugin
    node, topology = dra_node(env, "mixed", DGX1.read_text(), device_plugin_gpus=4, indices=range(4))
    allocated_claim(env, "one", node, topology, [2])
    env.create(pod("quad", env.namespace, gpus=4, cpu="1"))

    checklist = explain(env, tmp_path, "pod/quad")["gpuChecklist"]["dra"]["nodes"][node]
    assert (checklist["devicePluginGpus"], checklist["devices"], checklist["gpus"], checklist["allocated"]) == \
        (4, 4, 8, 1)

    proc = start_scheduler()
    wait_for("quad bound", lambda: env.bound().get("quad"))
    annotations = env.pods()["quad"]["metadata"].get("annotations") or {}
    assert annotations[constants.GPU_IDS_ANNOTATION] == "4,5,6,7"  # never a GPU DRA serves
    wait_for("both kinds counted", lambda: (pool_gpus(proc, "allocated"), pool_gpus(proc, "free")) == (5, 3))


def test_slices_from_the_shared_captures_map_by_uuid(env, gpu_class, shared_dir, tmp_path):
    captures = sorted((shared_dir / "data" / "topologies").glob("*.txt"))
    nodes = {}
    for k, capture in enumerate(captures):
        name, topology = dra_node(env, f"n{k}", capture.read_text())
        nodes[name] = topology
    env.create(pod("waiter", env.namespace, gpus=9, cpu="1"))  # more than a node has: stays pending
    report = explain(env, tmp_path, "pod/waiter")
    for name, topology in nodes.items():
        assert mapping(report, name) == {f"gpu-{dra.minor(topology, i)}": (i, "uuid", False)
                                         for i in range(len(topology))}
