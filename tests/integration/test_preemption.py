"""Preemption end to end: policy-driven, gang-aware, through the Eviction API."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from batchsched.api.constants import (CHECKPOINT_TIME_ANNOTATION, GPU_IDS_ANNOTATION, GPU_TOPOLOGY_ANNOTATION,
                                      POD_GROUP_LABEL)
from batchsched.core.topology.annotation import to_annotation
from batchsched.core.topology.choose import choose_gpus, mask_of
from batchsched.core.topology.parse import parse_topo
from tests.integration.test_gang_scheduling import condition, make_gang, members_bound
from tests.unit.topology_support import FIXTURES
from tests.support.kube import wait_for
from tests.support.metrics import sample
from tests.support.objects import pod, priority_class

pytestmark = pytest.mark.e2e

INFERENCE = {"workload": "inference"}


def preemption_config(**victims) -> dict:
    return {"preemption": {"enabled": True, "nodeCooldownSeconds": 0,
                           "victims": {"matchLabels": INFERENCE, **victims}},
            "queue": {"initialBackoffSeconds": 0.2}}


class Classes:
    def __init__(self, env):
        self.low, self.mid, self.high = (f"{n}-{env.id}" for n in ("low", "mid", "high"))
        for name, value in ((self.low, 100), (self.mid, 500), (self.high, 1000)):
            env.add_cluster_object(priority_class(name, value))


def fill_with_inference(env, nodes, per_node: int, priority_class_name: str, linger: bool = False,
                        gpu_order: list[int] | None = None) -> list[str]:
    """Single-GPU inference pods placed directly on the nodes, Running; with
    ``gpu_order``, pod i names GPU gpu_order[i] in its gpu-ids annotation."""
    names = []
    for node in nodes:
        for i in range(per_node):
            p = pod(f"inf-{node[-4:]}-{i}", env.namespace, gpus=1, cpu="1", scheduler="default-scheduler",
                    priority_class=priority_class_name, labels=INFERENCE)
            p["spec"]["nodeName"] = node
            p["metadata"]["annotations"] = {}
            if gpu_order:
                p["metadata"]["annotations"][GPU_IDS_ANNOTATION] = str(gpu_order[i])
            if linger:
                p["metadata"]["annotations"]["batchsched.io/linger"] = "true"
                p["spec"]["terminationGracePeriodSeconds"] = 600
            env.create(p)
            names.append(p["metadata"]["name"])
    wait_for("inference running", lambda: all(
        env.pods()[n]["status"].get("phase") == "Running" for n in names))
    return names


def full_nodes_and_training_gang(env, pc: Classes, inference_class: str, size: int = 2, gpus: int = 4,
                                 nodes: int = 2, **group_spec) -> list[str]:
    """``nodes`` 8-GPU nodes full of inference pods, and a high-priority
    training gang of ``size`` pods x ``gpus`` waiting; returns the inference pods."""
    names = [env.add_node(f"gpu{i}", gpus=8) for i in range(nodes)]
    inference = fill_with_inference(env, names, 8, inference_class)
    make_gang(env, "train", size, group_spec={"priorityClassName": pc.high, **group_spec}, gpus=gpus, cpu="1",
              priority_class=pc.high)
    return inference


def alive(env, names) -> list[str]:
    pods = env.pods()
    return [n for n in names if n in pods and not pods[n]["metadata"].get("deletionTimestamp")]


def wait_verdict(env, group: str, text: str, timeout: float = 30) -> str:
    return wait_for(f"{group} condition containing {text!r}", lambda: (
        text in (m := condition(env.podgroup(group), "Unschedulable").get("message", "")) and m), timeout)


def events_about(env, name: str, reason: str) -> list[str]:
    events = env.kube.get(f"/api/v1/namespaces/{env.namespace}/events")["items"]
    return [e["message"] for e in events if e["involvedObject"]["name"] == name and e["reason"] == reason]


def budget_allowing_one_disruption(env, name: str, selector: dict, pods: int) -> None:
    """A PodDisruptionBudget over ``pods`` healthy pods that allows one
    disruption, once the disruption controller says so: the Eviction API takes
    it down to 0 on the first real eviction."""
    env.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
                "spec": {"minAvailable": pods - 1, "selector": {"matchLabels": selector}}})
    wait_for(f"the disruption controller allowing one disruption of {name}", lambda: (
        (budget := env.kube.get(f"/apis/policy/v1/namespaces/{env.namespace}/poddisruptionbudgets/{name}"))
        .get("status", {}).get("observedGeneration") == budget["metadata"]["generation"]
        and budget["status"].get("disruptionsAllowed") == 1))


# 1
def test_training_gang_evicts_only_what_it_needs_then_binds_on_aligned_gpus(env, start_scheduler):
    pc = Classes(env)
    dgx1 = parse_topo((FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt").read_text())
    annotation = {GPU_TOPOLOGY_ANNOTATION: to_annotation(dgx1)}
    nodes = [env.add_node(f"gpu{i}", gpus=8, annotations=annotation) for i in range(2)]
    # the pods' names interleave the two NVLink quads, so the cheapest victims by name alone are scattered
    inference = fill_with_inference(env, nodes, 8, pc.low, gpu_order=[0, 5, 2, 7, 1, 4, 3, 6])
    make_gang(env, "train", 2, group_spec={"priorityClassName": pc.high}, gpus=4, cpu="1",
              priority_class=pc.high)
    start_scheduler(**preemption_config())
    wait_for("gang bound", lambda: len(members_bound(env, "train-")) == 2, timeout=60)
    assert len(inference) - len(alive(env, inference)) == 8, "evicted more (or fewer) than needed"
    best = choose_gpus(dgx1, mask_of(range(8)), 4).objective[:3]
    for name in ("train-0", "train-1"):
        ids = [int(g) for g in env.pods()[name]["metadata"]["annotations"][GPU_IDS_ANNOTATION].split(",")]
        assert choose_gpus(dgx1, mask_of(ids), 4).objective[:3] == best, f"{name} got {ids}"
    def preempted() -> list[dict]:
        return [e for e in env.kube.get(f"/api/v1/namespaces/{env.namespace}/events")["items"]
                if e["reason"] == "Preempted"]

    # Events yield to bindings (docs/binding.md): they may follow the gang's binding.
    wait_for("a Preempted event per victim", lambda: len(preempted()) >= 8)
    assert len(preempted()) == 8 and all("train" in e["message"] for e in preempted())


# 2
def test_pdb_that_allows_no_disruption_stops_preemption_with_a_reason(env, start_scheduler):
    pc = Classes(env)
    env.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "inference"},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": INFERENCE}}})
    inference = full_nodes_and_training_gang(env, pc, pc.low)
    start_scheduler(**preemption_config())
    message = wait_verdict(env, "train", "could not be evicted")
    assert "429" in message or "disruption" in message.lower(), message
    assert alive(env, inference) == inference
    assert members_bound(env, "train-") == []


# 3
def test_equal_priority_does_not_preempt(env, start_scheduler):
    pc = Classes(env)
    inference = full_nodes_and_training_gang(env, pc, pc.high)
    start_scheduler(**preemption_config())
    wait_verdict(env, "train", "would not fit even after evicting")
    assert alive(env, inference) == inference


# 4
@pytest.mark.parametrize("gangs", ["whole", "never"])
def test_running_lower_priority_gang_is_evicted_whole_or_not_at_all(env, start_scheduler, gangs):
    pc = Classes(env)
    env.add_node("gpu0", gpus=8)
    make_gang(env, "old", 4, group_spec={"priorityClassName": pc.mid}, gpus=2, cpu="1",
              priority_class=pc.mid)
    start_scheduler(**{**preemption_config(gangs=gangs, matchLabels={})})
    wait_for("old gang running", lambda: env.podgroup("old").get("status", {}).get("phase") == "Running")
    make_gang(env, "new", 1, group_spec={"priorityClassName": pc.high}, gpus=2, cpu="1",
              priority_class=pc.high)
    old = [f"old-{i}" for i in range(4)]
    if gangs == "whole":
        wait_for("new gang bound", lambda: members_bound(env, "new-") == ["new-0"], timeout=60)
        assert alive(env, old) == []
    else:
        wait_verdict(env, "new", "would not fit even after evicting")
        assert alive(env, old) == old
        assert members_bound(env, "new-") == []


# 5
def test_preemption_policy_never_on_the_preemptor(env, start_scheduler):
    pc = Classes(env)
    inference = full_nodes_and_training_gang(env, pc, pc.low, preemptionPolicy="Never")
    start_scheduler(**preemption_config())
    wait_verdict(env, "train", "preemptionPolicy is Never")
    assert alive(env, inference) == inference


# 6
def test_lower_priority_gang_does_not_take_room_freed_for_a_preemptor(env, start_scheduler):
    pc = Classes(env)
    node = env.add_node("gpu0", gpus=8)
    inference = fill_with_inference(env, [node], 8, pc.low, linger=True)
    make_gang(env, "big", 1, group_spec={"priorityClassName": pc.high}, gpus=4, cpu="1",
              priority_class=pc.high)
    start_scheduler(**preemption_config())
    wait_for("four victims terminating", lambda: len(alive(env, inference)) == 4, timeout=60)
    victims = sorted(set(inference) - set(alive(env, inference)))
    wait_for("big nominated", lambda: env.pods()["big-0"]["status"].get("nominatedNodeName") == node)
    # lower than the preemptor, and no higher than the inference pods: it cannot preempt
    make_gang(env, "small", 1, group_spec={"priorityClassName": pc.low}, gpus=2, cpu="1",
              priority_class=pc.low)
    for name in victims[:2]:  # two of four victims gone: room for "small", not yet for "big"
        env.kube.delete(f"/api/v1/namespaces/{env.namespace}/pods/{name}", gracePeriodSeconds=0)
    wait_verdict(env, "small", "would not fit even after evicting")
    assert members_bound(env, "small-") == []
    for name in victims[2:]:
        env.kube.delete(f"/api/v1/namespaces/{env.namespace}/pods/{name}", gracePeriodSeconds=0)
    wait_for("big bound", lambda: members_bound(env, "big-") == ["big-0"], timeout=30)
    assert members_bound(env, "small-") == []
    assert len(alive(env, inference)) == 4, "no further victims"


# 7
def test_gang_that_cannot_fit_even_after_evictions_evicts_nothing(env, start_scheduler):
    pc = Classes(env)
    # 24 GPUs of 16: beyond the cluster, so no eviction is even planned
    inference = full_nodes_and_training_gang(env, pc, pc.low, size=3, gpus=8)
    start_scheduler(**preemption_config())
    message = wait_verdict(env, "train", "they ask 24 nvidia.com/gpu, the cluster has 16 allocatable")
    assert message.startswith("Exceeds cluster capacity:"), message
    assert condition(env.podgroup("train"), "Unschedulable")["reason"] == "ExceedsClusterCapacity"
    assert alive(env, inference) == inference


# 8
def test_a_real_eviction_refused_after_its_dry_run_is_given_up_and_the_gang_planned_again(env, start_scheduler):
    """Gang "old" (two members, the cheapest victims) is under a budget of one
    disruption: each dry run passes alone, the second real eviction is
    refused.  Within evictionRetrySeconds the preemptor gives up, is planned
    again and takes gang "other" instead; "old", left below its minMember,
    says why."""
    pc = Classes(env)
    config = preemption_config(matchLabels={})
    config["preemption"]["evictionRetrySeconds"] = 2
    start_scheduler(**config)
    gpu0 = env.add_node("gpu0", gpus=4)
    make_gang(env, "old", 2, group_spec={"priorityClassName": pc.low}, gpus=2, cpu="1", priority_class=pc.low)
    wait_for("old bound", lambda: members_bound(env, "old-") == ["old-0", "old-1"])
    gpu1 = env.add_node("gpu1", gpus=4)
    make_gang(env, "other", 2, group_spec={"priorityClassName": pc.mid}, gpus=2, cpu="1", priority_class=pc.mid)
    wait_for("other bound", lambda: members_bound(env, "other-") == ["other-0", "other-1"])
    assert {env.bound()[n] for n in ("old-0", "old-1")} == {gpu0}
    budget_allowing_one_disruption(env, "old", {POD_GROUP_LABEL: "old"}, pods=2)

    make_gang(env, "new", 1, group_spec={"priorityClassName": pc.high}, gpus=4, cpu="1", priority_class=pc.high)
    wait_for("new bound", lambda: members_bound(env, "new-") == ["new-0"], timeout=60)
    assert env.bound()["new-0"] == gpu1
    assert alive(env, ["other-0", "other-1"]) == [], "the second victim set goes whole"
    assert len(alive(env, ["old-0", "old-1"])) == 1, "the budget let exactly one member of old go"
    given_up = wait_for("the preemptor's event", lambda: events_about(env, "new", "PreemptionIncomplete"))
    assert "refused" in given_up[0] and "429" in given_up[0], given_up
    broken = wait_for("old's event", lambda: events_about(env, "old", "PreemptionIncomplete"))
    assert "below minMember=2" in broken[0], broken


# 9
def test_nominations_left_while_preemption_was_on_expire_once_it_is_off(env, start_scheduler):
    pc = Classes(env)
    node = env.add_node("gpu0", gpus=8)
    fill_with_inference(env, [node], 8, pc.low, linger=True)  # victims that stay terminating
    make_gang(env, "big", 1, group_spec={"priorityClassName": pc.high}, gpus=4, cpu="1",
              priority_class=pc.high)
    with_preemption = start_scheduler(**preemption_config())
    wait_for("big nominated", lambda: env.pods()["big-0"]["status"].get("nominatedNodeName") == node, timeout=60)
    with_preemption.stop()

    config = preemption_config()
    config["preemption"].update(enabled=False, nominationTimeoutSeconds=3)
    started = time.monotonic()
    start_scheduler(**config)
    wait_for("nomination cleared", lambda: not env.pods()["big-0"]["status"].get("nominatedNodeName"), timeout=45)
    assert time.monotonic() - started >= 3, "cleared before nominationTimeoutSeconds"
    assert members_bound(env, "big-") == []


# 10
def test_a_namespace_past_its_eviction_budget_gives_no_more_victims(env, start_scheduler):
    pc = Classes(env)
    node = env.add_node("gpu0", gpus=8)
    inference = fill_with_inference(env, [node], 8, pc.low)
    make_gang(env, "first", 1, group_spec={"priorityClassName": pc.high}, gpus=2, cpu="1", priority_class=pc.high)
    start_scheduler(**preemption_config(maxPerNamespacePerHour=2))
    wait_for("first bound", lambda: len(members_bound(env, "first-")) == 1, timeout=60)
    assert len(alive(env, inference)) == 6
    # the namespace's two evictions of the hour are spent: the next gang gets none and says why
    make_gang(env, "second", 1, group_spec={"priorityClassName": pc.high}, gpus=2, cpu="1", priority_class=pc.high)
    message = wait_verdict(env, "second", "reached their eviction budget")
    assert f"Namespace(s) {env.namespace} reached their eviction budget (maxPerNamespacePerHour=2)" in message
    assert len(alive(env, inference)) == 6 and members_bound(env, "second-") == []


# 11
def test_the_victim_is_the_pod_that_loses_least_work_and_hostile_checkpoints_are_logged(env, start_scheduler):
    pc = Classes(env)
    node = env.add_node("gpu0", gpus=8)
    inference = fill_with_inference(env, [node], 8, pc.low)

    def ran_a_while() -> bool:  # every pod has run a while: the one that saved its work just now loses least
        pods = env.pods()
        starts = [pods[name]["status"].get("startTime") for name in inference]
        return all(starts) and (datetime.now(timezone.utc) - max(
            datetime.fromisoformat(s.replace("Z", "+00:00")) for s in starts)).total_seconds() >= 1.5
    wait_for("every inference pod started over 1.5 s ago", ran_a_while, timeout=30)
    saved, garbled, ahead = inference[5], inference[6], inference[7]
    now = datetime.now(timezone.utc)
    for name, value in ((saved, now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")), (garbled, "tomorrow"),
                        (ahead, (now + timedelta(days=1)).isoformat())):
        env.kube.merge_patch(f"/api/v1/namespaces/{env.namespace}/pods/{name}",
                             {"metadata": {"annotations": {CHECKPOINT_TIME_ANNOTATION: value}}})
    make_gang(env, "train", 1, group_spec={"priorityClassName": pc.high}, gpus=1, cpu="1", priority_class=pc.high)
    scheduler = start_scheduler(**preemption_config())
    wait_for("train bound", lambda: len(members_bound(env, "train-")) == 1, timeout=60)
    assert [n for n in inference if n not in alive(env, inference)] == [saved]
    log = scheduler.log()
    assert f"{env.namespace}/{garbled}: ignoring annotation {CHECKPOINT_TIME_ANNOTATION}: 'tomorrow' is not an " \
           "RFC3339 time" in log
    assert f"{env.namespace}/{ahead}: ignoring annotation {CHECKPOINT_TIME_ANNOTATION}: it is in the future" in log


# 12
def test_a_preemptor_class_with_a_wait_evicts_only_once_it_has_waited(env, start_scheduler):
    """preemptors.waitSeconds: the gang's condition says it waits for room to
    free by itself, nothing is evicted meanwhile, then it evicts and binds."""
    pc = Classes(env)
    node = env.add_node("gpu0", gpus=8)
    inference = fill_with_inference(env, [node], 8, pc.low)
    config = preemption_config()
    config["preemption"]["preemptors"] = {"waitSeconds": {pc.high: 6}}
    make_gang(env, "train", 1, group_spec={"priorityClassName": pc.high}, gpus=2, cpu="1", priority_class=pc.high)
    started = time.monotonic()
    start_scheduler(**config)
    message = wait_verdict(env, "train", "once it has waited 6s")
    assert f"(preemption.preemptors.waitSeconds of PriorityClass {pc.high})" in message
    assert alive(env, inference) == inference
    wait_for("train bound", lambda: len(members_bound(env, "train-")) == 1, timeout=60)
    assert time.monotonic() - started >= 6, "evicted before its wait was over"
    assert len(alive(env, inference)) == 6


# 13
def test_reserved_room_lent_to_a_victim_is_taken_back_once_the_holder_can_use_it(env, start_scheduler):
    """queue.lendReservedToVictims: two nodes drain for a high-priority gang
    (a Job-like pod of ours on each, ending within its deadline). An
    inference pod that fits nowhere else borrows their room, and its
    PodGroup's Scheduled event says so; the reservation outlives the borrow,
    as the reservation metrics show (a pod that may neither borrow nor
    backfill waits for that room meanwhile). Once the drained pods are gone
    the gang evicts it and binds there."""
    pc = Classes(env)
    nodes = [env.add_node(f"gpu{i}", gpus=8) for i in range(2)]
    draining = []
    for node in nodes:
        job = pod(f"job-{node[-4:]}", env.namespace, gpus=4, cpu="1", priority_class=pc.mid)
        job["spec"].update(nodeName=node, restartPolicy="Never", activeDeadlineSeconds=600)
        env.create(job)
        draining.append(job["metadata"]["name"])
    wait_for("the Job pods running", lambda: all(env.pods()[n]["status"].get("phase") == "Running" for n in draining))
    make_gang(env, "big", 2, group_spec={"priorityClassName": pc.high}, gpus=8, cpu="1", priority_class=pc.high)
    config = preemption_config()
    config["queue"]["reservationAfterSeconds"] = 1
    proc = start_scheduler(**config)

    def reservation() -> tuple[float | None, float | None]:  # (nodes reserved, GPUs it idles)
        text = proc.get("/metrics")[1]
        return sample(text, "batchsched_reserved_nodes"), sample(text, "batchsched_reservation_idle_gpus")

    wait_verdict(env, "big", "It holds a reservation of 2 node(s) while they drain")
    env.create(pod("waits", env.namespace, gpus=4, cpu="1", priority_class=pc.low))  # no victim, no bound
    wait_for("2 nodes reserved, their 8 free GPUs idled", lambda: reservation() == (2, 8))
    make_gang(env, "serve", 1, gpus=4, cpu="1", priority_class=pc.low, labels=INFERENCE)
    wait_for("serve bound", lambda: len(members_bound(env, "serve-")) == 1, timeout=30)
    assert env.bound()["serve-0"] in nodes
    wait_for("still 2 nodes reserved, 4 GPUs idled", lambda: reservation() == (2, 4))
    wait_for("serve's Scheduled event saying it borrowed", lambda: any(
        "borrowed room on nodes reserved for gang" in e["message"]
        for e in env.kube.get(f"/api/v1/namespaces/{env.namespace}/events")["items"]
        if e["involvedObject"]["name"] == "serve" and e["reason"] == "Scheduled"))
    assert not members_bound(env, "big-")
    for name in draining:  # as if they had ended
        env.kube.delete(f"/api/v1/namespaces/{env.namespace}/pods/{name}")
    wait_for("big bound", lambda: len(members_bound(env, "big-")) == 2, timeout=60)
    assert alive(env, ["serve-0"]) == []
    wait_for("serve-0's Preempted event naming the holder",  # events yield to bindings: may come after
             lambda: any("big" in message for message in events_about(env, "serve-0", "Preempted")))
    assert "waits" not in env.bound()
    wait_for("no reservation left", lambda: reservation() == (0, 0))
    assert sample(proc.get("/metrics")[1], "batchsched_reservation_idle_gpu_seconds_total") > 0
