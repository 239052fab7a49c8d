"""Claims fail closed, against the real API server (v1.37.2): a foreign
claim whose content is legal but hostile (8,000 bytes of non-ASCII opaque
parameters, as kubectl sends them; 257 ownerReferences) still holds every
GPU it was allocated, so no pod of ours lands on them; and a scheduler that
may list ResourceSlices but not ResourceClaims frees no DRA GPU, and says
so in its log, after `/readyz`'s ok and in `explain`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_dra_claims import claiming_pod
from tests.integration.test_dra_inventory import DGX1, dra_node, explain, gpu_class, set_allocation  # noqa: F401
from tests.integration.test_pod_status import pod_scheduled
from tests.support import dra
from tests.support.kube import wait_for
from tests.support.kubectl import run_kubectl, service_account_kubeconfig
from tests.support.objects import pod

pytestmark = pytest.mark.e2e

NOT_FREE = "no DRA GPU counts as free until they can be read"


def every_gpu_claimed(env, kubectl: str, name: str, node: str, topology, **extra) -> None:
    """A claim of someone else's holding every GPU of ``node``, created as a
    tenant's kubectl sends it (non-ASCII text as UTF-8, not \\u-escaped)."""
    obj = dra.claim(name, len(topology))
    obj["metadata"].update(namespace=env.namespace, **extra.pop("metadata", {}))
    obj["spec"]["devices"].update(extra)
    run_kubectl(kubectl, env.kubeconfig, "create", "-f", "-", stdin=json.dumps(obj, ensure_ascii=False))
    set_allocation(env, name, dra.allocation(node, [f"gpu-{dra.minor(topology, i)}" for i in range(len(topology))]))


def placed_or_refused(env, name: str, says: str) -> None:
    """The pod is not bound, and PodScheduled=False saying ``says``."""
    def seen():
        condition = pod_scheduled(env, name)
        return env.bound().get(name) or (condition.get("status") == "False" and says in condition.get("message", ""))
    wait_for(f"{name} bound, or refused saying {says!r}", seen, timeout=30)
    assert name not in env.bound(), f"{name} bound onto {env.bound()[name]}, whose GPUs are not known free"


def test_foreign_claims_with_hostile_but_legal_content_keep_every_gpu_they_hold(
        env, gpu_class, kubectl, start_scheduler, tmp_path):
    utf8_node, topology = dra_node(env, "utf8", DGX1.read_text())
    owned_node, _ = dra_node(env, "owned", DGX1.read_text())
    # 8,012 bytes as the API counts them (24,012 once \u-escaped): legal, and read whole
    every_gpu_claimed(env, kubectl, "utf8", utf8_node, topology, config=[
        {"requests": ["gpus"], "opaque": {"driver": dra.DRIVER, "parameters": {"note": "é" * 4000}}}])
    # 257 owners (real ones, so the garbage collector leaves them be): legal, read no further than the allocation
    owners = [env.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"owner-{i}"}})
              for i in range(257)]
    every_gpu_claimed(env, kubectl, "owned", owned_node, topology, metadata={"ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]}
        for o in owners]})
    env.create(pod("pair", env.namespace, gpus=2, cpu="1"))
    claiming_pod(env, "joiner", claim="owned")
    start_scheduler()

    placed_or_refused(env, "pair", "free device")
    placed_or_refused(env, "joiner", f"ResourceClaim {env.namespace}/owned: not read: metadata.ownerReferences has "
                                     "257 entries, more than 256")
    checklist = explain(env, tmp_path, "pod/pair")
    assert checklist["gpuChecklist"]["dra"]["allocated"] == 16
    assert {n["node"]: n["fits"] for n in checklist["shapes"][0]["nodes"]} == {utf8_node: 0, owned_node: 0}
    assert not env.bound()


def restricted_service_account(env, deployed, kubectl: str, tmp_path: Path) -> str:
    """A kubeconfig of a ServiceAccount of the test's namespace granted
    deploy/rbac.yaml less list and watch on resourceclaims (all else as shipped)."""
    shipped = {o["kind"]: o for o in deployed.rbac  # the scheduler's own (deploy/ also ships tenants' roles)
               if o["metadata"]["name"] in ("batchsched", "batchsched-leader-election", "batchsched-system")}
    rules = []
    for rule in shipped["ClusterRole"]["rules"]:
        if "resourceclaims" in rule["resources"] and "list" in rule["verbs"]:
            rule = {**rule, "resources": [r for r in rule["resources"] if r != "resourceclaims"]}
        rules.append(rule)
    name = f"{env.id}-batchsched-without-claims-list"
    subject = [{"kind": "ServiceAccount", "name": "batchsched", "namespace": env.namespace}]
    env.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "batchsched"}})
    env.add_cluster_object({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                            "metadata": {"name": name}, "rules": rules})
    env.add_cluster_object({**shipped["ClusterRoleBinding"], "metadata": {"name": name},
                            "roleRef": {**shipped["ClusterRoleBinding"]["roleRef"], "name": name},
                            "subjects": subject})
    env.create({**shipped["Role"], "metadata": {"name": "leader-election"}})  # the test's own Lease
    env.create({**shipped["RoleBinding"], "metadata": {"name": "leader-election"},
                "roleRef": {**shipped["RoleBinding"]["roleRef"], "name": "leader-election"}, "subjects": subject})
    forbidden = run_kubectl(kubectl, env.kubeconfig, "auth", "can-i", "list", "resourceclaims.resource.k8s.io",
                            f"--as=system:serviceaccount:{env.namespace}:batchsched", check=False)
    assert forbidden.stdout.strip() == "no"
    return service_account_kubeconfig(env.kube, env.kubeconfig, env.namespace, "batchsched",
                                      tmp_path / "without-claims-list")


def test_with_less_than_the_shipped_rbac_no_resourceclaims_list_frees_no_dra_gpu_and_says_so(
        env, deployed, gpu_class, kubectl, start_scheduler, tmp_path):
    dra_node_name, _ = dra_node(env, "dra", DGX1.read_text())  # 8 DRA GPUs, none allocated that it can see
    plain = env.add_node("plain", gpus=8)
    env.create(pod("on-dra", env.namespace, gpus=1, cpu="1", node_selector={"kubernetes.io/hostname": dra_node_name}))
    env.create(pod("on-plain", env.namespace, gpus=1, cpu="1", node_selector={"kubernetes.io/hostname": plain}))
    kubeconfig = restricted_service_account(env, deployed, kubectl, tmp_path)
    proc = start_scheduler(kubeconfig=kubeconfig)

    wait_for("on-plain bound (the device plugin's GPUs are served)", lambda: env.bound().get("on-plain"), timeout=30)
    placed_or_refused(env, "on-dra", "free device")
    note = f"resourceclaims may not be read (RBAC): {NOT_FREE}"
    assert proc.get("/readyz") == (200, f"ok, degraded: {note}\n")
    report = explain(env, tmp_path, "pod/on-dra", kubeconfig=kubeconfig)
    assert report["gpuChecklist"]["dra"]["claimsUnreadable"] == note
    reasons = {n["node"]: n["reasons"] for n in report["shapes"][0]["nodes"]}
    assert reasons[dra_node_name][-1] == note
    assert "on-dra" not in env.bound()
    assert len([line for line in proc.log().splitlines() if NOT_FREE in line]) == 1
