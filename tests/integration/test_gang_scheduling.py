"""Gang scheduling end to end: the real scheduler process against a real API server.

Every object is created before the scheduler starts where ordering matters,
and "never binds" is asserted only after the scheduler has written its
verdict on the gang (a condition), so no test waits on a fixed sleep.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from batchsched.api import constants
from batchsched.core import resources as res
from tests.support.kube import wait_for
from tests.support.objects import pod, pod_group, priority_class

pytestmark = pytest.mark.e2e


def condition(group: dict, ctype: str) -> dict:
    for c in (group.get("status") or {}).get("conditions") or ():
        if c["type"] == ctype:
            return c
    return {}


def wait_unschedulable(env, name: str, reason: str = "Unschedulable", timeout: float = 30) -> dict:
    """Wait for the scheduler's verdict on a gang; returns the Unschedulable condition."""
    return wait_for(f"PodGroup {name} condition reason {reason}", lambda: (
        c := condition(env.podgroup(name), "Scheduled")) and c.get("reason") == reason and c, timeout)


def members_bound(env, prefix: str) -> list[str]:
    return sorted(name for name in env.bound() if name.startswith(prefix))


def make_gang(env, name: str, size: int, min_member: int | None = None, group_spec: dict | None = None,
              **pod_kwargs) -> None:
    env.create(pod_group(name, env.namespace, min_member or size, **(group_spec or {})))
    for i in range(size):
        env.create(pod(f"{name}-{i}", env.namespace, group=name, **pod_kwargs))


def assert_not_overcommitted(env) -> None:
    """Sum of requests of non-terminal pods on each node <= allocatable."""
    nodes = {n: env.kube.get(f"/api/v1/nodes/{n}") for n in env.nodes}
    used: dict[str, dict[str, int]] = {n: {} for n in nodes}
    for p in env.kube.get("/api/v1/pods")["items"]:
        node = p["spec"].get("nodeName")
        if node in used and p["status"].get("phase") not in ("Succeeded", "Failed"):
            from batchsched.core.readers import pod_requests
            used[node] = res.add(used[node], pod_requests(p["spec"]))
    for name, node in nodes.items():
        allocatable = res.parse_resource_map(node["status"]["allocatable"])
        over = {k: v for k, v in used[name].items() if v > allocatable.get(k, 0)}
        assert not over, f"node {name} over-committed: {over} > {allocatable}"


# 1
def test_gangs_fit_whole_or_not_at_all_on_one_node(env, start_scheduler):
    env.add_node("n1", memory="300", gpus=0)
    env.create(pod_group("p1", env.namespace, 3))
    env.create(pod_group("p2", env.namespace, 4))
    for i in range(4):  # interleaved creation
        if i < 3:
            env.create(pod(f"p1-{i}", env.namespace, group="p1", memory="50"))
        env.create(pod(f"p2-{i}", env.namespace, group="p2", memory="100"))
    start_scheduler()
    wait_for("all of P1 bound", lambda: len(members_bound(env, "p1-")) == 3)
    wait_unschedulable(env, "p2", "ExceedsClusterCapacity")  # 4 x 100 of 300
    assert members_bound(env, "p2-") == []
    assert_not_overcommitted(env)


# 2
def test_higher_priority_gang_goes_first(env, start_scheduler):
    low, high = f"low-{env.id}", f"high-{env.id}"
    env.add_cluster_object(priority_class(low, 10))
    env.add_cluster_object(priority_class(high, 1000))
    env.add_node("n1", memory="300", gpus=0)
    env.create(pod_group("p1", env.namespace, 3, priorityClassName=low))
    for i in range(3):
        env.create(pod(f"p1-{i}", env.namespace, group="p1", memory="100", priority_class=low))
    env.create(pod_group("p2", env.namespace, 3, priorityClassName=high))
    for i in range(3):
        env.create(pod(f"p2-{i}", env.namespace, group="p2", memory="50", priority_class=high))
    start_scheduler()
    wait_for("all of P2 bound", lambda: len(members_bound(env, "p2-")) == 3)
    wait_unschedulable(env, "p1")
    assert members_bound(env, "p1-") == []


# 3
def test_group_without_quorum_never_binds_but_plain_pods_do(env, start_scheduler):
    env.add_node("n1", gpus=0)
    env.create(pod_group("short", env.namespace, 3))
    for i in range(2):
        env.create(pod(f"short-{i}", env.namespace, group="short", cpu="1"))
    for i in range(3):
        env.create(pod(f"plain-{i}", env.namespace, cpu="1"))
    start_scheduler()
    wait_for("plain pods bound", lambda: len(members_bound(env, "plain-")) == 3)
    c = wait_unschedulable(env, "short", reason="QuorumNotReached")
    assert "2" in c["message"] and "3" in c["message"]
    assert env.podgroup("short")["status"]["phase"] == "Pending"
    assert members_bound(env, "short-") == []


# 4
def test_hopeless_gang_does_not_starve_a_later_small_one(env, start_scheduler):
    for i, cpu in enumerate(("6", "2", "2", "2")):
        env.add_node(f"n{i}", cpu=cpu, gpus=0)
    make_gang(env, "big", 6, cpu="4")
    env.create(pod_group("small", env.namespace, 1))
    env.create(pod("small-0", env.namespace, group="small", cpu="1"))
    # reservations start at once, to show a hopeless head gang gets none
    start_scheduler(queue={"reservationAfterSeconds": 0, "initialBackoffSeconds": 0.2})
    wait_for("the small gang bound", lambda: members_bound(env, "small-") == ["small-0"])
    c = wait_unschedulable(env, "big", "ExceedsClusterCapacity")
    assert "they ask 24 cpu, the cluster has 12 allocatable" in c["message"], c["message"]
    assert members_bound(env, "big-") == []


# 5
def test_succeeded_member_does_not_count_toward_quorum(env, start_scheduler):
    env.add_node("n1", gpus=0)
    env.create(pod_group("g", env.namespace, 3))
    done = pod("g-0", env.namespace, group="g", cpu="1")
    # It ran earlier on a node since retired: no kwok stage races the
    # Succeeded status below (one re-applied Running under load).
    done["spec"]["nodeName"] = "retired-node"
    env.create(done)
    env.kube.merge_patch(f"/api/v1/namespaces/{env.namespace}/pods/g-0/status",
                         {"status": {"phase": "Succeeded"}})
    wait_for("g-0 Succeeded", lambda: env.pods()["g-0"]["status"].get("phase") == "Succeeded")
    for i in (1, 2):
        env.create(pod(f"g-{i}", env.namespace, group="g", cpu="1"))
    start_scheduler()
    wait_unschedulable(env, "g", reason="QuorumNotReached")
    assert sorted(env.bound()) == ["g-0"]
    env.create(pod("g-3", env.namespace, group="g", cpu="1"))  # now 3 active members
    wait_for("the three active members bound",
             lambda: members_bound(env, "g-") == ["g-0", "g-1", "g-2", "g-3"])


# 6
def test_phases_follow_the_members(env, start_scheduler):
    env.add_node("n1", gpus=0)
    make_gang(env, "ok", 2, cpu="1")
    make_gang(env, "bad", 2, cpu="1")
    start_scheduler()
    for name in ("ok", "bad"):
        wait_for(f"{name} Running", lambda n=name: env.podgroup(n).get("status", {}).get("phase") == "Running")
    status = env.podgroup("ok")["status"]
    assert status["bound"] == 2 and status["running"] == 2
    assert condition(env.podgroup("ok"), "Scheduled")["status"] == "True"
    for i in range(2):
        env.kube.merge_patch(f"/api/v1/namespaces/{env.namespace}/pods/ok-{i}/status",
                             {"status": {"phase": "Succeeded"}})
    env.kube.merge_patch(f"/api/v1/namespaces/{env.namespace}/pods/bad-0/status", {"status": {"phase": "Failed"}})
    wait_for("ok Succeeded", lambda: env.podgroup("ok")["status"].get("phase") == "Succeeded")
    wait_for("bad Failed", lambda: env.podgroup("bad")["status"].get("phase") == "Failed")
    assert env.podgroup("ok")["status"]["succeeded"] == 2
    assert env.podgroup("bad")["status"]["failed"] == 1


# 7
def test_gpu_gang_binds_one_pod_per_node(env, start_scheduler):
    for i in range(4):
        env.add_node(f"gpu{i}", gpus=8)
    make_gang(env, "train", 4, gpus=8, cpu="1")
    start_scheduler()
    wait_for("gang bound", lambda: len(members_bound(env, "train-")) == 4)
    assert len(set(env.bound().values())) == 4
    wait_for("phase Running", lambda: env.podgroup("train").get("status", {}).get("phase") == "Running")


def test_gpu_gang_too_big_binds_nothing_and_names_the_shortage(env, start_scheduler):
    nodes = [env.add_node(f"gpu{i}", gpus=8) for i in range(4)]
    other = pod("other", env.namespace, gpus=4, cpu="1")  # another scheduler's, bound: half of one node
    other["spec"]["nodeName"] = nodes[3]
    env.create(other)
    make_gang(env, "train", 4, gpus=8, cpu="1")
    start_scheduler()
    c = wait_unschedulable(env, "train")
    assert c["message"].startswith(f"Gang {env.namespace}/train needs 4 pods placed at once; the best plan found "
                                   "places 3 ("), c["message"]
    assert c["message"].endswith("with 3 of them placed, 0/4 nodes are available for pod train-3: "
                                 "4 Insufficient nvidia.com/gpu."), c["message"]
    assert env.bound() == {"other": nodes[3]}
    wait_for("train's FailedScheduling event", lambda: any(  # posted beside the condition, not before it
        e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "train"
        for e in env.kube.get(f"/api/v1/namespaces/{env.namespace}/events")["items"]))


# 8
def test_tainted_gpu_nodes_take_only_tolerating_selected_members(env, start_scheduler):
    taint = [{"key": constants.GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]
    gpu_nodes = {env.add_node(f"gpu{i}", gpus=8, taints=taint, labels={"accelerator": "h100"}) for i in range(2)}
    env.add_node("cpu0", gpus=0)
    toleration = [{"key": constants.GPU_RESOURCE, "operator": "Equal", "value": "present", "effect": "NoSchedule"}]
    make_gang(env, "ok", 2, gpus=4, cpu="1", tolerations=toleration, node_selector={"accelerator": "h100"})
    make_gang(env, "notol", 2, gpus=4, cpu="1", node_selector={"accelerator": "h100"})
    start_scheduler()
    wait_for("tolerating gang bound", lambda: len(members_bound(env, "ok-")) == 2)
    assert {env.bound()[f"ok-{i}"] for i in range(2)} <= gpu_nodes
    c = wait_unschedulable(env, "notol", "ExceedsClusterCapacity")  # no node it may use, even empty
    assert "untolerated taint {nvidia.com/gpu: present}" in c["message"], c["message"]
    assert "didn't match Pod's node affinity/selector" in c["message"], c["message"]
    assert members_bound(env, "notol-") == []


# 9
def test_killed_scheduler_restarts_and_every_gang_ends_whole(env, start_scheduler):
    for i in range(4):
        env.add_node(f"gpu{i}", gpus=8, cpu="64")
    rng = random.Random(int(env.id, 16))
    sizes = [rng.choice((1, 2, 3, 4)) for _ in range(12)]
    first = start_scheduler()
    for g, size in enumerate(sizes):
        make_gang(env, f"g{g}", size, gpus=2, cpu="1")
        if g == 5:
            wait_for("some gangs bound", lambda: len(env.bound()) >= 4)
            first.kill()
            start_scheduler()
    total = sum(sizes)
    expected = min(total, 16)  # 4 nodes x 8 GPUs / 2 per pod
    wait_for("the cluster filled by whole gangs", lambda: len(env.bound()) >= expected - 3, timeout=60)
    bound = env.bound()
    for g, size in enumerate(sizes):
        got = len([n for n in bound if n.startswith(f"g{g}-")])
        assert got in (0, size), f"gang g{g} bound {got}/{size}"
    assert_not_overcommitted(env)


# 10
@pytest.mark.skipif(bool(os.environ.get("KUBECONFIG")) and not os.environ.get("BATCHSCHED_E2E_KUBE_SCHEDULER"),
                    reason="needs the harness's kube-scheduler")
def test_pods_of_kube_scheduler_are_accounted_for(env, start_scheduler):
    nodes = [env.add_node(f"gpu{i}", gpus=8) for i in range(2)]
    for i, node in enumerate(nodes):
        env.create(pod(f"other-{i}", env.namespace, gpus=6, cpu="1", scheduler="default-scheduler",
                       node_selector={"kubernetes.io/hostname": node}))
    wait_for("kube-scheduler placed its pods", lambda: len(members_bound(env, "other-")) == 2)
    make_gang(env, "wide", 2, gpus=4, cpu="1")
    make_gang(env, "narrow", 2, gpus=2, cpu="1")
    start_scheduler()
    wait_for("narrow gang bound", lambda: len(members_bound(env, "narrow-")) == 2)
    c = wait_unschedulable(env, "wide")
    assert "Insufficient nvidia.com/gpu" in c["message"]
    assert members_bound(env, "wide-") == []
    assert_not_overcommitted(env)


def test_pod_naming_a_missing_group_gets_a_reason_and_others_go_on(env, start_scheduler):
    env.add_node("n1", gpus=0)
    env.create(pod("orphan", env.namespace, group="nope", cpu="1"))
    env.create(pod("plain", env.namespace, cpu="1"))
    start_scheduler()
    wait_for("plain bound", lambda: "plain" in env.bound())
    wait_for("FailedScheduling event naming the missing group", lambda: any(
        e["reason"] == "FailedScheduling" and "nope" in e["message"]
        for e in env.kube.get(f"/api/v1/namespaces/{env.namespace}/events")["items"]
        if e["involvedObject"]["name"] == "orphan"))
    assert "orphan" not in env.bound()


def test_schedule_timeout_marks_the_gang_failed_and_stops_trying(env, start_scheduler):
    env.add_node("n1", gpus=8)
    make_gang(env, "late", 2, group_spec={"scheduleTimeoutSeconds": 2}, gpus=8)
    start_scheduler()
    wait_for("timeout verdict", lambda: condition(env.podgroup("late"), "Scheduled").get("reason")
             == "ScheduleTimeout", timeout=30)
    assert env.podgroup("late")["status"]["phase"] == "Failed"
    assert env.bound() == {}


def test_explain_answers_why_a_gang_is_pending_from_the_live_cluster(env):
    """`batchsched explain` reads the cluster itself (no scheduler needs to run)."""
    env.add_node("gpu0", gpus=8)
    env.add_node("cpu0", gpus=0)
    make_gang(env, "train", 2, gpus=8, cpu="1")
    out = subprocess.run([sys.executable, "-m", "batchsched", "explain", f"{env.namespace}/train",
                          "--kubeconfig", env.kubeconfig], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert f"Gang {env.namespace}/train: minMember 2" in text
    assert "pods asking nvidia.com/gpu in limits: 2/2" in text
    assert f"{env.id}-cpu0: Insufficient nvidia.com/gpu" in text
    assert f"{env.id}-gpu0: fits (1 such pod(s), GPUs 0,1,2,3,4,5,6,7 for the first)" in text
    assert "The gang needs 2 of its 2 pending pod(s) placed at once." in text
    assert text.rstrip().endswith(f"Exceeds cluster capacity: gang {env.namespace}/train needs 2 pods placed at "
                                  "once; they ask 16 nvidia.com/gpu, the cluster has 8 allocatable."), text


def test_a_gang_that_can_never_fit_says_so_and_the_gang_behind_it_binds(env, start_scheduler):
    """24 GPUs asked of 2 x 8: the condition and explain give the same
    distinct verdict, and the gang holds no reservation against others."""
    for i in range(2):
        env.add_node(f"gpu{i}", gpus=8)
    make_gang(env, "huge", 3, gpus=8, cpu="1")
    start_scheduler(queue={"reservationAfterSeconds": 0, "initialBackoffSeconds": 0.2})
    c = wait_unschedulable(env, "huge", "ExceedsClusterCapacity")
    expected = (f"Exceeds cluster capacity: gang {env.namespace}/huge needs 3 pods placed at once; "
                "they ask 24 nvidia.com/gpu, the cluster has 16 allocatable.")
    assert c["message"] == expected
    group = env.podgroup("huge")
    assert group["status"]["phase"] == "Queued"
    assert condition(group, "Unschedulable")["status"] == "True"
    assert condition(group, "Unschedulable")["reason"] == "ExceedsClusterCapacity"
    make_gang(env, "small", 2, gpus=4, cpu="1")  # behind it in the queue, long after its reservation delay
    wait_for("the small gang bound", lambda: members_bound(env, "small-") == ["small-0", "small-1"])
    out = subprocess.run([sys.executable, "-m", "batchsched", "explain", "-o", "json", f"{env.namespace}/huge",
                          "--kubeconfig", env.kubeconfig], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["verdict"] == expected
    assert data["neverFits"] == {"reason": "ExceedsClusterCapacity", "message": expected}
    assert members_bound(env, "huge-") == []


def test_an_idle_cluster_costs_no_status_writes(env, start_scheduler):
    env.add_node("n1", gpus=8)
    make_gang(env, "steady", 2, gpus=2, cpu="1")
    proc = start_scheduler()
    wait_for("steady Running", lambda: env.podgroup("steady").get("status", {}).get("phase") == "Running")

    def metric(name: str) -> float:
        from tests.support.metrics import sample
        return sample(proc.get("/metrics")[1], name) or 0

    # let the writer flush what is pending, then count writes across idle cycles
    wait_for("status settled", lambda: env.podgroup("steady")["status"].get("running") == 2)
    writes, cycles = metric("batchsched_podgroup_status_writes_total"), metric("batchsched_scheduling_cycles_total")
    version = env.podgroup("steady")["metadata"]["resourceVersion"]
    wait_for("two idle cycles", lambda: metric("batchsched_scheduling_cycles_total") >= cycles + 2, timeout=20)
    assert metric("batchsched_podgroup_status_writes_total") == writes
    assert env.podgroup("steady")["metadata"]["resourceVersion"] == version


# 11
def test_no_reservation_waits_for_deployment_pods(env, start_scheduler):
    """Issue 11, finding 6: a ReplicaSet's inference never ends, so a big gang
    that could only fit without it must not reserve the nodes and idle them."""
    low, high = f"low-{env.id}", f"high-{env.id}"
    env.add_cluster_object(priority_class(low, 10))
    env.add_cluster_object(priority_class(high, 1000))
    nodes = [env.add_node(f"gpu{i}", gpus=8) for i in range(4)]
    # its pods, placed one per node by kube-scheduler before batchsched starts
    template = pod("infer", env.namespace, gpus=1, cpu="1", priority_class=low, labels={"app": "infer"},
                   scheduler="default-scheduler", node_selector=env.node_label)
    template["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "infer"}}, "topologyKey": "kubernetes.io/hostname"}]}}
    env.kube.create(f"/apis/apps/v1/namespaces/{env.namespace}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "infer"},
        "spec": {"replicas": len(nodes), "selector": {"matchLabels": {"app": "infer"}},
                 "template": {"metadata": {"labels": {"app": "infer"}}, "spec": template["spec"]}}})
    wait_for("the ReplicaSet's pods bound one per node", lambda: sorted(env.bound().values()) == sorted(nodes))
    make_gang(env, "big", 4, gpus=8, cpu="1", priority_class=high, group_spec={"priorityClassName": high})
    start_scheduler(queue={"reservationAfterSeconds": 0, "initialBackoffSeconds": 0.2})
    wait_unschedulable(env, "big")
    make_gang(env, "later", 2, gpus=4, cpu="1", priority_class=low, group_spec={"priorityClassName": low})
    wait_for("the later gang bound beside the inference",
             lambda: members_bound(env, "later-") == ["later-0", "later-1"])
    assert members_bound(env, "big-") == []
    assert_not_overcommitted(env)


# 16
def job_gang(env, name: str, size: int, gpus: int, deadline: int | None = None, **group_spec) -> None:
    """A gang of a Job's pods: restartPolicy Never, so they end by themselves."""
    env.create(pod_group(name, env.namespace, size, **group_spec))
    for i in range(size):
        member = pod(f"{name}-{i}", env.namespace, group=name, gpus=gpus, cpu="1")
        member["spec"]["restartPolicy"] = "Never"
        if deadline is not None:
            member["spec"]["activeDeadlineSeconds"] = deadline
        env.create(member)


def nodes_reserved_for_big(env, start_scheduler) -> None:
    """Two 8-GPU nodes half held by a gang whose pods have
    activeDeadlineSeconds 600, and gang "big" (two whole nodes) waiting
    with the nodes reserved, expected to fit once those pods are gone."""
    for i in range(2):
        env.add_node(f"gpu{i}", gpus=8)
    job_gang(env, "running", 2, gpus=4, deadline=600)
    start_scheduler(queue={"reservationAfterSeconds": 0, "initialBackoffSeconds": 0.2})
    wait_for("the running gang bound", lambda: members_bound(env, "running-") == ["running-0", "running-1"])
    job_gang(env, "big", 2, gpus=8)
    wait_unschedulable(env, "big")


def test_gangs_that_end_before_the_reserved_gang_fits_backfill_its_nodes(env, start_scheduler):
    """Issue 16, point 1: while two nodes drain for a reserved gang, a gang
    whose expectedRuntimeSeconds ends sooner runs there; one whose hint ends
    later, and one with no bound, wait."""
    nodes_reserved_for_big(env, start_scheduler)
    job_gang(env, "long", 1, gpus=4, expectedRuntimeSeconds=3600)
    job_gang(env, "unbounded", 1, gpus=4)
    for name in ("long", "unbounded"):
        assert "reserved for a waiting gang" in wait_unschedulable(env, name)["message"]
    job_gang(env, "short", 1, gpus=4, expectedRuntimeSeconds=60)
    wait_for("the short gang backfilled", lambda: members_bound(env, "short-") == ["short-0"])
    assert members_bound(env, "long-") == members_bound(env, "unbounded-") == members_bound(env, "big-") == []
    assert_not_overcommitted(env)
