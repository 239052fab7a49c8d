"""GPUs per node pool: allocated, free, and stranded (pure; read by the metrics).

A GPU is *stranded* when it is free but no whole-node pod could use it: the
leftover of a node whose free GPUs are not a multiple of a whole-node pod's
GPUs (8 by default: one HGX board; all the GPUs of a smaller node), and
every free GPU of a node that takes no new pods (cordoned or not Ready).
Stranded GPUs are counted in ``free`` too: they are free, just fragmented.
A node's GPUs are those of its device plugin and those it serves through
DRA (``NodeInfo.dra``); a DRA GPU is allocated when a claim holds it
(docs/dra.md).

The figures are read on every ``/metrics`` scrape, so :class:`GpuPoolTally`
keeps them across reads and re-derives only the nodes changed since the
last one: a scrape costs the changes, not the cluster.
"""
from __future__ import annotations

from dataclasses import dataclass

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core.cluster import ClusterState
from batchsched.core.model import NodeInfo, device_plugin_gpus

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
    return free % min(whole_pod_gpus, node_gpu_count(node))


def node_gpu_count(node: NodeInfo) -> int:
    """The device plugin's GPUs and the DRA GPUs of the node."""
    return device_plugin_gpus(node) + (len(node.dra.gpus) if node.dra is not None else 0)


def node_gpus(node: NodeInfo, free_gpus: int, whole_pod_gpus: int = WHOLE_NODE_POD_GPUS,
              dra_allocated: int = 0) -> PoolGpus | None:
    """One node's figures, given its free device-plugin GPUs (negative when
    overcommitted) and its DRA GPUs allocated; None for a node with no GPU."""
    allocatable = node_gpu_count(node)
    if allocatable <= 0:
        return None
    if node.gpus_by_dra:  # free_gpus counts the DRA GPUs serving nvidia.com/gpu already
        free = min(allocatable, max(0, free_gpus))
    else:
        dra_free = allocatable - node.allocatable.get(GPU_RESOURCE, 0) - dra_allocated
        free = min(allocatable, max(0, free_gpus) + max(0, dra_free))
    return PoolGpus(allocatable - free, free, stranded_gpus(node, free, whole_pod_gpus))


class GpuPoolTally:
    """Pool name (the node's ``pool_label`` value) -> its GPU figures, kept
    for one ClusterState: each :meth:`read` re-derives only the nodes changed
    since the previous one (``ClusterState.changed_since``)."""

    def __init__(self, pool_label: str, whole_pod_gpus: int = WHOLE_NODE_POD_GPUS):
        self.pool_label = pool_label
        self.whole_pod_gpus = whole_pod_gpus
        self._cluster: ClusterState | None = None
        self._mark = 0
        self._by_node: dict[str, tuple[str, PoolGpus]] = {}  # node -> (pool, its figures)
        self._pools: dict[str, tuple[int, PoolGpus]] = {}  # pool -> (GPU nodes in it, sums)

    def read(self, cluster: ClusterState) -> dict[str, PoolGpus]:
        if cluster is not self._cluster:  # another cluster: count it all
            self._cluster, self._mark, self._by_node, self._pools = cluster, 0, {}, {}
        for name in cluster.changed_since(self._mark):
            before = self._by_node.pop(name, None)
            if before is not None:
                self._add(*before, -1)
            node = cluster.nodes.get(name)
            figures = None if node is None else node_gpus(
                node, cluster.free(name).get(GPU_RESOURCE, 0), self.whole_pod_gpus, cluster.dra_allocated(name))
            if figures is not None:
                pool = node.labels.get(self.pool_label) or NO_POOL
                self._by_node[name] = (pool, figures)
                self._add(pool, figures, 1)
        self._mark = cluster.mark
        return {pool: sums for pool, (_, sums) in self._pools.items()}

    def _add(self, pool: str, figures: PoolGpus, sign: int) -> None:
        nodes, sums = self._pools.get(pool, (0, PoolGpus()))
        if nodes + sign == 0:
            del self._pools[pool]
            return
        self._pools[pool] = (nodes + sign, PoolGpus(sums.allocated + sign * figures.allocated,
                                                    sums.free + sign * figures.free,
                                                    sums.stranded + sign * figures.stranded))
