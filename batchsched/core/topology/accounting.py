"""Which GPU ids of each node are taken, and what each NUMA node has left,
rebuilt from the pods alone -- so a restarted scheduler knows exactly what
its predecessor handed out.

* A bound pod's ``scheduling.batchsched.io/gpu-ids`` annotation names its
  GPUs.  GPUs a pod holds without naming them (pods of other schedulers, or
  ids out of range or already named by another pod) are *used with unknown
  identity*: they count against the node's nvidia.com/gpu like every GPU
  (the resource counts stay exact) but mark no id.
* A node's GPUs have ids when they can be handed out one by one: the
  topology's GPUs, or ``0..allocatable-1`` when the topology is unknown
  (up to ``MAX_GPU_ID``; a larger count is bogus and goes by count only).
  GPUs that are shared (time-slicing, MPS, replicas > 1) or carved into MIG
  devices have none; pods get them by count only.  The topology's GPUs
  served through DRA (``NodeInfo.dra``, docs/dra.md) are never in the room:
  device-plugin pods cannot get them, and claims account for them -- except
  on a node where DRA serves nvidia.com/gpu (``NodeInfo.gpus_by_dra``): its
  room holds the GPUs a class serves it with (by topology index, or by
  position where the GPUs are flat) less those in any claim's allocation.
* NUMA (topology-known nodes): each NUMA node gets a share of the node's
  allocatable cpu (its CPUs over all CPUs) and memory (its declared memory,
  else the cpu share).  A pod whose GPUs all sit in one NUMA node is charged
  there -- it is where a single-numa-node kubelet put its cpu and memory;
  any other pod is spread over the NUMA nodes by their shares.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

from batchsched.api import constants
from batchsched.core import resources as res
from batchsched.core.dra.inventory import DraGpu
from batchsched.core.model import NodeInfo, PodInfo, gpu_replicas, has_mig_devices
from batchsched.core.readers import MAX_GPU_ID
from batchsched.core.resources import Resources
from batchsched.core.topology.choose import mask_of
from batchsched.core.topology.model import GpuTopology

_NUMA_RESOURCES = (res.CPU, res.MEMORY)


def _facts(node: NodeInfo) -> tuple:
    """The node's fixed GPU facts (sharing, id count, topology, NUMA shares),
    computed once per ``NodeInfo`` object: they depend only on its fields, the
    object is frozen, and a changed node is a new object.  Kept in
    ``_GPU_FACTS`` by node name beside the object they are of."""
    kept = _GPU_FACTS.get(node.name)
    if kept is not None and kept[0] is node:
        return kept[1]
    shared = _gpus_shared(node)
    flat = node.allocatable.get(constants.GPU_RESOURCE, 0)
    ids = 0 if shared or has_mig_devices(node.labels, node.allocatable) else (
        len(node.topology) if node.topology is not None
        else flat if flat <= MAX_GPU_ID + 1 else 0)  # a bogus huge count: no id masks that wide
    topology = node.topology if ids else None
    facts = (shared, ids, topology, _numa_capacity(node, topology))
    if len(_GPU_FACTS) >= GPU_FACTS_KEPT:  # names of nodes gone: dropped at once (amortized O(1))
        _GPU_FACTS.clear()
    _GPU_FACTS[node.name] = (node, facts)
    return facts


_GPU_FACTS: dict[str, tuple[NodeInfo, tuple]] = {}
GPU_FACTS_KEPT = 65536


def _gpus_shared(node: NodeInfo) -> bool:
    return gpu_replicas(node.labels) != 1


def gpus_shared(node: NodeInfo) -> bool:
    """GPU feature discovery says the node's GPUs are time-sliced or MPS-shared."""
    return _facts(node)[0]


def gpu_id_count(node: NodeInfo) -> int:
    """How many GPU ids the node hands out (0: its GPUs go by count only)."""
    return _facts(node)[1]


def topology_of(node: NodeInfo) -> GpuTopology | None:
    """The topology the planner uses: none where GPUs have no ids."""
    return _facts(node)[2]


def numa_capacity(node: NodeInfo) -> dict[int, Resources]:
    """Each NUMA node's share of the node's allocatable cpu and memory.
    Shared with every caller: do not mutate."""
    return _facts(node)[3]


def _numa_capacity(node: NodeInfo, topology: GpuTopology | None) -> dict[int, Resources]:
    if topology is None or not topology.numa_nodes:
        return {}
    numa_nodes = topology.numa_nodes
    if all(n.cpus for n in numa_nodes):
        cpu_count = max(max(n.cpus) for n in numa_nodes) + 1  # Linux numbers CPUs densely
        shares = {n.id: (len(n.cpus), cpu_count) for n in numa_nodes}
    else:
        shares = {n.id: (1, len(numa_nodes)) for n in numa_nodes}
    cpu, memory = node.allocatable.get(res.CPU, 0), node.allocatable.get(res.MEMORY, 0)
    declared = sum(n.memory for n in numa_nodes)
    capacity = {}
    for n in numa_nodes:
        part, whole = shares[n.id]
        node_memory = (n.memory * min(memory, declared) // declared if all(m.memory for m in numa_nodes)
                       else memory * part // whole)
        capacity[n.id] = {res.CPU: cpu * part // whole, res.MEMORY: node_memory}
    return capacity


def numa_of(topology: GpuTopology, gpus: Iterable[int]) -> int | None:
    """The NUMA node all of ``gpus`` sit in, if there is one."""
    numas = {topology.gpus[g].numa for g in gpus}
    return numas.pop() if len(numas) == 1 else None


@dataclass(frozen=True)
class GpuRoom:
    """What a node has left beyond plain resource counts."""

    free: int  # bit mask of the GPU ids no pod names
    numa_free: Mapping[int, Resources]  # NUMA node -> cpu and memory left; empty: unknown
    numa_capacity: Mapping[int, Resources]

    @functools.cached_property
    def key(self) -> tuple:
        """Equal for rooms with the same GPUs and NUMA room left (hashable;
        computed once per room object)."""
        return (self.free, tuple((numa, tuple(left.items())) for numa, left in self.numa_free.items()))

    def take(self, gpus: Iterable[int], request: Mapping[str, int], numa: int | None) -> GpuRoom:
        """Room after a pod with ``request`` takes ``gpus``, its cpu and
        memory charged to NUMA node ``numa`` (None: spread by share)."""
        return self._move(gpus, request, numa, res.subtract)

    def give(self, gpus: Iterable[int], request: Mapping[str, int], numa: int | None) -> GpuRoom:
        """Room after such a pod is gone (the inverse of ``take``)."""
        return self._move(gpus, request, numa, res.add)

    def _move(self, gpus: Iterable[int], request: Mapping[str, int], numa: int | None,
              op: Callable[[Mapping[str, int], Mapping[str, int]], Resources]) -> GpuRoom:
        mask = mask_of(gpus)
        free = self.free & ~mask if op is res.subtract else self.free | mask
        if not self.numa_free:
            return self if free == self.free else replace(self, free=free)  # most pods name no GPU
        numa_free = dict(self.numa_free)
        if numa is not None:
            numa_free[numa] = op(numa_free[numa], {r: request.get(r, 0) for r in _NUMA_RESOURCES})
        else:
            for node_id, charge in _spread(self.numa_capacity, request.get(res.CPU, 0),
                                           request.get(res.MEMORY, 0)).items():
                numa_free[node_id] = op(numa_free[node_id], charge)
        return GpuRoom(free, numa_free, self.numa_capacity)


def _spread(capacity: Mapping[int, Resources], cpu: int, memory: int) -> dict[int, Resources]:
    """Each NUMA node's share of a pod's ``cpu`` and ``memory`` charged by
    share (``capacity``: each NUMA node's).  Kept per capacity (by identity:
    a node's is one object, ``numa_capacity``) and request, as pods of a
    node mostly ask a few sizes and every room of a node is rebuilt pod by
    pod (``room_of``)."""
    key = (id(capacity), cpu, memory)
    known = _SPREADS.get(key)
    if known is None or known[0] is not capacity:
        totals = {r: sum(c[r] for c in capacity.values()) for r in _NUMA_RESOURCES}
        asked = {res.CPU: cpu, res.MEMORY: memory}
        if len(_SPREADS) >= SPREADS_KEPT:
            _SPREADS.clear()
        known = _SPREADS[key] = (capacity, {
            node_id: {r: asked[r] * share[r] // totals[r] for r in _NUMA_RESOURCES if totals[r]}
            for node_id, share in capacity.items()})
    return known[1]


# Spread charges kept (capacity, cpu, memory): past this many (a cluster's
# nodes times the pod sizes it runs; ~0.9 KB each) they are dropped and kept
# afresh. A node's room is rebuilt pod by pod, and its pods reuse its own.
SPREADS_KEPT = 4096
_SPREADS: dict[tuple, tuple[Mapping[int, Resources], dict[int, Resources]]] = {}


def charged_numa(node: NodeInfo, gpus: Iterable[int], asked: int) -> int | None:
    """The NUMA node a bound pod's cpu and memory were charged to: where all
    its named GPUs sit, when it named all it asked for; else None (spread)."""
    named = list(gpus)
    topology = topology_of(node)
    return numa_of(topology, named) if topology and named and len(named) == asked else None


def dra_gpus_by_id(node: NodeInfo) -> dict[int, DraGpu]:
    """On a node where DRA serves nvidia.com/gpu: the GPU id of each DRA GPU
    a class serves it with -- its topology index, or its position (by
    device minor) where the GPUs are flat; empty on other nodes."""
    if not node.gpus_by_dra or node.dra is None:
        return {}
    serving = [g for g in node.dra.gpus if g.extended_class]
    if topology_of(node) is None:
        return dict(enumerate(serving)) if gpu_id_count(node) else {}
    return {g.index: g for g in serving if g.index is not None}


def room_of(node: NodeInfo, holding: Iterable[PodInfo], dra_in_use: int = 0) -> GpuRoom | None:
    """The room left on ``node`` by the pods ``holding`` room there, taken
    in order (a GPU id two pods name is the first one's), and, where DRA
    serves nvidia.com/gpu, by the ids ``dra_in_use`` (their devices are in
    claims); None for a node whose GPUs have no ids and whose NUMA nodes
    are unknown."""
    ids, capacity = gpu_id_count(node), numa_capacity(node)
    if not (ids or capacity):
        return None
    if node.gpus_by_dra:
        free = mask_of(dra_gpus_by_id(node))
    else:
        free = ((1 << ids) - 1) & ~(node.dra.mask if node.dra is not None else 0)
    room = GpuRoom(free, capacity, capacity)
    for pod in holding:
        room = room_after(node, room, pod)
    return replace(room, free=room.free & ~dra_in_use) if dra_in_use else room


def room_after(node: NodeInfo, room: GpuRoom, pod: PodInfo) -> GpuRoom:
    """``room`` once ``pod``, holding room on ``node``, takes its share:
    the GPU ids it names that are free there (in range, unclaimed), up to
    what it asks, and its cpu and memory where ``charged_numa`` says."""
    asked = pod.requests.get(constants.GPU_RESOURCE, 0)
    named = [g for g in sorted(set(pod.gpu_ids)) if room.free >> g & 1][:asked]
    return room.take(named, pod.requests, charged_numa(node, named, asked))
