"""Kueue in front of batchsched, both real, against the real API server:
Kueue (sigs.k8s.io/kueue, built from source; tests/support/kueue.py) gates
the plain pods of a LocalQueue, admits a pod group within its ClusterQueue's
quota and lifts the gates; batchsched forms the gang from Kueue's group
label and total-count annotation and binds it whole.  A group beyond the
quota stays gated and unbound, whatever GPUs are free, until the first
group finishes and Kueue admits it."""
from __future__ import annotations

import pytest

from tests.support.kube import wait_for
from tests.support.kueue import KUEUE_API, running_kueue
from tests.support.objects import pod

pytestmark = pytest.mark.e2e

GATE = "kueue.x-k8s.io/admission"


@pytest.fixture(scope="session")
def kueue_binary() -> str:
    import localcluster
    return str(localcluster.build_all()["kueue"])


def queue_setup(env, gpus: int) -> str:
    flavor, cluster_queue = f"rf-{env.id}", f"cq-{env.id}"
    env.add_cluster_object({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                            "metadata": {"name": flavor}, "spec": {}})
    env.add_cluster_object({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.namespace}},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                     {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "64"},
                                                    {"name": "memory", "nominalQuota": "256Gi"},
                                                    {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}]}]}})
    env.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq"},
                "spec": {"clusterQueue": cluster_queue}})
    return cluster_queue


def kueue_group(env, group: str, size: int, gpus: int) -> list[str]:
    names = []
    for i in range(size):
        obj = pod(f"{group}-{i}", env.namespace, cpu="1", gpus=gpus,
                  labels={"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/pod-group-name": group})
        obj["metadata"].setdefault("annotations", {})["kueue.x-k8s.io/pod-group-total-count"] = str(size)
        names.append(env.create(obj)["metadata"]["name"])
    return names


def gated(p: dict) -> bool:
    return any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or ())


def test_kueue_admits_within_quota_and_batchsched_binds_each_admitted_group_whole(
        env, kube, kubeconfig, kueue_binary, start_scheduler, tmp_path):
    for i in range(3):
        env.add_node(f"gpu{i}", gpus=8)
    with running_kueue(kube, kubeconfig, kueue_binary, tmp_path, env.namespace, env.id):
        cluster_queue = queue_setup(env, gpus=16)
        start_scheduler()
        first = kueue_group(env, "a", 2, 8)
        second = kueue_group(env, "b", 2, 8)  # 16 more GPUs: beyond the quota while a holds it
        created = env.pods()
        assert all(gated(created[n]) for n in first + second), "Kueue's webhook did not gate the pods"

        wait_for("group a admitted and bound", lambda: sorted(n for n in env.bound() if n in first) == first,
                 timeout=90)
        bound = env.bound()
        assert len({bound[n] for n in first}) == 2  # 8 GPUs each: two nodes
        # b: a node is free, but Kueue has not admitted it -- nothing of it binds, its pods stay gated
        wait_for("Kueue's verdict on b", lambda: _workload_condition(env, "b", "QuotaReserved") == "False",
                 timeout=60)
        pods = env.pods()
        assert all(gated(pods[n]) and not pods[n]["spec"].get("nodeName") for n in second)

        for name in first:  # a finishes: Kueue releases its quota and admits b
            kube.merge_patch(f"/api/v1/namespaces/{env.namespace}/pods/{name}/status",
                             {"status": {"phase": "Succeeded"}})
        wait_for("group b admitted and bound", lambda: sorted(n for n in env.bound() if n in second) == second,
                 timeout=90)
        status = kube.get(f"{KUEUE_API}/clusterqueues/{cluster_queue}").get("status") or {}
        assert status.get("admittedWorkloads", 0) >= 1


def _workload_condition(env, group: str, kind: str) -> str:
    """The status of condition ``kind`` of the Workload Kueue made for pod group ``group`` ("" until there)."""
    for workload in env.kube.get(f"{KUEUE_API}/namespaces/{env.namespace}/workloads")["items"]:
        if workload["metadata"]["name"] == group or \
                (workload["metadata"].get("labels") or {}).get("kueue.x-k8s.io/pod-group-name") == group:
            for condition in (workload.get("status") or {}).get("conditions") or ():
                if condition["type"] == kind:
                    return condition["status"]
    return ""
