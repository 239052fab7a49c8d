"""The node agent against the real API server: the reporter writes its node's
topology annotation and BatchschedGPUReady condition, and refuses a topology
whose GPU count the node does not advertise."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from batchsched.api import constants
from batchsched.core.topology.annotation import from_annotation
from batchsched.core.topology.parse import parse_topo
from batchsched.nodeagent.report import GPU_READY_CONDITION
from tests.support.kube import wait_for
from tests.support.nvml import fake_nvidia_smi, query_xml, uuid_of

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DGX1 = ROOT / "tests" / "fixtures" / "topologies" / "dgx1-hybrid-cube-mesh-8gpu.txt"


def run_agent(env, node: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    script = fake_nvidia_smi(tmp_path, DGX1, query_xml(parse_topo(DGX1.read_text())))
    return subprocess.run([sys.executable, "-m", "batchsched", "node-agent", "--once", "--node", node,
                           "--backend", "text", "--nvidia-smi", str(script), "--sys-root", str(tmp_path),
                           "--kubeconfig", env.kubeconfig, *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def condition(env, node: str) -> dict:
    conditions = env.kube.get(f"/api/v1/nodes/{node}")["status"]["conditions"]
    return next((c for c in conditions if c["type"] == GPU_READY_CONDITION), {})


def test_the_reporter_writes_the_topology_of_a_node_that_advertises_its_gpus(env, tmp_path):
    node = env.add_node("gpu", gpus=8)
    done = run_agent(env, node, tmp_path)
    assert done.returncode == 0, done.stderr
    annotations = env.kube.get(f"/api/v1/nodes/{node}")["metadata"]["annotations"]
    topology = from_annotation(annotations[constants.GPU_TOPOLOGY_ANNOTATION])
    assert [g.uuid for g in topology.gpus] == [uuid_of(i) for i in range(8)]
    assert str(topology.link(0, 3)) == "NV2"
    assert (condition(env, node)["status"], condition(env, node)["reason"]) == ("True", "TopologyReported")


def test_a_gpu_count_the_node_does_not_advertise_is_refused_with_an_event_and_a_condition(env, tmp_path):
    node = env.add_node("short", gpus=4)  # the driver shows 8
    done = run_agent(env, node, tmp_path)
    assert done.returncode == 1
    annotations = env.kube.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
    assert constants.GPU_TOPOLOGY_ANNOTATION not in annotations
    refused = condition(env, node)
    assert (refused["status"], refused["reason"]) == ("False", "GPUCountMismatch")
    assert "the driver shows 8 GPUs but the node advertises 4 (nvidia.com/gpu capacity)" in refused["message"]
    events = wait_for("the node's event", lambda: [
        e for e in env.kube.get("/api/v1/namespaces/default/events")["items"]
        if e["involvedObject"].get("name") == node and e["reason"] == "GPUCountMismatch"])
    assert events[0]["type"] == "Warning"
