"""A gang whose binding the API refuses persistently (issue 11, point 8).

A ValidatingAdmissionPolicy refuses the pods/binding of one member, as an
admission webhook or a quota would.  The refused binding backs off instead
of being retried every cycle, and once the gang has been partly bound for
binding.partialGangTimeoutSeconds its bound members are evicted through the
Eviction API; when its pods return (the policy lifted), the gang binds whole.
"""
from __future__ import annotations

import re
import time

import pytest

from tests.integration.test_gang_scheduling import condition, make_gang, members_bound
from tests.support.kube import wait_for
from tests.support.objects import pod, priority_class

pytestmark = pytest.mark.e2e


def refuse_binding_of(env, pod_name: str) -> str:
    """Refuse every pods/binding of ``pod_name`` in env's namespace, as an
    admission webhook would; returns once the API server enforces it."""
    name = f"refuse-{env.id}"
    env.add_cluster_object({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{
                     "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                     "resources": ["pods/binding"]}]},
                 "validations": [{"expression": f"object.metadata.name != '{pod_name}'",
                                  "message": f"binding of {pod_name} refused by policy"}]}})
    env.add_cluster_object({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": env.namespace}}}}})
    # The API server loads the policy a moment later: probe with a pod of
    # that name (bound by nobody else) until a binding of it is refused.
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod_name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": env.nodes[0]}}
    path = f"/api/v1/namespaces/{env.namespace}/pods/{pod_name}"

    def refused() -> bool:
        env.create(pod(pod_name, env.namespace, cpu="1", scheduler="nobody"))
        try:
            env.kube.create(path + "/binding", body)
        except Exception as exc:  # noqa: BLE001 - any refusal will do
            return "refused by policy" in str(exc)
        finally:
            env.kube.delete(path, gracePeriodSeconds=0)
            wait_for("probe pod gone", lambda: pod_name not in env.pods())
        return False
    wait_for("the admission policy in force", refused, timeout=30, interval=0.5)
    return name


def lift(env, policy: str, pod_name: str) -> None:
    """Remove ``refuse_binding_of``'s policy; returns once a binding of the
    pod would go through (a dry run, which admission judges alike)."""
    for path in list(env.cluster_objects):
        if policy in path:
            env.kube.delete(path)
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod_name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": env.nodes[0]}}

    def admitted() -> bool:
        try:
            env.kube.request("POST", f"/api/v1/namespaces/{env.namespace}/pods/{pod_name}/binding", body=body,
                             query={"dryRun": "All"})
        except Exception as exc:  # noqa: BLE001 - refused by the policy still
            return "refused by policy" not in str(exc)
        return True
    wait_for("the admission policy lifted", admitted, timeout=30, interval=0.5)


def test_a_gang_partly_bound_before_a_restart_keeps_its_precedence(env, start_scheduler):
    """A start believes who bound a member from the PodGroup's status alone
    (docs/binding.md): what the first replica wrote there, the next reads."""
    low, high = f"low-{env.id}", f"high-{env.id}"
    env.add_cluster_object(priority_class(low, 100))
    env.add_cluster_object(priority_class(high, 1000))
    env.add_node("n1", gpus=4)
    policy = refuse_binding_of(env, "g-2")
    make_gang(env, "g", 3, cpu="1", gpus=1, priority_class=low)
    first = start_scheduler(binding={"retries": 0})
    wait_for("two members bound", lambda: members_bound(env, "g-") == ["g-0", "g-1"], timeout=30)
    uids = sorted(env.pods()[name]["metadata"]["uid"] for name in ("g-0", "g-1"))
    wait_for("both recorded", lambda: sorted((env.podgroup("g").get("status") or {}).get("boundByScheduler") or ())
             == uids, timeout=30)
    first.stop()
    lift(env, policy, "g-2")
    # a gang of higher priority that needs the room the remainder needs
    make_gang(env, "h", 1, cpu="1", gpus=2, priority_class=high)
    start_scheduler()
    wait_for("the partly bound gang completed first", lambda: members_bound(env, "g-") == ["g-0", "g-1", "g-2"],
             timeout=30)
    wait_for("the other gang waiting", lambda: condition(env.podgroup("h"), "Scheduled").get("reason")
             == "Unschedulable")
    assert members_bound(env, "h-") == []


def bind_errors(proc) -> float:
    status, body = proc.get("/metrics")
    match = re.search(r"^batchsched_bind_errors_total (\S+)$", body, re.M) if status == 200 else None
    return float(match.group(1)) if match else 0.0


def test_a_refused_member_backs_off_and_the_partial_gang_starts_over(env, start_scheduler):
    env.add_node("n1", gpus=8)
    policy = refuse_binding_of(env, "g-3")
    make_gang(env, "g", 4, cpu="1", gpus=1, scheduler="batchsched")
    proc = start_scheduler(binding={"partialGangTimeoutSeconds": 8, "retries": 0},
                           queue={"initialBackoffSeconds": 1, "maxBackoffSeconds": 4})
    wait_for("three members bound", lambda: members_bound(env, "g-") == ["g-0", "g-1", "g-2"], timeout=30)
    started = time.monotonic()
    errors_then = bind_errors(proc)
    wait_for("the partial gang started over", lambda: (
        condition(env.podgroup("g"), "Unschedulable").get("reason") == "PartialGangTimeout"), timeout=30)
    waited = time.monotonic() - started
    attempts = bind_errors(proc) - errors_then
    # backing off 1, 2, 4, 4, ... s: a handful of tries, not ~100 a second
    assert 1 <= attempts <= waited / 0.9 + 2, f"{attempts} refused bindings in {waited:.1f}s"
    message = condition(env.podgroup("g"), "Unschedulable")["message"]
    assert "3/4" in message and "evicted" in message
    wait_for("bound members evicted", lambda: not any(n in env.pods() for n in ("g-0", "g-1", "g-2")), timeout=30)
    wait_for("g's PartialGangTimeout event", lambda: any(  # events may follow what they report
        e["reason"] == "PartialGangTimeout" and e["involvedObject"]["name"] == "g"
        for e in env.kube.get(f"/api/v1/namespaces/{env.namespace}/events")["items"]))
    assert members_bound(env, "g-") == []  # nothing left half-bound

    # the admission policy lifted and the pods back (as their Job would make them): bound whole
    for path in list(env.cluster_objects):
        if policy in path:
            env.kube.delete(path)
    for i in range(3):
        env.create(pod(f"g-{i}", env.namespace, group="g", cpu="1", gpus=1, scheduler="batchsched"))
    wait_for("the gang bound whole", lambda: members_bound(env, "g-") == [f"g-{i}" for i in range(4)], timeout=40)
