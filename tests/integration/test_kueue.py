"""Kueue in front of batchsched, both real, against the real API server:
Kueue (sigs.k8s.io/kueue, built from source; tests/support/kueue.py) gates
the plain pods of a LocalQueue, admits a pod group within its ClusterQueue's
quota and lifts the gates; batchsched forms the gang from Kueue's group
label and total-count annotation and binds it whole: an admitted group that
does not fit yet binds no member, and one beyond the quota stays gated,
until room is freed."""
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


def queue_setup(env, gpus: int, flavor_spec: dict | None = None) -> None:
    flavor, cluster_queue = f"rf-{env.id}", f"cq-{env.id}"
    env.add_cluster_object({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                            "metadata": {"name": flavor}, "spec": flavor_spec or {}})
    env.add_cluster_object({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.namespace}},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                     {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "64"},
                                                    {"name": "memory", "nominalQuota": "256Gi"},
                                                    {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}]}]}]}})
    env.create({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "lq"},
                "spec": {"clusterQueue": cluster_queue}})


def kueue_group(env, group: str, size: int, gpus: int, annotations: dict | None = None) -> list[str]:
    names = []
    for i in range(size):
        obj = pod(f"{group}-{i}", env.namespace, cpu="1", gpus=gpus,
                  labels={"kueue.x-k8s.io/queue-name": "lq", "kueue.x-k8s.io/pod-group-name": group})
        obj["metadata"].setdefault("annotations", {}).update(
            {"kueue.x-k8s.io/pod-group-total-count": str(size), **(annotations or {})})
        names.append(env.create(obj)["metadata"]["name"])
    return names


def gated(p: dict) -> bool:
    return any(g["name"] == GATE for g in p["spec"].get("schedulingGates") or ())


def test_kueue_admits_within_quota_and_batchsched_binds_each_admitted_group_whole(
        env, kube, kubeconfig, kueue_binary, start_scheduler, tmp_path):
    for i in range(3):
        env.add_node(f"gpu{i}", gpus=8)
    with running_kueue(kube, kubeconfig, kueue_binary, tmp_path, env.namespace, env.id):
        queue_setup(env, gpus=32)
        start_scheduler()
        first = kueue_group(env, "a", 2, 8)
        assert all(gated(p) for p in env.pods().values()), "Kueue's webhook did not gate the pods"
        wait_for("group a admitted and bound", lambda: sorted(n for n in env.bound() if n in first) == first,
                 timeout=90)
        assert len(set(env.bound().values())) == 2  # 8 GPUs each: two of the three nodes

        # b is admitted (32 GPUs of quota) and ungated, but one node is free: no member of it binds
        second = kueue_group(env, "b", 2, 8)
        wait_for("group b admitted", lambda: not any(gated(env.pods()[n]) for n in second), timeout=60)
        third = kueue_group(env, "c", 2, 8)  # beyond the quota while a and b hold it: Kueue keeps it gated
        wait_for("Kueue's verdict on c", lambda: _workload_condition(env, "c", "QuotaReserved") == "False",
                 timeout=60)
        wait_for("b's pods told why they wait", lambda: all(
            _scheduled_condition(env.pods()[n]).startswith(f"gang {env.namespace}/kueue:b") for n in second),
            timeout=30)
        pods = env.pods()
        assert not any(pods[n]["spec"].get("nodeName") for n in second + third)
        assert all(gated(pods[n]) for n in third)

        for name in first:  # a finishes: b fits now and binds whole
            kube.merge_patch(f"/api/v1/namespaces/{env.namespace}/pods/{name}/status",
                             {"status": {"phase": "Succeeded"}})
        wait_for("group b bound", lambda: sorted(n for n in env.bound() if n in second) == second, timeout=90)
        assert _workload_condition(env, "b", "Admitted") == "True"
        wait_for("a finished for Kueue", lambda: _workload_condition(env, "a", "Finished") == "True", timeout=30)


def test_under_kueue_topology_aware_scheduling_kueue_pins_the_node_and_batchsched_picks_the_gpus(
        env, kube, kubeconfig, kueue_binary, start_scheduler, tmp_path):
    """Kueue's TAS (beta, on by default in v0.17) holds the pods with a second
    gate, chooses a node for each and writes it as a nodeSelector on
    kubernetes.io/hostname when it lifts the gate: batchsched keeps that node
    and chooses only the GPUs in it, for the gang whole."""
    block = "batchsched.io/e2e-block"
    nodes = [env.add_node(f"gpu{i}", gpus=8, labels={block: "b0"}) for i in range(3)]
    topology = f"topo-{env.id}"
    with running_kueue(kube, kubeconfig, kueue_binary, tmp_path, env.namespace, env.id):
        env.add_cluster_object({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology",
                                "metadata": {"name": topology},
                                "spec": {"levels": [{"nodeLabel": block}, {"nodeLabel": "kubernetes.io/hostname"}]}})
        queue_setup(env, gpus=24, flavor_spec={"nodeLabels": env.node_label, "topologyName": topology})
        start_scheduler()
        # Two 4-GPU pods required on one host: Kueue picks it, batchsched the GPUs.
        names = kueue_group(env, "tas", 2, 4, {"kueue.x-k8s.io/podset-required-topology": "kubernetes.io/hostname"})
        assert all(any(g["name"] == "kueue.x-k8s.io/topology" for g in p["spec"].get("schedulingGates") or ())
                   for p in env.pods().values()), "Kueue's TAS gate missing: TAS is not on"
        wait_for("the TAS group bound", lambda: sorted(n for n in env.bound() if n in names) == names, timeout=90)
        pods = env.pods()
        pins = {pods[n]["spec"].get("nodeSelector", {}).get("kubernetes.io/hostname") for n in names}
        assert len(pins) == 1 and pins <= set(nodes), f"Kueue pinned {pins}"
        assert {env.bound()[n] for n in names} == pins  # Kueue's node kept
        ids = [pods[n]["metadata"]["annotations"]["scheduling.batchsched.io/gpu-ids"].split(",") for n in names]
        assert [len(i) for i in ids] == [4, 4] and not set(ids[0]) & set(ids[1])  # batchsched's GPUs, disjoint


def _scheduled_condition(p: dict) -> str:
    """The message of the pod's PodScheduled=False condition ("" without one)."""
    for condition in (p.get("status") or {}).get("conditions") or ():
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return condition.get("message") or ""
    return ""


def _workload_condition(env, group: str, kind: str) -> str:
    """The status of condition ``kind`` of the Workload Kueue made for pod group ``group`` ("" until there)."""
    for workload in env.kube.get(f"{KUEUE_API}/namespaces/{env.namespace}/workloads")["items"]:
        if workload["metadata"]["name"] == group or \
                (workload["metadata"].get("labels") or {}).get("kueue.x-k8s.io/pod-group-name") == group:
            for condition in (workload.get("status") or {}).get("conditions") or ():
                if condition["type"] == kind:
                    return condition["status"]
    return ""
