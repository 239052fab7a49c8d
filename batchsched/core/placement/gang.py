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

GPU pods get GPU ids on the way (``gpus``), and the score of a node puts the
quality of the best GPU set it offers before packing.  A gang whose
topology policy names a domain (``domain_mode``) is planned inside one
domain -- the nodes sharing a value of one of its label keys -- trying the
smallest first: fewest allocatable GPUs, then fewest nodes, then fewest
free GPUs.  ``required`` fails when no domain fits; ``preferred`` then plans
as if there were no domains.

No plan ever takes more of a resource on a node than the free map holds,
nor a GPU id that is not free.
"""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core import resources as res
from batchsched.core.model import PodInfo, TopologyPolicy
from batchsched.core.placement.capacity import CapacityIndex, ShapeView, shape_key
from batchsched.core.placement.gpus import GpuPick
from batchsched.core.resources import Resources
from batchsched.core.topology.accounting import GpuRoom


@dataclass(frozen=True)
class Assignment:
    pod: PodInfo
    node_name: str
    gpu_ids: tuple[int, ...] = ()


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


def _shapes(pods: Sequence[PodInfo], capacity: CapacityIndex, policy: TopologyPolicy) -> list[_Shape]:
    by_key: dict[tuple, _Shape] = {}
    for pod in sorted(pods, key=lambda p: (p.created, p.name, p.uid)):
        key = shape_key(pod)
        if key in by_key:
            by_key[key].pods.append(pod)
        else:
            by_key[key] = _Shape(capacity.view(pod, policy), [pod])
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
    rooms: dict[str, GpuRoom] = field(default_factory=dict)  # node -> its GPU room after this attempt
    failure_counts: Counter | None = None  # reasons for the first pod that fitted nowhere


def _attempt(shapes: Sequence[_Shape], capacity: CapacityIndex, reserved: Collection[str],
             outside: Collection[str] = frozenset()) -> _Attempt:
    """Place pod by pod, each on its best node, none on ``reserved`` or
    ``outside`` nodes; the index is left as it was."""
    trial = _Attempt()
    taken, rooms = trial.taken, trial.rooms

    def room(name: str) -> GpuRoom | None:
        return rooms.get(name, capacity.rooms.get(name))

    for shape in shapes:
        view = shape.view
        # nodes this attempt already used are scored here, the rest by the view
        local = []
        for name, free in taken.items():
            pick = view.pick(name, free, room(name)) if name in view.feasible else None
            if isinstance(pick, GpuPick):
                local.append((view.score(name, free, pick), name))
        heapq.heapify(local)
        for i, pod in enumerate(shape.pods):
            shared = view.peek(reserved, outside, taken)
            if local and (shared is None or local[0] < shared[:2]):
                name = heapq.heappop(local)[1]
            elif shared is not None:
                name = view.pop()[1]
            else:
                trial.unplaced.extend(shape.pods[i:])
                if trial.failure_counts is None:
                    trial.failure_counts = view.reason_counts(reserved, taken, rooms)
                break
            before = taken[name] if name in taken else capacity.free.get(name, {})
            room_before = room(name)
            pick = view.pick(name, before, room_before)  # a GpuPick: only fitting nodes are queued
            left = taken[name] = res.subtract(before, view.request)
            if room_before is not None:
                rooms[name] = room_before.take(pick.gpus, view.request, pick.numa)
            trial.placed.append(Assignment(pod, name, pick.gpus))
            pick = view.pick(name, left, room(name))
            if isinstance(pick, GpuPick):
                heapq.heappush(local, (view.score(name, left, pick), name))
    for shape in shapes:
        shape.view.restore()
    return trial


def _best_attempt(shapes: Sequence[_Shape], need: int, capacity: CapacityIndex, reserved: Collection[str],
                  outside: Collection[str] = frozenset()) -> tuple[_Attempt, _Attempt, int]:
    """Largest shapes first, then, if that misses the quorum and not every
    pod is needed, smallest first: (the attempt to use, the first one, the
    most pods either placed)."""
    first = chosen = _attempt(_largest_first(shapes), capacity, reserved, outside)
    most_placed = len(first.placed)
    if most_placed < need < sum(len(s.pods) for s in shapes):
        retry = _attempt(_smallest_first(shapes), capacity, reserved, outside)
        most_placed = max(most_placed, len(retry.placed))
        if len(retry.placed) >= need:
            chosen = retry
    return chosen, first, most_placed


def _domains(capacity: CapacityIndex, keys: Sequence[str], gpus_needed: int,
             bound_on: Collection[str]) -> tuple[list[tuple[str, frozenset[str]]], bool]:
    """Domains (``key=value`` and its nodes) that hold every node in
    ``bound_on`` and have ``gpus_needed`` free GPUs, smallest first; and
    whether any node carries one of ``keys`` at all."""
    members: dict[tuple[int, str], set[str]] = {}
    for name, node in capacity.nodes.items():
        for order, key in enumerate(keys):
            if key in node.labels:
                members.setdefault((order, node.labels[key]), set()).add(name)
    ranked = []
    for (order, value), names in members.items():
        free = sum(max(0, capacity.free.get(n, {}).get(GPU_RESOURCE, 0)) for n in names)
        if free >= gpus_needed and names.issuperset(bound_on):
            size = sum(capacity.nodes[n].allocatable.get(GPU_RESOURCE, 0) for n in names)
            ranked.append(((size, len(names), free, order, value), f"{keys[order]}={value}", frozenset(names)))
    ranked.sort()
    return [(label, names) for _, label, names in ranked], bool(members)


def _plan_in_a_domain(shapes: Sequence[_Shape], need: int, capacity: CapacityIndex, reserved: Collection[str],
                      policy: TopologyPolicy, bound_on: Collection[str]) -> tuple[_Attempt | None, int, str]:
    """The plan in the smallest domain that fits the quorum, or None, the
    most pods one domain held, and why no domain fits."""
    sizes = sorted(s.view.request.get(GPU_RESOURCE, 0) for s in shapes for _ in s.pods)
    gpus_needed = sum(sizes[:need])
    domains, labelled = _domains(capacity, policy.domain_labels, gpus_needed, bound_on)
    keys = " or ".join(policy.domain_labels) or "(none configured)"
    best_placed, best_domain = 0, ""
    for label, names in domains:
        chosen, _, most_placed = _best_attempt(shapes, need, capacity, reserved, capacity.nodes.keys() - names)
        if len(chosen.placed) >= need:
            return chosen, len(chosen.placed), ""
        if most_placed > best_placed or not best_domain:
            best_placed, best_domain = most_placed, label
    if not labelled:
        return None, 0, f"no node carries the domain label {keys}"
    if not domains:
        return None, 0, f"no domain ({keys}) has {gpus_needed} free GPUs"
    return None, best_placed, (f"{len(domains)} domain(s) ({keys}) with {gpus_needed} free GPUs were tried; "
                               f"the best, {best_domain}, fits only {best_placed}")


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def plan_gang(
    pods: Sequence[PodInfo],
    need: int,
    capacity: CapacityIndex,
    *,
    reserved: Collection[str] = frozenset(),
    policy: TopologyPolicy = TopologyPolicy(),
    bound_on: Collection[str] = frozenset(),
) -> GangPlan | PlanFailure:
    """Place at least ``need`` of ``pods`` at once, or explain why not.

    ``pods`` are one gang's unbound, schedulable members and ``policy`` its
    topology policy, with its domain label keys resolved; ``bound_on`` the
    nodes of its members already bound (the rest stay in their domain).  A
    returned plan is already committed to ``capacity`` (its free map
    shrinks accordingly); a failure leaves it untouched.  Nodes in
    ``reserved`` are not used.
    """
    gang_key = pods[0].gang_key if pods else ""
    if need > len(pods):
        return PlanFailure(need, 0, {}, f"Gang {gang_key} needs {_pods(need)} placed at once; "
                                        f"only {len(pods)} are pending.")
    shapes = _shapes(pods, capacity, policy)
    chosen = None
    if policy.domain_mode:
        chosen, most_placed, why = _plan_in_a_domain(shapes, need, capacity, reserved, policy, bound_on)
        if chosen is None and policy.domain_mode == "required":
            return PlanFailure(need, most_placed, {}, f"Gang {gang_key} needs {_pods(need)} placed at once "
                                                      f"inside one domain: {why}.")
    total_nodes = len(capacity.nodes)
    if chosen is None:
        chosen, first, most_placed = _best_attempt(shapes, need, capacity, reserved)
        if len(chosen.placed) < need:
            counts = dict(first.failure_counts or {})
            message = (f"{explain(counts, total_nodes)} Gang {gang_key} needs {_pods(need)} placed at once; "
                       f"only {most_placed} fit.")
            return PlanFailure(need, most_placed, counts, message)
    capacity.commit(chosen.taken, chosen.rooms)
    message = explain(chosen.failure_counts, total_nodes) if chosen.unplaced else ""
    return GangPlan(tuple(chosen.placed), tuple(chosen.unplaced), message)
