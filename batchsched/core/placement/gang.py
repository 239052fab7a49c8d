"""All-or-nothing placement of one gang.

``plan_gang`` places a gang's pending pods against a ``CapacityIndex`` and
either commits a plan with at least ``need`` pods (adding further members
when they fit) or returns a failure explaining, kube-scheduler style, why the
first pod that fitted nowhere did not fit; a failure changes nothing.

Heuristic: identical pods are grouped into shapes (equal requests and
placement constraints), so static predicates and node scores are computed
once per shape and cycle (see ``capacity``).  Shapes go largest first (GPU,
then cpu, then memory); each pod takes the node it fills most tightly --
fewest GPUs left, then least of the rest left, then node name -- so whole
nodes stay free for large gangs.  When not every member is needed and that
order misses the quorum, smallest-first is tried too: small pods reach a
count that large ones crowd out.

No plan ever takes more of a resource on a node than the free map holds.
"""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core import resources as res
from batchsched.core.model import PodInfo
from batchsched.core.placement.capacity import CapacityIndex, ShapeView, shape_key
from batchsched.core.resources import Resources


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


@dataclass
class _Shape:
    view: ShapeView
    pods: list[PodInfo]

    def size(self) -> tuple[int, int, int]:
        r = self.view.request
        return (r.get(GPU_RESOURCE, 0), r.get(res.CPU, 0), r.get(res.MEMORY, 0))


def _shapes(pods: Sequence[PodInfo], capacity: CapacityIndex) -> list[_Shape]:
    by_key: dict[tuple, _Shape] = {}
    for pod in sorted(pods, key=lambda p: (p.created, p.name, p.uid)):
        key = shape_key(pod)
        if key in by_key:
            by_key[key].pods.append(pod)
        else:
            by_key[key] = _Shape(capacity.view(pod), [pod])
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
    taken: dict[str, Resources] = field(default_factory=dict)  # node -> its free after this attempt
    failure_counts: Counter | None = None  # reasons for the first pod that fitted nowhere


def _attempt(shapes: Sequence[_Shape], capacity: CapacityIndex, reserved: Collection[str]) -> _Attempt:
    """Place pod by pod, each on its best node; the index is left as it was."""
    trial = _Attempt()
    taken = trial.taken
    for shape in shapes:
        view = shape.view
        # nodes this attempt already used are scored here, the rest by the view
        local = [(view.score(n, f), n) for n, f in taken.items() if n in view.feasible and view.fits(f)]
        heapq.heapify(local)
        for i, pod in enumerate(shape.pods):
            shared = view.peek(reserved, taken)
            if local and (shared is None or local[0] < shared[:2]):
                name = heapq.heappop(local)[1]
            elif shared is not None:
                name = view.pop()[1]
            else:
                trial.unplaced.extend(shape.pods[i:])
                if trial.failure_counts is None:
                    trial.failure_counts = view.reason_counts(reserved, taken)
                break
            before = taken[name] if name in taken else capacity.free.get(name, {})
            left = taken[name] = res.subtract(before, view.request)
            trial.placed.append(Assignment(pod, name))
            if view.fits(left):
                heapq.heappush(local, (view.score(name, left), name))
    for shape in shapes:
        shape.view.restore()
    return trial


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def plan_gang(
    pods: Sequence[PodInfo],
    need: int,
    capacity: CapacityIndex,
    *,
    reserved: Collection[str] = frozenset(),
) -> GangPlan | PlanFailure:
    """Place at least ``need`` of ``pods`` at once, or explain why not.

    ``pods`` are one gang's unbound, schedulable members.  A returned plan is
    already committed to ``capacity`` (its free map shrinks accordingly); a
    failure leaves it untouched.  Nodes in ``reserved`` are not used.
    """
    gang_key = pods[0].gang_key if pods else ""
    if need > len(pods):
        return PlanFailure(need, 0, {}, f"Gang {gang_key} needs {_pods(need)} placed at once; "
                                        f"only {len(pods)} are pending.")
    shapes = _shapes(pods, capacity)
    first = chosen = _attempt(_largest_first(shapes), capacity, reserved)
    most_placed = len(first.placed)
    if most_placed < need < len(pods):
        retry = _attempt(_smallest_first(shapes), capacity, reserved)
        most_placed = max(most_placed, len(retry.placed))
        if len(retry.placed) >= need:
            chosen = retry
    total_nodes = len(capacity.nodes)
    if len(chosen.placed) >= need:
        capacity.commit(chosen.taken)
        message = explain(chosen.failure_counts, total_nodes) if chosen.unplaced else ""
        return GangPlan(tuple(chosen.placed), tuple(chosen.unplaced), message)
    counts = dict(first.failure_counts or {})
    message = (f"{explain(counts, total_nodes)} Gang {gang_key} needs {_pods(need)} placed at once; "
               f"only {most_placed} fit.")
    return PlanFailure(need, most_placed, counts, message)
