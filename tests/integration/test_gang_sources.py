"""Foreign gang sources end to end: pods and PodGroups stamped exactly as MPI
Operator (scheduler-plugins) and KubeRay's Volcano mode stamp them, against
the real API server with the CRDs of tests/fixtures/crds.  Each gang binds
whole, nothing of it while a member is missing, and its status is written
back in its own CRD's vocabulary (docs/integrations.md)."""
from __future__ import annotations

import pytest

from tests.integration.test_gang_scheduling import members_bound
from tests.integration.test_pod_status import events_on, wait_all_unschedulable
from tests.support.frameworks import (
    SCHEDULER_PLUGINS_API, VOLCANO_API, kuberay_volcano_cluster, mpi_operator_job,
)
from tests.support.kube import wait_for

pytestmark = pytest.mark.e2e

# MPI Operator's --gang-scheduling value and KubeRay's hard-coded Volcano name, beside our own.
SCHEDULER_NAMES = ["batchsched", "scheduler-plugins-scheduler", "volcano"]


def foreign_group(env, api: str, name: str) -> dict:
    return env.kube.get(f"/apis/{api}/namespaces/{env.namespace}/podgroups/{name}")


def status_of(env, api: str, name: str) -> dict:
    return foreign_group(env, api, name).get("status") or {}


def test_an_mpi_operator_job_binds_whole_once_its_last_member_exists(env, foreign_podgroup_crds, start_scheduler):
    nodes = [env.add_node(f"gpu{i}", gpus=8) for i in range(4)]
    group, pods = mpi_operator_job("pi", env.namespace, workers=4, gpus=8, scheduler="scheduler-plugins-scheduler")
    env.create(group)
    for p in pods[:-1]:
        env.create(p)
    # a PodGroup of scheduler-plugins' own scheduler, beside ours: never touched
    theirs, their_pods = mpi_operator_job("theirs", env.namespace, workers=1, gpus=1, scheduler="coscheduler")
    env.create(theirs)
    env.create(their_pods[0])
    start_scheduler(schedulerNames=SCHEDULER_NAMES)
    waiting = [p["metadata"]["name"] for p in pods[:-1]]
    wait_all_unschedulable(env, waiting, "(QuorumNotReached): 4/5 members exist (pods with label "
                                         "scheduling.x-k8s.io/pod-group=pi and schedulerName batchsched")
    wait_for("status Pending", lambda: status_of(env, SCHEDULER_PLUGINS_API, "pi").get("phase") == "Pending")
    assert members_bound(env, "pi-") == []
    env.create(pods[-1])
    names = sorted(p["metadata"]["name"] for p in pods)
    wait_for("the whole job bound", lambda: members_bound(env, "pi-") == names)
    bound = env.bound()
    assert sorted(bound[f"pi-worker-{i}"] for i in range(4)) == sorted(nodes)  # 8 GPUs each: one per node
    wait_for("status Running", lambda: (s := status_of(env, SCHEDULER_PLUGINS_API, "pi")).get("phase") == "Running"
             and s.get("running") == 5)
    assert "scheduleStartTime" in status_of(env, SCHEDULER_PLUGINS_API, "pi")
    assert status_of(env, SCHEDULER_PLUGINS_API, "theirs") == {}
    assert "theirs-launcher" not in env.bound()


def test_a_kuberay_cluster_in_volcano_mode_binds_whole_once_its_last_worker_exists(
        env, foreign_podgroup_crds, start_scheduler):
    for i in range(3):
        env.add_node(f"gpu{i}", gpus=8)
    group, pods = kuberay_volcano_cluster("llm", env.namespace, workers=3, gpus=8)
    env.create(group)
    for p in pods[:-1]:
        env.create(p)
    start_scheduler(schedulerNames=SCHEDULER_NAMES)
    wait_for("Inqueue, waiting for its tasks", lambda: (s := status_of(env, VOLCANO_API, "ray-llm-pg"))
             .get("phase") == "Inqueue" and s["conditions"][0]["reason"] == "NotEnoughTasks")
    condition = status_of(env, VOLCANO_API, "ray-llm-pg")["conditions"][0]
    assert condition["type"] == "Unschedulable" and condition["status"] == "True"
    assert condition["message"].startswith("3/4 members exist (pods with annotation "
                                           "scheduling.k8s.io/group-name=ray-llm-pg and schedulerName batchsched")
    assert members_bound(env, "llm-") == []
    env.create(pods[-1])
    names = sorted(p["metadata"]["name"] for p in pods)
    wait_for("the whole Ray cluster bound", lambda: members_bound(env, "llm-") == names)
    wait_for("Running, Scheduled", lambda: (s := status_of(env, VOLCANO_API, "ray-llm-pg")).get("phase") == "Running"
             and s["conditions"][0]["type"] == "Scheduled" and s.get("running") == 4)
    assert foreign_group(env, VOLCANO_API, "ray-llm-pg")["spec"]["minMember"] == 4  # the spec is left as it was


def test_hostile_foreign_podgroups_say_why_and_the_good_gang_beside_them_binds(
        env, foreign_podgroup_crds, start_scheduler):
    env.add_node("gpu0", gpus=8)
    negative, negative_pods = mpi_operator_job("neg", env.namespace, workers=1, gpus=1,
                                               scheduler="scheduler-plugins-scheduler", min_member=-1)
    huge, huge_pods = kuberay_volcano_cluster("huge", env.namespace, workers=1, gpus=1, min_member=2**31 - 1)
    good, good_pods = mpi_operator_job("good", env.namespace, workers=2, gpus=2,
                                       scheduler="scheduler-plugins-scheduler")
    for obj in [negative, *negative_pods, huge, *huge_pods, good, *good_pods]:
        env.create(obj)
    start_scheduler(schedulerNames=SCHEDULER_NAMES)
    wait_for("the good job bound", lambda: len(members_bound(env, "good-")) == 3)
    wait_all_unschedulable(env, [p["metadata"]["name"] for p in negative_pods],
                           "(InvalidPodGroup): spec.minMember: Input should be greater than or equal to 0")
    wait_all_unschedulable(env, [p["metadata"]["name"] for p in huge_pods],
                           "(InvalidPodGroup): spec.minMember: Input should be less than or equal to 100000")
    for api, name in ((SCHEDULER_PLUGINS_API, "neg"), (VOLCANO_API, "ray-huge-pg")):
        wait_for(f"an InvalidPodGroup Event on {name}", lambda api=api, name=name: any(
            e["reason"] == "InvalidPodGroup" and e["involvedObject"]["apiVersion"] == api
            for e in events_on(env, env.namespace, "PodGroup", name)))
    wait_for("Volcano's status says InvalidPodGroup", lambda: (s := status_of(env, VOLCANO_API, "ray-huge-pg"))
             .get("phase") == "Pending" and s["conditions"][0]["reason"] == "InvalidPodGroup")
    assert members_bound(env, "neg-") == members_bound(env, "huge-") == []
