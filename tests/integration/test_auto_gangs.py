"""Automatic gangs end to end (docs/integrations.md): an Indexed Job with no
PodGroup at all, its pods created by the real Job controller of the local
kube-controller-manager, is one gang of its parallelism: bound whole, or not
at all while the quorum cannot be placed, the pods saying why.  A
LeaderWorkerSet group, its pods stamped as the LWS controller stamps them
(no LWS controller runs here), binds whole once its last worker exists."""
from __future__ import annotations

import os

import pytest

from tests.integration.test_gang_scheduling import members_bound, nodes_reserved_for_big
from tests.integration.test_pod_status import wait_all_unschedulable
from tests.support.frameworks import (
    JOB_INDEX, JOB_NAME_LABEL, JOB_UID_LABEL, indexed_job, leader_worker_set_group,
)
from tests.conftest import ROOT
from tests.support.kube import wait_for
from tests.support.kubectl import run_kubectl

pytestmark = pytest.mark.e2e


def job_pods(env, job: dict, count: int) -> list[str]:
    """The Job controller's pods of ``job``, once it made ``count`` of them,
    checked to carry what the automatic gang reads."""
    name = job["metadata"]["name"]
    created = wait_for(f"the Job controller's {count} pods", lambda: len(
        found := [p for p in env.pods().values() if p["metadata"]["labels"].get(JOB_NAME_LABEL) == name])
        == count and found)
    uid = job["metadata"]["uid"]
    for pod in created:
        assert pod["metadata"]["labels"][JOB_UID_LABEL] == uid
        assert pod["metadata"]["annotations"][JOB_INDEX].isdigit()
    return sorted(p["metadata"]["name"] for p in created)


def test_an_indexed_job_with_no_podgroup_is_gang_bound_whole(env, start_scheduler):
    nodes = [env.add_node(f"gpu{i}", gpus=8) for i in range(4)]
    job = env.create(indexed_job("llama", env.namespace, parallelism=4, gpus=8))
    names = job_pods(env, job, 4)
    start_scheduler()
    wait_for("the whole Job bound", lambda: members_bound(env, "llama-") == names)
    assert sorted(env.bound().values()) == sorted(nodes)  # 8 GPUs each: one per node


def test_an_indexed_job_whose_quorum_cannot_be_placed_binds_nothing_and_says_why(env, start_scheduler):
    for i in range(3):
        env.add_node(f"gpu{i}", gpus=8)
    job = env.create(indexed_job("llama", env.namespace, parallelism=4, gpus=8))
    names = job_pods(env, job, 4)
    start_scheduler()
    wait_all_unschedulable(env, names, f"gang {env.namespace}/job:llama (ExceedsClusterCapacity): Exceeds cluster "
                                       f"capacity: gang {env.namespace}/job:llama needs 4 pods placed at once")
    assert members_bound(env, "llama-") == []
    env.add_node("gpu3", gpus=8)
    wait_for("the whole Job bound once a 4th node is there", lambda: members_bound(env, "llama-") == names)


def test_a_jobs_own_active_deadline_lets_its_gang_backfill_reserved_nodes(env, start_scheduler):
    """Issue 16, point 1: while two nodes drain for a reserved gang, an
    Indexed Job whose activeDeadlineSeconds (on the Job, not on its pods:
    the Job controller enforces it) ends sooner runs there; one that ends
    later waits."""
    nodes_reserved_for_big(env, start_scheduler)
    jobs = {}
    for name, deadline in (("late", 3600), ("soon", 60)):
        job = indexed_job(name, env.namespace, parallelism=1, gpus=4)
        job["spec"]["activeDeadlineSeconds"] = deadline
        assert "activeDeadlineSeconds" not in job["spec"]["template"]["spec"]
        jobs[name] = job_pods(env, env.create(job), 1)
        if name == "late":
            wait_all_unschedulable(env, jobs[name], "reserved for a waiting gang")
    wait_for("the Job that ends soon backfilled", lambda: members_bound(env, "soon-") == jobs["soon"])
    assert members_bound(env, "late-") == members_bound(env, "big-") == []


def test_a_leader_worker_set_group_binds_whole_once_its_last_worker_exists(env, start_scheduler):
    nodes = [env.add_node(f"gpu{i}", gpus=8) for i in range(4)]
    pods = leader_worker_set_group("serve", env.namespace, 0, size=4, gpus=8)
    for pod in pods[:-1]:
        env.create(pod)
    start_scheduler()
    waiting = [p["metadata"]["name"] for p in pods[:-1]]
    wait_all_unschedulable(env, waiting, f"gang {env.namespace}/leaderworkerset:serve-0 (QuorumNotReached): 3/4 "
                                         "members exist")
    assert members_bound(env, "serve-") == []
    env.create(pods[-1])
    wait_for("the whole group bound", lambda: members_bound(env, "serve-") == sorted(p["metadata"]["name"] for p in pods))
    assert sorted(env.bound().values()) == sorted(nodes)


def test_a_namespace_labelled_for_automatic_gangs_makes_its_jobs_gangs_with_no_label_on_them(
        env, kubeconfig, kubectl, start_scheduler, tmp_path):
    """deploy/auto-gang-namespaces: the admission policy labels the Job
    controller's pods in a namespace that opted in, so a Job whose author wrote
    nothing for batchsched is one gang; elsewhere it is not."""
    (tmp_path / "kustomization.yaml").write_text(
        f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"components: [{os.path.relpath(ROOT / 'deploy' / 'auto-gang-namespaces', tmp_path)}]\n")
    run_kubectl(kubectl, kubeconfig, "apply", "-k", str(tmp_path))
    try:
        env.kube.merge_patch(f"/api/v1/namespaces/{env.namespace}",
                             {"metadata": {"labels": {"scheduling.batchsched.io/auto-gang": "true"}}})
        probe = indexed_job("probe", env.namespace, parallelism=1, gpus=0, auto_gang=None)["spec"]["template"]
        probe.update(apiVersion="v1", kind="Pod")
        probe["metadata"].update(name="probe", namespace=env.namespace, ownerReferences=[
            {"apiVersion": "batch/v1", "kind": "Job", "name": "probe", "uid": "00000000-0000-0000-0000-000000000000"}])

        def labelled() -> bool:  # a dry run: a new policy takes effect once the API server has loaded it
            made = env.kube.request("POST", f"/api/v1/namespaces/{env.namespace}/pods", body=probe,
                                    query={"dryRun": "All"})
            return made["metadata"].get("labels", {}).get("scheduling.batchsched.io/auto-gang") == "true"
        wait_for("the policy in effect", labelled)
        for i in range(3):
            env.add_node(f"gpu{i}", gpus=8)
        job = env.create(indexed_job("llama", env.namespace, parallelism=4, gpus=8, auto_gang=None))
        names = job_pods(env, job, 4)
        start_scheduler()
        # One gang of 4 x 8 GPUs on 3 nodes: nothing binds (alone, 3 pods would).
        wait_all_unschedulable(env, names, f"gang {env.namespace}/job:llama (ExceedsClusterCapacity)")
        assert members_bound(env, "llama-") == []
        env.add_node("gpu3", gpus=8)
        wait_for("the whole Job bound", lambda: members_bound(env, "llama-") == names)
    finally:
        run_kubectl(kubectl, kubeconfig, "delete", "--ignore-not-found", "-k", str(tmp_path))
