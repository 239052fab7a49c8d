"""examples/ apply cleanly and their pods are scheduled: the Job and
ReplicaSet controllers of the cluster (the local control plane's
kube-controller-manager, or kind's) create the pods, batchsched binds them.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from batchsched.api import constants
from tests.support.kube import wait_for
from tests.support.kubectl import run_kubectl

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GPU_TAINT = [{"key": constants.GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]


def test_the_examples_apply_and_their_pods_are_scheduled(env, kubeconfig, kubectl, start_scheduler):
    run_kubectl(kubectl, kubeconfig, "apply", "-f", str(ROOT / "deploy" / "priorityclasses.yaml"))
    result = run_kubectl(kubectl, kubeconfig, "apply", "-n", env.namespace, "-k", str(ROOT / "examples"))
    assert "podgroup.scheduling.batchsched.io/llama-finetune created" in result.stdout, result.stdout
    for i in range(5):  # 4 training workers x 8 GPUs, then 2 x 1 GPU of inference
        env.add_node(f"gpu{i}", gpus=8, taints=GPU_TAINT)

    wait_for("the controllers' pods", lambda: len(env.kube.pods(env.namespace)) == 6)
    start_scheduler()

    training = wait_for("the 4 training workers bound", lambda: (
        placed := {n: node for n, node in env.bound().items() if n.startswith("llama-finetune-")})
        and len(placed) == 4 and placed, timeout=60)
    assert len(set(training.values())) == 4, training  # 8 GPUs each: one per node
    wait_for("both inference replicas bound",
             lambda: len([n for n in env.bound() if n.startswith("llm-inference-")]) == 2)
    wait_for("the PodGroup Running", lambda: env.podgroup("llama-finetune").get("status", {}).get("phase")
             == "Running")
