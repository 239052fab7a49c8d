"""The native gang API's PodGroup (scheduling.k8s.io/v1beta1) read into a
gang, its pods found by spec.schedulingGroup, and its status condition
(docs/integrations.md)."""
from __future__ import annotations

import asyncio

import pytest

from batchsched.core import gangsources
from batchsched.core.cycle import schedule_cycle
from batchsched.core.gangs import GangIndex
from batchsched.core.gangsources import native
from batchsched.core.readers import pod_from_json
from batchsched.core.queueing.queue import GangQueue
from batchsched.shell.cache import ClusterCache
from tests.unit.cache_support import relist
from tests.unit.test_kueue_gangs import nodes

ALL = frozenset(gangsources.PRECEDENCE)


def group(name: str, **spec) -> dict:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "train", "generation": 1}, "spec": spec}


def member(name: str, group_name: object, labels=None) -> dict:
    return {"metadata": {"name": name, "namespace": "train", "uid": f"uid-{name}", "labels": labels or {},
                         "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"schedulerName": "batchsched", "schedulingGroup": {"podGroupName": group_name},
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
            "status": {"phase": "Pending"}}


def test_gang_min_count_is_the_min_member_and_basic_asks_no_gang():
    assert native.group_from_json(group("g", schedulingPolicy={"gang": {"minCount": 4}})).min_member == 4
    assert native.group_from_json(group("g", schedulingPolicy={"basic": {}})).min_member == 1
    assert native.group_from_json(group("g")).min_member == 1
    assert native.group_from_json(group("g", schedulingPolicy={"gang": {"minCount": 4}})).key == \
        "train/kubernetes:g"


@pytest.mark.parametrize("policy, expected", [
    ({"gang": {"minCount": 0}}, "spec.schedulingPolicy.gang.minCount: Input should be greater than or equal to 1"),
    ({"gang": {"minCount": -2}}, "greater than or equal to 1"),
    ({"gang": {"minCount": 10**9}}, "less than or equal to 100000"),
    ({"gang": {"minCount": "4"}}, "spec.schedulingPolicy.gang.minCount: Input should be a valid integer"),
    ({"gang": {}}, "spec.schedulingPolicy.gang.minCount: Field required"),
    ({"gang": {"minCount": 2}, "basic": {}}, "gang and basic both set"),
    ("all", "spec.schedulingPolicy: Input should be a valid dictionary"),
])
def test_hostile_native_podgroups_are_refused_naming_the_field(policy, expected):
    with pytest.raises(ValueError) as caught:
        native.group_from_json(group("g", schedulingPolicy=policy))
    assert expected in str(caught.value)


def test_pods_join_through_spec_scheduling_group_after_our_label_only():
    pod = pod_from_json(member("p", "g"), ALL)
    assert (pod.group_source, pod.gang_key) == ("kubernetes", "train/kubernetes:g")
    ours = pod_from_json(member("p", "g", labels={"scheduling.batchsched.io/pod-group": "mine"}), ALL)
    assert ours.gang_key == "train/mine"
    sp = pod_from_json(member("p", "g", labels={"scheduling.x-k8s.io/pod-group": "other"}), ALL)
    assert sp.gang_key == "train/kubernetes:g"  # the API's own field before a foreign label
    for bad in ("", None, 7, {"x": 1}, "x" * 254):
        assert pod_from_json(member("p", bad), ALL).gang_key == "train/pod:p"
    assert pod_from_json(member("p", "g"), frozenset({"batchsched"})).gang_key == "train/pod:p"


def test_a_changed_min_count_is_the_next_cycles_gang():
    cache = asyncio.run(_cache())
    relist(cache, "nodes", nodes({}, {}))
    relist(cache, "podgroups.scheduling.k8s.io", [group("g", schedulingPolicy={"gang": {"minCount": 3}})])
    relist(cache, "pods", [member(f"w{i}", "g") for i in range(2)])
    plan = schedule_cycle(cache.snapshot(0.0), GangQueue())
    assert plan.bindings == [] and plan.verdicts["train/kubernetes:g"].reason == "QuorumNotReached"
    relist(cache, "podgroups.scheduling.k8s.io", [group("g", schedulingPolicy={"gang": {"minCount": 2}})])
    assert GangIndex(cache.snapshot(1.0))["train/kubernetes:g"].min_member == 2
    assert sorted(b.pod_name for b in schedule_cycle(cache.snapshot(1.0), GangQueue()).bindings) == ["w0", "w1"]


async def _cache() -> ClusterCache:
    return ClusterCache("batchsched", gang_sources=("kubernetes",))


def test_initially_scheduled_is_false_while_it_waits_and_true_for_good_once_placed():
    waiting = native.status("Queued", "QuorumNotReached", "2/3 members exist", None, "T1")
    [condition] = waiting["conditions"]
    assert (condition["status"], condition["reason"], condition["lastTransitionTime"]) == (
        "False", "Unschedulable", "T1")
    assert condition["message"] == "QuorumNotReached: 2/3 members exist"
    still = native.status("Queued", "QuorumNotReached", "2/3 members exist", waiting, "T2")
    assert still["conditions"][0]["lastTransitionTime"] == "T1"  # no transition
    placed = native.status("Scheduled", "Scheduled", "placed", still, "T3")
    assert placed["conditions"][0]["status"] == "True"
    after = native.status("Queued", "Unschedulable", "lost a member", placed, "T4")
    assert after == placed  # terminal once True
