"""The parts of e2e/kind that need no Docker, against a real API server:
the GPU simulation (nodes/status patch, topology annotation, pool label),
the kind-sized examples, and the kind config agreeing with both.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from batchsched.api import constants
from batchsched.core.topology.annotation import from_annotation
from tests.support.kube import wait_for
from tests.support.kubectl import rendered, run_kubectl

pytestmark = pytest.mark.e2e

KIND = Path(__file__).resolve().parents[2] / "e2e" / "kind"
GPUS_PER_NODE = 8


def simulate_gpus(kubectl: str, kubeconfig: str, selector: str) -> str:
    return subprocess.run(
        [sys.executable, str(KIND / "simulate_gpus.py"), "--selector", selector, "--gpus", str(GPUS_PER_NODE),
         "--topology", str(KIND / "hgx-8gpu-topo.txt"), "--pool", "kind-hgx", "--kubectl", kubectl],
        check=True, capture_output=True, text=True, env={**os.environ, "KUBECONFIG": kubeconfig}).stdout


def test_the_kind_config_has_room_for_the_examples_on_its_gpu_workers(kubectl, kubeconfig):
    config = yaml.safe_load((KIND / "kind-config.yaml").read_text())
    roles = [n["role"] for n in config["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") >= 2
    gpu_workers = [n for n in config["nodes"] if (n.get("labels") or {}).get("batchsched.io/gpu-node") == "true"]
    assert "--selector batchsched.io/gpu-node=true" in (KIND / "run.sh").read_text()

    objects = rendered(kubectl, kubeconfig, KIND / "examples")
    job = next(o for o in objects if o["kind"] == "Job")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    job_gpus = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][constants.GPU_RESOURCE]
    inference_gpus = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        constants.GPU_RESOURCE]
    assert job_gpus == GPUS_PER_NODE  # one worker per node
    assert job["spec"]["parallelism"] + 1 <= len(gpu_workers)  # and a node left for inference
    assert deployment["spec"]["replicas"] * inference_gpus <= GPUS_PER_NODE
    subprocess.run(["bash", "-n", str(KIND / "run.sh")], check=True)


def test_simulated_gpus_make_plain_nodes_take_the_kind_examples(env, kube, kubeconfig, kubectl, start_scheduler):
    """Nodes without GPUs (as kind's are) get them from simulate_gpus.py; then
    the examples, as e2e/kind/examples shapes them, are scheduled onto them."""
    nodes = [env.add_node(f"worker{i}", gpus=0) for i in range(5)]
    output = simulate_gpus(kubectl, kubeconfig, ",".join(f"{k}={v}" for k, v in env.node_label.items()))
    assert output.startswith(f"{len(nodes)} node(s) now have {GPUS_PER_NODE} simulated GPUs")
    for name in nodes:
        node = env.kube.get(f"/api/v1/nodes/{name}")
        assert node["status"]["capacity"][constants.GPU_RESOURCE] == str(GPUS_PER_NODE)
        assert node["status"]["allocatable"][constants.GPU_RESOURCE] == str(GPUS_PER_NODE)
        assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "kind-hgx"
        topology = from_annotation(node["metadata"]["annotations"][constants.GPU_TOPOLOGY_ANNOTATION])
        assert len(topology.gpus) == GPUS_PER_NODE
    simulate_gpus(kubectl, kubeconfig, ",".join(f"{k}={v}" for k, v in env.node_label.items()))  # idempotent

    run_kubectl(kubectl, kubeconfig, "apply", "-f", str(KIND.parents[1] / "deploy" / "priorityclasses.yaml"))
    objects = [o for o in rendered(kubectl, kubeconfig, KIND / "examples") if o["kind"] != "Namespace"]
    for obj in objects:
        obj["metadata"]["namespace"] = env.namespace
    run_kubectl(kubectl, kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    wait_for("the controllers' pods", lambda: len(env.kube.pods(env.namespace)) == 6)
    start_scheduler(queue={"initialBackoffSeconds": 0.2})
    wait_for("every example pod bound", lambda: len(env.bound()) == 6, timeout=60)
    wait_for("the training gang Running",
             lambda: env.podgroup("llama-finetune").get("status", {}).get("phase") == "Running")
