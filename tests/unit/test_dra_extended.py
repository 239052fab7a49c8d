"""The extended-resource path in the core: a node where DRA serves
nvidia.com/gpu counts its DRA GPUs as its nvidia.com/gpu (free: those in no
claim's allocation nor assumed), its GPU room holds them by topology index,
each GPU is counted once, and a pod placed there gets its claim: one
request per container, the devices of the GPU ids picked."""
from __future__ import annotations

import pytest

from batchsched.api import constants
from batchsched.core.dra.extended import ExtendedClaimError, extended_claim
from batchsched.core.dra.model import AllocatedDevice
from batchsched.core.dra.state import EXTENDED_CLAIM, InFlight
from batchsched.core.gpu_pools import node_gpus
from batchsched.core.readers import pod_from_json
from batchsched.core.topology.choose import gpus_of
from tests.support import dra
from tests.unit.test_dra import NODE, TOPOLOGY, cache, claim_json, device, listed, node_json, pod_json  # noqa: F401

GPU = constants.GPU_RESOURCE


def served(cache, *, claims=(), pods=(), classes=(dra.device_class(),)):
    return listed(cache, nodes=[node_json(gpus=0)], slices=[dra.resource_slice(NODE, TOPOLOGY)], claims=claims,
                  pods=pods, classes=classes)


def test_a_node_without_the_device_plugin_serves_nvidia_gpu_through_its_dra_gpus(cache):
    served(cache, claims=[claim_json("other", [device(0), device(1)])])
    node = cache.nodes[NODE]
    assert node.gpus_by_dra and node.allocatable[GPU] == 8 and cache.state.total_allocatable[GPU] == 8
    assert cache.state.free(NODE)[GPU] == 6  # someone else's claim holds 2
    assert gpus_of(cache.state.room(NODE).free) == (2, 3, 4, 5, 6, 7)
    figures = node_gpus(node, cache.state.free(NODE)[GPU], dra_allocated=cache.state.dra_allocated(NODE))
    assert (figures.allocated, figures.free) == (2, 6)  # counted once in the metrics too


def test_without_a_class_naming_nvidia_gpu_or_on_a_node_advertising_it_dra_does_not_serve_it(cache):
    served(cache, classes=[])
    assert not cache.nodes[NODE].gpus_by_dra and GPU not in cache.nodes[NODE].allocatable
    listed(cache, nodes=[node_json(gpus=4)], slices=[dra.resource_slice(NODE, TOPOLOGY, indices=range(4))])
    node = cache.nodes[NODE]
    assert not node.gpus_by_dra and node.allocatable[GPU] == 4  # the device plugin serves it (kube-scheduler's rule)


def test_a_bound_pod_served_by_its_claim_counts_once(cache):
    served(cache, claims=[claim_json("mine", [device(i) for i in range(4)], reserved_for="p")],
           pods=[pod_json("p", 4, NODE)])
    assert cache.state.free(NODE)[GPU] == 4
    assert gpus_of(cache.state.room(NODE).free) == (4, 5, 6, 7)


def test_an_assumed_pod_and_its_assumed_devices_count_once_until_the_claim_confirms(cache):
    served(cache, pods=[pod_json("p", 4)])
    cache.assume("p", NODE, (0, 1, 2, 3))
    attempt = cache.state.assume_allocation("p", {EXTENDED_CLAIM: tuple(
        AllocatedDevice("container-0-request-0", dra.DRIVER, NODE, device(i)) for i in range(4))})
    assert cache.state.free(NODE)[GPU] == 4 and gpus_of(cache.state.room(NODE).free) == (4, 5, 6, 7)
    cache.state.forget_allocation("p", attempt)  # written nowhere, and the pod still assumed: its request holds
    assert cache.state.free(NODE)[GPU] == 4


def test_as_if_drained_gives_back_the_devices_of_the_pods_gone_only(cache):
    served(cache, claims=[claim_json("mine", [device(i) for i in range(4)], reserved_for="p"),
                          claim_json("other", [device(4)])], pods=[pod_json("p", 4, NODE)])
    state = cache.state
    assert gpus_of(state.room(NODE).free) == (5, 6, 7)
    assert state.dra_in_use_ids(NODE, except_pods={"p"}) == 1 << 4


def pod_with(containers: list[tuple[str, int]], init: list[tuple[str, int]] = ()) -> object:
    def spec(items):
        return [{"name": n, "resources": {"limits": {GPU: str(k)}} if k else {}} for n, k in items]
    return pod_from_json({"metadata": {"name": "p", "namespace": "ns", "uid": "p"},
                          "spec": {"schedulerName": "batchsched", "containers": spec(containers),
                                   "initContainers": spec(init)}})


def test_the_claim_has_one_request_per_container_asking_and_the_picked_devices(cache):
    served(cache)
    node = cache.nodes[NODE]
    pod = pod_with([("a", 2), ("none", 0), ("b", 1)], init=[("setup", 0)])
    claim = extended_claim(node, pod, (4, 5, 6), cache.state.dra.classes)
    assert claim.device_class == dra.GPU_CLASS and claim.node == NODE
    assert [(r.name, r.container, r.count) for r in claim.requests] == [
        ("container-1-request-0", "a", 2), ("container-3-request-0", "b", 1)]
    assert [(d.request, d.driver, d.pool, d.device) for d in claim.devices] == [
        ("container-1-request-0", dra.DRIVER, NODE, device(4)), ("container-1-request-0", dra.DRIVER, NODE, device(5)),
        ("container-3-request-0", dra.DRIVER, NODE, device(6))]


def test_a_pod_asking_gpus_in_an_init_container_gets_no_claim_it_could_not_use(cache):
    served(cache)
    with pytest.raises(ExtendedClaimError, match="init container"):
        extended_claim(cache.nodes[NODE], pod_with([("a", 2)], init=[("setup", 2)]), (0, 1), {})


def gang_pod_json(name: str, gpus: int) -> dict:
    obj = pod_json(name, gpus)
    obj["metadata"]["labels"] = {constants.POD_GROUP_LABEL: "g"}
    return obj


def test_a_gang_on_a_dra_node_gets_nvlink_quads_as_the_devices_of_its_claims(cache):
    from batchsched.core.cycle import schedule_cycle
    from batchsched.core.queueing.queue import GangQueue
    from batchsched.core.topology.choose import mask_of

    served(cache, pods=[gang_pod_json("a", 4), gang_pod_json("b", 4)])
    cache._apply_group("ADDED", {"apiVersion": "scheduling.batchsched.io/v1alpha1", "kind": "PodGroup",
                                 "metadata": {"name": "g", "namespace": "ns", "uid": "g", "generation": 1},
                                 "spec": {"minMember": 2}})
    plan = schedule_cycle(cache.snapshot(1.0), GangQueue())
    assert len(plan.bindings) == 2, plan.verdicts
    quads = {mask_of(b.gpu_ids) for b in plan.bindings}
    assert quads == {0x0F, 0xF0}  # the DGX-1's two NVLink quads
    for b in plan.bindings:
        assert b.claim is not None and b.claim.node == NODE
        assert [d.device for d in b.claim.devices] == [device(i) for i in b.gpu_ids]
        assert {d.request for d in b.claim.devices} == {"container-0-request-0"}


def test_only_a_claim_holding_every_assumed_device_ends_the_assumption(cache):
    served(cache, pods=[pod_json("p", 2)])
    mine = tuple(AllocatedDevice("container-0-request-0", dra.DRIVER, NODE, device(i)) for i in (0, 1))
    attempt = cache.state.assume_allocation("p", {EXTENDED_CLAIM: mine})
    forged = claim_json("forged", [device(7)], reserved_for="p")  # a tenant's claim naming the pod
    cache._dra_apply("resourceclaims")("ADDED", forged)
    assert cache.state.dra.in_flight == {InFlight("p", attempt, EXTENDED_CLAIM): mine}
    assert cache.state.free(NODE)[GPU] == 5
    cache._dra_apply("resourceclaims")("ADDED", claim_json("real", [device(0), device(1)], reserved_for="p"))
    assert cache.state.dra.in_flight == {} and cache.state.free(NODE)[GPU] == 5


def test_the_serving_class_config_goes_into_the_allocation_for_every_request(cache):
    from batchsched.shell.claims import allocation_status

    opaque = {"driver": dra.DRIVER, "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                                                   "sharing": {"strategy": "TimeSlicing"}}}
    configured = dra.device_class()
    configured["spec"]["config"] = [{"opaque": opaque}]
    served(cache, classes=[configured])
    claim = extended_claim(cache.nodes[NODE], pod_with([("a", 1), ("b", 1)]), (0, 1), cache.state.dra.classes)
    status = allocation_status("p", "uid-p", claim)
    assert status["allocation"]["devices"]["config"] == [
        {"source": "FromClass", "requests": ["container-0-request-0", "container-1-request-0"], "opaque": opaque}]
    assert status["reservedFor"] == [{"resource": "pods", "name": "p", "uid": "uid-p"}]
    served(cache)  # NVIDIA's class as shipped has no config: the allocation has none either
    claim = extended_claim(cache.nodes[NODE], pod_with([("a", 1)]), (0,), cache.state.dra.classes)
    assert "config" not in allocation_status("p", "uid-p", claim)["allocation"]["devices"]


def init_gpus_pod_json(name: str = "p") -> dict:
    """A pod whose init container's 2 GPUs its app container reuses (it holds 2)."""
    obj = pod_json(name, 2)
    obj["spec"]["initContainers"] = [{"name": "setup", "resources": {"limits": {GPU: "2"}}}]
    return obj


def test_a_node_serving_gpus_only_through_dra_is_filtered_out_for_a_pod_reusing_an_init_containers_gpus(cache):
    from batchsched.core.cycle import schedule_cycle
    from batchsched.core.placement.fit import REASON_DRA_INIT_GPUS
    from batchsched.core.queueing.queue import GangQueue

    served(cache, pods=[init_gpus_pod_json()])
    queue = GangQueue()
    for now in (1.0, 100.0):  # the same node-level verdict each cycle, never a binding tried
        plan = schedule_cycle(cache.snapshot(now), queue)
        verdict = plan.verdicts["ns/pod:p"]
        assert plan.bindings == [] and not verdict.scheduled and verdict.reason != "InternalError"
        assert f"1 {REASON_DRA_INIT_GPUS}" in verdict.message, verdict.message


def test_a_pod_reusing_an_init_containers_gpus_goes_to_a_node_with_the_device_plugin(cache):
    from batchsched.core.cycle import schedule_cycle
    from batchsched.core.queueing.queue import GangQueue

    # "dgx" (DRA) ranks first by name among equal nodes: the pod would be planned there
    listed(cache, nodes=[node_json(gpus=0), node_json("plugin", gpus=8)], slices=[dra.resource_slice(NODE, TOPOLOGY)],
           pods=[init_gpus_pod_json()])
    assert cache.nodes[NODE].gpus_by_dra and not cache.nodes["plugin"].gpus_by_dra
    plan = schedule_cycle(cache.snapshot(1.0), GangQueue())
    assert [(b.node_name, b.claim) for b in plan.bindings] == [("plugin", None)], plan.verdicts
