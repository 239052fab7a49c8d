"""A per-cycle index of free capacity, so that planning a gang costs about
O(pods x log nodes) instead of a scan of every node per pod shape.

``CapacityIndex`` owns the running free map of one cycle.  For each pod shape
(equal requests and placement constraints) it keeps a ``ShapeView``: a heap
of the statically feasible nodes that fit the shape, best first by
``pack_score``, plus per-reason counts of the nodes that do not fit, for
explanations.  Both are built once per shape per cycle and updated only for
the nodes a committed plan changed.  Heap entries carry the node's version;
an entry whose node changed since it was pushed is stale and skipped.

A planning attempt works on top of the index without changing it: entries it
pops are stashed and put back afterwards (``ShapeView.restore``), and the
free resources it takes are applied only by ``CapacityIndex.commit``.

GPU pods also get GPU ids (``gpus.pick_gpus``): beside the free map the index
keeps each node's ``GpuRoom`` (free ids, NUMA cpu and memory), and a node
fits a shape only if a GPU set satisfying the gang's topology policy is
free there.  Views are per (shape, policy), and their scores put that set's
quality before packing.
"""
from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from typing import Collection, Mapping

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core import resources as res
from batchsched.core.model import NodeInfo, PodInfo, TopologyPolicy
from batchsched.core.placement.fit import REASON_RESERVED, NodeFilter, placement_key, resource_reasons
from batchsched.core.placement.gpus import GpuPick, pick_gpus, static_reason
from batchsched.core.resources import Resources
from batchsched.core.topology.accounting import GpuRoom

Entry = tuple[tuple, str, int]  # (score, node name, node version)


def pack_score(node: NodeInfo, request: Mapping[str, int], free: Mapping[str, int]) -> tuple:
    """Lower is better: fewest GPUs left after placement (keeping whole
    nodes free for large gangs), then the least of the rest left."""
    gpus_left = free.get(GPU_RESOURCE, 0) - request.get(GPU_RESOURCE, 0)
    rest_left = 0.0
    for name, amount in request.items():
        if name != GPU_RESOURCE and name != res.PODS:
            allocatable = node.allocatable.get(name)
            if allocatable:
                rest_left += (free.get(name, 0) - amount) / allocatable
    return (gpus_left, rest_left)


def shape_key(pod: PodInfo) -> tuple:
    return (placement_key(pod), tuple(sorted(pod.requests.items())))


# (request items in order, policy) -> node name -> (node, room, free, tiebreak,
# score or reasons): what ``ShapeView._classify`` last found for that node,
# reused -- in later views and later cycles -- while the node and its room
# are the same objects and its free resources and tiebreak are equal.  The
# outcome is a function of exactly those (and the request and policy of the
# key), so reuse changes no decision; rooms are immutable, and the free map is
# copied.  The shapes least recently used are dropped beyond _MEMO_SHAPES.
_MEMO: OrderedDict[tuple, dict[str, tuple]] = OrderedDict()
_MEMO_SHAPES = 16


def _outcomes(wanted: tuple, policy: TopologyPolicy) -> dict[str, tuple]:
    key = (wanted, policy)
    memo = _MEMO.get(key)
    if memo is None:
        memo = _MEMO[key] = {}
        while len(_MEMO) > _MEMO_SHAPES:
            _MEMO.popitem(last=False)
    else:
        _MEMO.move_to_end(key)
    return memo


class ShapeView:
    """Where pods of one shape can go under one topology policy, given the
    index's free map and GPU rooms."""

    def __init__(self, index: CapacityIndex, pod: PodInfo, policy: TopologyPolicy):
        self._index = index
        self.request: Resources = dict(pod.requests)
        self.policy = policy
        self._wanted = tuple(self.request.items())
        verdict = index.node_filter.evaluate(pod)
        self._static_counts = Counter(verdict.rejected.values())
        feasible = []
        for name in verdict.feasible:
            reason = static_reason(index.nodes[name], self.request, policy)
            if reason:
                self._static_counts[reason] += 1
            else:
                feasible.append(name)
        self.feasible = frozenset(feasible)
        self._short: dict[str, list[str]] = {}  # feasible node -> resources it lacks
        self._short_counts: Counter = Counter()
        self._heap: list[Entry] = []
        self._stash: list[Entry] = []  # popped by the current attempt
        self._memo = _outcomes(self._wanted, policy)
        for name in self.feasible:
            self._classify(name, push=False)
        heapq.heapify(self._heap)

    def fits(self, free: Mapping[str, int]) -> bool:
        return all(free.get(name, 0) >= amount for name, amount in self._wanted)

    def pick(self, name: str, free: Mapping[str, int], room: GpuRoom | None) -> GpuPick | list[str]:
        """The GPUs a pod of this shape gets on node ``name``, or why it does not fit."""
        if not self.fits(free):
            return resource_reasons(self.request, free)
        pick = pick_gpus(self._index.nodes[name], room, self.request, self.policy)
        return [pick] if isinstance(pick, str) else pick

    def score(self, name: str, free: Mapping[str, int], pick: GpuPick) -> tuple:
        return (pick.quality + pack_score(self._index.nodes[name], self.request, free)
                + self._index.tiebreak.get(name, ()))

    def peek(self, *unusable: Collection[str]) -> Entry | None:
        """The best node that fits the index's free map and is in none of ``unusable``."""
        heap, versions = self._heap, self._index.versions
        while heap:
            entry = heap[0]
            if entry[2] != versions.get(entry[1], 0):
                heapq.heappop(heap)  # superseded by a newer entry for that node
            elif any(entry[1] in names for names in unusable):
                self._stash.append(heapq.heappop(heap))
            else:
                return entry
        return None

    def pop(self) -> Entry:
        entry = heapq.heappop(self._heap)
        self._stash.append(entry)
        return entry

    def reason_counts(self, reserved: Collection[str], taken: Mapping[str, Mapping[str, int]],
                      rooms: Mapping[str, GpuRoom]) -> Counter:
        """Per-reason node counts for a pod of this shape, with ``reserved``
        nodes off-limits and ``taken`` and ``rooms`` overriding the index's."""
        counts = self._static_counts + self._short_counts
        for name in self.feasible.intersection(reserved):
            counts.subtract(self._short.get(name, ()))
            counts[REASON_RESERVED] += 1
        for name, free in taken.items():
            if name in self.feasible and name not in reserved:
                counts.subtract(self._short.get(name, ()))
                pick = self.pick(name, free, rooms.get(name, self._index.rooms.get(name)))
                if isinstance(pick, list):
                    counts.update(pick)
        return +counts  # drops the zero counts

    def _classify(self, name: str, push: bool = True) -> None:
        """File a feasible node as fitting (heap) or short (reasons)."""
        short = self._short.pop(name, None)
        if short:
            self._short_counts.subtract(short)
        index = self._index
        free = index.free.get(name, {})
        node, room, tiebreak = index.nodes[name], index.rooms.get(name), index.tiebreak.get(name, ())
        memo = self._memo.get(name)
        if (memo is not None and memo[0] is node and memo[1] is room and memo[2] == free
                and memo[3] == tiebreak):
            outcome = memo[4]
        else:
            pick = self.pick(name, free, room)
            outcome = self.score(name, free, pick) if isinstance(pick, GpuPick) else pick
            self._memo[name] = (node, room, dict(free), tiebreak, outcome)
        if type(outcome) is tuple:  # the score (else a list of reasons)
            entry = (outcome, name, index.versions.get(name, 0))
            if push:
                heapq.heappush(self._heap, entry)
            else:
                self._heap.append(entry)
        else:
            self._short[name] = outcome
            self._short_counts.update(outcome)

    def refresh(self, name: str) -> None:
        """Node ``name`` changed in the index's free map."""
        if name in self.feasible:
            self._classify(name)

    def restore(self) -> None:
        """Put back what the last attempt popped and is still current."""
        versions = self._index.versions
        for entry in self._stash:
            if entry[2] == versions.get(entry[1], 0):
                heapq.heappush(self._heap, entry)
        self._stash.clear()


class CapacityIndex:
    """The running free map of one cycle and the shape views over it.

    ``free`` maps every node name to its free resources and ``rooms`` the
    nodes whose GPUs have ids to their ``GpuRoom``; ``commit`` updates both
    in place.  Without ``rooms`` no GPU ids are tracked or chosen.
    ``tiebreak`` ranks nodes that score the same (lower first) before their
    names do.  Build a new index whenever nodes change.
    """

    def __init__(self, nodes: Mapping[str, NodeInfo], free: dict[str, Resources],
                 node_filter: NodeFilter | None = None, tiebreak: Mapping[str, tuple] | None = None,
                 rooms: dict[str, GpuRoom] | None = None):
        self.nodes = nodes
        self.free = free
        self.rooms = rooms if rooms is not None else {}
        self.node_filter = node_filter or NodeFilter(nodes)
        self.tiebreak = tiebreak or {}
        self.versions: dict[str, int] = {}
        self._views: dict[tuple, ShapeView] = {}

    def view(self, pod: PodInfo, policy: TopologyPolicy = TopologyPolicy()) -> ShapeView:
        key = (shape_key(pod), policy)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = ShapeView(self, pod, policy)
        return view

    def commit(self, taken: Mapping[str, Resources], rooms: Mapping[str, GpuRoom] | None = None) -> None:
        """Apply a plan: ``taken`` maps each node it uses to its free
        resources after, ``rooms`` to its GPU room after."""
        self.free.update(taken)
        self.rooms.update(rooms or {})
        for name in taken:
            self.versions[name] = self.versions.get(name, 0) + 1
            for view in self._views.values():
                view.refresh(name)
