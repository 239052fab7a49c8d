"""Queues end to end: the real scheduler process against a real API server
(docs/queues.md).  "Never binds" is asserted only once the scheduler has
written its verdict on the gang."""
from __future__ import annotations

import subprocess
import sys

import pytest

from batchsched.api import constants
from batchsched.api.queue import Queue, QueueMeta, QueueSpec
from tests.integration.test_gang_scheduling import condition, members_bound, wait_unschedulable
from tests.integration.test_preemption import alive
from tests.support.kube import wait_for
from tests.support.objects import pod, pod_group

pytestmark = pytest.mark.e2e

QUEUES = f"/apis/{constants.GROUP}/{constants.VERSION}/queues"


def add_queue(env, name: str, **spec) -> str:
    """A Queue named for this test run (Queues are cluster-scoped), removed after it."""
    full = f"{env.id}-{name}"
    env.add_cluster_object(Queue(metadata=QueueMeta(name=full), spec=QueueSpec.model_validate(spec)).to_json())
    return full


def test_a_queue_at_its_limit_keeps_the_gang_pending_with_the_reason(env, start_scheduler, queue_crd, kubectl):
    env.add_node("n1", gpus=8)
    team = add_queue(env, "team-a", resources={constants.GPU_RESOURCE: {"guaranteed": 2, "limit": 4}})
    for name in ("held", "train"):
        env.create(pod_group(name, env.namespace, 1, queue=team))
        env.create(pod(f"{name}-0", env.namespace, group=name, gpus=4))
    start_scheduler()
    # whichever goes first takes the queue's 4 GPUs; the other waits for the queue, not for room
    wait_for("one gang bound", lambda: len(members_bound(env, "held-") + members_bound(env, "train-")) == 1)
    waiting = "train" if members_bound(env, "held-") else "held"
    scheduled = wait_unschedulable(env, waiting, "QueueAtLimit")
    assert (f"queue {team} is at its limit: 4/4 {constants.GPU_RESOURCE} "
            f"(gang {env.namespace}/{waiting} needs 4 at once)") in scheduled["message"]
    assert members_bound(env, f"{waiting}-") == []
    status = wait_for("queue status written", lambda: (
        s := env.kube.get(f"{QUEUES}/{team}").get("status") or {}).get("pendingGangs") == 1 and s)
    assert status["allocated"][constants.GPU_RESOURCE] == "4" and status["borrowed"] == {constants.GPU_RESOURCE: "2"}
    assert status["runningGangs"] == 1
    out = subprocess.run([kubectl, "--kubeconfig", env.kubeconfig, "get", "queues.scheduling.batchsched.io", team],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0].split() == ["NAME", "PARENT", "WEIGHT", "GPU-GUARANTEED", "GPU-LIMIT", "GPU-ALLOCATED", "PENDING",
                              "RECLAIM", "AGE"]
    # (no parent: that column is blank) weight, GPUs guaranteed, limit, allocated, pending gangs
    assert out[1].split()[:6] == [team, "1", "2", "4", "4", "1"]


def test_a_podgroup_naming_a_missing_queue_gets_a_clear_condition(env, start_scheduler, queue_crd):
    env.add_node("n1", gpus=8)
    env.create(pod_group("lost", env.namespace, 1, queue=f"{env.id}-nowhere"))
    env.create(pod("lost-0", env.namespace, group="lost", gpus=1))
    start_scheduler()
    scheduled = wait_unschedulable(env, "lost", "QueueNotFound")
    assert scheduled["message"].startswith(f"Queue {env.id}-nowhere not found (spec.queue of PodGroup "
                                           f"{env.namespace}/lost)")
    assert members_bound(env, "lost-") == []


def test_a_parent_limit_binds_its_children_together(env, start_scheduler, queue_crd):
    env.add_node("n1", gpus=8)
    org = add_queue(env, "org", resources={constants.GPU_RESOURCE: {"limit": 4}})
    team_a = add_queue(env, "team-a", parent=org)
    team_b = add_queue(env, "team-b", parent=org)
    env.create(pod_group("a-job", env.namespace, 1, queue=team_a))
    env.create(pod("a-job-0", env.namespace, group="a-job", gpus=4))
    start_scheduler()
    wait_for("team-a's gang bound", lambda: members_bound(env, "a-job-") == ["a-job-0"])
    env.create(pod_group("b-job", env.namespace, 1, queue=team_b))
    env.create(pod("b-job-0", env.namespace, group="b-job", gpus=2))
    scheduled = wait_unschedulable(env, "b-job", "QueueAtLimit")
    assert f"queue {team_b}'s parent {org} is at its limit: 4/4 {constants.GPU_RESOURCE}" in scheduled["message"]
    assert members_bound(env, "b-job-") == []
    wait_for("the parent's status adds up its children", lambda: (
        env.kube.get(f"{QUEUES}/{org}").get("status") or {}).get("allocated", {}).get(constants.GPU_RESOURCE) == "4")


def test_gpu_type_quotas_are_apart(env, start_scheduler, queue_crd):
    h100 = env.add_node("h100", gpus=8, labels={constants.GPU_PRODUCT_LABEL: "H100"})
    a100 = env.add_node("a100", gpus=8, labels={constants.GPU_PRODUCT_LABEL: "A100"})
    team = add_queue(env, "team", gpuTypes={"H100": {"limit": 4}})
    on_h100 = {constants.GPU_PRODUCT_LABEL: "H100"}
    env.create(pod_group("first", env.namespace, 1, queue=team))
    env.create(pod("first-0", env.namespace, group="first", gpus=4, node_selector=on_h100))
    start_scheduler()
    wait_for("the first gang on the H100 node", lambda: env.bound().get("first-0") == h100)
    env.create(pod_group("anywhere", env.namespace, 1, queue=team))
    env.create(pod("anywhere-0", env.namespace, group="anywhere", gpus=4))
    wait_for("the next gang on the A100 node: the H100 quota is used up",
             lambda: env.bound().get("anywhere-0") == a100)
    env.create(pod_group("h100-only", env.namespace, 1, queue=team))
    env.create(pod("h100-only-0", env.namespace, group="h100-only", gpus=4, node_selector=on_h100))
    scheduled = wait_unschedulable(env, "h100-only")
    assert (f"1 node(s) had {constants.GPU_PRODUCT_LABEL}=H100, where queue {team} is at its limit "
            f"(4/4 {constants.GPU_RESOURCE})") in scheduled["message"]
    assert "h100-only-0" not in env.bound()


@pytest.mark.parametrize("reclaimable", [True, False])
def test_a_queue_reclaims_what_it_lent_whole_gangs_only_and_never_from_a_non_reclaimable_one(
        env, start_scheduler, queue_crd, kubectl, reclaimable):
    env.add_node("gpu0", gpus=8)
    lender = add_queue(env, "team-a", resources={constants.GPU_RESOURCE: {"guaranteed": 8}})
    borrower = add_queue(env, "team-b", reclaimable=reclaimable)
    env.create(pod_group("borrow", env.namespace, 2, queue=borrower))
    for i in range(2):  # kwok keeps them Terminating once evicted, until the test deletes them
        borrowed = pod(f"borrow-{i}", env.namespace, group="borrow", gpus=4)
        borrowed["metadata"]["annotations"] = {"batchsched.io/linger": "true"}
        borrowed["spec"]["terminationGracePeriodSeconds"] = 600
        env.create(borrowed)
    start_scheduler(preemption={"enabled": True, "nodeCooldownSeconds": 0}, queue={"initialBackoffSeconds": 0.2})
    wait_for("team-b borrows the node", lambda: len(members_bound(env, "borrow-")) == 2)
    env.create(pod_group("own", env.namespace, 1, queue=lender))
    env.create(pod("own-0", env.namespace, group="own", gpus=8))
    if not reclaimable:
        scheduled = wait_unschedulable(env, "own")
        assert "reclaims" not in scheduled["message"] and "waiting for reclaim" not in scheduled["message"]
        assert alive(env, ["borrow-0", "borrow-1"]) == ["borrow-0", "borrow-1"]
        return
    wait_for("the whole borrowing gang evicted", lambda: all(
        env.pods()[f"borrow-{i}"]["metadata"].get("deletionTimestamp") for i in range(2)), timeout=60)
    # while its victims terminate, the reclaim shows: the gang's condition, both Queues, kubectl, explain
    waiting = f"waiting for reclaim from {borrower} (1 gang)"
    wait_for("own's condition names the reclaim", lambda: waiting in condition(env.podgroup("own"), "Scheduled").get(
        "message", ""))
    reclaim = wait_for("team-a's status shows the reclaim", lambda: (
        env.kube.get(f"{QUEUES}/{lender}").get("status") or {}).get("reclaim"))
    assert (reclaim["message"], reclaim["waitingGangs"]) == (f"from {borrower} (1 gang)", 1)
    assert [(f["queue"], f["gangs"], f["pods"], f["resources"][constants.GPU_RESOURCE]) for f in reclaim["from"]] \
        == [(borrower, 1, 2, "8")]
    assert reclaim["since"] == min(env.pods()[f"borrow-{i}"]["metadata"]["deletionTimestamp"] for i in range(2))
    lent = wait_for("team-b's status shows who reclaims", lambda: (
        env.kube.get(f"{QUEUES}/{borrower}").get("status") or {}).get("reclaimedBy"))
    assert lent["message"] == f"by {lender} (1 gang)" and lent["to"][0]["pods"] == 2
    out = subprocess.run([kubectl, "--kubeconfig", env.kubeconfig, "get", "queues.scheduling.batchsched.io", lender],
                         capture_output=True, text=True, check=True).stdout
    assert f"from {borrower} (1 gang)" in out.split("\n")[1]
    explained = subprocess.run([sys.executable, "-m", "batchsched", "explain", "--kubeconfig", env.kubeconfig,
                                "-n", env.namespace, "own"], capture_output=True, text=True, timeout=60)
    assert f"-> {waiting}" in explained.stdout, explained.stdout + explained.stderr
    for i in range(2):
        env.kube.delete(f"/api/v1/namespaces/{env.namespace}/pods/borrow-{i}", gracePeriodSeconds=0)
    wait_for("team-a's gang bound on the reclaimed GPUs", lambda: members_bound(env, "own-") == ["own-0"],
             timeout=60)
    assert alive(env, ["borrow-0", "borrow-1"]) == []  # the whole gang went, through the Eviction API
    def preempted() -> list[str]:
        return sorted(e["involvedObject"]["name"] for e in env.kube.get(
            f"/api/v1/namespaces/{env.namespace}/events")["items"] if e["reason"] == "Preempted")

    # Events yield to bindings (docs/binding.md): they may follow the gang's binding.
    wait_for("a Preempted event per evicted pod", lambda: len(preempted()) >= 2)
    assert preempted() == ["borrow-0", "borrow-1"]
    wait_for("the reclaim over, gone from both statuses", lambda: not any(
        (env.kube.get(f"{QUEUES}/{q}").get("status") or {}).get(field) for q, field in
        ((lender, "reclaim"), (borrower, "reclaimedBy"))))


class Tree:
    """Queues A {A1, A2} and B {B1, B2} on four 8-GPU nodes (pool a: n0, n1;
    pool b: n2, n3); pods placed on them directly, each its own gang."""

    def __init__(self, env):
        self.env = env
        self.queues = {name: add_queue(env, name.lower()) for name in ("A", "B")}
        for name in ("A1", "A2", "B1", "B2"):
            self.queues[name] = add_queue(env, name.lower(), parent=self.queues[name[0]])
        self.nodes = [env.add_node(f"n{i}", gpus=8, labels={"pool": "a" if i < 2 else "b"}) for i in range(4)]

    def gang(self, name: str, queue: str, gpus: int, node: int | None = None, pool: str = "") -> None:
        """A one-pod gang of ``queue``: on node ``node``, or waiting (for ``pool``)."""
        self.env.create(pod_group(name, self.env.namespace, 1, queue=self.queues[queue]))
        selector = {"pool": pool} if pool else None
        self.place(pod(name, self.env.namespace, group=name, gpus=gpus, node_selector=selector), node)

    def foreign(self, name: str, gpus: int, node: int) -> None:
        self.place(pod(name, self.env.namespace, gpus=gpus, scheduler="default-scheduler"), node)

    def place(self, obj: dict, node: int | None) -> None:
        if node is not None:
            obj["spec"]["nodeName"] = self.nodes[node]
        self.env.create(obj)


def test_in_a_queue_tree_a_child_over_its_share_is_not_reclaimed_from_while_its_parent_is_under_its_own(
        env, start_scheduler, queue_crd):
    # As tests/unit/test_queues.py: shares A and B 16, A1 4, B1 8; B1 holds
    # 12, B only 12 (another scheduler's pods hold 8).
    tree = Tree(env)
    for name, node in (("a2x", 0), ("a2y", 0), ("a2z", 1)):
        tree.gang(name, "A2", 4, node)
    for name, node in (("b1x", 2), ("b1y", 2), ("b1z", 3)):
        tree.gang(name, "B1", 4, node)
    tree.foreign("other-1", 4, 1)
    tree.foreign("other-3", 4, 3)
    tree.gang("b2", "B2", 8, pool="a")
    tree.gang("a1", "A1", 4, pool="b")
    start_scheduler(preemption={"enabled": True, "nodeCooldownSeconds": 0}, queue={"initialBackoffSeconds": 0.2})
    scheduled = wait_unschedulable(env, "a1")
    assert "reclaims" not in scheduled["message"], scheduled["message"]
    assert alive(env, ["a2x", "a2y", "a2z", "b1x", "b1y", "b1z"]) == ["a2x", "a2y", "a2z", "b1x", "b1y", "b1z"]


def test_in_a_queue_tree_a_subtree_beyond_its_share_is_reclaimed_from_once_and_takes_nothing_back(
        env, start_scheduler, queue_crd):
    # Shares A and B 16, every child 8.  B1 holds 16, B 24: A1 takes one of
    # B1's gangs; B1's next gang, at its share, takes nothing back.
    tree = Tree(env)
    tree.gang("a2", "A2", 8, 0)
    tree.gang("b2", "B2", 8, 1)
    tree.gang("b1x", "B1", 8, 2)
    tree.gang("b1y", "B1", 8, 3)
    tree.gang("a1", "A1", 8)
    start_scheduler(preemption={"enabled": True, "nodeCooldownSeconds": 0}, queue={"initialBackoffSeconds": 0.2})
    wait_for("one of B1's gangs evicted", lambda: len(alive(env, ["b1x", "b1y"])) == 1, timeout=60)
    wait_for("A1's gang bound on the reclaimed GPUs", lambda: "a1" in env.bound(), timeout=60)
    tree.gang("b1-again", "B1", 8)
    scheduled = wait_unschedulable(env, "b1-again")
    assert "reclaims" not in scheduled["message"], scheduled["message"]
    assert alive(env, ["a1", "a2", "b2"]) == ["a1", "a2", "b2"]
