"""DRA inventory: conversion, mapping onto the topology, devices in use,
assumed allocations, hostile objects, mixed nodes, DRA not served."""
from __future__ import annotations

import asyncio
import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.api import constants
from batchsched.core.dra.inventory import gpu_selection, node_dra, pci_key
from batchsched.core.dra.model import (
    MAX_RESULTS, AllocatedDevice, DeviceClass, DraError, claim_from_json, slice_from_json,
)
from batchsched.core.dra.state import EXTENDED_CLAIM
from batchsched.core.gpu_pools import node_gpus
from batchsched.core.placement.gpus import REASON_DRA_NO_CLASS, static_reason
from batchsched.core.model import TopologyPolicy
from batchsched.core.topology.accounting import gpu_id_count
from batchsched.core.topology.annotation import to_annotation
from batchsched.kube.client import ApiError
from batchsched.shell import reflector as reflector_module
from batchsched.shell.cache import ClusterCache
from batchsched.shell.reflector import Reflector
from tests.support import dra
from tests.unit.cache_support import relist
from tests.unit.test_fuzz_hostile_input import json_values, quickly
from tests.unit.topology_support import fixture

NODE = "dgx"
TOPOLOGY = dra.identified(fixture("dgx1-hybrid-cube-mesh-8gpu.txt"), NODE)


def node_json(name: str = NODE, gpus: int = 0, topology=TOPOLOGY) -> dict:
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if gpus:
        allocatable[constants.GPU_RESOURCE] = str(gpus)
    return {"metadata": {"name": name, "uid": f"uid-{name}",
                         "annotations": {constants.GPU_TOPOLOGY_ANNOTATION: to_annotation(topology)}},
            "status": {"allocatable": allocatable, "capacity": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def claim_json(name: str, devices: list[str] = (), node: str = NODE, reserved_for: str = "", **meta) -> dict:
    obj = {**dra.claim(name, len(devices) or 1), "status": {}}
    obj["metadata"].update(namespace="ns", uid=f"uid-{name}", **meta)
    if devices:
        obj["status"]["allocation"] = dra.allocation(node, devices)
    if reserved_for:
        obj["status"]["reservedFor"] = [{"resource": "pods", "name": reserved_for, "uid": reserved_for}]
    return obj


def pod_json(name: str, gpus: int, node: str = "") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": {"schedulerName": "batchsched", "nodeName": node,
                     "containers": [{"name": "c", "resources": {"limits": {constants.GPU_RESOURCE: str(gpus)}}}]},
            "status": {"phase": "Running" if node else "Pending"}}


def device(index: int) -> str:
    return f"gpu-{dra.minor(TOPOLOGY, index)}"


@pytest.fixture
def cache():
    async def new() -> ClusterCache:
        return ClusterCache("batchsched")
    return asyncio.run(new())


def listed(cache, *, nodes=(), classes=(dra.device_class(),), slices=(), claims=(), pods=()) -> ClusterCache:
    relist(cache, "deviceclasses", list(classes))
    relist(cache, "resourceslices", list(slices))
    relist(cache, "resourceclaims", list(claims))
    relist(cache, "nodes", list(nodes))
    relist(cache, "pods", list(pods))
    return cache


# ---- conversion ----------------------------------------------------------------


def test_a_slice_converts_with_the_drivers_attributes_under_both_names():
    converted = slice_from_json(dra.resource_slice(NODE, TOPOLOGY))
    assert (converted.node, converted.driver, converted.pool, converted.generation, converted.slice_count) == \
        (NODE, "gpu.nvidia.com", NODE, 1, 1)
    first = converted.devices[0]
    assert first.name == "gpu-7"
    assert first.attributes["uuid"] == first.attributes["gpu.nvidia.com/uuid"] == TOPOLOGY.gpus[0].uuid
    assert first.attributes["resource.kubernetes.io/numaNode"] == 0
    assert first.capacity == {"memory": "16Gi"}


def test_a_claim_converts_its_allocation_reservations_owner_and_extended_annotation():
    obj = claim_json("c", [device(0), device(1)], reserved_for="pod-1",
                     annotations={"resource.kubernetes.io/extended-resource-claim": "true"},
                     ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-1",
                                       "controller": True}])
    claim = claim_from_json(obj)
    assert claim.allocated == (AllocatedDevice("gpus", "gpu.nvidia.com", NODE, "gpu-7"),
                               AllocatedDevice("gpus", "gpu.nvidia.com", NODE, "gpu-6"))
    assert (claim.reserved_for, claim.owner_pod, claim.extended, claim.key) == (("pod-1",), "pod-1", True, "ns/c")


@pytest.mark.parametrize("spoil, problem", [
    (lambda c: c["status"]["allocation"]["devices"].update(
        results=[{"request": "r", "driver": "d", "pool": "p", "device": f"d{i}"} for i in range(MAX_RESULTS + 1)]),
     "more than 32"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(device="x" * 64), "longer than 63"),
    (lambda c: c["status"]["allocation"]["devices"].update(results="all of them"), "must be a list"),
    (lambda c: c["status"].update(reservedFor=[{"resource": "pods", "uid": str(i)} for i in range(257)]),
     "more than 256"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool=["p"]), "must be a string"),
])
def test_a_hostile_claim_is_refused_naming_the_field(spoil, problem):
    obj = claim_json("c", [device(0)])
    spoil(obj)
    with pytest.raises(DraError, match=problem):
        claim_from_json(obj)


def test_a_slice_with_a_bad_attribute_or_too_many_devices_is_refused():
    obj = dra.resource_slice(NODE, TOPOLOGY)
    obj["spec"]["devices"][0]["attributes"]["uuid"] = {"string": "a", "int": 1}
    with pytest.raises(DraError, match="exactly one"):
        slice_from_json(obj)
    obj = dra.resource_slice(NODE, TOPOLOGY)
    obj["spec"]["devices"] *= 17  # 136 devices
    with pytest.raises(DraError, match="more than 128"):
        slice_from_json(obj)


# ---- which devices are GPUs, and which topology GPU each is ------------------------


def test_class_selectors_are_cel_and_one_that_does_not_compile_marks_the_class_unsupported():
    gpus = dra.resource_slice(NODE, TOPOLOGY, indices=range(4))
    for index in (0, 1):
        gpus["spec"]["devices"][index]["capacity"]["memory"] = {"value": "80Gi"}
    gpus["spec"]["devices"][2]["attributes"]["type"] = {"string": "mig"}
    selection = gpu_selection([
        DeviceClass("big", "nvidia.com/gpu", ("device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('40Gi'))",)),
        DeviceClass("gpu.nvidia.com", "nvidia.com/gpu", (dra.GPU_CLASS_SELECTOR,)),
        DeviceClass("odd", "nvidia.com/gpu", ("device.attributes['gpu.nvidia.com'].type.frobnicate()",))])
    assert "method 'frobnicate' is not supported" in selection.unsupported["odd"]
    assert [name for name, _ in selection.extended_rules] == ["big", "gpu.nvidia.com"]
    inventory = node_dra([slice_from_json(gpus)], selection, TOPOLOGY)
    # the first class by name serves each device it selects; the MIG device no class (nor NVIDIA's rule) takes
    assert {g.index: g.extended_class for g in inventory.gpus} == {0: "big", 1: "big", 3: "gpu.nvidia.com"}


def test_a_selector_failing_on_a_device_does_not_select_it_and_the_node_says_why():
    gpus = dra.resource_slice(NODE, TOPOLOGY, indices=range(2))
    del gpus["spec"]["devices"][1]["attributes"]["productName"]
    selection = gpu_selection([DeviceClass("v100", "nvidia.com/gpu",
                                           ("device.attributes['gpu.nvidia.com'].productName.startsWith('Tesla')",))])
    inventory = node_dra([slice_from_json(gpus)], selection, TOPOLOGY)
    assert {g.index: g.extended_class for g in inventory.gpus} == {0: "v100", 1: ""}  # NVIDIA's rule still counts it
    assert len(inventory.problems) == 1
    assert inventory.problems[0].startswith("DeviceClass v100: selector")
    assert "no such member in mapping: 'productName'" in inventory.problems[0]


def test_a_class_without_selectors_takes_every_device_of_any_driver():
    other = dra.resource_slice(NODE, TOPOLOGY)
    other["spec"]["driver"] = "gpu.example.com"
    converted = slice_from_json(other)
    assert node_dra([converted], gpu_selection([]), TOPOLOGY) is None  # not NVIDIA's, no class
    inventory = node_dra([converted], gpu_selection([DeviceClass("any", "nvidia.com/gpu")]), TOPOLOGY)
    assert len(inventory.gpus) == 8 and inventory.extended


def mapped(obj: dict, topology=TOPOLOGY) -> dict[str, tuple]:
    inventory = node_dra([slice_from_json(obj)], gpu_selection([]), topology)
    return {g.device: (g.index, g.mapped_by) for g in inventory.gpus}


def test_devices_map_by_uuid_though_their_minors_are_not_the_indices():
    assert mapped(dra.resource_slice(NODE, TOPOLOGY)) == {device(i): (i, "uuid") for i in range(8)}


def test_devices_without_uuid_map_by_pci_bus_id_in_either_form():
    assert pci_key("00000000:07:00.0") == pci_key("0000:07:00.0") == (0, 7, 0, 0)
    assert mapped(dra.resource_slice(NODE, TOPOLOGY, with_uuid=False)) == {device(i): (i, "pciBusID")
                                                                            for i in range(8)}


def test_devices_map_by_order_of_minor_only_where_identity_cannot_tell():
    anonymous = fixture("dgx1-hybrid-cube-mesh-8gpu.txt")  # a topology with no uuids or bus ids
    assert mapped(dra.resource_slice(NODE, TOPOLOGY), anonymous) == {f"gpu-{m}": (m, "order") for m in range(8)}
    stranger = dra.resource_slice(NODE, TOPOLOGY)
    stranger["spec"]["devices"][0]["attributes"]["uuid"] = {"string": "GPU-not-this-node"}
    del stranger["spec"]["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"]
    inventory = node_dra([slice_from_json(stranger)], gpu_selection([]), TOPOLOGY)
    assert (inventory.gpus[-1].device, inventory.gpus[-1].index) == ("gpu-7", None)  # never guessed
    assert "matches no GPU of the topology" in inventory.problems[0]


def test_only_a_pools_newest_generation_counts_and_mig_devices_are_not_gpus():
    old = dra.resource_slice(NODE, TOPOLOGY)
    new = dra.resource_slice(NODE, TOPOLOGY, indices=range(4))
    old["metadata"]["name"] += "-old"
    new["spec"]["pool"]["generation"] = 2
    new["spec"]["devices"][0]["attributes"]["type"] = {"string": "mig"}
    inventory = node_dra([slice_from_json(old), slice_from_json(new)], gpu_selection([]), TOPOLOGY)
    assert sorted(g.index for g in inventory.gpus) == [1, 2, 3]


# ---- in the cluster state --------------------------------------------------------


def test_every_claims_allocation_counts_in_use_and_a_deallocation_frees(cache):
    listed(cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)],
           claims=[claim_json("a", [device(0), device(1)]), claim_json("b", [device(5)]), claim_json("pending")])
    assert cache.state.dra_allocated(NODE) == 3
    cache._dra_apply("resourceclaims")("MODIFIED", claim_json("a"))  # its allocation cleared
    assert cache.state.dra_allocated(NODE) == 1
    cache._dra_apply("resourceclaims")("DELETED", claim_json("b"))
    assert cache.state.dra_allocated(NODE) == 0


def test_an_assumed_allocation_survives_a_relist_and_ends_when_a_claim_reserved_for_the_pod_shows_one(cache):
    listed(cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)], claims=[claim_json("a")])
    cache.state.assume_allocation("pod-1", {"uid-a": (AllocatedDevice("gpus", "gpu.nvidia.com", NODE, device(3)),)})
    relist(cache, "resourceclaims", [claim_json("a")])  # a lagging list: not allocated yet
    assert cache.state.dra_allocated(NODE) == 1
    relist(cache, "resourceclaims", [claim_json("a", [device(3)])])  # allocated, but not for that pod
    assert cache.state.dra.in_flight != {}
    relist(cache, "resourceclaims", [claim_json("a", [device(3)], reserved_for="pod-1")])
    assert cache.state.dra.in_flight == {} and cache.state.dra_allocated(NODE) == 1
    relist(cache, "resourceclaims", [])
    assert cache.state.dra_allocated(NODE) == 0


def test_an_assumed_allocation_ends_with_its_pod(cache):
    listed(cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)], pods=[pod_json("p", 1)])
    for k in (3, 5):  # two attempts of it
        cache.state.assume_allocation("p", {EXTENDED_CLAIM: (AllocatedDevice("gpus", "gpu.nvidia.com", NODE,
                                                                             device(k)),)})
    assert cache.state.dra_allocated(NODE) == 2
    cache.state.remove_pod("p")
    assert cache.state.dra_allocated(NODE) == 0


def test_a_late_end_of_a_failed_attempt_leaves_the_next_attempts_devices_in_flight(cache):
    """Attempt 1's undo ends after attempt 2 took devices for the same pod
    and claim: only attempt 1's are released."""
    listed(cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)], claims=[claim_json("a")],
           pods=[pod_json("p", 1)])
    first = cache.state.assume_allocation("p", {"uid-a": (AllocatedDevice("gpus", dra.DRIVER, NODE, device(3)),)})
    second = cache.state.assume_allocation("p", {"uid-a": (AllocatedDevice("gpus", dra.DRIVER, NODE, device(5)),)})
    assert second != first and cache.state.dra_allocated(NODE) == 2
    cache.state.forget_allocation("p", first)
    assert cache.state.dra_allocated(NODE) == 1 and cache.state.dra.in_use((dra.DRIVER, NODE, device(5)))
    cache.state.forget_allocation("p", first)  # once more (a retried undo): still nothing of attempt 2's
    assert cache.state.dra_allocated(NODE) == 1


def test_a_restarted_cache_rebuilds_the_same_counts_from_the_claims(cache):
    objects = dict(nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)],
                   claims=[claim_json("a", [device(0), device(1)])])
    before = listed(cache, **objects).state
    after = listed(ClusterCache("batchsched"), **objects).state
    assert after.nodes[NODE] == before.nodes[NODE] and after.dra_allocated(NODE) == before.dra_allocated(NODE) == 2


def test_a_claim_that_turns_bad_keeps_its_devices_counted_and_is_reported(cache):
    reports = []
    cache.on_bad_object = lambda kind, obj, why: reports.append((kind, why))
    listed(cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)],
           claims=[claim_json("a", [device(0)])])
    bad = claim_json("a", [device(0)])
    bad["status"]["allocation"]["devices"]["results"] *= MAX_RESULTS + 1
    cache._dra_apply("resourceclaims")("MODIFIED", bad)
    assert cache.state.dra_allocated(NODE) == 1
    relist(cache, "resourceclaims", [bad])  # nor does a relist that finds it so drop it
    assert cache.state.dra_allocated(NODE) == 1
    claims = [why for kind, why in reports if kind == "ResourceClaim"]
    assert len(claims) == 2 and "more than 32" in claims[0]


def test_a_mixed_node_keeps_its_topology_and_gives_device_plugin_pods_only_the_other_gpus(cache):
    listed(cache, nodes=[node_json(gpus=4)], slices=[dra.resource_slice(NODE, TOPOLOGY, indices=range(4))],
           claims=[claim_json("a", [device(2)])], pods=[pod_json("p", 1, NODE)])
    node = cache.nodes[NODE]
    assert node.topology is not None and node.topology_error == "" and gpu_id_count(node) == 8
    assert cache.state.room(NODE).free == 0b1111_0000  # DRA's 0-3 out (the pod names no GPU id)
    assert cache.state.free(NODE)[constants.GPU_RESOURCE] == 3
    figures = node_gpus(node, 3, dra_allocated=cache.state.dra_allocated(NODE))
    assert (figures.allocated, figures.free) == (2, 6)  # 1 device-plugin GPU + 1 DRA device of 8


def test_a_pod_served_by_its_claim_does_not_count_twice(cache):
    listed(cache, nodes=[node_json(gpus=4)], slices=[dra.resource_slice(NODE, TOPOLOGY, indices=range(4))],
           claims=[claim_json("a", [device(0), device(1)], reserved_for="p")], pods=[pod_json("p", 2, NODE)])
    assert cache.state.free(NODE)[constants.GPU_RESOURCE] == 4  # its 2 GPUs are the claim's devices
    assert cache.state.dra_allocated(NODE) == 2


def test_a_node_with_dra_gpus_no_class_serves_refuses_gpu_pods_with_a_reason_and_takes_the_rest(cache):
    listed(cache, nodes=[node_json(gpus=0)], slices=[dra.resource_slice(NODE, TOPOLOGY)], classes=[])
    node = cache.nodes[NODE]
    assert node.topology_error == ""  # its 8 GPUs are the topology's 8
    assert static_reason(node, {constants.GPU_RESOURCE: 1}, TopologyPolicy()) == REASON_DRA_NO_CLASS
    assert static_reason(node, {"cpu": 1000}, TopologyPolicy()) == ""
    listed(cache, nodes=[node_json(gpus=0)], slices=[dra.resource_slice(NODE, TOPOLOGY)])
    assert static_reason(cache.nodes[NODE], {constants.GPU_RESOURCE: 1}, TopologyPolicy()) == ""  # served: takes them


def test_a_topology_count_problem_waits_for_the_dra_lists_and_is_not_reported_for_dra_gpus(cache):
    reports = []
    cache.on_bad_object = lambda kind, obj, why: reports.append((kind, why))
    relist(cache, "nodes", [node_json(gpus=0), node_json("plain", gpus=4)])
    assert reports == []  # 8 GPUs described, 0 or 4 advertised: maybe served through DRA
    relist(cache, "resourceslices", [dra.resource_slice(NODE, TOPOLOGY)])
    relist(cache, "deviceclasses", [])
    relist(cache, "resourceclaims", [])
    assert [(kind, "plain" in why) for kind, why in reports] == [("Node", True)]
    assert "more than the node has: 4" in reports[0][1]
    cache._dra_apply("resourceslices")("DELETED", dra.resource_slice(NODE, TOPOLOGY))  # the driver went
    assert [(kind, NODE in why) for kind, why in reports[1:]] == [("Node", True)]
    assert "more than the node has: 0" in reports[1][1]


# ---- DRA not served ------------------------------------------------------------------


class NotServed:
    def __init__(self, status: int):
        self.status = status

    async def request(self, method: str, path: str, **_) -> dict:
        raise ApiError(self.status, "", "not served, or forbidden", {})


@pytest.mark.parametrize("status, said", [(404, "not served"), (403, "may not be read")])
def test_a_dra_collection_not_served_or_forbidden_counts_as_synced_and_empty_and_is_logged_once(
        cache, monkeypatch, caplog, status, said):
    monkeypatch.setattr(reflector_module, "ABSENT_RECHECK_SECONDS", 0.01)
    relist(cache, "resourceslices", [dra.resource_slice(NODE, TOPOLOGY)])
    reflector: Reflector = next(r for r in cache.reflectors(NotServed(status)) if r.kind == "resourceslices")
    replaced = 0
    replace = reflector.replace

    def counted(listed: dict) -> None:
        nonlocal replaced
        replaced += 1
        replace(listed)
    reflector.replace = counted

    async def run_a_while() -> None:
        task = asyncio.create_task(reflector.run())
        await asyncio.sleep(0.1)  # several looks
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.WARNING):
        asyncio.run(run_a_while())
    assert reflector.synced.is_set() and reflector.absent and reflector.error == ""
    assert cache.state.dra.slices == {}  # what it held is no longer known to be there
    assert replaced == 1  # later looks change nothing (no wake-ups, no backoff resets)
    assert len([r for r in caplog.records if said in r.getMessage()]) == 1
    pods = next(r for r in cache.reflectors(NotServed(status)) if r.kind == "pods")
    assert not pods.optional  # the core collections are never optional


# ---- fuzzing what tenants write ----------------------------------------------------------


def spoiled(base: dict, paths: list[tuple[str, ...]]):
    """``base`` with a hostile value at one of ``paths``."""
    def put(value, path):
        obj = json.loads(json.dumps(base))
        target = obj
        for key in path[:-1]:
            target = target.setdefault(key, {}) if isinstance(target, dict) else target
            if isinstance(target, list):
                target = target[0]
        if isinstance(target, dict):
            target[path[-1]] = value
        return obj
    return st.builds(put, json_values, st.sampled_from(paths))


CLAIM_PATHS = [("status",), ("status", "allocation"), ("status", "allocation", "devices"),
               ("status", "allocation", "devices", "results"),
               ("status", "allocation", "devices", "results", "device"), ("status", "reservedFor"),
               ("metadata",), ("metadata", "ownerReferences"), ("metadata", "annotations"), ("metadata", "uid")]
SLICE_PATHS = [("spec",), ("spec", "pool"), ("spec", "pool", "generation"), ("spec", "devices"),
               ("spec", "devices", "attributes"), ("spec", "devices", "capacity"), ("spec", "devices", "name"),
               ("spec", "devices", "attributes", "uuid"), ("spec", "nodeName")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spoiled(claim_json("c", [device(0)], reserved_for="p"), CLAIM_PATHS)
       | spoiled(dra.resource_slice(NODE, TOPOLOGY, indices=[0]), SLICE_PATHS))
def test_a_hostile_claim_or_slice_converts_or_is_a_dra_error_quickly(obj):
    convert = claim_from_json if obj.get("kind") == "ResourceClaim" else slice_from_json
    try:
        quickly(convert, obj)
    except DraError:
        pass


def test_readiness_names_the_collections_not_synced_yet():
    from batchsched.config import SchedulerConfig
    from batchsched.shell.replica import _readiness
    from batchsched.shell.scheduler import Scheduler

    async def check() -> None:
        scheduler = Scheduler(kube=None, config=SchedulerConfig())  # type: ignore[arg-type]  # nothing is sent
        for reflector in scheduler.reflectors:
            if reflector.kind != "resourceclaims":
                reflector.synced.set()
        assert _readiness(scheduler, None)() == "watch caches not synced yet (resourceclaims)"
    asyncio.run(check())


def test_explain_names_a_gpu_class_it_cannot_read(cache):
    from batchsched.core.explain import explain_gang

    unreadable = dra.device_class(["device.attributes['gpu.nvidia.com'].productName.frobnicate('H100')"], "h100")
    listed(cache, nodes=[node_json()], classes=[dra.device_class(), unreadable],
           slices=[dra.resource_slice(NODE, TOPOLOGY)], pods=[pod_json("w", 1)])
    report = explain_gang(cache.snapshot(0), "ns/pod:w")
    assert ("  nodes with DRA GPUs: 1 (8 devices, 0 allocated; nvidia.com/gpu served through them, "
            "by extended-resource claims, on 1)") in report.lines
    assert any(line.startswith("  -> DeviceClass h100 (nvidia.com/gpu) is not read: selector") and
               line.endswith("method 'frobnicate' is not supported in a device selector") for line in report.lines)
    assert list(report.data["gpuChecklist"]["dra"]["unsupportedClasses"]) == ["h100"]


def test_on_a_node_whose_topology_is_refused_dra_gpus_take_no_flat_gpu_id(cache):
    listed(cache, nodes=[node_json(gpus=6)], slices=[dra.resource_slice(NODE, TOPOLOGY, indices=range(4))])
    node = cache.nodes[NODE]
    assert node.topology is None and "describes 8 GPUs but the node allocates 10" in node.topology_error
    assert all(g.index is None for g in node.dra.gpus)
    assert cache.state.room(NODE).free == 0b11_1111  # the device plugin's 6, by count and id


def test_a_relist_of_claims_frees_capacity_only_when_a_claim_changed_or_went(cache):
    listed(cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)],
           claims=[claim_json("a", [device(0)])])
    cache.drain_changes()
    relist(cache, "resourceclaims", [claim_json("a", [device(0)]), claim_json("new")])
    assert cache.drain_changes()[1] is False
    relist(cache, "resourceclaims", [claim_json("new")])
    assert cache.drain_changes()[1] is True
