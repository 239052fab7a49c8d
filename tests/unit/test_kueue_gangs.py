"""Kueue's plain-pod groups as gangs (docs/integrations.md): no PodGroup
object, the pods' label and total-count annotation make the gang; Kueue's
scheduling gate holds them until it admits the group, and the nodeSelector
it injects is honoured.  Pods are shaped as Kueue's pod integration wants
them (label kueue.x-k8s.io/queue-name, pod-group-name, total-count)."""
from __future__ import annotations

import asyncio

import pytest

from batchsched.core import gangsources
from batchsched.core.cycle import schedule_cycle
from batchsched.core.gangs import GangIndex
from batchsched.core.readers import pod_from_json
from batchsched.core.queueing.queue import GangQueue
from batchsched.shell.cache import ClusterCache
from tests.unit.cache_support import relist

GROUP_LABEL, TOTAL = "kueue.x-k8s.io/pod-group-name", "kueue.x-k8s.io/pod-group-total-count"
GATE = "kueue.x-k8s.io/admission"


def kueue_pod(name: str, group: str, total: str, *, gated: bool = True, node_selector=None,
              labels=None) -> dict:
    spec = {"schedulerName": "batchsched",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"metadata": {"name": name, "namespace": "train", "uid": f"uid-{name}",
                         "creationTimestamp": "2024-01-01T00:00:00Z",
                         "labels": {"kueue.x-k8s.io/queue-name": "lq", GROUP_LABEL: group, **(labels or {})},
                         "annotations": {TOTAL: total}},
            "spec": spec, "status": {"phase": "Pending"}}


def nodes(*labelled: dict) -> list[dict]:
    return [{"metadata": {"name": f"n{i}", "labels": labels},
             "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                        "conditions": [{"type": "Ready", "status": "True"}]}} for i, labels in enumerate(labelled)]


def cache_with(pods: list[dict], node_list: list[dict], sources=("kueue",)) -> ClusterCache:
    cache = asyncio.run(_new(sources))
    relist(cache, "nodes", node_list)
    relist(cache, "pods", pods)
    return cache


async def _new(sources) -> ClusterCache:
    return ClusterCache("batchsched", gang_sources=sources)


def cycle(cache: ClusterCache, now: float = 0.0):
    return schedule_cycle(cache.snapshot(now), GangQueue())


def test_a_kueue_pod_group_is_one_gang_of_its_stated_size_and_waits_for_admission():
    pods = [kueue_pod(f"w{i}", "job", "3") for i in range(3)]
    cache = cache_with(pods, nodes({}, {}, {}))
    gang = GangIndex(cache.snapshot(0.0))["train/kueue:job"]
    assert (gang.min_member, gang.gated, len(gang.pending), gang.implicit, gang.problem) == (3, 3, 0, False, None)
    assert cycle(cache).bindings == []
    pods[0]["spec"].pop("schedulingGates")  # Kueue lifts the gate pod by pod: nothing binds before the last
    pods[1]["spec"].pop("schedulingGates")
    relist(cache, "pods", pods)
    plan = cycle(cache, 1.0)
    assert plan.bindings == []
    assert plan.verdicts["train/kueue:job"].message == (
        "2/3 members exist (pods with label kueue.x-k8s.io/pod-group-name=job and schedulerName batchsched in "
        "train); 1 more held by scheduling gates")
    pods[2]["spec"].pop("schedulingGates")
    relist(cache, "pods", pods)
    assert sorted(b.pod_name for b in cycle(cache, 2.0).bindings) == ["w0", "w1", "w2"]


def test_the_node_selector_kueue_injects_for_the_admitted_flavor_is_honoured():
    flavor = {"gpu.example/flavor": "h100"}
    pods = [kueue_pod(f"w{i}", "job", "2", gated=False, node_selector=flavor) for i in range(2)]
    cache = cache_with(pods, nodes({}, flavor, {}, flavor))
    placed = {b.pod_name: b.node_name for b in cycle(cache).bindings}
    assert sorted(placed.values()) == ["n1", "n3"]


@pytest.mark.parametrize("totals, expected", [
    (("2", "3"), "the pods of Kueue pod group job disagree on kueue.x-k8s.io/pod-group-total-count: 2, 3"),
    (("2", "-1"), "pod w1 of Kueue pod group job has no valid kueue.x-k8s.io/pod-group-total-count annotation"),
    (("2", "0"), "pod w1 of Kueue pod group job has no valid"),
    (("2", "2.5"), "pod w1 of Kueue pod group job has no valid"),
    (("2", "1e9"), "pod w1 of Kueue pod group job has no valid"),
    (("2", "99999999999999999999"), "pod w1 of Kueue pod group job has no valid"),
    (("2", " 2"), "pod w1 of Kueue pod group job has no valid"),
])
def test_a_group_whose_pods_state_no_usable_size_waits_with_the_reason(totals, expected):
    pods = [kueue_pod(f"w{i}", "job", total, gated=False) for i, total in enumerate(totals)]
    plan = cycle(cache_with(pods, nodes({}, {})))
    assert plan.bindings == []
    verdict = plan.verdicts["train/kueue:job"]
    assert verdict.reason == "InvalidPodGroup" and expected in verdict.message


def test_our_label_wins_over_kueues_group_and_the_source_can_be_switched_off():
    ours = kueue_pod("a", "job", "2", gated=False, labels={"scheduling.batchsched.io/pod-group": "mine"})
    read = pod_from_json(ours, frozenset(gangsources.PRECEDENCE))
    assert read.gang_key == "train/mine" and read.group_total == 0
    off = pod_from_json(kueue_pod("b", "job", "2"), frozenset({gangsources.OWN}))
    assert off.gang_key == "train/pod:b"  # Kueue's grouping not read: a gang of one (still gated)


def test_kueue_groups_have_no_podgroup_to_watch():
    cache = asyncio.run(_new(("scheduler-plugins", "volcano", "kueue")))
    kinds = [r.kind for r in cache.reflectors(None)]  # type: ignore[arg-type]
    assert not [k for k in kinds if "kueue" in k]
