"""The watch cache's bookkeeping, fed with API-shaped JSON (no I/O)."""
import asyncio

import pytest

from batchsched.api.constants import POD_GROUP_LABEL
from batchsched.shell.cache import ClusterCache


def pod_json(name: str, uid: str, node: str = "", group: str = "", phase: str = "Pending") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid,
                         "labels": {POD_GROUP_LABEL: group} if group else {}},
            "spec": {"schedulerName": "batchsched", "nodeName": node,
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
            "status": {"phase": phase}}


@pytest.fixture
def cache():
    async def make():
        return ClusterCache("batchsched")  # asyncio.Event wants a loop in some versions
    return asyncio.run(make())


def test_an_assumed_binding_survives_a_relist_that_does_not_show_it_yet(cache):
    cache._replace_pods([pod_json("p", "u1")])
    cache.assume("u1", "node-a", (0, 1))
    cache._replace_pods([pod_json("p", "u1")])  # e.g. after 410 Gone, from a lagging list
    assert cache.pods["u1"].node_name == "node-a"
    assert cache.pods["u1"].gpu_ids == (0, 1)
    assert "u1" in cache.assumed


def test_the_watch_confirming_a_binding_ends_the_assumption(cache):
    cache._replace_pods([pod_json("p", "u1")])
    cache.assume("u1", "node-a", ())
    cache._apply_pod("MODIFIED", pod_json("p", "u1", node="node-a"))
    assert "u1" not in cache.assumed
    assert cache.pods["u1"].node_name == "node-a"


def test_a_failed_binding_is_forgotten_and_frees_capacity_without_touching_the_gang(cache):
    # The gang keeps the backoff the refusal earns it: touching it would
    # clear that and re-plan it at once, binding after binding.
    cache._replace_pods([pod_json("p", "u1", group="g")])
    cache.drain_changes()
    cache.assume("u1", "node-a", ())
    cache.forget("u1")
    assert cache.pods["u1"].node_name == ""
    touched, freed = cache.drain_changes()
    assert touched == set() and freed


def test_an_assumption_never_expires_on_its_own(cache):
    # kubernetes#106361: an assumption dropped before the watch shows the
    # binding hands the same room (and GPU ids) to a second pod.
    cache._replace_pods([pod_json("p", "u1")])
    cache.assume("u1", "node-a", (0, 1))
    assert not hasattr(cache, "expire_assumptions")
    cache._replace_pods([pod_json("p", "u1")])
    assert cache.pods["u1"].node_name == "node-a" and cache.pods["u1"].gpu_ids == (0, 1)


def test_a_deleted_or_unlisted_pod_ends_its_assumption(cache):
    cache._replace_pods([pod_json("p", "u1"), pod_json("q", "u2")])
    cache.assume("u1", "node-a", ())
    cache.assume("u2", "node-a", ())
    cache._apply_pod("DELETED", pod_json("p", "u1"))
    cache._replace_pods([])
    assert cache.assumed == {}


def gpu_pod(name, uid, node="", ids=""):
    obj = pod_json(name, uid, node=node, phase="Running" if node else "Pending")
    if ids:
        obj["metadata"]["annotations"] = {"scheduling.batchsched.io/gpu-ids": ids}
    return obj


def test_gpu_ids_are_believed_only_for_bindings_made_or_seen(cache):
    cache._replace_pods([gpu_pod("listed", "u0", node="n", ids="0,1"), gpu_pod("ours", "u1"),
                         gpu_pod("seen", "u2")])
    # found at the first list: believed (nothing else to go by after a start)
    assert cache.pods["u0"].gpu_ids == (0, 1) and cache.pods["u0"].bound_by_scheduler
    # bound by us: the ids we chose, whatever the annotation the watch brings
    cache.assume("u1", "n", (2, 3))
    cache._apply_pod("MODIFIED", gpu_pod("ours", "u1", node="n", ids="6,7"))
    assert cache.pods["u1"].gpu_ids == (2, 3) and cache.pods["u1"].bound_by_scheduler
    # seen going from unbound to bound (only pods/binding does that)
    cache._apply_pod("MODIFIED", gpu_pod("seen", "u2", node="n", ids="4,5"))
    assert cache.pods["u2"].gpu_ids == (4, 5) and cache.pods["u2"].bound_by_scheduler
    # created already bound by a tenant: its GPUs count by number only
    cache._apply_pod("ADDED", gpu_pod("forged", "u3", node="n", ids="6,7"))
    assert cache.pods["u3"].gpu_ids == () and not cache.pods["u3"].bound_by_scheduler
    assert cache.pods["u3"].requests["nvidia.com/gpu"] == 2


def test_editing_or_removing_the_annotation_does_not_move_or_free_gpus(cache):
    cache._replace_pods([gpu_pod("p", "u1")])
    cache.assume("u1", "n", (0, 1))
    cache._apply_pod("MODIFIED", gpu_pod("p", "u1", node="n", ids="0,1"))
    cache._apply_pod("MODIFIED", gpu_pod("p", "u1", node="n"))  # annotation removed
    assert cache.pods["u1"].gpu_ids == (0, 1)
    cache._apply_pod("MODIFIED", gpu_pod("p", "u1", node="n", ids="4,5"))  # rewritten
    assert cache.pods["u1"].gpu_ids == (0, 1)
    # and a relist (which relearns nothing) keeps it
    cache._replace_pods([gpu_pod("p", "u1", node="n", ids="4,5")])
    assert cache.pods["u1"].gpu_ids == (0, 1)


def test_a_pod_that_finishes_frees_capacity_and_touches_its_gang(cache):
    cache._replace_pods([pod_json("p", "u1", node="n", group="g", phase="Running")])
    cache.drain_changes()
    cache._apply_pod("MODIFIED", pod_json("p", "u1", node="n", group="g", phase="Succeeded"))
    assert cache.drain_changes() == ({"ns/g"}, True)


def test_a_podgroup_naming_a_missing_priority_class_is_invalid_not_fatal(cache):
    bad = []
    cache.on_bad_object = lambda kind, obj, why: bad.append((kind, why))
    cache._replace_groups([{"metadata": {"name": "g", "namespace": "ns", "generation": 1},
                            "spec": {"minMember": 2, "priorityClassName": "nope"}}])
    assert "not found" in cache.invalid_groups["ns/g"]
    assert bad and bad[0][0] == "PodGroup"
    cache._apply_priority_class("ADDED", {"metadata": {"name": "nope"}, "value": 7})
    assert cache.groups["ns/g"].priority == 7 and "ns/g" not in cache.invalid_groups


def test_the_gang_index_follows_adds_deletes_and_relabels(cache):
    cache._replace_pods([pod_json("a", "u1", group="g"), pod_json("b", "u2", group="g")])
    assert sorted(p.name for p in cache.members("ns/g")) == ["a", "b"]
    cache._apply_pod("MODIFIED", pod_json("b", "u2", group="h"))
    assert [p.name for p in cache.members("ns/g")] == ["a"]
    assert [p.name for p in cache.members("ns/h")] == ["b"]
    cache._apply_pod("DELETED", pod_json("a", "u1", group="g"))
    assert cache.members("ns/g") == []


def node_json(name: str, allocatable: object = None) -> dict:
    return {"metadata": {"name": name},
            "status": {"allocatable": {"cpu": "8"} if allocatable is None else allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_node_that_does_not_convert_is_reported_and_skipped_not_fatal(cache):
    bad = []
    cache.on_bad_object = lambda kind, obj, why: bad.append((kind, obj["metadata"]["name"], why))
    cache._replace_nodes([node_json("broken", allocatable=["not", "a", "map"]), node_json("good")])
    assert list(cache.nodes) == ["good"]
    assert bad and bad[0][:2] == ("Node", "broken") and "AttributeError" in bad[0][2]
    cache._apply_node("MODIFIED", node_json("good", allocatable=["broken", "now"]))
    assert list(cache.nodes) == []  # what it said before may no longer hold: not used
    cache._apply_node("MODIFIED", node_json("good"))
    assert list(cache.nodes) == ["good"]


def test_a_podgroup_failing_in_an_unforeseen_way_is_invalid_and_the_others_convert(cache):
    bad = []
    cache.on_bad_object = lambda kind, obj, why: bad.append((kind, why))
    cache._replace_groups([
        {"metadata": {"name": "odd", "namespace": "ns", "annotations": ["not", "a", "map"]}, "spec": {"minMember": 1}},
        {"metadata": {"name": "fine", "namespace": "ns"}, "spec": {"minMember": 2}},
    ])
    assert "AttributeError" in cache.invalid_groups["ns/odd"]
    assert cache.groups["ns/fine"].min_member == 2
    assert bad == [("PodGroup", cache.invalid_groups["ns/odd"])]
