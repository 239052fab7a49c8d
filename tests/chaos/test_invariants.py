"""The invariant checker finds each violation, built by hand on the real API server.

No scheduler runs here: pods are bound through pods/binding by the test, as a
buggy scheduler would, and kwok (no kubelet admission) runs them anyway.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.chaos import invariants
from tests.chaos.proxy import Record, call
from tests.conftest import ROOT
from tests.support import dra
from tests.support.kube import wait_for
from tests.support.objects import configmap, pod, pod_group

pytestmark = pytest.mark.e2e


def bound_pod(env, name: str, node: str, *, gpus: int = 0, cpu: str | None = None, ids: str | None = None,
              group: str | None = None, scheduler: str = "batchsched") -> None:
    env.create(pod(name, env.namespace, gpus=gpus, cpu=cpu, group=group, scheduler=scheduler))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    if ids is not None:
        binding["metadata"]["annotations"] = {invariants.GPU_IDS_ANNOTATION: ids}
    env.kube.create(f"/api/v1/namespaces/{env.namespace}/pods/{name}/binding", binding)


def found(env) -> list[str]:
    return invariants.violations(env.kube, env.namespace, env.nodes)


def test_the_checker_imports_nothing_from_batchsched():
    code = ("import sys, tests.chaos.invariants, tests.chaos.proxy; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'batchsched'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_quantities_parse_exactly():
    q = invariants.parse_quantity
    assert (q("500m"), q("2"), q("1Ki"), q("1e3"), q("1.5Gi"), q(8)) == (
        q("0.5"), 2, 1024, 1000, 3 * 2**29, 8)
    with pytest.raises(ValueError):
        q("lots")


def test_a_sound_cluster_has_no_violation(env):
    node = env.add_node("n", gpus=8, cpu="4")
    bound_pod(env, "a", node, gpus=4, cpu="2", ids="0,1,2,3")
    bound_pod(env, "b", node, gpus=4, cpu="2", ids="4,5,6,7")
    bound_pod(env, "done", node, gpus=8, ids="0,1,2,3,4,5,6,7")
    # kwok moves a Pending pod to Running: only once it has can Succeeded not be overwritten
    wait_for("done running", lambda: env.pods()["done"]["status"].get("phase") == "Running")
    env.kube.merge_patch(f"/api/v1/namespaces/{env.namespace}/pods/done/status",
                         {"status": {"phase": "Succeeded"}})  # holds nothing any more
    assert found(env) == []


def test_gpus_over_committed_are_found(env):
    node = env.add_node("n", gpus=8)
    for i in range(3):
        bound_pod(env, f"p{i}", node, gpus=4)
    (violation,) = found(env)
    assert "over-committed" in violation and "nvidia.com/gpu': '12 > 8'" in violation


def test_cpu_and_pod_count_over_committed_are_found(env):
    node = env.add_node("n", gpus=0, cpu="2", pods=1)
    bound_pod(env, "a", node, cpu="1500m")
    bound_pod(env, "b", node, cpu="1")
    (violation,) = found(env)
    assert "'cpu': '2.5 > 2'" in violation and "'pods': '2 > 1'" in violation


def test_other_schedulers_pods_count_by_number(env):
    node = env.add_node("n", gpus=8)
    bound_pod(env, "ours", node, gpus=8, ids="0,1,2,3,4,5,6,7")
    bound_pod(env, "theirs", node, gpus=1, scheduler="default-scheduler")  # no ids: not ours to name
    (violation,) = found(env)
    assert "nvidia.com/gpu': '9 > 8'" in violation


def test_a_gpu_id_held_twice_or_out_of_range_is_found(env):
    node = env.add_node("n", gpus=8)
    bound_pod(env, "a", node, gpus=1, ids="3")
    bound_pod(env, "b", node, gpus=1, ids="3")
    bound_pod(env, "c", node, gpus=1, ids="8")
    bound_pod(env, "d", node, gpus=1, ids="x")
    assert sorted(found(env)) == sorted([
        f"GPU 3 of node {node} held by 2 pods: ['{env.namespace}/a', '{env.namespace}/b']",
        f"GPU 8 of node {node} does not exist (it has 8): ['{env.namespace}/c']",
        f"pod {env.namespace}/d on {node}: unreadable {invariants.GPU_IDS_ANNOTATION} annotation",
    ])


def test_a_gang_bound_below_min_member_is_found(env):
    node = env.add_node("n", gpus=0)
    for name in ("partial", "whole", "none"):
        env.create(pod_group(name, env.namespace, 3))
    for i in range(3):
        bound_pod(env, f"whole-{i}", node, cpu="1", group="whole")
        env.create(pod(f"none-{i}", env.namespace, group="none", cpu="1"))
    bound_pod(env, "partial-0", node, cpu="1", group="partial")
    bound_pod(env, "partial-1", node, cpu="1", group="partial")
    env.create(pod("partial-2", env.namespace, group="partial", cpu="1"))
    assert found(env) == [f"gang {env.namespace}/partial: 2 of minMember 3 bound: ['partial-0', 'partial-1']"]


def write(client: str, sent: float, answered: float, status: int = 201, method: str = "POST") -> Record:
    return Record(client, method, "/api/v1/namespaces/x/pods/p/binding", "", sent, answered, status, status)


def test_a_write_by_a_deposed_leader_is_found():
    records = [write("a", 1.0, 1.1), write("b", 5.0, 5.1), write("b", 6.0, 6.1),
               write("a", 4.9, 5.2),  # sent before b's first write: in flight, allowed
               write("a", 6.5, 6.6),  # sent after: a violation
               write("a", 7.0, 7.1, status=409),  # refused: harmless
               write("a", 7.0, 0.0, status=0, method="GET")]
    (violation,) = invariants.deposed_leader_writes(records)
    assert "deposed leader 'a'" in violation and "sent 1.400s after" in violation
    assert invariants.deposed_leader_writes(records[:4]) == []


def test_the_leader_check_reads_the_proxys_record(env, proxy, tmp_path):
    for name in ("old", "new"):
        proxy.add_client(name, tmp_path)
    path = f"/api/v1/namespaces/{env.namespace}/configmaps"
    for client, name in (("old", "a"), ("new", "b"), ("old", "c")):
        assert call(proxy, client, "POST", path, configmap(name))[0] == 201
    (violation,) = invariants.deposed_leader_writes(proxy.records)
    assert f"POST {path} by deposed leader 'old'" in violation


def test_a_device_in_two_claims_or_a_claim_reserved_for_a_pod_bound_elsewhere_is_found(env):
    node, other = env.add_node("n", gpus=0), env.add_node("m", gpus=0)
    claims = f"/apis/resource.k8s.io/v1/namespaces/{env.namespace}/resourceclaims"
    for name, devices in (("a", ["gpu-0", "gpu-1"]), ("b", ["gpu-1"]), ("c", ["gpu-2"])):
        env.create(dra.claim(name, len(devices)))
        env.kube.merge_patch(f"{claims}/{name}/status", {"status": {"allocation": dra.allocation(node, devices)}})
    bound_pod(env, "p", other, cpu="1")
    uid = env.kube.get(f"/api/v1/namespaces/{env.namespace}/pods/p")["metadata"]["uid"]
    env.kube.merge_patch(f"{claims}/c/status", {"status": {"reservedFor": [
        {"resource": "pods", "name": "p", "uid": uid}]}})
    assert sorted(found(env)) == sorted([
        f"device {dra.DRIVER}/{node}/gpu-1 allocated in 2 claims: ['{env.namespace}/a', '{env.namespace}/b']",
        f"claim {env.namespace}/c allocated on {node} is reserved for pod p, bound to {other}",
    ])
