"""Kubernetes' own gang API (v1.37, scheduling.k8s.io/v1beta1, gate
GenericWorkload, served by the local control plane) against the real API
server: a PodGroup whose gang.minCount changes while it waits.  Its pods
join through spec.schedulingGroup; nothing binds while fewer than minCount
exist, lowering minCount lets the gang bind whole, and the PodGroup's
PodGroupInitiallyScheduled condition says so."""
from __future__ import annotations

import pytest

from tests.support.kube import wait_for
from tests.support.objects import pod

pytestmark = pytest.mark.e2e

API = "/apis/scheduling.k8s.io/v1beta1"


def native_group(env, name: str, min_count: int) -> dict:
    return env.create({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": {"name": name},
                       "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}})


def native_member(env, name: str, group: str, gpus: int) -> dict:
    obj = pod(name, env.namespace, cpu="1", gpus=gpus)
    obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    return env.create(obj)


def initially_scheduled(env, name: str) -> dict:
    status = env.kube.get(f"{API}/namespaces/{env.namespace}/podgroups/{name}").get("status") or {}
    return next((c for c in status.get("conditions") or () if c["type"] == "PodGroupInitiallyScheduled"), {})


def test_a_native_gang_waits_for_min_count_and_binds_whole_when_min_count_is_lowered(env, start_scheduler):
    for i in range(2):
        env.add_node(f"gpu{i}", gpus=8)
    native_group(env, "train", 3)
    created = [native_member(env, f"train-{i}", "train", 8) for i in range(2)]
    assert all(p["spec"].get("schedulingGroup") == {"podGroupName": "train"} for p in created), \
        "the API server dropped spec.schedulingGroup: GenericWorkload is off"
    start_scheduler()
    waiting = wait_for("the gang's verdict on its PodGroup",
                       lambda: initially_scheduled(env, "train").get("status") == "False"
                       and initially_scheduled(env, "train"), timeout=60)
    assert waiting["reason"] == "Unschedulable"
    assert "2/3 members exist (pods with spec.schedulingGroup.podGroupName: train" in waiting["message"]
    assert not env.bound()

    env.kube.merge_patch(f"{API}/namespaces/{env.namespace}/podgroups/train",
                         {"spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}})
    wait_for("the gang bound whole", lambda: sorted(env.bound()) == ["train-0", "train-1"], timeout=60)
    assert len(set(env.bound().values())) == 2
    done = wait_for("PodGroupInitiallyScheduled", lambda: initially_scheduled(env, "train").get("status") == "True"
                    and initially_scheduled(env, "train"), timeout=30)
    assert done["reason"] == "Scheduled"
