"""What a PodGroup tells through the API server: `kubectl get podgroups`
columns (the server's Table), the pods that carry a gang's label but name
another scheduler, and the admission policy that keeps that from happening
(issue 17 points 2 and 7; docs/podgroup.md)."""
from __future__ import annotations

import os

import pytest

from batchsched.api import constants
from tests.integration.test_gang_scheduling import condition, members_bound
from tests.integration.test_preemption import events_about
from tests.support.kube import wait_for
from tests.support.kubectl import run_kubectl
from tests.support.objects import pod, pod_group, priority_class
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
LABEL = constants.POD_GROUP_LABEL


def table(env) -> tuple[list[dict], dict[str, dict[str, object]]]:
    """The PodGroups of the test's namespace as `kubectl get -o wide` reads
    them: the column definitions and, by name, each row's cells by column."""
    got = env.kube.request("GET", f"/apis/{constants.GROUP}/{constants.VERSION}/namespaces/{env.namespace}/podgroups",
                           accept=TABLE, query={"includeObject": "None"})
    columns = got["columnDefinitions"]
    rows = {row["cells"][0]: dict(zip((c["name"] for c in columns), row["cells"])) for row in got["rows"]}
    return columns, rows


def selector(env, group: str) -> str:
    return f"pods with label {LABEL}={group} and schedulerName batchsched in {env.namespace}"


def test_get_podgroups_shows_phase_counts_priority_and_reason_of_waiting_and_bound_gangs(env, start_scheduler):
    env.add_node("n1", cpu="8", gpus=0)
    important = f"important-{env.id}"
    env.add_cluster_object(priority_class(important, 50))
    env.create(pod_group("ready", env.namespace, 2))
    env.create(pod_group("short", env.namespace, 3))
    env.create(pod_group("train", env.namespace, 2))
    env.create(pod_group("wide", env.namespace, 1))  # elastic: 1 needed, 2 run as room allows
    for i in range(2):
        env.create(pod(f"wide-{i}", env.namespace, group="wide", cpu="1"))
        env.create(pod(f"ready-{i}", env.namespace, group="ready", cpu="1", priority_class=important))
        env.create(pod(f"short-{i}", env.namespace, group="short", cpu="1"))
        env.create(pod(f"typo-{i}", env.namespace, group="trian", cpu="1"))  # the label misspells "train"
    start_scheduler()
    wait_for("ready bound and running, short and train reported", lambda: (
        (rows := table(env)[1])["ready"]["Running"] == 2 and rows["short"]["Reason"] == "QuorumNotReached"
        and "trian" in rows["train"]["Message"] and rows["wide"]["Bound"] == 2), timeout=60)

    columns, rows = table(env)
    assert [c["name"] for c in columns if c["priority"] == 0] == [
        "Name", "Phase", "Queue", "MinMember", "Bound", "Running", "Pending", "Priority", "Reason", "Age"]
    assert [c["name"] for c in columns if c["priority"] == 1] == [
        "Succeeded", "Failed", "Elastic", "PriorityClass", "Message"]
    assert (rows["wide"]["Elastic"], rows["ready"]["Elastic"]) == (1, 0)
    ready, short, train = rows["ready"], rows["short"], rows["train"]
    assert {k: ready[k] for k in ("Phase", "MinMember", "Bound", "Running", "Pending", "Priority", "Reason")} == {
        "Phase": "Running", "MinMember": 2, "Bound": 2, "Running": 2, "Pending": 0, "Priority": 50,
        "Reason": "Scheduled"}
    assert {k: short[k] for k in ("Phase", "MinMember", "Bound", "Running", "Pending", "Priority", "Reason")} == {
        "Phase": "Pending", "MinMember": 3, "Bound": 0, "Running": 0, "Pending": 2, "Priority": 0,
        "Reason": "QuorumNotReached"}
    assert short["Message"] == f"2/3 members exist ({selector(env, 'short')})"
    assert train["Phase"] == "Pending" and train["Pending"] == 0 and train["Priority"] is None
    assert train["Reason"] == "QuorumNotReached"
    assert train["Message"] == f"0/2 members exist: no {selector(env, 'train')}; pods in {env.namespace} " \
                               f"carry {LABEL}=trian (a typo?)."
    assert members_bound(env, "short-") == []

    # Its pods gone, a gang's old verdict and priority no longer stand.
    for i in range(2):
        env.kube.delete(f"/api/v1/namespaces/{env.namespace}/pods/short-{i}", gracePeriodSeconds=0)
    wait_for("short without members", lambda: (short := table(env)[1]["short"])["Priority"] is None
             and short["Message"] == f"0/3 members exist: no {selector(env, 'short')}." and short["Pending"] == 0)


@pytest.mark.skipif(bool(os.environ.get("KUBECONFIG")) and not os.environ.get("BATCHSCHED_E2E_KUBE_SCHEDULER"),
                    reason="needs the harness's kube-scheduler")
def test_a_member_that_default_scheduler_bound_is_named_and_does_not_count(env, start_scheduler):
    node = env.add_node("n1", cpu="8", gpus=0)
    env.create(pod_group("w", env.namespace, 3))
    env.create(pod("w-0", env.namespace, group="w", cpu="1"))
    env.create(pod("w-1", env.namespace, group="w", cpu="1"))
    # The mistake of issue 17: a member without schedulerName (defaulted to default-scheduler).
    env.create(pod("w-2", env.namespace, group="w", cpu="1", scheduler="default-scheduler",
                   node_selector=env.node_label))
    wait_for("default-scheduler bound w-2", lambda: env.bound().get("w-2") == node)
    start_scheduler()
    foreign = (f"1 pod(s) carry the gang label but schedulerName default-scheduler: w-2 (bound to {node}); "
               "they do not count toward minMember (set schedulerName: batchsched)")
    message = wait_for("the condition names w-2", lambda: (
        c := condition(env.podgroup("w"), "Scheduled")) and "w-2" in c["message"] and c["message"])
    assert message == f"2/3 members exist ({selector(env, 'w')}); {foreign}"
    assert env.podgroup("w")["status"]["phase"] == "Pending"
    wait_for("ForeignSchedulerMembers events on the PodGroup and on w-2", lambda: (
        events_about(env, "w", "ForeignSchedulerMembers") == [foreign + "."]
        and len(events_about(env, "w-2", "ForeignSchedulerMembers")) == 1))
    assert "schedulerName default-scheduler" in events_about(env, "w-2", "ForeignSchedulerMembers")[0]
    assert members_bound(env, "w-") == ["w-2"]  # no partial gang of ours


def test_the_admission_policy_sets_schedulername_on_gang_pods_that_name_none(env, kubeconfig, kubectl, tmp_path):
    # An overlay with just the component, as docs/operations.md has users add it.
    (tmp_path / "kustomization.yaml").write_text(
        f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"components: [{os.path.relpath(ROOT / 'deploy' / 'gang-scheduler-name', tmp_path)}]\n")
    run_kubectl(kubectl, kubeconfig, "apply", "-k", str(tmp_path))
    try:
        def created(name: str, **kwargs) -> dict:
            """The pod as admission leaves it (a dry run: nothing is created)."""
            body = pod(name, env.namespace, **kwargs)
            if kwargs.get("scheduler") is None:
                del body["spec"]["schedulerName"]
            return env.kube.request("POST", f"/api/v1/namespaces/{env.namespace}/pods", body=body,
                                    query={"dryRun": "All"})["spec"]["schedulerName"]

        # A new policy takes effect once the API server has loaded it.
        wait_for("the policy in effect", lambda: created("member", group="g", scheduler=None) == "batchsched")
        assert created("explicit-default", group="g", scheduler="default-scheduler") == "batchsched"
        assert created("other", group="g", scheduler="volcano") == "volcano"  # an explicit choice stands
        assert created("plain", scheduler=None) == "default-scheduler"  # no gang label: not ours
    finally:
        run_kubectl(kubectl, kubeconfig, "delete", "--ignore-not-found", "-k", str(tmp_path))
