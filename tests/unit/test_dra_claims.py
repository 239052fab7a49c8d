"""Pods with ResourceClaims of their own, in the core: the join (what a
pod's claims ask, or why it waits), the GPUs chosen among those the
selectors select, matchAttribute, shared claims, and the allocation."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from batchsched.api import constants
from batchsched.api.constants import GPU_RESOURCE
from batchsched.core.cycle import schedule_cycle
from batchsched.core.dra.model import AllocatedDevice, DraError, claim_from_json
from batchsched.core.readers import pod_from_json
from batchsched.core.placement.capacity import cluster_capacity
from batchsched.core.placement.gang import plan_gang
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.snapshot import Snapshot
from batchsched.core.topology.choose import mask_of
from tests.support import dra
from tests.unit.test_dra import NODE, TOPOLOGY, cache, claim_json, device, listed, node_json, pod_json  # noqa: F401
from tests.unit.test_fuzz_hostile_input import FUZZ, json_values
from tests.unit.topology_support import fixture

ATTR = "gpu.nvidia.com/productName"


def claim_spec(name: str, count: int = 2, selectors=(), constraints=(), requests=None, **status) -> dict:
    obj = claim_json(name)
    obj["spec"]["devices"]["requests"] = requests or [{"name": "gpus", "exactly": {
        "deviceClassName": dra.GPU_CLASS, "count": count,
        "selectors": [{"cel": {"expression": e}} for e in selectors]}}]
    if constraints:
        obj["spec"]["devices"]["constraints"] = list(constraints)
    obj["status"].update(status)
    return obj


def claiming_pod(name: str, *claims: str, node: str = "", template: str = "") -> dict:
    entries = ([{"name": "gpus", "resourceClaimTemplateName": template}] if template else
               [{"name": f"c{k}", "resourceClaimName": c} for k, c in enumerate(claims)])
    obj = {"metadata": {"name": name, "namespace": "ns", "uid": name},
           "spec": {"schedulerName": "batchsched", "nodeName": node, "resourceClaims": entries,
                    "containers": [{"name": "c", "resources": {"claims": [{"name": e["name"]} for e in entries]}}]},
           "status": {"phase": "Running" if node else "Pending"}}
    if template and claims:
        obj["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": claims[0]}]
    return obj


def cycle(cache):
    snapshot = Snapshot.of(cache.state, {}, now=1000.0)
    return schedule_cycle(snapshot, GangQueue())


def served(cache, *, claims=(), pods=(), slices=None):
    return listed(cache, nodes=[node_json(gpus=0)], slices=slices or [dra.resource_slice(NODE, TOPOLOGY)],
                  claims=claims, pods=pods)


def nvlinked(gpus) -> bool:
    return all(TOPOLOGY.link(i, j).kind == "NV" for i in gpus for j in gpus if i < j)


def test_a_claim_for_two_gpus_gets_an_nvlink_pair_allocated_and_reserved(cache):
    served(cache, claims=[claim_spec("pair", 2)], pods=[claiming_pod("p", "pair")])
    assert cache.state.pods["p"].device_demand.count == 2
    plan = cycle(cache)
    (binding,) = plan.bindings
    assert len(binding.gpu_ids) == 2 and nvlinked(binding.gpu_ids)
    assert binding.claim is None  # no extended-resource claim: its own claim gets the GPUs
    (allocation,) = binding.claims
    assert (allocation.name, allocation.node, allocation.allocate) == ("pair", NODE, True)
    assert allocation.devices == tuple(AllocatedDevice("gpus", dra.DRIVER, NODE, device(i))
                                       for i in sorted(binding.gpu_ids))


def test_a_pod_waits_with_a_reason_for_a_claim_not_made_yet(cache):
    served(cache, pods=[claiming_pod("p", template="tmpl")])
    plan = cycle(cache)
    assert not plan.bindings
    verdict = plan.verdicts["ns/pod:p"]
    assert verdict.reason == "ResourceClaimsNotReady"
    assert "waiting for the resourceclaim controller to make the ResourceClaim 'gpus' from template tmpl" in \
        verdict.message
    served(cache, pods=[claiming_pod("p", "made", template="tmpl")])  # made, but not yet seen
    assert "waiting for ResourceClaim ns/made (not found)" in cycle(cache).verdicts["ns/pod:p"].message


def test_a_template_claim_made_for_another_pod_is_not_taken(cache):
    made = claim_spec("made", 2)
    made["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "q", "uid": "q",
                                            "controller": True}]
    served(cache, claims=[made], pods=[claiming_pod("p", "made", template="tmpl")])
    assert "was not made for this pod" in cycle(cache).verdicts["ns/pod:p"].message
    made["metadata"]["ownerReferences"][0]["uid"] = "p"
    served(cache, claims=[made], pods=[claiming_pod("p", "made", template="tmpl")])
    assert len(cycle(cache).bindings) == 1


def test_request_selectors_limit_the_gpus_and_say_so_when_none_fit(cache):
    slice_ = dra.resource_slice(NODE, TOPOLOGY)
    for k in (5, 6, 7):  # three of the GPUs are another model
        slice_["spec"]["devices"][k]["attributes"]["productName"] = {"string": "A100"}
    picky = "device.attributes['gpu.nvidia.com'].productName == 'A100'"
    served(cache, slices=[slice_], claims=[claim_spec("a", 2, [picky])], pods=[claiming_pod("p", "a")])
    (binding,) = cycle(cache).bindings
    a100 = {TOPOLOGY.gpus[i].index for i in range(8) if dra.minor(TOPOLOGY, i) in (0, 1, 2)}
    assert set(binding.gpu_ids) <= a100
    served(cache, slices=[slice_], claims=[claim_spec("a", 4, [picky])], pods=[claiming_pod("p", "a")])
    verdict = cycle(cache).verdicts["ns/pod:p"]
    assert "node(s) had no 4 devices of class gpu.nvidia.com matching its claims" in verdict.message


def test_match_attribute_keeps_the_devices_on_one_value(cache):
    slice_ = dra.resource_slice(NODE, TOPOLOGY)
    for k, gpu in enumerate(slice_["spec"]["devices"]):
        gpu["attributes"]["productName"] = {"string": "X" if k % 2 else "Y"}
    constraint = {"matchAttribute": ATTR}
    served(cache, slices=[slice_], claims=[claim_spec("m", 3, constraints=[constraint])],
           pods=[claiming_pod("p", "m")])
    (binding,) = cycle(cache).bindings
    names = {d.device for d in binding.claims[0].devices}
    values = {d["attributes"]["productName"]["string"] for d in slice_["spec"]["devices"] if d["name"] in names}
    assert len(names) == 3 and len(values) == 1


def test_an_unsupported_form_is_refused_with_its_reason_and_never_guessed(cache):
    first = claim_spec("first", requests=[{"name": "gpus", "firstAvailable": [
        {"name": "one", "deviceClassName": dra.GPU_CLASS}]}])
    served(cache, claims=[first], pods=[claiming_pod("p", "first")])
    plan = cycle(cache)
    assert not plan.bindings
    assert "uses firstAvailable, which this version does not allocate" in plan.verdicts["ns/pod:p"].message


def all_of(name: str, selectors=(), constraints=(), also=None) -> dict:
    requests = [{"name": "gpus", "exactly": {"deviceClassName": dra.GPU_CLASS, "allocationMode": "All",
                                              "selectors": [{"cel": {"expression": e}} for e in selectors]}}]
    return claim_spec(name, constraints=constraints, requests=requests + ([also] if also else []))


A100 = "device.attributes['gpu.nvidia.com'].productName == 'A100'"


def a100_slice(minors=(0, 1, 2)) -> dict:
    slice_ = dra.resource_slice(NODE, TOPOLOGY)
    for gpu in slice_["spec"]["devices"]:
        if int(gpu["name"].split("-")[1]) in minors:
            gpu["attributes"]["productName"] = {"string": "A100"}
    return slice_


def test_allocation_mode_all_gets_every_device_of_the_class_on_the_node(cache):
    served(cache, claims=[all_of("whole")], pods=[claiming_pod("p", "whole")])
    demand = cache.state.pods["p"].device_demand
    assert demand.asks_all and demand.count == 0
    (binding,) = cycle(cache).bindings
    assert mask_of(binding.gpu_ids) == 0xFF
    (allocation,) = binding.claims
    assert sorted(d.device for d in allocation.devices) == sorted(device(i) for i in range(8))
    assert {d.request for d in allocation.devices} == {"gpus"}


def test_allocation_mode_all_takes_just_what_its_selectors_select(cache):
    served(cache, slices=[a100_slice()], claims=[all_of("a100s", [A100])], pods=[claiming_pod("p", "a100s")])
    (binding,) = cycle(cache).bindings
    assert sorted(d.device for d in binding.claims[0].devices) == ["gpu-0", "gpu-1", "gpu-2"]
    assert len(binding.gpu_ids) == 3


def test_allocation_mode_all_fails_on_a_node_where_one_selected_device_is_taken(cache):
    served(cache, slices=[a100_slice()], claims=[claim_json("theirs", ["gpu-1"]), all_of("a100s", [A100])],
           pods=[claiming_pod("p", "a100s")])
    plan = cycle(cache)
    assert not plan.bindings  # never the two free ones: All is all or none
    assert ("1 node(s) had the devices of class gpu.nvidia.com its claims ask all of not all free"
            in plan.verdicts["ns/pod:p"].message)


def test_allocation_mode_all_with_no_device_selected_does_not_fit(cache):
    served(cache, claims=[all_of("none", [A100])], pods=[claiming_pod("p", "none")])
    plan = cycle(cache)
    assert not plan.bindings  # the API's rule: at least one device must exist on the node
    assert ("1 node(s) had none of the devices of class gpu.nvidia.com its claims ask all of"
            in plan.verdicts["ns/pod:p"].message)


def test_allocation_mode_all_beside_exact_count_gets_distinct_devices(cache):
    exact = {"name": "more", "exactly": {"deviceClassName": dra.GPU_CLASS, "count": 2}}
    served(cache, slices=[a100_slice()], claims=[all_of("mixed", [A100], also=exact)],
           pods=[claiming_pod("p", "mixed")])
    (binding,) = cycle(cache).bindings
    devices = binding.claims[0].devices
    by_request = {r: sorted(d.device for d in devices if d.request == r) for r in ("gpus", "more")}
    assert by_request["gpus"] == ["gpu-0", "gpu-1", "gpu-2"]
    assert len(by_request["more"]) == 2 and set(by_request["more"]).isdisjoint(by_request["gpus"])
    assert len(binding.gpu_ids) == 5


def test_allocation_mode_all_is_refused_where_its_devices_do_not_share_the_matched_attribute(cache):
    served(cache, slices=[a100_slice()], claims=[all_of("split", constraints=[{"matchAttribute": ATTR}])],
           pods=[claiming_pod("p", "split")])
    plan = cycle(cache)
    assert not plan.bindings  # never the five that agree: All allocates all of them or none
    assert ("not sharing one value of gpu.nvidia.com/productName as its matchAttribute constraint asks"
            in plan.verdicts["ns/pod:p"].message)
    served(cache, slices=[a100_slice(range(8))], claims=[all_of("split", constraints=[{"matchAttribute": ATTR}])],
           pods=[claiming_pod("p", "split")])
    assert len(cycle(cache).bindings[0].gpu_ids) == 8


def test_two_pods_asking_all_devices_of_one_node_never_share_them(cache):
    served(cache, claims=[all_of("x"), all_of("y")], pods=[claiming_pod("p", "x"), claiming_pod("q", "y")])
    plan = cycle(cache)
    (binding,) = plan.bindings
    other = "q" if binding.pod_name == "p" else "p"
    assert "not all free" in plan.verdicts[f"ns/pod:{other}"].message
    cache.assume(binding.pod_uid, binding.node_name, binding.gpu_ids)
    cache.state.assume_allocation(binding.pod_uid, binding.allocations)
    assert cache.state.free(NODE)["nvidia.com/gpu"] == 0
    assert not cycle(cache).bindings


def test_devices_allocated_by_someone_else_are_never_chosen(cache):
    taken = [device(i) for i in range(6)]
    served(cache, claims=[claim_json("theirs", taken), claim_spec("mine", 2)], pods=[claiming_pod("p", "mine")])
    (binding,) = cycle(cache).bindings
    assert {d.device for d in binding.claims[0].devices}.isdisjoint(taken)


def test_a_shared_claim_is_allocated_once_and_the_other_pod_follows_it(cache):
    served(cache, claims=[claim_spec("shared", 2)], pods=[claiming_pod("a", "shared"), claiming_pod("b", "shared")])
    plan = cycle(cache)
    (binding,) = plan.bindings
    assert binding.pod_name == "a" and binding.claims[0].allocate
    assert "is shared with pod a, which allocates it" in plan.verdicts["ns/pod:b"].message
    # a is bound and its allocation seen: b joins the claim on that node, asking no device
    allocated = claim_spec("shared", 2, allocation=dra.allocation(NODE, [d.device for d in binding.claims[0].devices]),
                           reservedFor=[{"resource": "pods", "name": "a", "uid": "a"}])
    served(cache, claims=[allocated], pods=[claiming_pod("a", "shared", node=NODE), claiming_pod("b", "shared")])
    demand = cache.state.pods["b"].device_demand
    assert (demand.count, demand.node, demand.reserve) == (0, NODE, ("ns/shared",))
    (joined,) = cycle(cache).bindings
    assert joined.pod_name == "b" and joined.node_name == NODE and joined.gpu_ids == ()
    assert [(c.name, c.allocate, c.devices) for c in joined.claims] == [("shared", False, ())]


# ---- a claim shared by the members of one gang ---------------------------------------

SECOND = "dgx-b"


def member(name: str, *claims: str, cpu: str = "1", node: str = "") -> dict:
    obj = claiming_pod(name, *claims, node=node)
    obj["metadata"]["labels"] = {constants.POD_GROUP_LABEL: "g"}
    obj["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    return obj


def two_dra_nodes(cache, *, claims=(), pods=(), first_cpu: str = "64", min_member: int = 2):
    """The node ``NODE`` (``first_cpu`` cpus) and ``SECOND`` (64), eight DRA GPUs each."""
    second = dra.identified(fixture("dgx1-hybrid-cube-mesh-8gpu.txt"), SECOND)
    first = node_json()
    first["status"]["allocatable"] = first["status"]["capacity"] = {**first["status"]["allocatable"],
                                                                   "cpu": first_cpu}
    listed(cache, nodes=[first, node_json(SECOND, topology=second)],
           slices=[dra.resource_slice(NODE, TOPOLOGY), dra.resource_slice(SECOND, second)], claims=claims, pods=pods)
    cache._apply_group("ADDED", group_g(min_member))


def group_g(min_member: int) -> dict:
    """The PodGroup of ``member`` pods."""
    return {"apiVersion": "scheduling.batchsched.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "ns", "uid": "g", "generation": 1},
            "spec": {"minMember": min_member}}


def gang_cycle(cache):
    return schedule_cycle(cache.snapshot(1000.0), GangQueue())


def test_a_gang_whose_pods_share_one_unallocated_claim_is_placed_on_one_node_with_one_allocation(cache):
    # NODE fits one pod's cpu only: the pod allocating the claim alone would go there (packed tighter)
    two_dra_nodes(cache, claims=[claim_spec("shared", 2)], pods=[member("a", "shared", cpu="2"),
                                                                  member("b", "shared", cpu="2")], first_cpu="3")
    plan = gang_cycle(cache)
    assert plan.verdicts["ns/g"].reason == "Scheduled", plan.verdicts["ns/g"]
    placed = {b.pod_name: b for b in plan.bindings}
    assert {b.node_name for b in placed.values()} == {SECOND}
    allocator, joiner = placed["a"].claims, placed["b"].claims
    assert [(c.name, c.node, c.allocate) for c in allocator] == [("shared", SECOND, True)]
    assert [(c.name, c.uid, c.node, c.allocate, c.devices) for c in joiner] == [
        ("shared", allocator[0].uid, SECOND, False, ())]  # the same claim on the same node: only reserved
    assert len(allocator[0].devices) == 2 and len(placed["a"].gpu_ids) == 2 and placed["b"].gpu_ids == ()
    for b in plan.bindings:  # as the shell assumes them: the two GPUs are taken once
        cache.assume(b.pod_uid, b.node_name, b.gpu_ids)
        cache.state.assume_allocation(b.pod_uid, b.allocations)
    assert cache.state.free(SECOND)[GPU_RESOURCE] == 6 and cache.state.free(NODE)[GPU_RESOURCE] == 8


def test_gang_mates_linked_through_two_shared_claims_go_on_one_node(cache):
    # c joins x, which a allocates, and y, which b allocates: the three go together
    two_dra_nodes(cache, claims=[claim_spec("x", 2), claim_spec("y", 2)],
                  pods=[member("a", "x", cpu="1"), member("b", "y", cpu="1"), member("c", "x", "y", cpu="1")],
                  first_cpu="2", min_member=3)
    plan = gang_cycle(cache)
    placed = {b.pod_name: b for b in plan.bindings}
    assert {b.node_name for b in placed.values()} == {SECOND}, plan.verdicts
    assert [(c.name, c.allocate) for c in placed["c"].claims] == [("x", False), ("y", False)]
    assert {c.name for p in "ab" for c in placed[p].claims if c.allocate} == {"x", "y"}
    devices = [d.device for p in "ab" for c in placed[p].claims for d in c.devices]
    assert len(devices) == len(set(devices)) == 4


def test_a_joiner_whose_allocating_mate_is_left_out_of_the_plan_is_placed_nowhere(cache):
    # (its queue's limits may admit the joiner, which asks no GPU, and not the allocator)
    two_dra_nodes(cache, claims=[claim_spec("shared", 2)], pods=[member("a", "shared"), member("b", "shared"),
                                                                  member("c")])
    b, c = cache.state.pods["b"], cache.state.pods["c"]
    plan = plan_gang([b, c], 1, cluster_capacity(cache.state, {}))
    assert [a.pod.name for a in plan.assignments] == ["c"] and plan.unplaced == (b,)


def test_a_gang_sharing_a_claim_that_no_node_holds_with_all_its_sharers_says_so(cache):
    two_dra_nodes(cache, claims=[claim_spec("shared", 2)], pods=[member("a", "shared", cpu="40"),
                                                                  member("b", "shared", cpu="40")])
    plan = gang_cycle(cache)
    assert not plan.bindings
    verdict = plan.verdicts["ns/g"]
    assert verdict.reason == "Unschedulable"
    assert "2 node(s) could not also hold the gang mates sharing its ResourceClaims" in verdict.message


def test_gang_sharers_of_a_claim_allocated_on_one_node_both_go_there(cache):
    pick = [device(i) for i in (0, 1)]
    two_dra_nodes(cache, claims=[claim_spec("shared", 2, allocation=dra.allocation(SECOND, pick))],
                  pods=[member("a", "shared"), member("b", "shared")])
    plan = gang_cycle(cache)
    assert {b.pod_name: b.node_name for b in plan.bindings} == {"a": SECOND, "b": SECOND}
    assert all([(c.name, c.allocate, c.devices) for c in b.claims] == [("shared", False, ())] for b in plan.bindings)


def test_a_gang_mate_joining_a_claim_waits_while_the_mate_allocating_it_waits(cache):
    two_dra_nodes(cache, claims=[claim_spec("shared", 2)],
                  pods=[member("a", "shared", "missing"), member("b", "shared")])
    plan = gang_cycle(cache)
    assert not plan.bindings
    verdict = plan.verdicts["ns/g"]
    assert verdict.reason == "ResourceClaimsNotReady"
    assert "waiting for ResourceClaim ns/missing (not found)" in verdict.message
    assert "ResourceClaim ns/shared is shared with gang mate a, which allocates it and waits" in verdict.message


def test_a_sharer_outside_the_gang_allocates_first_and_the_gang_then_joins_it(cache):
    outsider = claiming_pod("solo", "shared")  # a lone pod, created first: it allocates the claim
    two_dra_nodes(cache, claims=[claim_spec("shared", 2)], pods=[outsider, member("a", "shared"),
                                                                  member("b", "shared")])
    plan = gang_cycle(cache)
    (binding,) = plan.bindings
    assert binding.pod_name == "solo" and binding.claims[0].allocate
    assert plan.verdicts["ns/g"].reason == "ResourceClaimsNotReady"
    assert "is shared with pod solo, which allocates it" in plan.verdicts["ns/g"].message
    allocated = claim_spec("shared", 2, allocation=dra.allocation(binding.node_name,
                                                                  [d.device for d in binding.claims[0].devices]),
                           reservedFor=[{"resource": "pods", "name": "solo", "uid": "solo"}])
    two_dra_nodes(cache, claims=[allocated], pods=[claiming_pod("solo", "shared", node=binding.node_name),
                                                   member("a", "shared"), member("b", "shared")])
    plan = gang_cycle(cache)
    assert {b.pod_name: b.node_name for b in plan.bindings} == {"a": binding.node_name, "b": binding.node_name}
    assert all([(c.name, c.allocate) for c in b.claims] == [("shared", False)] for b in plan.bindings)


def test_a_claim_being_written_for_one_pod_is_not_allocated_again_for_another(cache):
    served(cache, claims=[claim_spec("shared", 2)], pods=[claiming_pod("a", "shared"), claiming_pod("b", "shared")])
    cache.assume("a", NODE, (0, 1))
    assert "to show the allocation made for pod a" in cache.state.pods["b"].device_demand.problem


def test_a_pod_asking_gpus_both_ways_is_refused(cache):
    pod = claiming_pod("p", "c")
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    served(cache, claims=[claim_spec("c", 1)], pods=[pod])
    assert "serves one or the other" in cycle(cache).verdicts["ns/pod:p"].message


def test_the_chosen_devices_count_as_used_once_assumed(cache):
    served(cache, claims=[claim_spec("x", 4), claim_spec("y", 4)],
           pods=[claiming_pod("p", "x"), claiming_pod("q", "y")])
    plan = cycle(cache)
    assert len(plan.bindings) == 2
    used = [d.device for b in plan.bindings for c in b.claims for d in c.devices]
    assert len(used) == len(set(used)) == 8
    assert mask_of(i for b in plan.bindings for i in b.gpu_ids) == 0xFF


@FUZZ
@given(st.sampled_from(["requests", "constraints", "config"]), json_values,
       st.sampled_from(["exactly", "firstAvailable", "count", "selectors", "allocationMode", "matchAttribute"]))
def test_a_hostile_claim_spec_is_read_or_refused_naming_the_field(field, value, key):
    obj = claim_spec("c", 2)
    devices = obj["spec"]["devices"]
    devices[field] = value if field != "requests" else [{"name": "gpus", key: value}]
    try:
        claim = claim_from_json(obj)
    except DraError:
        return
    assert all((r.all_devices and r.count == 0 or 1 <= r.count <= 32) and isinstance(r.device_class, str)
               for r in claim.requests)


@FUZZ
@given(json_values, json_values)
def test_a_pod_with_hostile_claim_entries_converts(entries, statuses):
    obj = claiming_pod("p", "c")
    obj["spec"]["resourceClaims"] = entries
    obj["status"]["resourceClaimStatuses"] = statuses
    pod = pod_from_json(obj)
    assert all(isinstance(c.claim, str) and isinstance(c.template, str) for c in pod.claims)


def test_verdicts_count_dra_gpus_as_devices_of_their_class(cache):
    taken = [device(i) for i in range(6)]
    served(cache, claims=[claim_json("theirs", taken)], pods=[pod_json("plain", 4)])  # the extended-resource path
    assert "1 node(s) had no 4 free devices of class gpu.nvidia.com." in cycle(cache).verdicts["ns/pod:plain"].message
    served(cache, claims=[claim_json("theirs", taken), claim_spec("mine", 4)], pods=[claiming_pod("p", "mine")])
    assert "1 node(s) had no 4 free devices of class gpu.nvidia.com." in cycle(cache).verdicts["ns/pod:p"].message


def test_a_claim_left_allocated_and_reserved_by_a_crash_binds_its_pod_where_it_is(cache):
    pick = [device(i) for i in (2, 3)]
    left = claim_spec("mine", 2, allocation=dra.allocation(NODE, pick),
                      reservedFor=[{"resource": "pods", "name": "p", "uid": "p"}])
    served(cache, claims=[left], pods=[claiming_pod("p", "mine")])
    (binding,) = cycle(cache).bindings
    assert (binding.node_name, binding.claims, binding.gpu_ids) == (NODE, (), ())  # nothing more to write


def test_on_mixed_nodes_claims_go_where_dra_serves_the_gpus(cache):
    plugin = node_json("plugin", gpus=8)
    listed(cache, nodes=[node_json(gpus=0), plugin], slices=[dra.resource_slice(NODE, TOPOLOGY)],
           claims=[claim_spec("mine", 8)], pods=[claiming_pod("p", "mine"), pod_json("plain", 8)])
    plan = cycle(cache)
    placed = {b.pod_name: b.node_name for b in plan.bindings}
    assert placed == {"p": NODE, "plain": "plugin"}
    for b in plan.bindings:  # as the shell assumes them
        cache.assume(b.pod_uid, b.node_name, b.gpu_ids)
        cache.state.assume_allocation(b.pod_uid, b.allocations)
    assert cache.state.free("plugin")["nvidia.com/gpu"] == 0 and cache.state.free(NODE)["nvidia.com/gpu"] == 0
