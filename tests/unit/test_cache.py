"""The watch cache's bookkeeping, fed with API-shaped JSON (no I/O)."""
import asyncio
import gc

import pytest

from batchsched.api.constants import POD_GROUP_LABEL
from batchsched.shell import reflector as reflector_module
from batchsched.shell.cache import ClusterCache
from tests.unit.cache_support import PagedList, relist


def pod_json(name: str, uid: str, node: str = "", group: str = "", phase: str = "Pending") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid,
                         "labels": {POD_GROUP_LABEL: group} if group else {}},
            "spec": {"schedulerName": "batchsched", "nodeName": node,
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
            "status": {"phase": phase}}


async def new_cache() -> ClusterCache:
    return ClusterCache("batchsched")  # asyncio.Event wants a loop in some versions


@pytest.fixture
def cache():
    return asyncio.run(new_cache())


def test_an_assumed_binding_survives_a_relist_that_does_not_show_it_yet(cache):
    relist(cache, "pods", [pod_json("p", "u1")])
    cache.assume("u1", "node-a", (0, 1))
    relist(cache, "pods", [pod_json("p", "u1")])  # e.g. after 410 Gone, from a lagging list
    assert cache.pods["u1"].node_name == "node-a"
    assert cache.pods["u1"].gpu_ids == (0, 1)
    assert "u1" in cache.assumed


def test_the_watch_confirming_a_binding_ends_the_assumption(cache):
    relist(cache, "pods", [pod_json("p", "u1")])
    cache.assume("u1", "node-a", ())
    cache._apply_pod("MODIFIED", pod_json("p", "u1", node="node-a"))
    assert "u1" not in cache.assumed
    assert cache.pods["u1"].node_name == "node-a"


def test_a_failed_binding_is_forgotten_frees_capacity_and_touches_the_gang(cache):
    # Touched, its status is rewritten (it counted the pod bound); the
    # refusal's backoff is the queue's and a touch does not clear it.
    relist(cache, "pods", [pod_json("p", "u1", group="g")])
    cache.drain_changes()
    cache.assume("u1", "node-a", ())
    cache.forget("u1")
    assert cache.pods["u1"].node_name == ""
    touched, freed = cache.drain_changes()
    assert touched == {"ns/g"} and freed


def test_another_schedulers_pod_touches_a_gang_only_when_it_names_one(cache):
    """A start lists every pod of the cluster: those of the default scheduler
    in no gang are capacity only, not tens of thousands of gangs to look at."""
    def foreign(name: str, uid: str, group: str = "", node: str = "") -> dict:
        obj = pod_json(name, uid, node=node, group=group)
        obj["spec"]["schedulerName"] = "default-scheduler"
        return obj

    relist(cache, "pods", [foreign("web", "u1", node="n1"), foreign("stray", "u2", group="g"), pod_json("p", "u3")])
    assert cache.drain_changes()[0] == {"ns/g", "ns/pod:p"}  # the stray member: its gang warns of it
    cache._apply_pod("DELETED", foreign("web", "u1", node="n1"))
    assert cache.drain_changes() == (set(), True)  # room freed, no gang touched
    cache._apply_pod("DELETED", foreign("stray", "u2", group="g"))
    assert cache.drain_changes()[0] == {"ns/g"}


def test_an_assumption_never_expires_on_its_own(cache):
    # kubernetes#106361: an assumption dropped before the watch shows the
    # binding hands the same room (and GPU ids) to a second pod.
    relist(cache, "pods", [pod_json("p", "u1")])
    cache.assume("u1", "node-a", (0, 1))
    assert not hasattr(cache, "expire_assumptions")
    relist(cache, "pods", [pod_json("p", "u1")])
    assert cache.pods["u1"].node_name == "node-a" and cache.pods["u1"].gpu_ids == (0, 1)


def test_a_deleted_or_unlisted_pod_ends_its_assumption(cache):
    relist(cache, "pods", [pod_json("p", "u1"), pod_json("q", "u2")])
    cache.assume("u1", "node-a", ())
    cache.assume("u2", "node-a", ())
    cache._apply_pod("DELETED", pod_json("p", "u1"))
    relist(cache, "pods", [])
    assert cache.assumed == {}


def gpu_pod(name, uid, node="", ids=""):
    obj = pod_json(name, uid, node=node, phase="Running" if node else "Pending")
    if ids:
        obj["metadata"]["annotations"] = {"scheduling.batchsched.io/gpu-ids": ids}
    return obj


def test_gpu_ids_are_believed_only_for_bindings_made_or_seen(cache):
    relist(cache, "pods", [gpu_pod("listed", "u0", node="n", ids="0,1"), gpu_pod("ours", "u1"),
                         gpu_pod("seen", "u2")])
    # found at the first list: ids believed (nothing else to go by after a start);
    # whether we bound it, only its PodGroup's status can say (test_partial_gangs.py)
    assert cache.pods["u0"].gpu_ids == (0, 1) and not cache.pods["u0"].bound_by_scheduler
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


def podgroup_json(name: str, recorded: list[str] | None = None) -> dict:
    obj = {"metadata": {"name": name, "namespace": "ns", "generation": 1}, "spec": {"minMember": 2}}
    if recorded is not None:
        obj["status"] = {"boundByScheduler": recorded}
    return obj


def test_a_start_believes_who_bound_a_member_only_from_its_podgroups_status(cache):
    relist(cache, "podgroups", [podgroup_json("g", ["u0"])])
    relist(cache, "pods", [pod_json("ours", "u0", node="n", group="g"), pod_json("forged", "u1", node="n", group="g"),
                           pod_json("rest", "u2", group="g")])
    assert not cache.pods["u0"].bound_by_scheduler and not cache.pods["u1"].bound_by_scheduler
    assert cache.groups["ns/g"].recorded_bindings == {"u0"}
    # the status written again (our next record) is read again, the spec unchanged
    cache._apply_group("MODIFIED", podgroup_json("g", ["u0", "u2"]))
    assert cache.groups["ns/g"].recorded_bindings == {"u0", "u2"}
    cache._apply_group("MODIFIED", podgroup_json("g"))
    assert cache.groups["ns/g"].recorded_bindings == frozenset()


def test_the_status_names_the_members_we_bound_and_no_others():
    from batchsched.config import SchedulerConfig
    from batchsched.shell.scheduler import Scheduler

    scheduler = Scheduler(kube=None, config=SchedulerConfig())  # type: ignore[arg-type]  # nothing is sent
    cache = scheduler.cache
    relist(cache, "podgroups", [podgroup_json("g", ["u0"])])
    relist(cache, "pods", [pod_json("recorded", "u0", node="n", group="g"),
                           pod_json("forged", "u1", node="n", group="g"), pod_json("new", "u2", group="g")])
    cache.assume("u2", "n", ())
    cache._apply_pod("MODIFIED", pod_json("new", "u2", node="n", group="g"))

    def written() -> dict:
        scheduler._write_status("ns/g", cache.groups_raw["ns/g"], cache.members("ns/g"))
        return scheduler.status.last_written("ns/g")

    assert written()["boundByScheduler"] == ["u0", "u2"]  # what was recorded, and what this process bound
    for uid in ("u0", "u2"):
        cache._apply_pod("DELETED", {"metadata": {"uid": uid}})
    assert written()["boundByScheduler"] is None  # a merge patch removes it only when told so


def test_a_member_moved_to_another_gang_proves_nothing_there(cache):
    relist(cache, "pods", [pod_json("p", "u1", group="g")])
    cache.assume("u1", "n", ())
    cache._apply_pod("MODIFIED", pod_json("p", "u1", node="n", group="g"))
    assert cache.pods["u1"].bound_by_scheduler
    cache._apply_pod("MODIFIED", pod_json("p", "u1", node="n", group="waiting"))  # a tenant relabels it
    assert not cache.pods["u1"].bound_by_scheduler
    cache._apply_pod("MODIFIED", pod_json("p", "u1", node="n", group="g"))  # and back
    assert cache.pods["u1"].bound_by_scheduler


def test_editing_or_removing_the_annotation_does_not_move_or_free_gpus(cache):
    relist(cache, "pods", [gpu_pod("p", "u1")])
    cache.assume("u1", "n", (0, 1))
    cache._apply_pod("MODIFIED", gpu_pod("p", "u1", node="n", ids="0,1"))
    cache._apply_pod("MODIFIED", gpu_pod("p", "u1", node="n"))  # annotation removed
    assert cache.pods["u1"].gpu_ids == (0, 1)
    cache._apply_pod("MODIFIED", gpu_pod("p", "u1", node="n", ids="4,5"))  # rewritten
    assert cache.pods["u1"].gpu_ids == (0, 1)
    # and a relist (which relearns nothing) keeps it
    relist(cache, "pods", [gpu_pod("p", "u1", node="n", ids="4,5")])
    assert cache.pods["u1"].gpu_ids == (0, 1)


def with_actual(obj, actual):
    obj["metadata"].setdefault("annotations", {})["scheduling.batchsched.io/gpu-ids-actual"] = actual
    return obj


def test_the_node_agents_actual_ids_win_on_our_pods_when_they_name_as_many_gpus(cache):
    relist(cache, "pods", [gpu_pod("p", "u1")])
    cache.assume("u1", "n", (0, 1))
    cache._apply_pod("MODIFIED", gpu_pod("p", "u1", node="n", ids="0,1"))
    # no agent reports on the node: the annotation may be a tenant's, the plan stands
    cache._apply_pod("MODIFIED", with_actual(gpu_pod("p", "u1", node="n", ids="0,1"), "4,5"))
    assert cache.pods["u1"].gpu_ids == (0, 1)
    agent_node = node_json("n")
    agent_node["status"]["conditions"].append({"type": "BatchschedGPUReady", "status": "True", "reason": "Ready"})
    cache._apply_node("ADDED", agent_node)
    cache._apply_pod("MODIFIED", with_actual(gpu_pod("p", "u1", node="n", ids="0,1"), "4,5"))
    assert cache.pods["u1"].gpu_ids == (4, 5) and cache.pods["u1"].bound_by_scheduler
    # a different count is no correction of where: the plan stands
    cache._apply_pod("MODIFIED", with_actual(gpu_pod("p", "u1", node="n", ids="0,1"), "4,5,6"))
    assert cache.pods["u1"].gpu_ids == (0, 1)
    # on a pod bound by someone else, it buys nothing either
    cache._apply_pod("ADDED", with_actual(gpu_pod("forged", "u3", node="n", ids="6,7"), "6,7"))
    assert cache.pods["u3"].gpu_ids == () and not cache.pods["u3"].bound_by_scheduler


def test_a_pod_that_finishes_frees_capacity_and_touches_its_gang(cache):
    relist(cache, "pods", [pod_json("p", "u1", node="n", group="g", phase="Running")])
    cache.drain_changes()
    cache._apply_pod("MODIFIED", pod_json("p", "u1", node="n", group="g", phase="Succeeded"))
    assert cache.drain_changes() == ({"ns/g"}, True)


def test_a_podgroup_naming_a_missing_priority_class_is_invalid_not_fatal(cache):
    bad = []
    cache.on_bad_object = lambda kind, obj, why: bad.append((kind, why))
    relist(cache, "podgroups", [{"metadata": {"name": "g", "namespace": "ns", "generation": 1},
                            "spec": {"minMember": 2, "priorityClassName": "nope"}}])
    assert "not found" in cache.invalid_groups["ns/g"]
    assert bad and bad[0][0] == "PodGroup"
    cache._apply_priority_class("ADDED", {"metadata": {"name": "nope"}, "value": 7})
    assert cache.groups["ns/g"].priority == 7 and "ns/g" not in cache.invalid_groups


def test_the_gang_index_follows_adds_deletes_and_relabels(cache):
    relist(cache, "pods", [pod_json("a", "u1", group="g"), pod_json("b", "u2", group="g")])
    assert sorted(p.name for p in cache.members("ns/g")) == ["a", "b"]
    cache._apply_pod("MODIFIED", pod_json("b", "u2", group="h"))
    assert [p.name for p in cache.members("ns/g")] == ["a"]
    assert [p.name for p in cache.members("ns/h")] == ["b"]
    cache._apply_pod("DELETED", pod_json("a", "u1", group="g"))
    assert cache.members("ns/g") == []


def node_json(name: str, gpus: str = "8", allocatable: object = None) -> dict:
    return {"metadata": {"name": name},
            "status": {"allocatable": {"nvidia.com/gpu": gpus} if allocatable is None else allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_node_that_does_not_convert_is_reported_and_skipped_not_fatal(cache):
    bad = []
    cache.on_bad_object = lambda kind, obj, why: bad.append((kind, obj["metadata"]["name"], why))
    relist(cache, "nodes", [node_json("broken", allocatable=["not", "a", "map"]), node_json("good")])
    assert list(cache.nodes) == ["good"]
    assert bad and bad[0][:2] == ("Node", "broken") and "AttributeError" in bad[0][2]
    cache._apply_node("MODIFIED", node_json("good", allocatable=["broken", "now"]))
    assert list(cache.nodes) == []  # what it said before may no longer hold: not used
    cache._apply_node("MODIFIED", node_json("good"))
    assert list(cache.nodes) == ["good"]


def test_a_pod_that_does_not_convert_is_reported_and_skipped_and_the_others_list(cache):
    """Shapes the API server would refuse, as if one got through: a
    toleration value no cache can key, a GPU limit that is no quantity."""
    bad = []
    cache.on_bad_object = lambda kind, obj, why: bad.append((kind, obj["metadata"]["name"], why))
    odd_toleration = pod_json("tol", "u1")
    odd_toleration["spec"]["tolerations"] = [{"key": "k", "operator": "Equal", "value": {"not": "text"}}]
    odd_gpus = pod_json("gpu", "u2")
    odd_gpus["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = ["2"]
    relist(cache, "pods", [odd_toleration, odd_gpus, pod_json("fine", "u3")])
    assert list(cache.pods) == ["u3"]
    assert [(kind, name) for kind, name, _ in bad] == [("Pod", "tol"), ("Pod", "gpu")]


def test_a_podgroup_failing_in_an_unforeseen_way_is_invalid_and_the_others_convert(cache):
    bad = []
    cache.on_bad_object = lambda kind, obj, why: bad.append((kind, why))
    relist(cache, "podgroups", [
        {"metadata": {"name": "odd", "namespace": "ns", "annotations": ["not", "a", "map"]}, "spec": {"minMember": 1}},
        {"metadata": {"name": "fine", "namespace": "ns"}, "spec": {"minMember": 2}},
    ])
    assert "AttributeError" in cache.invalid_groups["ns/odd"]
    assert cache.groups["ns/fine"].min_member == 2
    assert bad == [("PodGroup", cache.invalid_groups["ns/odd"])]


# ---- relists: page by page, swapped in whole --------------------------------

def test_a_relist_holds_the_raw_objects_of_two_pages_at_most(cache):
    source = relist(cache, "pods", [pod_json(f"p{i}", f"u{i}") for i in range(7)], page_size=2)
    # 4 pages: each asked for while the one before is converted, none kept once converted
    assert source.alive_from_earlier_pages == [0, 0, 0, 0]
    assert source.alive_from_the_last_page == [0, 2, 2, 2]
    assert len(cache.pods) == 7


def test_a_page_being_converted_frees_each_raw_object_once_converted(cache):
    source = PagedList([pod_json(f"p{i}", f"u{i}") for i in range(6)])
    reflector = next(r for r in cache.reflectors(source) if r.kind == "pods")
    reflector.page_size = 3
    convert, alive_in_its_page = reflector.convert, []

    def counting(obj):
        gc.collect()
        page = next(refs for refs in source._served if any(ref() is obj for ref in refs))
        alive_in_its_page.append(sum(1 for ref in page if ref() is not None))
        return convert(obj)

    reflector.convert = counting
    asyncio.run(reflector.list_once())
    assert alive_in_its_page == [3, 2, 1, 3, 2, 1]
    assert len(cache.pods) == 6


def test_list_pages_are_sized_by_the_bytes_of_their_objects(cache, monkeypatch):
    monkeypatch.setattr(reflector_module, "FIRST_PAGE_SIZE", 2)
    monkeypatch.setattr(reflector_module, "PAGE_BYTES", 20_000)
    small = relist(cache, "pods", [pod_json(f"p{i}", f"u{i}") for i in range(30)], page_size=10)
    assert small.limits == [2, 10, 10, 10]  # ~300 bytes a pod: the most a page may hold

    def big(i: int) -> dict:  # a tenant's pod with 5 KB of annotations
        pod = pod_json(f"b{i}", f"ub{i}")
        pod["metadata"]["annotations"] = {"note": "x" * 5000}
        return pod

    large = relist(cache, "pods", [big(i) for i in range(12)], page_size=10)
    assert large.limits == [2, 3, 3, 3, 3]
    assert max(large.page_bytes) <= 20_000
    assert len(cache.pods) == 12


def test_a_garbled_or_unpaged_list_answer_is_relisted_or_taken_whole(cache):
    """The page sizing reads each answer's items and bytes: a page whose
    items are no list (never sent by a real API server) counts as an error
    and the list starts over; an answer that ignores the limit (as an
    unpaged list from the watch cache does) is taken whole."""
    pods = [pod_json(f"p{i}", f"u{i}") for i in range(30)]

    class GarbledFirst(PagedList):
        garbled = True

        async def request(self, method, path, *, query, **kwargs):
            if self.garbled:
                self.garbled = False
                return {"metadata": {"resourceVersion": "7", "continue": "0"}, "items": {"not": "a list"}}
            return await super().request(method, path, query=query, **kwargs)

    restarts = []
    cache.on_watch_restart = lambda kind, why: restarts.append((kind, why))
    source = GarbledFirst(pods)
    reflector = next(r for r in cache.reflectors(source) if r.kind == "pods")

    async def until_synced():
        running = asyncio.create_task(reflector.run())
        await asyncio.wait_for(reflector.synced.wait(), 10)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

    asyncio.run(until_synced())
    assert restarts == [("pods", "error")] and reflector.error == ""
    assert len(cache.pods) == 30

    class Unpaged(PagedList):
        async def request(self, method, path, *, query, **kwargs):
            return await super().request(method, path, query={**query, "limit": len(self.items)}, **kwargs)

    unpaged = asyncio.run(new_cache())
    served = Unpaged(pods)
    asyncio.run(next(r for r in unpaged.reflectors(served) if r.kind == "pods").list_once())
    assert len(served.page_bytes) == 1 and unpaged.pods == cache.pods


def relist_while_the_scheduler_runs(cache, page_size: int, assume_before_page: int) -> list[bool]:
    """The scenario of a relist after missed events, with a cycle assuming
    a binding for pod e before page ``assume_before_page`` is requested;
    says, per page, whether the cache still held exactly the pods it held
    before the relist (our own assumption aside)."""
    relist(cache, "pods", [pod_json("a", "ua", node="n1", group="g", phase="Running"),
                           pod_json("b", "ub", group="g"),
                           pod_json("c", "uc", node="n1", group="h", phase="Running"),
                           pod_json("d", "ud"), pod_json("e", "ue", group="k")], page_size=100)
    cache.assume("ub", "n2", (0, 1))
    cache.drain_changes()
    before = dict(cache.pods)
    unchanged = []

    def between_pages(index: int) -> None:
        unchanged.append(dict(cache.pods) == before)
        if index == assume_before_page:
            cache.assume("ue", "n4", (3,))
            before["ue"] = cache.pods["ue"]

    # c was deleted and d bound while nobody watched; f is new; b's binding not seen yet
    relist(cache, "pods", [pod_json("a", "ua", node="n1", group="g", phase="Running"),
                           pod_json("b", "ub", group="g"), pod_json("e", "ue", group="k"),
                           pod_json("d", "ud", node="n3", phase="Running"), pod_json("f", "uf", group="m")],
           page_size=page_size, on_page=between_pages)
    return unchanged


def test_a_relist_in_pages_replaces_the_state_exactly_and_only_at_its_end(cache):
    unchanged = relist_while_the_scheduler_runs(cache, page_size=1, assume_before_page=3)  # e's was the 3rd
    assert unchanged == [True] * 5  # no cycle saw a half-replaced state
    assert sorted(cache.pods) == ["ua", "ub", "ud", "ue", "uf"]
    assert (cache.pods["ub"].node_name, cache.pods["ub"].gpu_ids) == ("n2", (0, 1))  # assumptions kept,
    assert (cache.pods["ue"].node_name, cache.pods["ue"].gpu_ids) == ("n4", (3,))  # even one made midway
    assert cache.assumed.keys() == {"ub", "ue"}
    assert cache.drain_changes() == ({"ns/h", "ns/pod:d", "ns/m"}, True)  # c held room on n1

    whole = asyncio.run(new_cache())
    relist_while_the_scheduler_runs(whole, page_size=100, assume_before_page=0)  # one page, as lists were
    assert whole.pods == cache.pods and whole.assumed.keys() == cache.assumed.keys()


def test_a_relist_that_finds_nothing_changed_touches_nothing_and_keeps_every_object(cache):
    pods = [pod_json("a", "ua", node="n1", group="g", phase="Running"), pod_json("b", "ub", group="h")]
    relist(cache, "pods", pods)
    relist(cache, "nodes", [node_json("n1"), node_json("n2")])
    held = dict(cache.pods), dict(cache.nodes)
    assert len(held[0]) == 2 and len(held[1]) == 2
    mark = cache.state.mark
    cache.drain_changes()
    relist(cache, "pods", pods, page_size=1)
    relist(cache, "nodes", [node_json("n1"), node_json("n2")], page_size=1)
    assert cache.drain_changes() == (set(), False)  # no backoff reset for every gang in the cluster
    assert all(cache.pods[uid] is pod for uid, pod in held[0].items())
    assert all(cache.nodes[name] is node for name, node in held[1].items())
    assert cache.state.changed_since(mark) == []


def test_a_relist_removes_nodes_and_podgroups_gone_meanwhile(cache):
    relist(cache, "nodes", [node_json("n1"), node_json("n2")])
    relist(cache, "podgroups", [{"metadata": {"name": g, "namespace": "ns"}, "spec": {"minMember": 1}}
                                for g in ("g", "h")])
    cache.drain_changes()
    relist(cache, "nodes", [node_json("n2", gpus="4")], page_size=1)
    relist(cache, "podgroups", [{"metadata": {"name": "h", "namespace": "ns"}, "spec": {"minMember": 1}}],
           page_size=1)
    assert list(cache.nodes) == ["n2"] and cache.nodes["n2"].allocatable["nvidia.com/gpu"] == 4
    assert list(cache.groups) == ["ns/h"] and list(cache.groups_raw) == ["ns/h"]
    assert cache.drain_changes() == ({"ns/g"}, True)  # g gone (h unchanged: untouched); n2 changed


def test_a_requested_relist_drops_the_watch_and_lists_again(cache):
    restarts = []
    cache.on_watch_restart = lambda kind, why: restarts.append((kind, why))

    async def scenario():
        source = PagedList([pod_json("p", "u1")])
        reflector = next(r for r in cache.reflectors(source) if r.kind == "pods")
        running = asyncio.create_task(reflector.run())
        async with asyncio.timeout(10):
            while source.watches < 1:
                await asyncio.sleep(0.01)
            source.items = [pod_json("q", "u2")]  # a change the watch never delivered
            reflector.relist()
            while source.watches < 2:
                await asyncio.sleep(0.01)
        running.cancel()
    asyncio.run(scenario())
    assert list(cache.pods) == ["u2"]
    assert restarts == [("pods", "requested")]


def group_json(name: str, min_member: int = 2, priority_class: str = "") -> dict:
    spec = {"minMember": min_member, **({"priorityClassName": priority_class} if priority_class else {})}
    return {"metadata": {"name": name, "namespace": "ns", "generation": 1}, "spec": spec}


def test_a_podgroup_or_priority_class_relist_touches_only_what_changed(cache):
    # Touching resets backoffs, hopeless marks and schedule timeouts: a relist
    # (any watch error) must not do that to every gang of the cluster.
    relist(cache, "priorityclasses", [{"metadata": {"name": "high"}, "value": 10}])
    relist(cache, "podgroups", [group_json("a"), group_json("b", priority_class="high"), group_json("c")])
    cache.drain_changes()
    held = dict(cache.groups)
    relist(cache, "podgroups", [group_json("a"), group_json("b", priority_class="high"), group_json("c", 3)])
    assert cache.drain_changes()[0] == {"ns/c"}
    assert cache.groups["ns/a"] is held["ns/a"]  # the held object: gangs built from it stay valid
    relist(cache, "priorityclasses", [{"metadata": {"name": "high"}, "value": 10}])
    assert cache.drain_changes()[0] == set()
    relist(cache, "priorityclasses", [{"metadata": {"name": "high"}, "value": 20}])
    assert cache.drain_changes()[0] == {"ns/b"}
    relist(cache, "podgroups", [group_json("a")])
    assert cache.drain_changes()[0] == {"ns/b", "ns/c"}


def test_pod_with_is_dataclasses_replace_without_the_values_cached_on_the_pod():
    import dataclasses

    from batchsched.core.model import PodInfo, pod_with
    from batchsched.core.placement.capacity import shape_key

    pod = PodInfo("u1", "ns", "p", group="g", requests={"nvidia.com/gpu": 2}, gpu_ids=(1, 2))
    assert pod.gang_key == "ns/g" and shape_key(pod)  # cached on the instance
    changes = {"group": "h", "node_name": "n1", "gpu_ids": (3, 4), "bound_by_scheduler": True,
               "requests": {"nvidia.com/gpu": 4}}
    moved = pod_with(pod, **changes)
    assert moved == dataclasses.replace(pod, **changes)
    assert moved.gang_key == "ns/h"  # not the cached "ns/g"
    assert shape_key(moved) == shape_key(dataclasses.replace(pod, **changes))
    assert pod_with(pod) == pod and pod_with(pod) is not pod
    with pytest.raises(TypeError, match="no field nodeName"):
        pod_with(pod, nodeName="n1")
