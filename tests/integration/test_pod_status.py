"""Pod-level status end to end (issue 17, points 4 and 5): a waiting gang's
pods carry PodScheduled=False naming the gang and get FailedScheduling
Events, both following the verdict; a bound pod's condition is the
binding's; a node's Events always end on its current topology state."""
from __future__ import annotations

import pytest

from batchsched.api import constants
from batchsched.core.topology.annotation import to_annotation
from tests.support.kube import wait_for
from tests.support.metrics import sample
from tests.support.objects import pod, pod_group
from tests.unit.topology_support import fixture

pytestmark = pytest.mark.e2e


def pod_scheduled(env, name: str) -> dict:
    conditions = (env.pods().get(name, {}).get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c["type"] == "PodScheduled"), {})


def events_on(env, namespace: str, kind: str, name: str) -> list[dict]:
    """Oldest first (resourceVersions of one collection grow with each write)."""
    items = [e for e in env.kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
             if e["involvedObject"].get("kind") == kind and e["involvedObject"].get("name") == name]
    return sorted(items, key=lambda e: int(e["metadata"]["resourceVersion"]))


def wait_all_unschedulable(env, names: list[str], says: str) -> None:
    wait_for(f"{names} PodScheduled=False saying {says!r}", lambda: all(
        (c := pod_scheduled(env, n)).get("status") == "False" and c.get("reason") == "Unschedulable"
        and says in c.get("message", "") for n in names), timeout=30)


def wait_failed_scheduling(env, name: str, says: str) -> None:
    wait_for(f"a FailedScheduling Event on {name} saying {says!r}", lambda: any(
        e["reason"] == "FailedScheduling" and e["type"] == "Warning" and says in e["message"]
        for e in events_on(env, env.namespace, "Pod", name)), timeout=30)


def test_a_waiting_gangs_pods_say_why_and_follow_its_verdict_until_bound(env, start_scheduler):
    env.add_node("gpu0", gpus=8)
    env.create(pod_group("train", env.namespace, 3))
    for i in range(2):
        env.create(pod(f"train-{i}", env.namespace, group="train", gpus=4, cpu="1"))
    proc = start_scheduler()

    quorum = f"gang {env.namespace}/train (QuorumNotReached): 2/3 members exist"
    wait_all_unschedulable(env, ["train-0", "train-1"], quorum)
    wait_failed_scheduling(env, "train-0", quorum)

    # the quorum is there, the room is not (3 x 4 GPUs on 8, the whole cluster): the condition and the Events follow
    env.create(pod("train-2", env.namespace, group="train", gpus=4, cpu="1"))
    no_room = f"gang {env.namespace}/train (ExceedsClusterCapacity): Exceeds cluster capacity: "
    wait_all_unschedulable(env, ["train-0", "train-1", "train-2"], no_room)
    for name in ("train-0", "train-2"):
        wait_failed_scheduling(env, name, no_room)  # train-0's comes when its 10 s pace allows
    assert events_on(env, env.namespace, "Pod", "train-0")[-1]["message"].startswith(no_room)

    env.add_node("gpu1", gpus=8)
    wait_for("the gang bound", lambda: len(env.bound()) == 3)
    # the binding set PodScheduled=True; idle cycles later nothing of ours has touched it
    wait_for("PodScheduled=True on every member", lambda: all(
        pod_scheduled(env, f"train-{i}").get("status") == "True" for i in range(3)))
    metrics = proc.get("/metrics")[1]
    cycles, writes = (sample(metrics, f"batchsched_{name}_total")
                      for name in ("scheduling_cycles", "pod_condition_writes"))
    wait_for("two more cycles", lambda: sample(
        proc.get("/metrics")[1], "batchsched_scheduling_cycles_total") >= cycles + 2, timeout=20)
    for i in range(3):
        condition = pod_scheduled(env, f"train-{i}")
        assert condition["status"] == "True" and condition.get("reason") != "Unschedulable", condition
    assert sample(proc.get("/metrics")[1], "batchsched_pod_condition_writes_total") == writes


def test_a_restarted_scheduler_rewrites_no_condition_a_pod_already_has(env, start_scheduler):
    env.add_node("gpu0", gpus=8)
    env.create(pod_group("big", env.namespace, 2))
    for i in range(2):
        env.create(pod(f"big-{i}", env.namespace, group="big", gpus=8, cpu="1"))
    first = start_scheduler()
    wait_all_unschedulable(env, ["big-0", "big-1"], f"gang {env.namespace}/big (ExceedsClusterCapacity)")
    wait_for("both written", lambda: sample(first.get("/metrics")[1], "batchsched_pod_condition_writes_total") == 2)
    first.kill()
    versions = {name: p["metadata"]["resourceVersion"] for name, p in env.pods().items()}

    second = start_scheduler()
    wait_for("three cycles", lambda: (sample(
        second.get("/metrics")[1], "batchsched_scheduling_cycles_total") or 0) >= 3, timeout=20)
    assert sample(second.get("/metrics")[1], "batchsched_pod_condition_writes_total") == 0
    assert {name: p["metadata"]["resourceVersion"] for name, p in env.pods().items()} == versions


def test_a_nodes_events_end_on_its_current_topology_state(env, start_scheduler):
    """Bad A -> bad B -> bad A -> fixed: four Events, the newest always the
    node's current state (the second A was dropped before, as a repeat)."""
    bad_a, bad_b = '{"version": 1, "gpus": "eight"}', "not json"
    node = env.add_node("gpu0", gpus=8, annotations={constants.GPU_TOPOLOGY_ANNOTATION: bad_a})
    start_scheduler()

    def annotate(value: str) -> None:
        env.kube.merge_patch(f"/api/v1/nodes/{node}",
                             {"metadata": {"annotations": {constants.GPU_TOPOLOGY_ANNOTATION: value}}})

    def latest_is(count: int, reason: str, says: str) -> None:
        # "default": Events on cluster-scoped objects (nodes) go there
        wait_for(f"Event {count} on the node: {reason} {says!r}", lambda: (
            len(e := events_on(env, "default", "Node", node)) == count
            and e[-1]["reason"] == reason and says in e[-1]["message"]), timeout=30)

    latest_is(1, "InvalidGpuTopology", "gpus must be a non-empty list")
    annotate(bad_b)
    latest_is(2, "InvalidGpuTopology", "is invalid")  # within the reason's 10 s pace: held, then posted
    assert "non-empty list" not in events_on(env, "default", "Node", node)[-1]["message"]
    annotate(bad_a)
    latest_is(3, "InvalidGpuTopology", "gpus must be a non-empty list")
    annotate(to_annotation(fixture("pcie-switch-pairs-8gpu.txt")))
    latest_is(4, "GpuTopologyAccepted", "its GPU topology is used")
    assert events_on(env, "default", "Node", node)[-1]["type"] == "Normal"
