"""GPUs per node pool: allocated, free, and stranded (pure; read by the metrics).

A GPU is *stranded* when it is free but no whole-node pod could use it: the
leftover of a node whose free GPUs are not a multiple of a whole-node pod's
GPUs (8 by default: one HGX board; all the GPUs of a smaller node), and
every free GPU of a node that takes no new pods (cordoned or not Ready).
Stranded GPUs are counted in ``free`` too: they are free, just fragmented.
"""
from __future__ import annotations

from dataclasses import dataclass

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core.model import NodeInfo
from batchsched.core.snapshot import Snapshot

WHOLE_NODE_POD_GPUS = 8
NO_POOL = "none"  # pool of nodes without the pool label


@dataclass(frozen=True)
class PoolGpus:
    allocated: int = 0
    free: int = 0
    stranded: int = 0


def stranded_gpus(node: NodeInfo, free: int, whole_pod_gpus: int = WHOLE_NODE_POD_GPUS) -> int:
    """How many of the ``free`` GPUs of ``node`` are stranded."""
    if node.unschedulable or not node.ready or free == 0:
        return free
    return free % min(whole_pod_gpus, node.allocatable.get(GPU_RESOURCE, 0))


def gpu_pools(snapshot: Snapshot, pool_label: str,
              whole_pod_gpus: int = WHOLE_NODE_POD_GPUS) -> dict[str, PoolGpus]:
    """Pool name (the node's ``pool_label`` value) -> its GPU figures; nodes
    advertising no GPU are left out."""
    used = snapshot.used_by_node()
    pools: dict[str, PoolGpus] = {}
    for name, node in snapshot.nodes.items():
        allocatable = node.allocatable.get(GPU_RESOURCE, 0)
        if allocatable <= 0:
            continue
        allocated = min(allocatable, used[name].get(GPU_RESOURCE, 0))
        free = allocatable - allocated
        stranded = stranded_gpus(node, free, whole_pod_gpus)
        pool = node.labels.get(pool_label) or NO_POOL
        total = pools.get(pool, PoolGpus())
        pools[pool] = PoolGpus(total.allocated + allocated, total.free + free, total.stranded + stranded)
    return pools
