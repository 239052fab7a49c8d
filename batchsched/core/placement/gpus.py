"""Which GPUs a pod gets on a node, under its gang's topology policy.

``pick_gpus`` answers for one pod on one node: the GPU ids (the optimal set
of ``batchsched.core.topology.choose`` on topology-known nodes, the lowest
free ids on the others), the NUMA node its cpu and memory are charged to,
and the set's quality, which node scoring compares before packing -- or,
when no set satisfies the policy, why not.

The policy (PodGroup ``spec.topologyPolicy``, docs/topology.md):

* ``gpuLink``: ``prefer-nvlink`` (default) compares nodes on set quality
  first; ``any`` on packing alone; ``require-nvlink`` gives a pod of two or
  more GPUs only a set joined by NVLink everywhere, so never a node whose
  topology is unknown.
* ``numa: single-numa-node``, or the node's declared Topology Manager policy
  ``single-numa-node``: the pod's GPUs, cpu and memory come from one NUMA
  node, where the topology says which that is.
* ``exclusiveGpus``: nodes whose GPUs are shared are left out.

On a node where DRA serves nvidia.com/gpu (``NodeInfo.gpus_by_dra``) the
GPU ids are its DRA GPUs' and the pod gets them through its extended-resource
claim (core/dra/extended.py, docs/dra.md).  A node with DRA GPUs but neither
the device plugin nor a DeviceClass serving nvidia.com/gpu takes no GPU pod.
A pod whose own ResourceClaims ask GPUs (``PodInfo.device_demand``) gets
the best set among the GPUs their selectors select, under their
matchAttribute constraints (core/dra/claims.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from batchsched.api import constants
from batchsched.core import resources as res
from batchsched.core.dra import claims
from batchsched.core.dra.demand import DeviceDemand
from batchsched.core.model import NodeInfo, TopologyPolicy
from batchsched.core.placement.fit import insufficient_reason
from batchsched.core.topology.accounting import GpuRoom, gpus_shared, numa_of, topology_of
from batchsched.core.topology.choose import GpuChoice, choose_gpus, evaluate, gpus_of, mask_of
from batchsched.core.topology.model import GpuTopology, Link

REASON_SHARED_GPUS = "node(s) had shared GPUs and the gang asks for exclusive ones"
REASON_NO_NVLINK_SET = "node(s) had no free GPUs all joined by NVLink"
REASON_NO_NUMA_FIT = "node(s) could not fit the pod's GPUs, cpu and memory in one NUMA node"
REASON_DRA_NO_CLASS = (f"node(s) have DRA GPUs but no DeviceClass with extendedResourceName "
                       f"{constants.GPU_RESOURCE} that selects them")

SINGLE_NUMA_NODE = "single-numa-node"
_NVLINK = Link("NV", 1).rank  # the weakest NVLink class
_FLAT_WORST = 0  # an unknown topology ranks below every known link class


@dataclass(frozen=True)
class GpuPick:
    gpus: tuple[int, ...]
    numa: int | None  # where the pod's cpu and memory are charged (None: spread)
    quality: tuple[int, ...]  # lower is better; compared across nodes for one pod shape


NO_GPU_IDS = GpuPick((), None, ())


def static_reason(node: NodeInfo, request: Mapping[str, int], policy: TopologyPolicy,
                  demand: DeviceDemand | None = None) -> str:
    """Why the node is out for this gang whatever is free there ("" if it is not)."""
    if demand is not None:
        reason = claims.static_reason(node, demand)
        if reason or demand.asks_devices:
            return reason
    if (request.get(constants.GPU_RESOURCE, 0) and node.dra is not None
            and not node.allocatable.get(constants.GPU_RESOURCE, 0)):
        return REASON_DRA_NO_CLASS
    if policy.exclusive_gpus and request.get(constants.GPU_RESOURCE, 0) and gpus_shared(node):
        return REASON_SHARED_GPUS
    return ""


def pick_gpus(node: NodeInfo, room: GpuRoom | None, request: Mapping[str, int],
              policy: TopologyPolicy, demand: DeviceDemand | None = None) -> GpuPick | str:
    """The GPUs a pod asking ``request`` (and, when its claims ask GPUs,
    ``demand``) gets on ``node`` with ``room`` left, or why none fits.
    ``request`` must fit the node's free resources."""
    if demand is not None and demand.asks_devices and room is not None:
        return _pick_for_claims(node, room, request, policy, demand)
    k = request.get(constants.GPU_RESOURCE, 0)
    if room is None or k == 0:
        return NO_GPU_IDS
    if room.free.bit_count() < k:  # not while named ids stay within the GPUs counted as used
        return insufficient_reason(constants.GPU_RESOURCE)
    topology = topology_of(node)
    if topology is None:
        if k > 1 and policy.gpu_link == "require-nvlink":
            return REASON_NO_NVLINK_SET
        return GpuPick(gpus_of(room.free)[:k], None, _quality(policy, k, _FLAT_WORST, 0, 1, k))
    single_numa = SINGLE_NUMA_NODE in (policy.numa, node.labels.get(constants.TOPOLOGY_MANAGER_POLICY_LABEL))
    if single_numa and room.numa_free:
        wanted = {name: request.get(name, 0) for name in (res.CPU, res.MEMORY)}
        options = []
        for numa, left in sorted(room.numa_free.items()):
            in_numa = mask_of(g.index for g in topology.gpus if g.numa in (numa, None))
            choice = None if res.shortfall(wanted, left) else choose_gpus(topology, room.free, k, in_numa)
            if choice is not None and policy.rdma:
                choice = _with_rdma(topology, room.free, k, choice, in_numa)
            if choice is not None:
                options.append((tuple(-x for x in choice.objective), choice.gpus, numa, choice))
        if not options:
            return REASON_NO_NUMA_FIT
        *_, numa, choice = min(options)
    else:
        choice = choose_gpus(topology, room.free, k)
        if policy.rdma:
            choice = _with_rdma(topology, room.free, k, choice)
        numa = numa_of(topology, choice.gpus)
    if k > 1 and policy.gpu_link == "require-nvlink" and choice.worst < _NVLINK:
        return REASON_NO_NVLINK_SET
    return GpuPick(choice.gpus, numa, _quality(policy, k, choice.worst, choice.gbps, choice.numa_nodes,
                                               _without_rdma(topology, choice.gpus)))


def _with_rdma(topology: GpuTopology, free: int, k: int, best: GpuChoice, allowed: int | None = None) -> GpuChoice:
    """``best`` (of the ``allowed`` GPUs), or as good a set (the same worst
    link, no more NUMA nodes) whose every GPU has GPUDirect RDMA, when there
    is one."""
    if not _without_rdma(topology, best.gpus) or not topology.rdma_gpus & free:
        return best
    served = choose_gpus(topology, free, k, topology.rdma_gpus if allowed is None else topology.rdma_gpus & allowed)
    if served is not None and served.worst >= best.worst and served.numa_nodes <= best.numa_nodes:
        return served
    return best


def _without_rdma(topology: GpuTopology | None, gpus: tuple[int, ...]) -> int:
    """How many of ``gpus`` have no NIC at PIX/PXB (all, on an unknown topology)."""
    if topology is None:
        return len(gpus)
    return (mask_of(gpus) & ~topology.rdma_gpus).bit_count()


def charged(request: Mapping[str, int], pick: GpuPick | None, demand: DeviceDemand | None) -> Mapping[str, int]:
    """What a pod asking ``request`` takes of its node's free resources with
    ``pick``: the request, its GPUs as many as picked when an allocationMode
    All claim takes every device it selects (their number depends on the node)."""
    if demand is None or not demand.asks_all or pick is None:
        return request
    return {**request, constants.GPU_RESOURCE: len(pick.gpus)}


def in_dra_terms(node: NodeInfo, reasons: list[str], request: Mapping[str, int]) -> list[str]:
    """On a node where DRA serves nvidia.com/gpu, GPU shortfalls said as
    devices of its DeviceClass: "node(s) had no 4 free devices of class
    gpu.nvidia.com [joined by NVLink]"."""
    if not node.gpus_by_dra or node.dra is None:
        return reasons
    words = claims.devices_words(request.get(constants.GPU_RESOURCE, 0),
                                 (g.extended_class for g in node.dra.gpus if g.extended_class), free=True)
    said = {insufficient_reason(constants.GPU_RESOURCE): f"node(s) had no {words}",
            REASON_NO_NVLINK_SET: f"node(s) had no {words} joined by NVLink"}
    return [said.get(r, r) for r in reasons]


def _pick_for_claims(node: NodeInfo, room: GpuRoom, request: Mapping[str, int], policy: TopologyPolicy,
                     demand: DeviceDemand) -> GpuPick | str:
    """The best pick among the ways of meeting the claims' matchAttribute
    constraints, each limited to the GPUs its requests' selectors select;
    requests selecting different GPUs take theirs one after the other."""
    masks = claims.eligible_masks(node, demand)
    if isinstance(masks, str):
        return masks
    best: GpuPick | None = None
    reasons = []
    for group in claims.attribute_groups(node, demand, masks):
        limited = replace(room, free=room.free & claims.mask_of_all(group))
        if len(set(group)) == 1 and not demand.asks_all:
            pick = pick_gpus(node, limited, request, policy)
        else:
            pick = _pick_in_turn(node, limited, request, policy, demand, group)
        if isinstance(pick, str):
            reasons.append(pick)
        elif best is None or pick.quality < best.quality:
            best = pick
    if best is not None:
        return best
    if REASON_NO_NVLINK_SET in reasons:
        return claims.nvlink_reason(demand)
    if REASON_NO_NUMA_FIT in reasons:
        return REASON_NO_NUMA_FIT
    return claims.free_reason(demand)


def _pick_in_turn(node: NodeInfo, room: GpuRoom, request: Mapping[str, int], policy: TopologyPolicy,
                  demand: DeviceDemand, masks: tuple[int, ...]) -> GpuPick | str:
    def choose(allowed: int, k: int) -> tuple[int, ...] | None:
        pick = pick_gpus(node, replace(room, free=allowed), {**request, constants.GPU_RESOURCE: k}, policy)
        return None if isinstance(pick, str) else pick.gpus

    gpus = claims.dealt_set(demand, room.free, masks, choose)
    if gpus is None:
        return claims.free_reason(demand)
    topology = topology_of(node)
    if topology is None:
        return GpuPick(gpus, None, _quality(policy, len(gpus), _FLAT_WORST, 0, 1, len(gpus)))
    choice = evaluate(topology, gpus, room.free)
    if len(gpus) > 1 and policy.gpu_link == "require-nvlink" and choice.worst < _NVLINK:
        return REASON_NO_NVLINK_SET
    return GpuPick(gpus, numa_of(topology, gpus), _quality(policy, len(gpus), choice.worst, choice.gbps,
                                                           choice.numa_nodes, _without_rdma(topology, gpus)))


def _quality(policy: TopologyPolicy, k: int, worst: int, gbps: int, numa_nodes: int,
             without_rdma: int) -> tuple[int, ...]:
    """Lower is better.  For a gang preferring GPUDirect RDMA, the GPUs
    without it count right after the worst link (alone for one GPU, which
    has no link); ``gpuLink: any`` compares nodes on packing only."""
    if policy.gpu_link == "any":
        return ()
    rdma = (without_rdma,) if policy.rdma else ()
    if k < 2:
        return rdma
    return (-worst,) + rdma + (-gbps, numa_nodes)
