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


FRAMEWORKS = sorted((ROOT / "examples" / "frameworks").glob("*.yaml"))


@pytest.fixture(scope="module")
def framework_crds(foreign_podgroup_crds, jobset_crd):
    """The CRDs the framework examples name: scheduler-plugins', Volcano's, Kueue's and JobSet's."""
    from tests.support import controllers, kueue
    controllers.install_crds(foreign_podgroup_crds, controllers.module_dir(*kueue.MODULE))
    return foreign_podgroup_crds


@pytest.mark.parametrize("example", FRAMEWORKS, ids=lambda p: p.stem)
def test_each_framework_example_is_accepted_by_the_api_server(example, env, kubeconfig, kubectl, framework_crds):
    result = run_kubectl(kubectl, kubeconfig, "apply", "--dry-run=server", "-n", env.namespace, "-f", str(example))
    assert "(server dry run)" in result.stdout, result.stdout
    assert example.read_text().startswith("# "), "each example opens with a comment saying what it is"


def test_the_indexed_job_example_is_gang_bound_whole_with_no_podgroup(env, kubeconfig, kubectl, start_scheduler):
    run_kubectl(kubectl, kubeconfig, "apply", "-n", env.namespace, "-f",
                str(ROOT / "examples" / "frameworks" / "indexed-job.yaml"))
    nodes = [env.add_node(f"gpu{i}", gpus=8, taints=GPU_TAINT) for i in range(4)]
    wait_for("the Job controller's 4 pods", lambda: len(env.kube.pods(env.namespace)) == 4)
    start_scheduler()
    bound = wait_for("the 4 workers bound", lambda: len(placed := env.bound()) == 4 and placed, timeout=60)
    assert sorted(bound.values()) == sorted(nodes)
