"""Pods' own ResourceClaims against the real API server (v1.37.2) and the
real resourceclaim controller (kube-controller-manager): claims made from
ResourceClaimTemplates are allocated with the NVLink set batchsched chose
(the finalizer by a merge patch carrying the resourceVersion, then one
status update with allocation and reservedFor), by the scheduler's own
ServiceAccount under deploy/rbac.yaml, as every test here runs it, a claim shared by two pods is allocated once and reserved for
both, devices allocated by someone else are left alone, a claim asking all devices gets
every GPU of a node where none is taken, and a form batchsched does not
allocate is refused with a condition.  Every scenario checks that
no device is in two claims."""
from __future__ import annotations

import pytest

from batchsched.api import constants
from tests.integration.test_dra_extended import FINALIZER, claims
from tests.integration.test_dra_inventory import DGX1, allocated_claim, dra_node, gpu_class  # noqa: F401
from tests.integration.test_partial_gangs import refuse_binding_of
from tests.support import dra
from tests.support.kube import wait_for
from tests.support.objects import pod, pod_group

pytestmark = pytest.mark.e2e

API = "/apis/resource.k8s.io/v1"


def template(env, name: str, count: int) -> None:
    env.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": env.namespace},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                    "deviceClassName": dra.GPU_CLASS, "allocationMode": "ExactCount", "count": count}}]}}}})


def claiming_pod(env, name: str, *, group: str | None = None, template_name: str = "", claim: str = "") -> dict:
    obj = pod(name, env.namespace, group=group, cpu="1")
    entry = {"name": "gpus", **({"resourceClaimTemplateName": template_name} if template_name
                                else {"resourceClaimName": claim})}
    obj["spec"]["resourceClaims"] = [entry]
    obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    return env.create(obj)


def claim_named(env, name: str) -> dict:
    return env.kube.get(f"{API}/namespaces/{env.namespace}/resourceclaims/{name}")


def indices_of(claim: dict, topology) -> set[int]:
    by_device = {f"gpu-{dra.minor(topology, i)}": i for i in range(len(topology))}
    return {by_device[r["device"]] for r in claim["status"]["allocation"]["devices"]["results"]}


def assert_allocated_for(claim: dict, pods: list[dict], node: str) -> None:
    status = claim["status"]
    assert FINALIZER in claim["metadata"]["finalizers"]
    assert {(r["request"], r["driver"], r["pool"]) for r in status["allocation"]["devices"]["results"]} == \
        {("gpus", dra.DRIVER, node)}
    assert status["allocation"]["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    assert sorted(status["reservedFor"], key=lambda r: r["name"]) == sorted(
        ({"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods),
        key=lambda r: r["name"])


def test_template_claims_of_a_gang_get_nvlink_pairs_and_skip_devices_allocated_by_others(
        env, gpu_class, start_scheduler):
    node, topology = dra_node(env, "dgx", DGX1.read_text())
    allocated_claim(env, "theirs", node, topology, [0, 5])  # kube-scheduler's, say
    template(env, "pair", 2)
    env.create(pod_group("train", env.namespace, 2))
    for i in range(2):
        claiming_pod(env, f"train-{i}", group="train", template_name="pair")
    start_scheduler()
    wait_for("the gang bound", lambda: len(env.bound()) == 2, timeout=60)

    items = {c["metadata"]["name"]: c for c in claims(env)}  # (no device in two claims)
    used: set[int] = set()
    for name, p in env.pods().items():
        [status] = p["status"]["resourceClaimStatuses"]  # written by the resourceclaim controller
        claim = items[status["resourceClaimName"]]
        assert claim["metadata"]["ownerReferences"][0]["uid"] == p["metadata"]["uid"]
        assert_allocated_for(claim, [p], node)
        pair = indices_of(claim, topology)
        assert len(pair) == 2 and all(topology.link(i, j).kind == "NV" for i in pair for j in pair if i < j), \
            f"{name} got GPUs {sorted(pair)}, not an NVLink pair"
        gpu_ids = {int(i) for i in p["metadata"]["annotations"][constants.GPU_IDS_ANNOTATION].split(",")}
        assert gpu_ids == pair  # the devices are the GPUs batchsched chose
        used |= pair
    assert len(used) == 4 and not used & {0, 5}


def test_a_claim_shared_by_two_pods_is_allocated_once_and_reserved_for_both(env, gpu_class, start_scheduler):
    node, topology = dra_node(env, "dgx", DGX1.read_text())
    env.create(dra.claim("shared", 4))
    first = claiming_pod(env, "first", claim="shared")
    second = claiming_pod(env, "second", claim="shared")
    start_scheduler()
    wait_for("both bound", lambda: len(env.bound()) == 2, timeout=60)
    assert set(env.bound().values()) == {node}
    claim = next(c for c in claims(env) if c["metadata"]["name"] == "shared")
    assert_allocated_for(claim, [first, second], node)
    assert len(indices_of(claim, topology)) == 4


def test_a_claim_batchsched_does_not_allocate_is_refused_with_a_condition_and_left_alone(
        env, gpu_class, start_scheduler):
    dra_node(env, "dgx", DGX1.read_text())
    env.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "either", "namespace": env.namespace},
                "spec": {"devices": {"requests": [{"name": "gpus", "firstAvailable": [
                    {"name": "four", "deviceClassName": dra.GPU_CLASS, "count": 4},
                    {"name": "two", "deviceClassName": dra.GPU_CLASS, "count": 2}]}]}}})
    env.create(pod_group("solo", env.namespace, 1))
    claiming_pod(env, "solo-0", group="solo", claim="either")
    start_scheduler()

    def condition():
        found = [c for c in (env.podgroup("solo").get("status") or {}).get("conditions") or ()
                 if c["type"] == "Unschedulable" and c["status"] == "True"]
        return found[0] if found else None
    refused = wait_for("the refusal on the PodGroup", condition, timeout=30)
    assert refused["reason"] == "ResourceClaimsNotReady"
    assert "ResourceClaim" in refused["message"] and "firstAvailable" in refused["message"]
    assert not env.bound()
    assert not (claim_named(env, "either").get("status") or {}).get("allocation")


def test_a_claim_asking_all_devices_gets_every_gpu_of_a_node_where_none_is_taken(env, gpu_class, start_scheduler):
    busy, topology = dra_node(env, "busy", DGX1.read_text())
    free, _ = dra_node(env, "free", DGX1.read_text())
    allocated_claim(env, "theirs", busy, topology, [3])  # one GPU of busy is someone else's
    env.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "whole", "namespace": env.namespace},
                "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                    "deviceClassName": dra.GPU_CLASS, "allocationMode": "All"}}]}}})
    solo = claiming_pod(env, "solo", claim="whole")
    start_scheduler()
    wait_for("the pod bound", lambda: len(env.bound()) == 1, timeout=60)
    assert env.bound() == {"solo": free}
    claim = claim_named(env, "whole")
    assert_allocated_for(claim, [solo], free)
    assert indices_of(claim, topology) == set(range(8))
    gpu_ids = env.pods()["solo"]["metadata"]["annotations"][constants.GPU_IDS_ANNOTATION]
    assert {int(i) for i in gpu_ids.split(",")} == set(range(8))
    used = [(r["pool"], r["device"]) for c in claims(env) for r in
            ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", ())]
    assert len(used) == len(set(used)) == 9  # no device in two claims


def test_no_member_is_bound_when_one_claim_cannot_be_allocated_and_a_refused_binding_undoes_its_claim(
        env, gpu_class, start_scheduler):
    node, _ = dra_node(env, "dgx", DGX1.read_text())
    template(env, "pair", 2)
    # the API refuses the allocation of all-1's claim: no member of "all" may be bound
    name = f"refuse-allocation-{env.id}"
    env.add_cluster_object({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                     "resources": ["resourceclaims/status"]}]},
                 "validations": [{"expression": "!has(object.status.reservedFor) || "
                                                "!object.status.reservedFor.exists(r, r.name == 'all-1')",
                                  "message": "allocation for all-1 refused by policy"}]}})
    env.add_cluster_object({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": env.namespace}}}}})
    refuse_binding_of(env, "part-1")  # and the binding of one member of "part"
    for gang in ("all", "part"):
        env.create(pod_group(gang, env.namespace, 2))
        for i in range(2):
            claiming_pod(env, f"{gang}-{i}", group=gang, template_name="pair")
    proc = start_scheduler()

    def events_of(pod_name: str) -> list[str]:
        return [e["message"] for e in env.kube.get(f"/api/v1/namespaces/{env.namespace}/events")["items"]
                if e["involvedObject"]["name"] == pod_name and e["reason"] == "FailedBinding"]

    def claim_of(pod_name: str) -> dict:
        made = env.pods()[pod_name]["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        return next(c for c in claims(env) if c["metadata"]["name"] == made)

    def untouched(pod_name: str) -> bool:
        claim = claim_of(pod_name)
        return (not (claim.get("status") or {}).get("allocation") and not claim["status"].get("reservedFor")
                and FINALIZER not in (claim["metadata"].get("finalizers") or ()))

    wait_for("the refused allocation reported", lambda: any("refused by policy" in m for m in events_of("all-1")),
             timeout=60)
    wait_for("its gang mate told why", lambda: any("ResourceClaim of gang member all-1" in m
                                                   for m in events_of("all-0")))
    wait_for("part-1's refused binding reported", lambda: events_of("part-1"), timeout=60)
    wait_for("part-0 bound", lambda: "part-0" in env.bound())
    # between retries (the gangs back off): the claims of all-0, all-1 and part-1 hold nothing of ours
    wait_for("what was written undone", lambda: all(untouched(p) for p in ("all-0", "all-1", "part-1")))
    assert not {"all-0", "all-1", "part-1"} & set(env.bound())
    assert_allocated_for(claim_of("part-0"), [env.pods()["part-0"]], node)
    assert "Traceback" not in proc.log()
