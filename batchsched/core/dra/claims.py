"""Pods with ResourceClaims of their own: which claims they wait for, which
devices of a node their claims may get, and the allocation written for them.

* ``join_demand`` reads a pending pod's ``spec.resourceClaims`` against the
  claims and DeviceClasses known (``DraState``) into a ``DeviceDemand``.
* ``eligible_masks`` says, per request, which GPU ids of a node its DeviceClass
  and its own CEL selectors select (``core/dra/cel.py``); ``static_reason``
  rules a node out whatever is free, ``pick`` chooses the best set by
  topology among the free eligible GPUs, honouring ``matchAttribute``.
* ``allocations`` deals the chosen GPUs to the requests and gives each claim
  its allocation (results, configs from class and claim) or, for a claim
  already allocated or allocated by a gang mate in the same plan, its
  reservation only.

Only GPUs are allocated, and only on nodes where DRA serves nvidia.com/gpu
(``NodeInfo.gpus_by_dra``): there the GPU room holds the DRA GPUs by
topology index, so accounting, preemption and the reservation treat a
claim's devices like any GPU (docs/dra.md, "Explicit claims").
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core.dra.selector import compile_selector
from batchsched.core.dra.demand import AttributeDemand, DeviceDemand, RequestDemand
from batchsched.core.dra.model import MAX_RESERVED_FOR, AllocatedDevice, DeviceClass, ResourceClaim, SelectorError
from batchsched.core.model import NodeInfo, PodInfo
from batchsched.core.text import clip
from batchsched.core.topology.accounting import GpuRoom, dra_gpus_by_id
from batchsched.core.topology.choose import gpus_of, mask_of

MAX_GROUP_COMBINATIONS = 64  # matchAttribute values tried per node, beyond which the first ones only


@dataclass(frozen=True)
class ClaimAllocation:
    """What the claim writer does to one claim of a pod being bound."""

    namespace: str
    name: str
    uid: str
    node: str
    allocate: bool = False  # False: allocated already, only reserved for the pod
    devices: tuple[AllocatedDevice, ...] = ()
    config: tuple[str, ...] = ()  # JSON {"source", "requests", "opaque"}, class configs first


# ---- joining a pod with its claims ------------------------------------------------

def join_demand(pod: PodInfo, claims: Callable[[str], ResourceClaim | None],
                classes: Mapping[str, DeviceClass],
                shared_turn: Callable[[str, PodInfo], tuple[str, str]]) -> DeviceDemand:
    """What ``pod``'s claims ask; ``claims`` finds a claim by namespace/name,
    ``shared_turn(claim key, pod)`` says, of an unallocated claim it shares
    with others, why it may not allocate it now and the gang mate it joins
    it with instead (("", "") when it allocates it)."""
    requests: list[RequestDemand] = []
    constraints: list[AttributeDemand] = []
    reserve: list[str] = []
    allocate: list[str] = []
    follows: list[tuple[str, str]] = []
    node = ""
    for ref in pod.claims:
        if not ref.claim:
            return DeviceDemand(problem=f"waiting for the resourceclaim controller to make the ResourceClaim "
                                        f"{clip(ref.name, 63)!r} from template {clip(ref.template, 253)}")
        key = f"{pod.namespace}/{ref.claim}"
        claim = claims(key)
        if claim is None:
            return DeviceDemand(problem=f"waiting for ResourceClaim {clip(key, 200)} (not found)")
        if claim.partial:  # only its allocation is read: whose it is and what it asks are not known
            return DeviceDemand(problem=f"ResourceClaim {clip(key, 200)}: {claim.unsupported}")
        if ref.template and claim.owner_pod != pod.uid:
            return DeviceDemand(problem=f"ResourceClaim {clip(key, 200)} was not made for this pod "
                                        "(its controller is not the pod)")
        if claim.allocated:
            if not claim.allocated_node:
                return DeviceDemand(problem=f"ResourceClaim {clip(key, 200)} is allocated with a nodeSelector this "
                                            "version does not read (it reads one node by metadata.name)")
            if node and node != claim.allocated_node:
                return DeviceDemand(problem=f"its ResourceClaims are allocated on different nodes ({node}, "
                                            f"{claim.allocated_node}): no node can run it")
            node = claim.allocated_node
            if pod.uid not in claim.reserved_for:
                if len(claim.reserved_for) >= MAX_RESERVED_FOR:
                    return DeviceDemand(problem=f"ResourceClaim {clip(key, 200)} is reserved for "
                                                f"{MAX_RESERVED_FOR} pods already, the most the API allows")
                reserve.append(key)
            continue
        if claim.unsupported:
            return DeviceDemand(problem=f"ResourceClaim {clip(key, 200)}: {claim.unsupported}")
        wait, allocator = shared_turn(key, pod)
        if wait:
            return DeviceDemand(problem=wait)
        if allocator:
            follows.append((key, allocator))
            continue
        names = [r.name for r in claim.requests]
        for request in claim.requests:
            device_class = classes.get(request.device_class)
            if device_class is None:
                return DeviceDemand(problem=f"waiting for DeviceClass {clip(request.device_class, 253)} of "
                                            f"ResourceClaim {clip(key, 200)} (not found)")
            selectors = device_class.selectors + request.selectors
            for expression in selectors:
                try:
                    compile_selector(expression)
                except SelectorError as exc:
                    return DeviceDemand(problem=f"ResourceClaim {clip(key, 200)} request {request.name!r}: {exc}")
            requests.append(RequestDemand(key, request.name, request.device_class, request.count, selectors,
                                          request.all_devices))
        for constraint in claim.constraints:
            unknown = [n for n in constraint.requests if n not in names]
            if unknown:
                return DeviceDemand(problem=f"ResourceClaim {clip(key, 200)}: a constraint names request "
                                            f"{clip(unknown[0], 63)!r}, which it does not have")
            constraints.append(AttributeDemand(constraint.attribute,
                                               tuple((key, n) for n in constraint.requests or names)))
        allocate.append(key)
    if requests and pod.requests.get(GPU_RESOURCE, 0):
        return DeviceDemand(problem=f"it asks {GPU_RESOURCE} in its containers' resources and GPU devices "
                                    "through its ResourceClaims; this version serves one or the other")
    return DeviceDemand(tuple(requests), tuple(constraints), node, tuple(reserve), tuple(allocate), tuple(follows))


def joined(pod: PodInfo, demand: DeviceDemand) -> PodInfo:
    """The pod as placement sees it: asking the GPUs its claims allocate."""
    if demand.count:
        return replace(pod, device_demand=demand,
                       requests={**pod.requests, GPU_RESOURCE: pod.requests.get(GPU_RESOURCE, 0) + demand.count})
    return replace(pod, device_demand=demand)


def unjoined(pod: PodInfo) -> PodInfo:
    """A pod as put, from one that ``joined`` made (the shell derives pods
    from those the state holds: assumed bound, unbound again, nominated)."""
    demand = pod.device_demand
    if demand is None:
        return pod
    requests = dict(pod.requests)
    if demand.count:
        requests[GPU_RESOURCE] -= demand.count
        if not requests[GPU_RESOURCE]:
            del requests[GPU_RESOURCE]
    return replace(pod, device_demand=None, requests=requests)


# ---- which GPUs of a node a demand may get ----------------------------------------

_MASKS: dict[tuple[DeviceDemand, str], tuple[object, tuple[int, ...] | str]] = {}
_MASKS_KEPT = 8192


def eligible_masks(node: NodeInfo, demand: DeviceDemand) -> tuple[int, ...] | str:
    """Per request, the GPU ids of ``node`` its selectors select; or the
    CEL runtime error one of them raised there (a claim the allocator
    cannot read on that node)."""
    cache_key = (demand, node.name)
    known = _MASKS.get(cache_key)
    if known is not None and known[0] is node.dra:
        return known[1]
    masks = _masks(node, demand)
    if len(_MASKS) >= _MASKS_KEPT:
        _MASKS.clear()
    _MASKS[cache_key] = (node.dra, masks)
    return masks


def _masks(node: NodeInfo, demand: DeviceDemand) -> tuple[int, ...] | str:
    by_id = dra_gpus_by_id(node)
    masks = []
    for request in demand.requests:
        mask = 0
        selectors = [compile_selector(s) for s in request.selectors]
        for index, gpu in by_id.items():
            try:
                if gpu.source is not None and all(s.matches(gpu.driver, gpu.source) for s in selectors):
                    mask |= 1 << index
            except SelectorError as exc:
                return (f"ResourceClaim {clip(request.claim, 200)} request {request.request!r}: "
                        f"{exc} (device {gpu.device})")
        masks.append(mask)
    return tuple(masks)


def devices_words(count: int, classes: Iterable[str], free: bool = False) -> str:
    """"4 free devices of class gpu.nvidia.com": how verdicts count DRA devices."""
    return f"{count} {'free ' if free else ''}devices of class {_names(classes)}"


def _names(classes: Iterable[str]) -> str:
    return ", ".join(clip(n, 100) for n in sorted(set(classes)))


def _all_words(demand: DeviceDemand) -> str:
    """"the devices of class X its claims ask all of (and 2 more)": allocationMode All."""
    more = f" (and {demand.count} more)" if demand.count else ""
    return f"the devices of class {_names(_classes(demand))} its claims ask all of{more}"


def all_mask(demand: DeviceDemand, masks: Iterable[int]) -> int:
    """The devices the demand's allocationMode All requests take: every one they select."""
    return mask_of_all(m for m, r in zip(masks, demand.requests) if r.all_devices)


def static_reason(node: NodeInfo, demand: DeviceDemand) -> str:
    """Why ``node`` is out for the demand whatever is free ("" if it is not)."""
    if demand.node and node.name != demand.node:
        return "node(s) were not the node its allocated ResourceClaim is on"
    if not demand.asks_devices:
        return ""
    masks = eligible_masks(node, demand)
    if isinstance(masks, str):
        return masks
    every = all_mask(demand, masks)
    if any(not m if r.all_devices else (m & ~every).bit_count() < r.count for m, r in zip(masks, demand.requests)) \
            or (mask_of_all(masks) & ~every).bit_count() < demand.count:
        if demand.asks_all:  # allocationMode All needs one device at least
            return f"node(s) had none of {_all_words(demand)}"
        return f"node(s) had no {devices_words(demand.count, _classes(demand))} matching its claims"
    if demand.asks_all and not attribute_groups(node, demand, masks):
        return (f"node(s) had {_all_words(demand)} not sharing one value of "
                f"{clip(demand.constraints[0].attribute, 100)} as its matchAttribute constraint asks")
    return ""


def mask_of_all(masks: Iterable[int]) -> int:
    union = 0
    for mask in masks:
        union |= mask
    return union


def _classes(demand: DeviceDemand) -> list[str]:
    return [r.device_class for r in demand.requests]


def free_reason(demand: DeviceDemand) -> str:
    if demand.asks_all:  # All fails on a node where one device it selects is taken
        return f"node(s) had {_all_words(demand)} not all free"
    return f"node(s) had no {devices_words(demand.count, _classes(demand), free=True)}"


def nvlink_reason(demand: DeviceDemand) -> str:
    if demand.asks_all:
        return f"node(s) had {_all_words(demand)} not all joined by NVLink"
    return f"node(s) had no {devices_words(demand.count, _classes(demand), free=True)} joined by NVLink"


def attribute_groups(node: NodeInfo, demand: DeviceDemand, masks: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The per-request masks under each way of meeting the matchAttribute
    constraints (every constrained request restricted to devices sharing
    one value), the first ``MAX_GROUP_COMBINATIONS`` of them.  An
    allocationMode All request is never restricted: a way that would leave
    out one of its devices is no way (the API allocates all or none)."""
    if not demand.constraints:
        return [masks]
    by_id = dra_gpus_by_id(node)
    positions = {(r.claim, r.request): k for k, r in enumerate(demand.requests)}
    choices = []
    for constraint in demand.constraints:
        members = [positions[m] for m in constraint.requests if m in positions]
        values: dict[object, int] = {}
        for index, gpu in by_id.items():
            value = gpu.source.attributes.get(constraint.attribute) if gpu.source is not None else None
            if value is not None:
                values[(type(value).__name__, value)] = values.get((type(value).__name__, value), 0) | 1 << index
        choices.append([(members, group) for _, group in sorted(values.items(), key=lambda item: str(item[0]))])
    combos = []
    for combo in itertools.islice(itertools.product(*choices), MAX_GROUP_COMBINATIONS):
        restricted = list(masks)
        for members, group in combo:
            for k in members:
                restricted[k] &= group
        if all(restricted[k] == masks[k] for k, r in enumerate(demand.requests) if r.all_devices):
            combos.append(tuple(restricted))
    return combos


def deal(demand: DeviceDemand, masks: tuple[int, ...], gpus: Iterable[int]) -> list[list[int]] | None:
    """The GPUs ``gpus`` dealt to the requests (each its count, an All
    request every GPU of its mask; each GPU in its request's mask), or None
    when they cannot be: a bipartite matching."""
    slots = [k for k, r in enumerate(demand.requests)
             for _ in range(masks[k].bit_count() if r.all_devices else r.count)]
    gpus = sorted(gpus)
    if len(gpus) != len(slots):
        return None
    owner: dict[int, int] = {}  # gpu -> slot

    def augment(slot: int, seen: set[int]) -> bool:
        for gpu in gpus:
            if masks[slots[slot]] >> gpu & 1 and gpu not in seen:
                seen.add(gpu)
                if gpu not in owner or augment(owner[gpu], seen):
                    owner[gpu] = slot
                    return True
        return False

    if not all(augment(slot, set()) for slot in range(len(slots))):
        return None
    dealt: list[list[int]] = [[] for _ in demand.requests]
    for gpu, slot in sorted(owner.items()):
        dealt[slots[slot]].append(gpu)
    return dealt


def restricted_rooms(room: GpuRoom, demand: DeviceDemand, groups: list[tuple[int, ...]]) -> list[GpuRoom]:
    """The room as each group leaves it: only GPUs some request may take."""
    return [replace(room, free=room.free & mask_of_all(masks)) for masks in groups]


def dealt_set(demand: DeviceDemand, free: int, masks: tuple[int, ...],
              choose: Callable[[int, int], tuple[int, ...] | None]) -> tuple[int, ...] | None:
    """Requests whose masks differ: the All requests take their whole masks
    (all free), then each other in turn its best ``count`` of what is left
    (``choose(allowed, k)``); None when one cannot."""
    taken = all_mask(demand, masks)
    if taken & ~free:
        return None
    for request, mask in zip(demand.requests, masks):
        if request.all_devices:
            continue
        got = choose(free & mask & ~taken, request.count)
        if got is None:
            return None
        taken |= mask_of(got)
    return tuple(gpus_of(taken))


# ---- the allocation written --------------------------------------------------------

def allocations(node: NodeInfo, pod: PodInfo, gpu_ids: tuple[int, ...],
                claims: Callable[[str], ResourceClaim | None],
                classes: Mapping[str, DeviceClass]) -> tuple[ClaimAllocation, ...]:
    """Each claim of the pod as written when it is bound to ``node`` with
    ``gpu_ids``: the claims it allocates with the devices dealt to their
    requests, then those it joins (allocated already, or by the gang mate
    placed on ``node`` with it).  ``claims`` finds one by namespace/name."""
    demand = pod.device_demand
    if demand is None:
        return ()
    dealt: list[list[int]] = [[] for _ in demand.requests]
    if demand.requests:
        masks = eligible_masks(node, demand)
        if isinstance(masks, str):
            raise ValueError(masks)
        for group in attribute_groups(node, demand, masks):
            found = deal(demand, group, gpu_ids)
            if found is not None:
                dealt = found
                break
        else:
            raise ValueError(f"GPUs {list(gpu_ids)} of {node.name} cannot be dealt to the requests of pod {pod.key}")
    by_id = dra_gpus_by_id(node)
    written = []
    for key in demand.allocate:
        claim = _known(claims, key)
        devices, used_classes = [], {}
        for request, gpus in zip(demand.requests, dealt):
            if request.claim == key:
                devices.extend(AllocatedDevice(request.request, by_id[i].driver, by_id[i].pool, by_id[i].device)
                               for i in gpus)
                used_classes.setdefault(request.device_class, []).append(request.request)
        config = [json.dumps({"source": "FromClass", "requests": names, "opaque": json.loads(c)}, sort_keys=True)
                  for name, names in sorted(used_classes.items()) if name in classes for c in classes[name].config]
        config += [json.dumps({"source": "FromClaim", **json.loads(c)}, sort_keys=True) for c in claim.config]
        written.append(ClaimAllocation(claim.namespace, claim.name, claim.uid, node.name, True, tuple(devices),
                                       tuple(config)))
    for key in (*demand.reserve, *(key for key, _ in demand.follows)):
        claim = _known(claims, key)
        written.append(ClaimAllocation(claim.namespace, claim.name, claim.uid, node.name))
    return tuple(written)


def _known(claims: Callable[[str], ResourceClaim | None], key: str) -> ResourceClaim:
    claim = claims(key)
    if claim is None:  # the join saw it: only a bug gets here
        raise ValueError(f"ResourceClaim {key} is not known")
    return claim
