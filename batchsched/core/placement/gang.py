"""All-or-nothing placement of one gang.

``plan_gang`` places a gang's pending pods against a map of free resources
and either returns a plan with at least ``need`` pods (adding further members
when they fit) or a failure explaining, kube-scheduler style, why the first
pod that fitted nowhere did not fit.

Heuristic: identical pods are grouped into shapes (equal requests and
placement constraints), so the static filter runs once per shape and the
candidate nodes are scored once per shape, kept in a heap, and rescored only
where a pod was placed.  Shapes go largest first (GPU, then cpu, then
memory); each pod takes the node it fills most tightly -- fewest GPUs left,
then least other resources left, then node name -- so whole nodes stay free
for large gangs.  When that fails, up to two other orders are tried (see
``_retry_strategies``) before giving up.

The free map is only written when a plan is returned, and never so that any
resource on any node goes below what it was asked to cover.
"""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Mapping, Sequence

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core import resources as res
from batchsched.core.model import NodeInfo, PodInfo
from batchsched.core.placement.fit import NodeFilter, placement_key, resource_reasons
from batchsched.core.resources import Resources

REASON_RESERVED = "node(s) were reserved for a waiting gang"

# (node, request, free before placing) -> sort key; lower is better.
Score = Callable[[NodeInfo, Resources, Mapping[str, int]], tuple]


@dataclass(frozen=True)
class Assignment:
    pod: PodInfo
    node_name: str


@dataclass(frozen=True)
class GangPlan:
    assignments: tuple[Assignment, ...]
    unplaced: tuple[PodInfo, ...] = ()  # members beyond `need` that fit nowhere
    unplaced_message: str = ""  # why the first of them fits nowhere


@dataclass(frozen=True)
class PlanFailure:
    need: int
    placed: int  # the most pods any attempt placed at once
    reason_counts: Mapping[str, int]  # for the first pod that fitted nowhere
    message: str


def explain(reason_counts: Mapping[str, int], total_nodes: int) -> str:
    """kube-scheduler's "0/N nodes are available: ..." sentence."""
    ranked = sorted(reason_counts.items(), key=lambda item: (-item[1], item[0]))
    if not ranked:
        return f"0/{total_nodes} nodes are available."
    return f"0/{total_nodes} nodes are available: " + ", ".join(f"{n} {r}" for r, n in ranked) + "."


def pack_score(node: NodeInfo, request: Resources, free: Mapping[str, int]) -> tuple:
    """Fewest GPUs left after placement, then the least of the rest left."""
    gpus_left = free.get(GPU_RESOURCE, 0) - request.get(GPU_RESOURCE, 0)
    rest_left = sum(
        (free.get(name, 0) - amount) / node.allocatable[name]
        for name, amount in request.items()
        if name not in (GPU_RESOURCE, res.PODS) and node.allocatable.get(name)
    )
    return (gpus_left, rest_left)


def spread_score(node: NodeInfo, request: Resources, free: Mapping[str, int]) -> tuple:
    """Most of the requested resources left after placement."""
    return (-sum(
        (free.get(name, 0) - amount) / node.allocatable[name]
        for name, amount in request.items()
        if name != res.PODS and node.allocatable.get(name)
    ),)


@dataclass
class _Shape:
    """Pods with equal requests and placement constraints."""

    request: Resources
    pods: list[PodInfo]

    def size(self) -> tuple[int, int, int]:
        r = self.request
        return (r.get(GPU_RESOURCE, 0), r.get(res.CPU, 0), r.get(res.MEMORY, 0))


def _shapes(pods: Iterable[PodInfo]) -> list[_Shape]:
    by_key: dict[tuple, _Shape] = {}
    for pod in sorted(pods, key=lambda p: (p.created, p.name, p.uid)):
        key = (placement_key(pod), tuple(sorted(pod.requests.items())))
        shape = by_key.get(key)
        if shape is None:
            by_key[key] = _Shape(dict(pod.requests), [pod])
        else:
            shape.pods.append(pod)
    return list(by_key.values())


def _largest_first(shapes: list[_Shape]) -> list[_Shape]:
    # the first pod's name breaks ties so the order never depends on dict order
    return sorted(shapes, key=lambda s: (tuple(-x for x in s.size()), s.pods[0].name))


def _smallest_first(shapes: list[_Shape]) -> list[_Shape]:
    return sorted(shapes, key=lambda s: (s.size(), s.pods[0].name))


@dataclass
class _Attempt:
    placed: list[Assignment] = field(default_factory=list)
    unplaced: list[PodInfo] = field(default_factory=list)
    taken: dict[str, Resources] = field(default_factory=dict)  # node -> free after this attempt
    failure_counts: Counter | None = None  # reasons for the first pod that fitted nowhere


class _Planner:
    def __init__(self, nodes: Mapping[str, NodeInfo], free: Mapping[str, Resources],
                 reserved: Collection[str], node_filter: NodeFilter):
        self.nodes = nodes
        self.free = free
        self.reserved = reserved
        self.node_filter = node_filter

    def attempt(self, shapes: Sequence[_Shape], score: Score) -> _Attempt:
        trial = _Attempt()

        def free_on(name: str) -> Mapping[str, int]:
            return trial.taken[name] if name in trial.taken else self.free.get(name, {})

        for shape in shapes:
            request = shape.request
            wanted = tuple(request.items())
            verdict = self.node_filter.evaluate(shape.pods[0])
            heap = []
            for name in verdict.feasible:
                if name in self.reserved:
                    continue
                f = free_on(name)
                if all(f.get(r, 0) >= v for r, v in wanted):
                    heap.append((score(self.nodes[name], request, f), name))
            heapq.heapify(heap)
            for i, pod in enumerate(shape.pods):
                if not heap:
                    trial.unplaced.extend(shape.pods[i:])
                    if trial.failure_counts is None:
                        trial.failure_counts = self._reason_counts(pod, free_on)
                    break
                _, name = heapq.heappop(heap)
                left = res.subtract(free_on(name), request)
                trial.taken[name] = left
                trial.placed.append(Assignment(pod, name))
                if all(left.get(r, 0) >= v for r, v in wanted):
                    heapq.heappush(heap, (score(self.nodes[name], request, left), name))
        return trial

    def _reason_counts(self, pod: PodInfo, free_on: Callable[[str], Mapping[str, int]]) -> Counter:
        rejected = self.node_filter.evaluate(pod).rejected
        counts: Counter = Counter()
        for name in self.nodes:
            if name in rejected:
                counts[rejected[name]] += 1
            elif name in self.reserved:
                counts[REASON_RESERVED] += 1
            else:
                counts.update(resource_reasons(pod.requests, free_on(name)))
        return counts

    def worth_retrying(self, shapes: Sequence[_Shape], need: int) -> bool:
        """Whether the usable free capacity, summed over nodes, covers the
        ``need`` smallest pods -- if not, no order can succeed."""
        needed: Resources = {}
        for shape in _smallest_first(list(shapes)):
            count = min(need, len(shape.pods))
            needed = res.add(needed, {k: v * count for k, v in shape.request.items()})
            need -= count
        total: Resources = {}
        for name, free in self.free.items():
            if name in self.nodes and name not in self.reserved:
                total = res.add(total, {k: v for k, v in free.items() if v > 0})
        return not res.fits(needed, total)


def _retry_strategies(need: int, pod_count: int) -> list[tuple[Callable, Score]]:
    """Spreading helps when packing strands a resource other than GPUs;
    smallest-first helps reach a count when not every member is needed."""
    strategies: list[tuple[Callable, Score]] = [(_largest_first, spread_score)]
    if need < pod_count:
        strategies.append((_smallest_first, pack_score))
    return strategies


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def plan_gang(
    pods: Sequence[PodInfo],
    need: int,
    nodes: Mapping[str, NodeInfo],
    free: dict[str, Resources],
    *,
    reserved: Collection[str] = frozenset(),
    node_filter: NodeFilter | None = None,
) -> GangPlan | PlanFailure:
    """Place at least ``need`` of ``pods`` at once, or explain why not.

    ``pods`` are one gang's unbound, schedulable members; ``free`` maps every
    node name to its free resources and is updated in place with the plan's
    pods when a plan is returned (it is left untouched on failure).  Nodes in
    ``reserved`` are not used.  Pass one ``node_filter`` built on ``nodes`` to
    share static predicate results across gangs of the same cycle.
    """
    gang_key = pods[0].gang_key if pods else ""
    if need > len(pods):
        return PlanFailure(need, 0, {}, f"Gang {gang_key} needs {_pods(need)} placed at once; "
                                        f"only {len(pods)} are pending.")
    planner = _Planner(nodes, free, reserved, node_filter or NodeFilter(nodes))
    shapes = _shapes(pods)
    first = chosen = planner.attempt(_largest_first(shapes), pack_score)
    most_placed = len(first.placed)
    if most_placed < need and planner.worth_retrying(shapes, need):
        for order, score in _retry_strategies(need, len(pods)):
            retry = planner.attempt(order(shapes), score)
            most_placed = max(most_placed, len(retry.placed))
            if len(retry.placed) >= need:
                chosen = retry
                break
    if len(chosen.placed) >= need:
        free.update(chosen.taken)
        message = explain(chosen.failure_counts, len(nodes)) if chosen.unplaced else ""
        return GangPlan(tuple(chosen.placed), tuple(chosen.unplaced), message)
    counts = dict(first.failure_counts or {})
    message = (f"{explain(counts, len(nodes))} Gang {gang_key} needs {_pods(need)} placed at once; "
               f"only {most_placed} fit.")
    return PlanFailure(need, most_placed, counts, message)
