"""Fragmentation-aware node choice: an approximation of FGD (Weng et al.,
ATC'23, "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent"), and keeping NVLink domains whole for
whole-node pods.

The GPU shapes the workload asks (``ClusterState.gpu_asks``: how many of
our pending pods and of the bound pods ask each number of whole GPUs) make
a mix, quantized in ``MIX_STEPS`` steps.  A node's fragment for a pod
asking ``k`` GPUs is its free GPUs when they cannot serve it -- fewer than
``k`` are free, or, on a node whose GPUs have a known topology and ``k`` >
1, no *aligned* set of ``k`` (``topology.alignment``) is among them -- else
0; its fragmentation is the fragment expected over the mix.  A pod prefers
the node whose fragmentation its placement raises least
(``NodeChoice.score``), best fit breaking ties.  Unlike the paper it
counts whole GPUs only (no GPU sharing, no cpu or memory in the fragment)
and the mix is the cluster's current demand, not a trace's.

Keeping cliques (``nvidia.com/gpu.clique``): while a pod of ours waits that
asks a node's every GPU, a pod asking fewer prefers not to open a wholly
free node of a clique; it goes outside cliques, or to clique nodes already
partly used.  Per node, so a node's score still depends only on the node
and its entry (``capacity.kept_index``).

Both change decisions only through ``NodeChoice``, the key of the kept
capacity index: the index is rebuilt when the quantized mix or the largest
waiting ask changes, and ``settled_mix`` holds the mix until the demand
moves a clear step away, so churn near a rounding edge rebuilds nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from batchsched.api.constants import GPU_CLIQUE_LABEL, GPU_RESOURCE
from batchsched.core.cluster import ClusterState
from batchsched.core.config import CoreConfig
from batchsched.core.model import NodeInfo
from batchsched.core.topology.accounting import GpuRoom, topology_of
from batchsched.core.topology.alignment import is_aligned
from batchsched.core.topology.choose import choose_gpus, mask_of
from batchsched.core.topology.model import GpuTopology

MIX_STEPS = 20  # a shape's weight is a whole number of twentieths (5%)
# How far (in steps) the demand must move from the mix in use to replace it.
MIX_HYSTERESIS = 0.75

Mix = tuple[tuple[int, int], ...]  # (GPUs a pod asks, weight in steps), by GPUs


def quantized_mix(asks: Mapping[int, int]) -> Mix:
    """``asks`` (GPUs per pod -> pods) as weights in steps; shapes under
    half a step are left out."""
    total = sum(asks.values())
    if not total:
        return ()
    weights = ((k, round(MIX_STEPS * n / total)) for k, n in sorted(asks.items()))
    return tuple((k, w) for k, w in weights if w)


def settled_mix(asks: Mapping[int, int], kept: Mix | None) -> Mix:
    """``kept`` while every shape's exact weight is within
    ``MIX_HYSTERESIS`` steps of it, else the new ``quantized_mix``."""
    if kept is not None:
        total = sum(asks.values())
        exact = {k: MIX_STEPS * n / total for k, n in asks.items()} if total else {}
        held = dict(kept)
        if all(abs(exact.get(k, 0.0) - held.get(k, 0)) <= MIX_HYSTERESIS for k in exact.keys() | held.keys()):
            return kept
    return quantized_mix(asks)


def fragmentation(free_gpus: int, mix: Mix, topology: GpuTopology | None = None, free_mask: int = 0) -> int:
    """The node's expected fragment over ``mix`` (in GPU-steps): its free
    GPUs weighted by the shapes they cannot serve: those asking more, and,
    with its ``topology`` and the ids free (``free_mask``), those of 2+
    GPUs no aligned set among them serves."""
    return free_gpus * sum(w for k, w in mix
                           if free_gpus < k or (topology is not None and k > 1 and not has_aligned_set(
                               topology, free_mask, k)))


def has_aligned_set(topology: GpuTopology, free_mask: int, k: int) -> bool:
    """Whether the GPUs of ``free_mask`` include an aligned set of ``k``."""
    best = choose_gpus(topology, free_mask, k)
    return best is not None and is_aligned(topology, best.gpus)


@dataclass(frozen=True)
class NodeChoice:
    """What node scoring weighs beside best fit; the kept capacity index's key.

    ``mix``: the GPU shapes asked (empty: fragmentation not counted);
    ``whole_node_ask``: the most GPUs a pod of ours waiting for placement
    asks when cliques are kept for such pods (0: not kept)."""

    mix: Mix = ()
    whole_node_ask: int = 0
    _increase: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def score(self, node: NodeInfo, request: Mapping[str, int], free: Mapping[str, int],
              room: GpuRoom | None, gpus: tuple[int, ...]) -> tuple:
        """Lower is better: (opens a whole clique node, fragmentation
        increase) for a pod asking ``request`` that takes ``gpus`` (ids,
        where ``room`` tracks them) on ``node``, which has ``free`` now."""
        asked, free_gpus = request.get(GPU_RESOURCE, 0), free.get(GPU_RESOURCE, 0)
        if not asked:
            return (0, 0)
        topology = topology_of(node) if room is not None and gpus else None
        free_mask = room.free if topology is not None else 0
        return (self._opens_clique_node(node, asked, free_gpus),
                self.increase(free_gpus, asked, topology, free_mask, free_mask & ~mask_of(gpus)))

    def increase(self, free_gpus: int, asked: int, topology: GpuTopology | None = None,
                 mask_before: int = 0, mask_after: int = 0) -> int:
        """How much placing ``asked`` GPUs on a node with ``free_gpus``
        free (ids ``mask_before`` of ``topology``, then ``mask_after``)
        raises its fragmentation (negative: lowers it)."""
        key = (id(topology), free_gpus, asked, mask_before, mask_after)
        known = self._increase.get(key)
        if known is None or known[0] is not topology:  # an id reused by a newer topology
            known = self._increase[key] = (topology, fragmentation(free_gpus - asked, self.mix, topology, mask_after)
                                           - fragmentation(free_gpus, self.mix, topology, mask_before))
        return known[1]

    def _opens_clique_node(self, node: NodeInfo, asked: int, free_gpus: int) -> int:
        """1 when a pod asking part of the node would be the first on a
        clique node that a waiting whole-node pod could take."""
        node_gpus = node.allocatable.get(GPU_RESOURCE, 0)
        return int(GPU_CLIQUE_LABEL in node.labels and asked < node_gpus <= self.whole_node_ask
                   and free_gpus >= node_gpus)


@dataclass
class _SettledMix:
    """The mix of the last cycle, which the next one settles from (hysteresis)."""

    mix: Mix | None = None


def node_choice(cluster: ClusterState, config: CoreConfig) -> NodeChoice | None:
    """This cycle's ``NodeChoice``; None when it would weigh nothing
    (best fit alone, as configured or for want of shapes or cliques)."""
    mix: Mix = ()
    if config.fragmentation_aware:
        kept = cluster.kept(_SettledMix)
        mix = kept.mix = settled_mix(cluster.gpu_asks, kept.mix)
    whole_node_ask = 0
    if config.keep_cliques_whole and cluster.clique_node_gpus:
        # Only which clique nodes a waiting pod could take whole matters: the
        # largest such size, so the kept index is rebuilt only when it changes
        # (not whenever the largest ask does: 9, 16 or 999 GPUs protect as 8 does).
        asked = max(cluster.pending_gpu_asks, default=0)
        whole_node_ask = max((gpus for gpus in cluster.clique_node_gpus if gpus <= asked), default=0)
    return NodeChoice(mix, whole_node_ask) if mix or whole_node_ask else None
