"""The extended-resource path against the real API server (v1.37.2): pods
asking plain ``nvidia.com/gpu`` on kwok nodes that serve it through NVIDIA's
DeviceClass only (no device plugin: no nvidia.com/gpu in allocatable) get
claims batchsched writes -- exact fields, allocation of the NVLink sets the
topology chooser picked, reservation, the pod's extendedResourceClaimStatus
-- before binding; failures undo what was written; a crash leaves no second
claim.  Every scenario checks that no device is in two claims."""
from __future__ import annotations

from collections import Counter

import pytest

from batchsched.api import constants
from tests.integration.test_dra_inventory import DGX1, allocated_claim, dra_node, gpu_class  # noqa: F401
from tests.integration.test_gang_scheduling import make_gang
from tests.integration.test_partial_gangs import refuse_binding_of
from tests.support import dra
from tests.support.kube import wait_for
from tests.support.objects import pod

pytestmark = pytest.mark.e2e

ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
FINALIZER = "resource.kubernetes.io/delete-protection"
QUADS = ({0, 1, 2, 3}, {4, 5, 6, 7})  # the DGX-1's NVLink quads (hybrid cube mesh)


def claims(env) -> list[dict]:
    """Every claim of the namespace, after checking no device is in two of them."""
    items = env.kube.get(f"/apis/resource.k8s.io/v1/namespaces/{env.namespace}/resourceclaims")["items"]
    held = Counter((r["driver"], r["pool"], r["device"]) for c in items
                   for r in ((c.get("status") or {}).get("allocation") or {"devices": {"results": []}})["devices"][
                       "results"])
    assert not [key for key, n in held.items() if n > 1], f"devices in two claims: {held}"
    return items


def extended_claims_of(env) -> dict[str, list[dict]]:
    """Pod name -> its extended-resource claims (by owner)."""
    owned: dict[str, list[dict]] = {}
    for c in claims(env):
        if (c["metadata"].get("annotations") or {}).get(ANNOTATION) == "true":
            owned.setdefault(c["metadata"]["ownerReferences"][0]["name"], []).append(c)
    return owned


def assert_claim_serves(env, pod: dict, claim: dict, topology, gpus: int) -> set[int]:
    """The claim is the one kube-scheduler would write for ``pod``, allocated
    on its node, reserved for it, and named by its status; returns the
    topology indices of its devices."""
    name, uid, node = pod["metadata"]["name"], pod["metadata"]["uid"], pod["spec"]["nodeName"]
    meta, spec, status = claim["metadata"], claim["spec"], claim["status"]
    assert meta["name"].startswith(f"{name}-extended-resources-") and meta.get("generateName") == \
        f"{name}-extended-resources-"
    assert meta["annotations"][ANNOTATION] == "true"
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid,
                                        "controller": True, "blockOwnerDeletion": True}]
    assert meta["finalizers"] == [FINALIZER]
    [request] = spec["devices"]["requests"]
    assert request["name"] == "container-0-request-0"
    assert {k: request["exactly"][k] for k in ("deviceClassName", "allocationMode", "count")} == {
        "deviceClassName": dra.GPU_CLASS, "allocationMode": "ExactCount", "count": gpus}
    results = status["allocation"]["devices"]["results"]
    assert {(r["request"], r["driver"], r["pool"]) for r in results} == {("container-0-request-0", dra.DRIVER, node)}
    assert status["allocation"]["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    assert status["reservedFor"] == [{"resource": "pods", "name": name, "uid": uid}]
    assert pod["status"]["extendedResourceClaimStatus"] == {
        "resourceClaimName": meta["name"],
        "requestMappings": [{"containerName": "main", "requestName": "container-0-request-0",
                             "resourceName": constants.GPU_RESOURCE}]}
    by_device = {f"gpu-{dra.minor(topology, i)}": i for i in range(len(topology))}
    indices = {by_device[r["device"]] for r in results}
    gpu_ids = pod["metadata"]["annotations"][constants.GPU_IDS_ANNOTATION]
    assert indices == {int(i) for i in gpu_ids.split(",")}  # the devices are the GPUs batchsched chose
    return indices


def test_an_extended_resource_gang_gets_nvlink_quads_through_the_claims_batchsched_writes(
        env, gpu_class, start_scheduler):
    text = DGX1.read_text()
    a, topology = dra_node(env, "dgx-a", text)
    dra_node(env, "dgx-b", text)
    c, _ = dra_node(env, "dgx-c", text)
    allocated_claim(env, "theirs", c, topology, [1])  # allocated by someone else (kube-scheduler, say)
    make_gang(env, "train", 4, gpus=4, cpu="1")
    start_scheduler()
    wait_for("the gang bound", lambda: len(env.bound()) == 4, timeout=60)

    pods, owned = env.pods(), extended_claims_of(env)
    assert sorted(owned) == sorted(pods)
    used_on: dict[str, list[set[int]]] = {}
    for name, pod in pods.items():
        [claim] = owned[name]
        quad = assert_claim_serves(env, pod, claim, topology, 4)
        assert quad in QUADS, f"{name} got GPUs {sorted(quad)}, not an NVLink quad"
        used_on.setdefault(pod["spec"]["nodeName"], []).append(quad)
    assert 1 not in set().union(*used_on.get(c, [set()]))  # someone else's device is left alone


def test_no_member_is_bound_when_one_claim_cannot_be_written_and_a_refused_binding_takes_its_claim_along(
        env, gpu_class, start_scheduler):
    text = DGX1.read_text()
    node, topology = dra_node(env, "dgx", text)
    # the API refuses the claim of one member of "all": none of the gang may be bound
    name = f"refuse-claim-{env.id}"
    env.add_cluster_object({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                     "resources": ["resourceclaims"]}]},
                 "validations": [{"expression": "!object.metadata.generateName.startsWith('all-1-')",
                                  "message": "claim of all-1 refused by policy"}]}})
    env.add_cluster_object({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": env.namespace}}}}})
    refuse_binding_of(env, "part-1")  # and the binding of one member of "part"
    make_gang(env, "all", 2, gpus=2, cpu="1")
    make_gang(env, "part", 2, gpus=2, cpu="1")
    proc = start_scheduler()

    def events_of(pod: str) -> list[str]:
        return [e["message"] for e in env.kube.get(f"/api/v1/namespaces/{env.namespace}/events")["items"]
                if e["involvedObject"]["name"] == pod and e["reason"] == "FailedBinding"]
    wait_for("the refused claim reported", lambda: any("refused by policy" in m for m in events_of("all-1")),
             timeout=60)
    wait_for("its gang mate told why", lambda: any("ResourceClaim of gang member all-1" in m
                                                   for m in events_of("all-0")))
    wait_for("part-1's refused binding reported", lambda: events_of("part-1"), timeout=60)
    wait_for("part-0 bound, with its claim", lambda: "part-0" in env.bound() and "part-0" in extended_claims_of(env))
    # between retries (the gangs back off): nothing of "all" bound, no claim of "all" or of part-1 left
    wait_for("the written claims deleted", lambda: not {"all-0", "all-1", "part-1"} & set(extended_claims_of(env)))
    assert not {"all-0", "all-1"} & set(env.bound())
    [claim] = extended_claims_of(env)["part-0"]
    assert_claim_serves(env, env.pods()["part-0"], claim, topology, 2)
    assert "Traceback" not in proc.log()


def test_after_a_kill_mid_gang_a_restart_leaves_one_claim_per_pod_and_binds_the_gang(
        env, gpu_class, start_scheduler):
    text = DGX1.read_text()
    dra_node(env, "dgx-a", text)
    b, topology = dra_node(env, "dgx-b", text)
    make_gang(env, "train", 4, gpus=4, cpu="1")  # all 16 GPUs
    # what a crash between claim and binding leaves: train-3's claim, allocated and reserved, pod unbound
    pod3 = env.pods()["train-3"]
    leftover = env.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"generateName": "train-3-extended-resources-", "annotations": {ANNOTATION: "true"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "train-3",
                                          "uid": pod3["metadata"]["uid"], "controller": True}],
                     "finalizers": [FINALIZER]},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
            "deviceClassName": dra.GPU_CLASS, "allocationMode": "ExactCount", "count": 4}}]}}})
    allocation = dra.allocation(b, [f"gpu-{dra.minor(topology, i)}" for i in (0, 2, 5, 7)])  # no NVLink quad
    for result in allocation["devices"]["results"]:
        result["request"] = "container-0-request-0"
    env.kube.request("PUT", f"/apis/resource.k8s.io/v1/namespaces/{env.namespace}/resourceclaims/"
                     f"{leftover['metadata']['name']}/status", {**leftover, "status": {
                         "allocation": allocation,
                         "reservedFor": [{"resource": "pods", "name": "train-3", "uid": pod3["metadata"]["uid"]}]}})
    proc = start_scheduler()
    wait_for("a claim written", lambda: len(claims(env)) >= 2, timeout=60, interval=0.02)
    proc.kill()  # kill -9 mid-gang
    start_scheduler()
    wait_for("the gang bound", lambda: len(env.bound()) == 4, timeout=60)
    wait_for("one claim per pod", lambda: all(len(c) == 1 for c in extended_claims_of(env).values())
             and len(extended_claims_of(env)) == 4)
    pods, owned = env.pods(), extended_claims_of(env)
    assert leftover["metadata"]["name"] not in {c["metadata"]["name"] for cs in owned.values() for c in cs}
    for name, pod in pods.items():
        assert assert_claim_serves(env, pod, owned[name][0], topology, 4) in QUADS


def test_without_resourceclaims_binding_the_refusal_is_explained_and_nothing_is_left(
        env, gpu_class, start_scheduler, kubeconfig, tmp_path):
    import yaml

    from tests.integration.test_deploy import DEPLOY
    from tests.support.kubectl import service_account_kubeconfig

    role = next(o for o in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if o["kind"] == "ClusterRole")
    rules = [{**r, "resources": [x for x in r["resources"] if x != "resourceclaims/binding"]} for r in role["rules"]]
    rules = [r for r in rules if r["resources"]]
    rules.append({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "update"]})
    name = f"no-binding-{env.id}"
    env.add_cluster_object({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                            "metadata": {"name": name}, "rules": rules})
    env.add_cluster_object({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                            "metadata": {"name": name},
                            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                            "subjects": [{"kind": "ServiceAccount", "name": "sched", "namespace": env.namespace}]})
    env.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sched"}})
    dra_node(env, "dgx", DGX1.read_text())
    make_gang(env, "train", 1, gpus=2, cpu="1")
    proc = start_scheduler(kubeconfig=service_account_kubeconfig(env.kube, kubeconfig, env.namespace, "sched",
                                                                 tmp_path / "sa-kubeconfig"))

    def explained() -> list[str]:
        return [e["message"] for e in env.kube.get(f"/api/v1/namespaces/{env.namespace}/events")["items"]
                if e["involvedObject"]["name"] == "train-0" and e["reason"] == "FailedBinding"
                and "needs update on resourceclaims/binding, which the scheduler's RBAC does not grant"
                in e["message"]]
    wait_for("the missing permission named", explained, timeout=60)
    assert "needs update on resourceclaims/binding" in proc.log()
    wait_for("its claim deleted", lambda: not extended_claims_of(env))
    assert env.bound() == {}


def test_the_serving_class_config_is_written_into_the_allocation(env, gpu_class, start_scheduler):
    opaque = {"driver": dra.DRIVER, "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                                                   "sharing": {"strategy": "TimeSlicing"}}}
    configured = dra.device_class(name=f"a-configured-{env.id}")  # sorts first: the class its claims ask
    configured["spec"]["config"] = [{"opaque": opaque}]
    env.add_cluster_object(configured)
    node, topology = dra_node(env, "dgx", DGX1.read_text())
    make_gang(env, "train", 1, gpus=2, cpu="1")
    start_scheduler()
    wait_for("the pod bound", lambda: "train-0" in env.bound(), timeout=60)
    [claim] = extended_claims_of(env)["train-0"]
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == configured["metadata"]["name"]
    assert claim["status"]["allocation"]["devices"]["config"] == [
        {"source": "FromClass", "requests": ["container-0-request-0"], "opaque": opaque}]
    assert len(claim["status"]["allocation"]["devices"]["results"]) == 2


def init_gpu_pod(env, name: str) -> dict:
    """A pod whose init container asks 2 GPUs that its app container reuses."""
    body = pod(name, env.namespace, gpus=2, cpu="1")
    body["spec"]["initContainers"] = [{"name": "warm", "image": "registry.example/train:1",
                                       "resources": {"limits": {constants.GPU_RESOURCE: "2"}}}]
    return env.create(body)


def test_a_pod_reusing_init_container_gpus_is_kept_off_dra_nodes_with_a_reason_and_goes_to_the_device_plugin(
        env, gpu_class, start_scheduler):
    dra_node(env, "dgx", DGX1.read_text())
    init_gpu_pod(env, "warm")
    start_scheduler()

    def reason() -> str:
        condition = next((c for c in (env.pods()["warm"].get("status") or {}).get("conditions") or []
                          if c["type"] == "PodScheduled"), {})
        return condition.get("message", "") if condition.get("reason") == "Unschedulable" else ""
    message = wait_for("warm unschedulable with the node's reason", reason, timeout=60)
    assert "serve nvidia.com/gpu through DRA, where this version gives no pod the GPUs of an init container" \
        in message, message
    assert env.bound() == {} and not extended_claims_of(env)
    plugin = env.add_node("plugin", gpus=8)  # the device plugin's nvidia.com/gpu
    wait_for("warm bound where the device plugin serves its GPUs", lambda: env.bound().get("warm") == plugin,
             timeout=60)
    assert not extended_claims_of(env)
