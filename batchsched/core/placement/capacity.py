"""A per-cycle index of free capacity, so that planning a gang costs about
O(pods x log nodes) instead of a scan of every node per pod shape.

``CapacityIndex`` owns the running free map of one cycle.  For each pod shape
(equal requests and placement constraints) it keeps a ``ShapeView``: a heap
of the statically feasible nodes that fit the shape, best first by
``pack_score``, plus per-reason counts of the nodes that do not fit, for
explanations.  Both are built once per shape per cycle and updated only for
the nodes a committed plan changed.  Heap entries carry the node's version;
an entry whose node changed since it was pushed is stale and skipped.
While a view is built, nodes of one kind (``node_kind``: a fleet's alike
machines) with equal free amounts of what the shape asks and equal GPU rooms
are filed once, each taking its own tiebreak.

A planning attempt works on top of the index without changing it: entries it
pops are stashed and put back afterwards (``ShapeView.restore``), and the
free resources it takes are applied only by ``CapacityIndex.commit``.

GPU pods also get GPU ids (``gpus.pick_gpus``): beside the free map the index
keeps each node's ``GpuRoom`` (free ids, NUMA cpu and memory), and a node
fits a shape only if a GPU set satisfying the gang's topology policy is
free there.  Views are per (shape, policy), and their scores put that set's
quality before packing.  With a ``NodeChoice`` (``fragmentation``) the
score weighs, between the two, the fragmentation a placement adds for the
GPU shapes asked and whether it opens a whole clique node.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Collection, Hashable, Iterable, Mapping

from batchsched.api.constants import GPU_CLIQUE_LABEL, GPU_RESOURCE, TOPOLOGY_MANAGER_POLICY_LABEL
from batchsched.core import resources as res
from batchsched.core.model import NodeInfo, PodInfo, TopologyPolicy
from batchsched.core.cluster import ClusterState
from batchsched.core.placement.fit import (
    REASON_NOT_READY, REASON_RESERVED, REASON_UNSCHEDULABLE, NodeFilter, placement_key, resource_reasons,
    static_reasons,
)
from batchsched.core.placement.fragmentation import NodeChoice
from batchsched.core.placement.gpus import SINGLE_NUMA_NODE, GpuPick, in_dra_terms, pick_gpus, static_reason
from batchsched.core.resources import Resources
from batchsched.core.topology.accounting import GpuRoom, gpu_id_count, room_of, topology_of

Entry = tuple[tuple, str, int]  # (score, node name, node version)
# A view's heap holds at most one live entry per feasible node; past half as
# many superseded ones again (and this many) it is compacted.
HEAP_SLACK = 64
_NOTHING: Resources = {}  # the free map of a node it has no entry for
# Answers of ShapeView.pick kept per view; past this many (GPU rooms
# that vary a lot) they are dropped and kept afresh.
PICKS_KEPT = 4096
# Static reasons a node may lose soon (uncordoned, ready again): its room
# still counts for a gang that could never fit (gang.never_fits).
PASSING_REASONS = frozenset({REASON_UNSCHEDULABLE, REASON_NOT_READY})


def pack_score(node: NodeInfo, request: Mapping[str, int], free: Mapping[str, int]) -> tuple:
    """Lower is better: no GPUs stranded (GPUs left where what is left of
    a resource this pod asks could not go with even one of them at this
    pod's ratio: no pod like it could use them, and in a trace of cpu-heavy
    GPU pods such GPUs sat idle while pods waited), then fewest GPUs left
    after placement (keeping whole nodes free for large gangs), then the
    least of the rest left."""
    asked_gpus = request.get(GPU_RESOURCE, 0)
    gpus_left = free.get(GPU_RESOURCE, 0) - asked_gpus
    rest_left = 0.0
    stranded = 0
    for name, amount in request.items():
        if name != GPU_RESOURCE and name != res.PODS:
            allocatable = node.allocatable.get(name)
            if allocatable:
                rest_left += (free.get(name, 0) - amount) / allocatable
            if asked_gpus and gpus_left > 0 and (free.get(name, 0) - amount) * asked_gpus < amount:
                stranded = gpus_left
    return (stranded, gpus_left, rest_left)


def shape_key(pod: PodInfo) -> tuple:
    """Pods with equal keys are placed alike.  Computed once per pod object
    (frozen: a changed pod is a new object) and kept in ``_SHAPE_KEYS``; a
    gang's pods are asked at each of its attempts."""
    kept = _SHAPE_KEYS.get(pod.uid)
    if kept is not None and kept[0] is pod:
        return kept[1]
    key = (placement_key(pod), tuple(sorted(pod.requests.items())))
    if len(_SHAPE_KEYS) >= SHAPE_KEYS_KEPT:
        _SHAPE_KEYS.clear()
    _SHAPE_KEYS[pod.uid] = (pod, key)
    return key


# Pod uid -> (the pod object, its shape key): the key of a changed pod is
# computed anew, and those of pods gone are dropped at once past
# SHAPE_KEYS_KEPT (each key is then computed once more: amortized O(1)).
_SHAPE_KEYS: dict[str, tuple[PodInfo, tuple]] = {}
SHAPE_KEYS_KEPT = 1 << 17


def node_kind(node: NodeInfo) -> int:
    """What a shape view's filing of a node depends on of the node itself,
    beside its name and DRA devices: a fleet's alike machines are one kind,
    filed once while a view is built for equal free resources
    (``ShapeView._classify``), and once per view when empty
    (``_file_empty``).  Its board goes in by identity (``node.topology``;
    filings kept beyond a build keep the board beside their answers: an id
    outlives its object).  Computed once per node object (frozen: a
    changed node is a new object) and kept in ``_NODE_KINDS``, as
    ``shape_key`` is.

    An int token stands for the kind's facts: the filings' keys hold it
    and are hashed at every node of a build, and a tuple's hash is not
    kept.  Equal facts get one token while ``_KIND_TOKENS`` keeps them; it
    starts over past ``KIND_TOKENS_KEPT`` and a token is never reused, so
    starting over only loses sharing."""
    kept = _NODE_KINDS.get(node.name)
    if kept is not None and kept[0] is node:
        return kept[1]
    facts = (id(node.topology), gpu_id_count(node), tuple(sorted(node.allocatable.items())),
             node.labels.get(TOPOLOGY_MANAGER_POLICY_LABEL), GPU_CLIQUE_LABEL in node.labels, node.gpus_by_dra)
    kind = _KIND_TOKENS.get(facts)
    if kind is None:
        if len(_KIND_TOKENS) >= KIND_TOKENS_KEPT:
            _KIND_TOKENS.clear()
        kind = _KIND_TOKENS[facts] = next(_NEXT_KIND)
    if len(_NODE_KINDS) >= KIND_TOKENS_KEPT:
        _NODE_KINDS.clear()
    _NODE_KINDS[node.name] = (node, kind)
    return kind


# Distinct node kinds kept tokens for: a fleet has a few; nodes whose
# allocatable differs a little each are one kind each.
KIND_TOKENS_KEPT = 65536
_KIND_TOKENS: dict[tuple, int] = {}
_NODE_KINDS: dict[str, tuple[NodeInfo, int]] = {}  # node name -> (the node object, its kind), as _SHAPE_KEYS
_NEXT_KIND = itertools.count()


class ShapeView:
    """Where pods of one shape can go under one topology policy, given the
    index's free map and GPU rooms."""

    def __init__(self, index: CapacityIndex, pod: PodInfo, policy: TopologyPolicy,
                 like: ShapeView | None = None):
        """``like``: a view of the same shape under a policy that differs
        only in preferences (``rdma``), kept current by the same index: where
        pods may go at all is the same, so only the ranking is computed."""
        self._index = index
        self._pod = pod  # stands for its shape in static predicates
        self.request: Resources = dict(pod.requests)
        self.policy = policy
        self.last_used = index.generation
        self.upkeep = 0  # nodes filed anew since it was last handed out (CapacityIndex.drop_idle_views)
        self._wanted = tuple(self.request.items())
        self._asked = tuple(self.request)
        self._aligns_numa = policy.numa == SINGLE_NUMA_NODE
        self._empty_filings: dict[Hashable, tuple] = {}  # node_kind -> (its board, holds, too small)
        self._picks: dict[tuple, tuple] = {}  # _pick_key -> (its topology, pick's answer)
        self._short: dict[str, list[str]] = {}  # feasible node -> resources it lacks
        self._short_counts: Counter = Counter()
        # reason_counts for a reserved set alone, until a node is filed anew:
        # the gangs that fail one after another in a cycle ask it alike
        self._counts_for: tuple[frozenset[str], Counter] | None = None
        self._fits_for: tuple[Collection[str], bool] | None = None  # fits_outside's, kept alike
        self._heap: list[Entry] = []
        self._stash: list[Entry] = []  # popped by the current attempt
        self._dirty: dict[str, None] = {}  # feasible nodes changed since last filed (``refresh``)
        if like is not None:
            self._static: dict[str, str] = dict(like._static)  # node -> why it never fits this shape
            self._static_counts = Counter(like._static_counts)
            self.feasible: set[str] = set(like.feasible)
            # Empty nodes, for gangs that could never fit (gang.never_fits).
            self._holds: dict[str, int] = dict(like._holds)  # node -> how many such pods it holds empty
            self.holds_when_empty = like.holds_when_empty  # their sum
            self._too_small: dict[str, list[str]] = dict(like._too_small)  # node -> what it lacks even empty
            self.too_small_counts = Counter(like.too_small_counts)
            self._empty_filings.update(like._empty_filings)
        else:
            verdict = index.node_filter.evaluate(pod)
            self._static = dict(verdict.rejected)
            self._static_counts = Counter(verdict.rejected.values())
            self.feasible = set()
            self._holds = {}
            self.holds_when_empty = 0
            self._too_small = {}
            self.too_small_counts = Counter()
            self._file_static(verdict)
        # Alike nodes are filed once while the view is built, when most are
        # alike (empty, or full); not kept after: a node filed anew later
        # has mostly been used, and its free amounts differ from the rest's.
        self._classify(self.feasible, filings={})
        heapq.heapify(self._heap)

    def _file_static(self, verdict) -> None:
        """Where pods of this shape may go at all, from the static predicates' ``verdict``."""
        index, pod, policy = self._index, self._pod, self.policy
        self._file_empty([name for name, reason in verdict.rejected.items() if reason in PASSING_REASONS])
        nodes, request, demand, feasible = index.nodes, self.request, pod.device_demand, self.feasible
        for name in verdict.feasible:
            reason = static_reason(nodes[name], request, policy, demand)
            if reason:
                self._static[name] = reason
                self._static_counts[reason] += 1
            else:
                feasible.add(name)
        self._file_empty(feasible)

    def fits(self, free: Mapping[str, int]) -> bool:
        return all(free.get(name, 0) >= amount for name, amount in self._wanted)

    def pick(self, name: str, free: Mapping[str, int], room: GpuRoom | None) -> GpuPick | list[str]:
        """The GPUs a pod of this shape gets on node ``name``, or why it does not fit."""
        node = self._index.nodes[name]
        key = self._pick_key(node, free, room)
        known = self._picks.get(key) if key is not None else None
        if known is not None and known[0] is topology_of(node):
            return known[1]
        if not self.fits(free):
            pick = in_dra_terms(node, resource_reasons(self.request, free), self.request)
        else:
            pick = pick_gpus(node, room, self.request, self.policy, self._pod.device_demand)
            pick = in_dra_terms(node, [pick], self.request) if isinstance(pick, str) else pick
        if key is not None:
            if len(self._picks) >= PICKS_KEPT:
                self._picks.clear()
            self._picks[key] = (topology_of(node), pick)
        return pick

    def _pick_key(self, node: NodeInfo, free: Mapping[str, int], room: GpuRoom | None) -> tuple | None:
        """What ``pick`` depends on, so that nodes alike share one answer:
        the board (its topology, checked by identity on a hit) and Topology
        Manager policy, which of the resources the shape asks are short
        (what it says when the pod does not fit), and, when it fits, the
        free GPU ids, with the NUMA room where single-numa-node alignment
        applies (``GpuRoom.key``).  Not the free amounts themselves: in a
        real cluster they differ from node to node while the answer does
        not.  None (not kept) where DRA or the pod's claims are involved:
        the answer depends on the node's devices then."""
        if node.dra is not None or self._pod.device_demand is not None:
            return None
        policy_label = node.labels.get(TOPOLOGY_MANAGER_POLICY_LABEL)
        short = tuple([resource for resource, amount in self._wanted if free.get(resource, 0) < amount])
        if short or room is None:
            gpus = None
        elif SINGLE_NUMA_NODE in (self.policy.numa, policy_label):
            gpus = room.key
        else:
            gpus = room.free
        return (id(topology_of(node)), policy_label, short, gpus)

    def score(self, name: str, free: Mapping[str, int], pick: GpuPick, room: GpuRoom | None) -> tuple:
        """Node ``name``'s score for a pod of this shape taking ``pick``
        there, where ``free`` and ``room`` are left now."""
        return self._merit(self._index.nodes[name], free, pick, room) + self._index.tiebreak.get(name, ())

    def _merit(self, node: NodeInfo, free: Mapping[str, int], pick: GpuPick, room: GpuRoom | None) -> tuple:
        """``score`` less the node's tiebreak: what nodes alike share."""
        choice = self._index.choice
        chosen = choice.score(node, self.request, free, room, pick.gpus) if choice is not None else ()
        return pick.quality + chosen + pack_score(node, self.request, free)

    def peek(self, *unusable: Collection[str]) -> Entry | None:
        """The best node that fits the index's free map and is in none of ``unusable``."""
        if self._dirty:
            self.settle()
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

    def fits_outside(self, reserved: Collection[str]) -> bool:
        """Whether a node outside ``reserved`` fits a pod of this shape now.
        Kept for one reserved set until a node is filed anew: the gangs
        woken in a cycle ask it one after another of the same few views
        (``places_none``), and each look pops the reserved nodes' entries."""
        self.settle()
        kept = self._fits_for
        if kept is not None and (kept[0] is reserved or kept[0] == reserved):
            return kept[1]
        try:
            fits = self.peek(reserved) is not None
        finally:
            self.restore()
        self._fits_for = (reserved, fits)
        return fits

    def pop(self) -> Entry:
        entry = heapq.heappop(self._heap)
        self._stash.append(entry)
        return entry

    def reason_counts(self, reserved: Collection[str], taken: Mapping[str, Mapping[str, int]],
                      rooms: Mapping[str, GpuRoom]) -> Counter:
        """Per-reason node counts for a pod of this shape, with ``reserved``
        nodes off-limits and ``taken`` and ``rooms`` overriding the index's.
        ``reserved`` may map each node to why it is off-limits (default: a
        reservation)."""
        self.settle()
        kept = self._counts_for
        if not taken and kept is not None and kept[0] == reserved:
            return Counter(kept[1])
        counts = self._static_counts + self._short_counts
        why = reserved.get if isinstance(reserved, Mapping) else lambda name, default: default
        for name in self.feasible.intersection(reserved):
            counts.subtract(self._short.get(name, ()))
            counts[why(name, REASON_RESERVED)] += 1
        for name, free in taken.items():
            if name in self.feasible and name not in reserved:
                counts.subtract(self._short.get(name, ()))
                pick = self.pick(name, free, rooms.get(name, self._index.rooms.get(name)))
                if isinstance(pick, list):
                    counts.update(pick)
        counts = +counts  # drops the zero counts
        if not taken and isinstance(reserved, frozenset):
            self._counts_for = (reserved, Counter(counts))
        return counts

    def never_counts(self) -> Counter:
        """Per-reason counts of the nodes that could not hold a pod of this
        shape even empty (every node when ``holds_when_empty`` is 0), each
        node once."""
        counts = self._static_counts + self.too_small_counts
        for name in self._holds.keys() & self._static.keys():  # counted as too small
            counts[self._static[name]] -= 1
        return +counts

    def _file_empty(self, names: Iterable[str]) -> None:
        """Note how many pods of this shape each node of ``names`` holds empty."""
        index, by_node = self._index, self._pod.device_demand is not None
        nodes, rooms, filings = index.nodes, index.rooms, self._empty_filings
        holds_of, too_small_of, added = self._holds, self._too_small, 0
        lacking: dict[int, list] = {}  # id(reasons) -> [reasons, nodes lacking them]: a kind's share a list
        for name in names:
            node = nodes[name]
            has_room = name in rooms
            if by_node or node.dra is not None:  # devices and claims differ per node
                holds, too_small = self._when_empty(node, has_room)
            else:
                kind = (node_kind(node), has_room)
                known = filings.get(kind)
                if known is None or known[0] is not node.topology:
                    known = filings[kind] = (node.topology, *self._when_empty(node, has_room))
                _, holds, too_small = known
            holds_of[name] = holds
            added += holds
            if too_small:
                too_small_of[name] = too_small
                _tally(lacking, too_small)
        self.holds_when_empty += added
        _count_tallies(self.too_small_counts, lacking)

    def _when_empty(self, node: NodeInfo, has_room: bool) -> tuple[int, list[str]]:
        """How many pods of this shape ``node`` holds empty, and what it
        lacks when none (its resources, or a GPU set the policy accepts
        even with all its GPUs free, where ``has_room``: its GPUs have ids)."""
        holds = min((node.allocatable.get(k, 0) // v for k, v in self._wanted if v > 0), default=0)
        too_small = [] if holds else resource_reasons(self.request, node.allocatable)
        if holds and self.request.get(GPU_RESOURCE, 0) and has_room:
            pick = pick_gpus(node, room_of(node, ()), self.request, self.policy, self._pod.device_demand)
            if isinstance(pick, str):
                holds, too_small = 0, [pick]
        return holds, too_small

    def _unfile_empty(self, name: str) -> None:
        self.holds_when_empty -= self._holds.pop(name, 0)
        self.too_small_counts.subtract(self._too_small.pop(name, ()))

    def _classify(self, names: Iterable[str], filings: dict[tuple, tuple] | None = None) -> None:
        """File feasible nodes as fitting (heap) or short (reasons).  With
        ``filings`` (a view's build: heap entries are appended, for one
        heapify), nodes alike file once: those of one kind (``node_kind``)
        with equal free amounts of what the shape asks and an equal GPU room
        as ``pick`` reads it (free ids, or the NUMA room where
        single-numa-node applies) share (pick, score less tiebreak); not
        where DRA or the pod's claims are involved (as ``_pick_key``).
        Within one build every node keyed by its board's id is alive."""
        self._counts_for = self._fits_for = None
        index = self._index
        nodes, free_of, rooms, tiebreak, versions = index.nodes, index.free, index.rooms, index.tiebreak, index.versions
        short_of, heap, asked = self._short, self._heap, self._asked
        alike = filings is not None and self._pod.device_demand is None
        aligns = self._aligns_numa
        shorts: dict[int, list] = {}  # id(reasons) -> [reasons, nodes short of them]: alike nodes share a list
        for name in names:
            short = short_of.pop(name, None)
            if short:
                self._short_counts.subtract(short)
            node, free, room = nodes[name], free_of.get(name, _NOTHING), rooms.get(name)
            key = known = None
            if alike and node.dra is None:
                if room is None:
                    gpus = None
                elif aligns or node.labels.get(TOPOLOGY_MANAGER_POLICY_LABEL) == SINGLE_NUMA_NODE:
                    gpus = room.key
                else:
                    gpus = room.free
                # (an absent resource keys as None, apart from a 0: less sharing only)
                key = (node_kind(node), tuple(map(free.get, asked)), gpus)
                known = filings.get(key)
            if known is None:
                pick = self.pick(name, free, room)
                known = (pick, self._merit(node, free, pick, room) if isinstance(pick, GpuPick) else None)
                if key is not None:
                    filings[key] = known
            pick, merit = known
            if merit is not None:
                entry = (merit + tiebreak.get(name, ()), name, versions.get(name, 0))
                if filings is None:
                    heapq.heappush(heap, entry)
                else:
                    heap.append(entry)
            else:
                short_of[name] = pick
                _tally(shorts, pick)
        _count_tallies(self._short_counts, shorts)
        if len(heap) > len(self.feasible) * 3 // 2 + HEAP_SLACK:
            self._compact()

    def _compact(self) -> None:
        """Drop the heap's superseded entries.  Each node filed anew leaves
        one behind, and ``peek`` skips only those that come up: a view kept
        idle while nodes change (the reservation's) held four for each live
        one, and its next use popped them all, ~7,000 in one cycle."""
        versions = self._index.versions
        self._heap[:] = [entry for entry in self._heap if entry[2] == versions.get(entry[1], 0)]
        heapq.heapify(self._heap)

    def refresh(self, name: str) -> None:
        """Node ``name`` changed in the index's free map: filed anew when the
        view is next read (``settle``)."""
        self.upkeep += 1
        if name in self.feasible:
            self._dirty[name] = None

    def settle(self) -> None:
        """File the nodes changed since the view was last read.  A burst's
        plans change a node several times between two reads of a view (half
        the filings in one run were of a node filed since), and a view
        unused for a while is filed when read, not at each change."""
        if self._dirty:
            names = list(self._dirty)
            self._dirty.clear()
            self._classify(names)

    def node_changed(self, name: str) -> None:
        """Node ``name`` was added, removed or replaced in the index's nodes
        (its version already bumped, so its old heap entries are stale)."""
        self.upkeep += 1
        self._counts_for = self._fits_for = None
        self._dirty.pop(name, None)
        reason = self._static.pop(name, None)
        if reason is not None:
            self._static_counts[reason] -= 1
        self.feasible.discard(name)
        self._unfile_empty(name)
        short = self._short.pop(name, None)
        if short:
            self._short_counts.subtract(short)
        node = self._index.nodes.get(name)
        if node is None:
            return
        reasons = static_reasons(self._pod, node)
        reason = reasons[0] if reasons else static_reason(node, self.request, self.policy, self._pod.device_demand)
        if not reason or reason in PASSING_REASONS:
            self._file_empty((name,))
        if reason:
            self._static[name] = reason
            self._static_counts[reason] += 1
        else:
            self.feasible.add(name)
            self._classify((name,))

    def restore(self) -> None:
        """Put back what the last attempt popped and is still current."""
        versions = self._index.versions
        for entry in self._stash:
            if entry[2] == versions.get(entry[1], 0):
                heapq.heappush(self._heap, entry)
        self._stash.clear()


def _tally(tallies: dict[int, list], reasons: list[str]) -> None:
    """Count one more node for ``reasons``, a list nodes filed alike share
    (kept alive by the caller while it tallies)."""
    tally = tallies.get(id(reasons))
    if tally is None:
        tallies[id(reasons)] = [reasons, 1]
    else:
        tally[1] += 1


def _count_tallies(counts: Counter, tallies: dict[int, list]) -> None:
    for reasons, nodes in tallies.values():
        for reason in reasons:
            counts[reason] += nodes


class CapacityIndex:
    """A running free map and the shape views over it.

    ``free`` maps every node name to its free resources and ``rooms`` the
    nodes whose GPUs have ids to their ``GpuRoom``; ``commit`` updates both
    (entries are replaced, never changed in place, so they may be shared).
    Without ``rooms`` no GPU ids are tracked or chosen.  ``tiebreak`` ranks
    nodes that score the same (lower first) before their names do.
    ``choice`` adds fragmentation and clique terms to node scores (None:
    set quality, then best fit).

    An index over fixed inputs (the reservation's "as if drained" picture)
    is built and dropped within a cycle; the cluster's own index lives
    across cycles (``cluster_capacity``) and is brought up to date from the
    nodes that changed.
    """

    def __init__(self, nodes: Mapping[str, NodeInfo], free: dict[str, Resources],
                 node_filter: NodeFilter | None = None, tiebreak: Mapping[str, tuple] | None = None,
                 rooms: dict[str, GpuRoom] | None = None, choice: NodeChoice | None = None):
        self.nodes = nodes
        self.choice = choice
        self.free = free
        self.rooms = rooms if rooms is not None else {}
        self.node_filter = node_filter or NodeFilter(nodes)
        self.tiebreak = dict(tiebreak or {})
        self.versions: dict[str, int] = {}  # bumped whenever a node's entry changes; kept for gone nodes
        self.generation = 0  # syncs so far (see cluster_capacity)
        self.committed: set[str] = set()  # nodes ``commit`` changed since the last sync
        # While a statement is open (cycle.statement): each node's entry
        # before its first commit since, for ``rollback``.
        self.undo: dict[str, tuple[Resources, GpuRoom | None]] | None = None
        self._views: dict[tuple, ShapeView] = {}

    def view(self, pod: PodInfo, policy: TopologyPolicy = TopologyPolicy()) -> ShapeView:
        key = (shape_key(pod), policy)
        view = self._views.get(key)
        if view is None:
            like = self._views.get((key[0], dataclasses.replace(policy, rdma=not policy.rdma)))
            view = self._views[key] = ShapeView(self, pod, policy, like)
        view.last_used, view.upkeep = self.generation, 0
        view.settle()
        return view

    def commit(self, taken: Mapping[str, Resources], rooms: Mapping[str, GpuRoom] | None = None) -> None:
        """Apply a plan: ``taken`` maps each node it uses to its free
        resources after, ``rooms`` to its GPU room after."""
        if self.undo is not None:
            for name in taken:
                if name not in self.undo:
                    self.undo[name] = (self.free[name], self.rooms.get(name))
        self.free.update(taken)
        self.rooms.update(rooms or {})
        self.committed.update(taken)
        for name in taken:
            self.versions[name] = self.versions.get(name, 0) + 1
            for view in self._views.values():
                view.refresh(name)

    def rollback(self) -> None:
        """Put back every entry committed since ``undo`` was opened, and close it."""
        undo, self.undo = self.undo, None
        if undo:
            self.commit({name: free for name, (free, _) in undo.items()},
                        {name: room for name, (_, room) in undo.items() if room is not None})

    def reset_node(self, name: str, free: Resources, room: GpuRoom | None, tiebreak: tuple,
                   replaced: bool) -> None:
        """Node ``name`` now has ``free``, ``room`` and ``tiebreak``;
        ``replaced``: the node object itself was added, removed or replaced
        in ``nodes``."""
        if (not replaced and self.free.get(name) == free and self.rooms.get(name) == room
                and self.tiebreak.get(name, ()) == tiebreak):
            return
        if name in self.nodes:
            self.free[name] = free
        else:
            self.free.pop(name, None)
        if room is None:
            self.rooms.pop(name, None)
        else:
            self.rooms[name] = room
        if tiebreak:
            self.tiebreak[name] = tiebreak
        else:
            self.tiebreak.pop(name, None)
        self.versions[name] = self.versions.get(name, 0) + 1
        for view in self._views.values():
            if replaced:
                view.node_changed(name)
            else:
                view.refresh(name)

    def drop_idle_views(self, kept_rebuilds: int = 0) -> None:
        """Drop the views unused for ``VIEW_IDLE_SYNCS`` syncs but those
        whose upkeep since is below ``kept_rebuilds`` rebuilds' worth (a
        filing per node each), unused for at most ``VIEW_KEPT_SYNCS``, and
        among the ``IDLE_VIEWS_KEPT`` most lately used of them."""
        generation, views = self.generation, self._views
        idle = [k for k, v in views.items() if v.last_used < generation - VIEW_IDLE_SYNCS]
        upkeep = kept_rebuilds * len(self.nodes)
        cheap = [k for k in idle if views[k].upkeep < upkeep and views[k].last_used >= generation - VIEW_KEPT_SYNCS]
        kept = sorted(cheap, key=lambda k: views[k].last_used, reverse=True)[:IDLE_VIEWS_KEPT]
        for key in set(idle).difference(kept):
            del views[key]


# A live view costs a filing for every node that changes, a dropped one a
# rebuild over all nodes when asked again, in one cycle.  Syncs a view may
# go unused before it may be dropped.  An index of few views, asked of by
# turns (the reservation's: heads of a few shapes take turns holding it,
# each for a while), keeps an unused one on while its upkeep since its last
# use is below ``kept_index``'s ``kept_rebuilds`` rebuilds' worth (upkeep
# spread over cycles is kinder to the slowest cycles than a rebuild in
# one), up to VIEW_KEPT_SYNCS, and at most IDLE_VIEWS_KEPT of them.  Not the
# cluster's index: a workload of many shapes keeps many views there, and
# each costs a filing for every node that changes.
VIEW_IDLE_SYNCS = 32
VIEW_KEPT_SYNCS = 4096
IDLE_VIEWS_KEPT = 64


# A node's entry in a kept index: its free resources, GPU room (None: none)
# and tiebreak (() when none).
NodeEntry = tuple[Resources, GpuRoom | None, tuple]


def cluster_capacity(cluster: ClusterState, withheld: Mapping[str, Resources],
                     choice: NodeChoice | None = None) -> CapacityIndex:
    """The cluster's capacity index for this cycle: every node's free
    resources less ``withheld``, and its GPU room (see ``kept_index``),
    scored with ``choice`` (a new choice rebuilds it)."""
    kept = cluster.kept(_ClusterIndex)
    withheld_before, kept.withheld = kept.withheld, dict(withheld)
    return kept_index(cluster, kept, choice,
                      lambda name: (_less(cluster.free(name), withheld.get(name)), cluster.room(name), ()),
                      also_changed=withheld_before.keys() | withheld.keys(), choice=choice)


@dataclass
class KeptIndex:
    """Where ``kept_index`` keeps an index across cycles (a subclass per
    index, in ``ClusterState.kept``): the key it was built for and the
    cluster's change clock when it was last brought up to date."""

    key: Hashable = None
    index: CapacityIndex | None = None
    mark: int = 0

    def forget(self) -> None:
        """Rebuild at the next use (after a failure that may have left it half updated)."""
        self.index = None


@dataclass
class _ClusterIndex(KeptIndex):
    """The cluster's own index (``cluster_capacity``) and the room it withheld."""

    withheld: dict[str, Resources] = field(default_factory=dict)


def kept_index(cluster: ClusterState, kept: KeptIndex, key: Hashable, entry: Callable[[str], NodeEntry],
               also_changed: Collection[str] = (), choice: NodeChoice | None = None,
               kept_rebuilds: int = 0) -> CapacityIndex:
    """A capacity index over the cluster's nodes, ``entry(name)`` giving
    each node's free resources, room and tiebreak, scored with ``choice``
    (which ``key`` must determine); unused views are dropped as
    ``CapacityIndex.drop_idle_views(kept_rebuilds)`` says.

    Kept in ``kept`` across cycles while ``key`` is the
    same; each call resets only the nodes whose entry may differ from the
    last call's: those the cluster changed since, those plans committed to
    the index, and ``also_changed`` (``entry`` must depend on nothing else
    that changes under the same key).  So its shape views (heaps and
    reasons) are updated, not rebuilt, and a cycle costs what changed.  The
    result is the index a fresh build would give: each node's entries depend
    only on its node object and its entry.
    """
    if kept.index is None or kept.key != key:
        seen: dict[str, NodeInfo] = dict(cluster.nodes)
        free, rooms, tiebreak = {}, {}, {}
        for name in seen:
            free[name], room, tie = entry(name)
            if room is not None:
                rooms[name] = room
            if tie:
                tiebreak[name] = tie
        index = CapacityIndex(seen, free, NodeFilter(seen), tiebreak=tiebreak, rooms=rooms, choice=choice)
    else:
        index = kept.index
        changed = set(cluster.changed_since(kept.mark))
        changed.update(index.committed, also_changed)
        index.committed = set()
        nodes = index.nodes  # the index's own copy: it tells which node objects it has seen
        replaced = False
        for name in changed:
            node, was = cluster.nodes.get(name), nodes.get(name)
            if node is None and was is None:
                continue  # a node name pods were bound to, never a node
            if node is None:
                del nodes[name]
                index.reset_node(name, {}, None, (), replaced=True)
            else:
                nodes[name] = node
                index.reset_node(name, *entry(name), replaced=was is not node)
            replaced |= was is not node
        if replaced:
            index.node_filter.nodes_changed()
        index.generation += 1
        index.drop_idle_views(kept_rebuilds)
    kept.key, kept.index, kept.mark = key, index, cluster.mark
    return index


def _less(free: Resources, withheld: Resources | None) -> Resources:
    return res.subtract(free, withheld) if withheld else free
