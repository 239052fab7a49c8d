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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from batchsched.api import constants
from batchsched.core import resources as res
from batchsched.core.model import NodeInfo, TopologyPolicy
from batchsched.core.placement.fit import insufficient_reason
from batchsched.core.topology.accounting import GpuRoom, gpus_shared, numa_of, topology_of
from batchsched.core.topology.choose import choose_gpus, gpus_of, mask_of
from batchsched.core.topology.model import Link

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


def static_reason(node: NodeInfo, request: Mapping[str, int], policy: TopologyPolicy) -> str:
    """Why the node is out for this gang whatever is free there ("" if it is not)."""
    if (request.get(constants.GPU_RESOURCE, 0) and node.dra is not None
            and not node.allocatable.get(constants.GPU_RESOURCE, 0)):
        return REASON_DRA_NO_CLASS
    if policy.exclusive_gpus and request.get(constants.GPU_RESOURCE, 0) and gpus_shared(node):
        return REASON_SHARED_GPUS
    return ""


def pick_gpus(node: NodeInfo, room: GpuRoom | None, request: Mapping[str, int],
              policy: TopologyPolicy) -> GpuPick | str:
    """The GPUs a pod asking ``request`` gets on ``node`` with ``room`` left,
    or why none fits.  ``request`` must fit the node's free resources."""
    k = request.get(constants.GPU_RESOURCE, 0)
    if room is None or k == 0:
        return NO_GPU_IDS
    if room.free.bit_count() < k:  # not while named ids stay within the GPUs counted as used
        return insufficient_reason(constants.GPU_RESOURCE)
    topology = topology_of(node)
    if topology is None:
        if k > 1 and policy.gpu_link == "require-nvlink":
            return REASON_NO_NVLINK_SET
        return GpuPick(gpus_of(room.free)[:k], None, _quality(policy, k, _FLAT_WORST, 0, 1))
    single_numa = SINGLE_NUMA_NODE in (policy.numa, node.labels.get(constants.TOPOLOGY_MANAGER_POLICY_LABEL))
    if single_numa and room.numa_free:
        wanted = {name: request.get(name, 0) for name in (res.CPU, res.MEMORY)}
        options = []
        for numa, left in sorted(room.numa_free.items()):
            in_numa = mask_of(g.index for g in topology.gpus if g.numa in (numa, None))
            choice = None if res.fits(wanted, left) else choose_gpus(topology, room.free, k, in_numa)
            if choice is not None:
                options.append((tuple(-x for x in choice.objective), choice.gpus, numa, choice))
        if not options:
            return REASON_NO_NUMA_FIT
        *_, numa, choice = min(options)
    else:
        choice = choose_gpus(topology, room.free, k)
        numa = numa_of(topology, choice.gpus)
    if k > 1 and policy.gpu_link == "require-nvlink" and choice.worst < _NVLINK:
        return REASON_NO_NVLINK_SET
    return GpuPick(choice.gpus, numa, _quality(policy, k, choice.worst, choice.gbps, choice.numa_nodes))


def _quality(policy: TopologyPolicy, k: int, worst: int, gbps: int, numa_nodes: int) -> tuple[int, ...]:
    if k < 2 or policy.gpu_link == "any":
        return ()
    return (-worst, -gbps, numa_nodes)
