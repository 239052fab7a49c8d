"""A tenant with a namespace-scoped ServiceAccount tries every trick of
issue 11, point 4; none buys it more than its pods were admitted with.

The tenant acts through its own token, bound to Kubernetes' `edit` role in
its namespace (with what deploy/tenant-roles.yaml aggregates into it), as a
user of a shared cluster would be.
"""
from __future__ import annotations

import pytest

from batchsched.api.constants import GPU_IDS_ANNOTATION, PREEMPTIBLE_ANNOTATION
from tests.integration.test_gang_scheduling import condition, make_gang, members_bound
from tests.support.kube import KubeError, TestKube, object_collection_path, wait_for
from tests.support.kubectl import service_account_kubeconfig
from tests.support.objects import pod, pod_group, priority_class

pytestmark = pytest.mark.e2e


def may(client: TestKube, namespace: str, verb: str, resource: str, subresource: str = "") -> bool:
    review = client.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "group": "scheduling.batchsched.io",
                                        "resource": resource, "subresource": subresource}}})
    return review["status"].get("allowed", False)


@pytest.fixture
def tenant(env, kube, kubeconfig, tmp_path, deployed) -> TestKube:
    """A client acting as a tenant: bound to `edit` in env's namespace, into
    which deploy/'s RBAC (applied once per cluster) aggregates its roles."""
    deployed.apply(kube)
    env.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant"}})
    env.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "tenant"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": env.namespace}]})
    client = TestKube(service_account_kubeconfig(kube, kubeconfig, env.namespace, "tenant",
                                                 tmp_path / "tenant-kubeconfig"))
    # the controller manager aggregates the shipped roles into edit a moment later
    wait_for("the tenant's RBAC in force", lambda: may(client, env.namespace, "create", "podgroups"))
    return client


def as_tenant(tenant: TestKube, env, obj: dict) -> dict:
    obj.setdefault("metadata", {})["namespace"] = env.namespace
    return tenant.create(object_collection_path(obj), obj)


def test_naming_a_system_priority_class_on_the_podgroup_buys_nothing(env, tenant, start_scheduler):
    training = f"training-{env.id}"
    env.add_cluster_object(priority_class(training, 1000))
    env.add_node("gpu0", gpus=8)
    # the tenant's gang is older and its PodGroup claims system-cluster-critical...
    as_tenant(tenant, env, pod_group("greedy", env.namespace, 2, priorityClassName="system-cluster-critical"))
    for i in range(2):
        as_tenant(tenant, env, pod(f"greedy-{i}", env.namespace, group="greedy", gpus=4, cpu="1"))
    # ...but its pods were admitted at priority 0; these at 1000
    env.create(pod_group("honest", env.namespace, 2))
    for i in range(2):
        env.create(pod(f"honest-{i}", env.namespace, group="honest", gpus=4, cpu="1", priority_class=training))
    start_scheduler()
    wait_for("the honest gang bound", lambda: members_bound(env, "honest-") == ["honest-0", "honest-1"])
    wait_for("the greedy gang refused", lambda: condition(env.podgroup("greedy"), "Scheduled").get("reason")
             == "Unschedulable")
    assert members_bound(env, "greedy-") == []


def test_a_member_created_already_bound_gives_no_precedence(env, tenant, start_scheduler):
    # The node is cordoned while everything arrives, then opened: both gangs
    # wait in the same cycle, and only queue order decides who gets the room.
    node = env.add_node("gpu0", gpus=4)
    env.kube.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})
    proc = start_scheduler()
    wait_for("the scheduler's first list done", lambda: proc.get("/readyz")[0] == 200)
    placed = pod("forged-0", env.namespace, group="forged", gpus=1, cpu="1")
    placed["spec"]["nodeName"] = node  # "partly bound": the queue must not believe it
    as_tenant(tenant, env, placed)
    env.create(pod_group("fair", env.namespace, 3))  # the older gang
    for i in range(3):
        env.create(pod(f"fair-{i}", env.namespace, group="fair", gpus=1, cpu="1"))
    as_tenant(tenant, env, pod_group("forged", env.namespace, 2))
    as_tenant(tenant, env, pod("forged-1", env.namespace, group="forged", gpus=1, cpu="1"))
    for name in ("fair", "forged"):
        wait_for(f"{name} waiting", lambda: condition(env.podgroup(name), "Scheduled").get("reason")
                 == "Unschedulable")
    env.kube.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": False}})
    wait_for("the older gang bound", lambda: members_bound(env, "fair-") == ["fair-0", "fair-1", "fair-2"])
    assert "forged-1" not in env.bound()


def test_a_tenant_writes_podgroups_but_never_what_the_scheduler_believes_of_them(env, kube, tenant):
    path = f"/apis/scheduling.batchsched.io/v1alpha1/namespaces/{env.namespace}/podgroups/mine"
    forged = pod_group("mine", env.namespace, 2)
    forged["status"] = {"boundByScheduler": ["a-uid-of-its-own"]}  # dropped: status is a subresource
    as_tenant(tenant, env, forged)
    tenant.merge_patch(path, {"spec": {"minMember": 3}})
    assert tenant.get(path)["spec"]["minMember"] == 3
    assert "boundByScheduler" not in (tenant.get(path).get("status") or {})
    for write in (lambda: tenant.merge_patch(f"{path}/status", {"status": {"boundByScheduler": ["a-uid"]}}),
                  lambda: tenant.request("PUT", f"{path}/status", body=tenant.get(path))):
        with pytest.raises(KubeError) as refused:
            write()
        assert refused.value.status == 403
    assert not may(tenant, env.namespace, "patch", "podgroups", "status")
    # and whoever views (cluster-wide, Queues being cluster-scoped) reads Queues
    assert any("scheduling.batchsched.io" in rule.get("apiGroups", ()) and "queues" in rule.get("resources", ())
               and "list" in rule.get("verbs", ())
               for rule in kube.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/view").get("rules") or ())


def test_a_member_created_bound_while_no_scheduler_ran_gives_no_precedence_after_the_start(
        env, tenant, start_scheduler):
    low, high = f"low-{env.id}", f"high-{env.id}"
    env.add_cluster_object(priority_class(low, 100))
    env.add_cluster_object(priority_class(high, 1000))
    node = env.add_node("gpu0", gpus=4)
    # No replica runs (a restart, an upgrade): the tenant makes its low gang
    # look partly bound, one member created on the node...
    as_tenant(tenant, env, pod_group("low", env.namespace, 2))
    forged = pod("low-0", env.namespace, group="low", gpus=1, cpu="1", priority_class=low)
    forged["spec"]["nodeName"] = node
    as_tenant(tenant, env, forged)
    as_tenant(tenant, env, pod("low-1", env.namespace, group="low", gpus=3, cpu="1", priority_class=low))
    # ...so that its remainder would come first and take the room this gang needs
    env.create(pod_group("high", env.namespace, 1))
    env.create(pod("high-0", env.namespace, group="high", gpus=3, cpu="1", priority_class=high))
    start_scheduler()
    wait_for("the higher-priority gang bound", lambda: members_bound(env, "high-") == ["high-0"])
    wait_for("the low gang waiting", lambda: condition(env.podgroup("low"), "Scheduled").get("reason")
             == "Unschedulable")
    assert "low-1" not in env.bound()
    # what a later start believes: high-0 bound by batchsched, nothing of the low gang
    high_uid = env.pods()["high-0"]["metadata"]["uid"]
    wait_for("high-0 recorded", lambda: (env.podgroup("high").get("status") or {}).get("boundByScheduler")
             == [high_uid])
    assert "boundByScheduler" not in env.podgroup("low")["status"]


def ids_of(env, name: str) -> set[int]:
    text = (env.pods()[name]["metadata"].get("annotations") or {}).get(GPU_IDS_ANNOTATION, "")
    return {int(i) for i in text.split(",") if i}


@pytest.mark.parametrize("edit", ["claim-the-others", "remove"])
def test_editing_the_gpu_ids_annotation_moves_and_frees_nothing(env, tenant, start_scheduler, edit):
    env.add_node("gpu0", gpus=4)
    as_tenant(tenant, env, pod("first", env.namespace, gpus=2, cpu="1"))
    start_scheduler()
    wait_for("first bound", lambda: "first" in env.bound())
    held = ids_of(env, "first")
    assert len(held) == 2
    wait_for("first running", lambda: env.pods()["first"]["status"].get("phase") == "Running")
    others = set(range(4)) - held
    value = ",".join(map(str, sorted(others))) if edit == "claim-the-others" else None
    tenant.merge_patch(f"/api/v1/namespaces/{env.namespace}/pods/first",
                       {"metadata": {"annotations": {GPU_IDS_ANNOTATION: value}}})
    as_tenant(tenant, env, pod("second", env.namespace, gpus=2, cpu="1"))
    wait_for("second bound", lambda: "second" in env.bound())
    assert ids_of(env, "second") == others, "the scheduler believed the edited annotation"


def test_the_preemptible_opt_out_is_ignored_unless_the_config_trusts_the_namespace(env, tenant, start_scheduler):
    low, high = f"low-{env.id}", f"high-{env.id}"
    env.add_cluster_object(priority_class(low, 100))
    env.add_cluster_object(priority_class(high, 1000))
    node = env.add_node("gpu0", gpus=8)
    squatter = pod("squatter", env.namespace, gpus=8, cpu="1", priority_class=low, scheduler="default-scheduler")
    squatter["spec"]["nodeName"] = node
    squatter["metadata"]["annotations"] = {PREEMPTIBLE_ANNOTATION: "false"}
    as_tenant(tenant, env, squatter)
    wait_for("squatter running", lambda: env.pods()["squatter"]["status"].get("phase") == "Running")
    make_gang(env, "train", 1, group_spec={"priorityClassName": high}, gpus=8, cpu="1", priority_class=high)
    start_scheduler(preemption={"enabled": True, "nodeCooldownSeconds": 0})
    wait_for("the gang bound after evicting the squatter", lambda: members_bound(env, "train-") == ["train-0"],
             timeout=60)
