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

Members sharing an unallocated ResourceClaim (``DeviceDemand.follows``: one
allocates it, the others join it) go on one node or none: the first of
them placed takes the best node where all of them fit, and the rest go
there with it (``_Sharing``).

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
from batchsched.core.gangs import Gang
from batchsched.core.model import PodInfo, TopologyPolicy
from batchsched.core.placement.capacity import CapacityIndex, ShapeView, shape_key
from batchsched.core.placement.gpus import GpuPick, charged
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
    reason_counts: Mapping[str, int]  # for the first pod that fitted nowhere in that attempt
    message: str
    never_fits: bool = False  # not even on empty nodes: the message starts with NEVER_FITS


# How a failure that no freed room can cure begins (see ``never_fits``).
NEVER_FITS = "Exceeds cluster capacity"
# Why a node that fits a pod is out when the gang mates sharing its claims do not fit there too.
REASON_SHARERS = "node(s) could not also hold the gang mates sharing its ResourceClaims"


@dataclass(frozen=True)
class _Sharing:
    """The gang's members that share unallocated ResourceClaims, grouped by
    node: each group's lead is placed as any pod, the rest on its node."""

    units: Mapping[str, tuple[PodInfo, ...]] = field(default_factory=dict)  # lead uid -> lead, then the rest
    placed_with_lead: frozenset[str] = frozenset()  # uids placed with their group's lead
    stranded: tuple[PodInfo, ...] = ()  # members whose group lacks a pod allocating what they join


def _sharing(pods: Sequence[PodInfo]) -> _Sharing:
    """Group the pods joined by ``follows`` (joiner and allocator, linked
    through all their claims): one node for each group.  A group is ordered
    so that each pod comes after those allocating the claims it joins (the
    order the claims are written in), its lead first; a group missing one
    of its allocators (left out by its queue's limits) is stranded."""
    by_uid = {p.uid: p for p in pods}
    follows = {p.uid: {uid for _, uid in p.device_demand.follows} for p in pods
               if p.device_demand is not None and p.device_demand.follows}
    if not follows:
        return _Sharing()
    group_of: dict[str, str] = {}  # uid -> a uid standing for its group (union-find)

    def find(uid: str) -> str:
        while group_of.setdefault(uid, uid) != uid:
            group_of[uid] = group_of[group_of[uid]]
            uid = group_of[uid]
        return uid

    joiners: dict[str, list[str]] = {}  # allocator uid -> the pods joining its claims
    for uid, allocators in follows.items():
        for allocator in allocators:
            group_of[find(uid)] = find(allocator)
            joiners.setdefault(allocator, []).append(uid)
    groups: dict[str, list[str]] = {}
    for uid in group_of:
        groups.setdefault(find(uid), []).append(uid)
    units, with_lead, stranded = {}, set(), []
    for members in groups.values():
        if any(uid not in by_uid for uid in members):
            stranded.extend(by_uid[uid] for uid in members if uid in by_uid)
            continue
        # each pod once the pods allocating what it joins are in; ties in creation order
        waiting = {uid: len(follows.get(uid, ())) for uid in members}
        ready = [(by_uid[uid].created, by_uid[uid].name, uid) for uid in members if not waiting[uid]]
        heapq.heapify(ready)
        ordered = []
        while ready:
            uid = heapq.heappop(ready)[2]
            ordered.append(by_uid[uid])
            for joiner in joiners.get(uid, ()):
                waiting[joiner] -= 1
                if not waiting[joiner]:
                    heapq.heappush(ready, (by_uid[joiner].created, by_uid[joiner].name, joiner))
        if len(ordered) < len(members):  # a cycle, which joins never make: none can go
            stranded.extend(by_uid[uid] for uid in members)
            continue
        units[ordered[0].uid] = tuple(ordered)
        with_lead.update(p.uid for p in ordered[1:])
    return _Sharing(units, frozenset(with_lead), tuple(stranded))


def explain(reason_counts: Mapping[str, int], total_nodes: int, pod_name: str = "") -> str:
    """kube-scheduler's "0/N nodes are available: ..." sentence (naming
    the pod when given)."""
    available = f"0/{total_nodes} nodes are available" + (f" for pod {pod_name}" if pod_name else "")
    return f"{available}: {_ranked(reason_counts)}." if reason_counts else f"{available}."


def _ranked(reason_counts: Mapping[str, int]) -> str:
    """"8 Insufficient nvidia.com/gpu, 4 node(s) had ...": by count, then reason."""
    ranked = sorted(reason_counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{n} {r}" for r, n in ranked)


@dataclass
class _Shape:
    view: ShapeView
    pods: list[PodInfo]

    def size(self) -> tuple[int, int, int]:
        r = self.view.request
        return (r.get(GPU_RESOURCE, 0), r.get(res.CPU, 0), r.get(res.MEMORY, 0))


def _shapes(pods: Sequence[PodInfo], capacity: CapacityIndex, policy: TopologyPolicy,
            task_need: Mapping[str, int] | None = None) -> list[_Shape]:
    """Pods grouped by shape, each shape's in creation order; with
    ``task_need``, the members each task needs first (so a shape shared by
    several tasks places them before the rest)."""
    by_key: dict[tuple, _Shape] = {}
    in_order = sorted(pods, key=lambda p: (p.created, p.name, p.uid))
    if task_need:
        left, needed = dict(task_need), set()
        for pod in in_order:
            if left.get(pod.task, 0) > 0:
                left[pod.task] -= 1
                needed.add(pod.uid)
        in_order.sort(key=lambda p: p.uid not in needed)  # stable: creation order kept within each part
    for pod in in_order:
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
    failed_pod: PodInfo | None = None  # that pod
    placed_before_failure: int = 0  # pods placed when it fitted nowhere


def _attempt(shapes: Sequence[_Shape], capacity: CapacityIndex, reserved: Collection[str],
             outside: Collection[str] = frozenset(), sharing: _Sharing = _Sharing()) -> _Attempt:
    """Place pod by pod, each on its best node, none on ``reserved`` or
    ``outside`` nodes, the members of a ``sharing`` group on their lead's;
    the index is left as it was.  (Longer than the core's guideline: it is
    the planner's inner loop, run for every pod of every attempt, and its
    local heap, free map and GPU rooms stay in one frame rather than
    travelling through calls per pod.)"""
    trial = _Attempt()
    taken, rooms = trial.taken, trial.rooms
    view_of = {p.uid: s.view for s in shapes for p in s.pods} if sharing.units else {}

    def room(name: str) -> GpuRoom | None:
        return rooms.get(name, capacity.rooms.get(name))

    def together(name: str, group: Sequence[PodInfo]) -> tuple | None:
        """(the GPUs each pod of a sharing ``group`` gets on node ``name``,
        one after another; what is left there then), or None when one does
        not fit."""
        free, gpu_room, picks = taken[name] if name in taken else capacity.free.get(name, {}), room(name), []
        for pod in group:
            view = view_of[pod.uid]
            pick = view.pick(name, free, gpu_room) if name in view.feasible else None
            if not isinstance(pick, GpuPick):
                return None
            free = res.subtract(free, charged(view.request, pick, pod.device_demand))
            if gpu_room is not None:
                gpu_room = gpu_room.take(pick.gpus, view.request, pick.numa)
            picks.append(pick)
        return picks, free, gpu_room

    for shape in shapes:
        view = shape.view
        # nodes this attempt already used are scored here, the rest by the view
        local = []
        for name, free in taken.items():
            pick = view.pick(name, free, room(name)) if name in view.feasible else None
            if isinstance(pick, GpuPick):
                local.append((view.score(name, free, pick, room(name)), name))
        heapq.heapify(local)
        for i, pod in enumerate(shape.pods):
            group = None
            if sharing.units:
                if pod.uid in sharing.placed_with_lead:
                    continue  # placed with its lead
                group = sharing.units.get(pod.uid)
            placed, passed_over = None, []  # a group's: where it goes, the nodes fitting its lead only
            while True:
                shared = view.peek(reserved, outside, taken)
                if local and (shared is None or local[0] < shared[:2]):
                    entry = heapq.heappop(local)
                    name = entry[1]
                elif shared is not None:
                    entry, name = None, view.pop()[1]
                else:
                    name = None
                    break
                if group is None:
                    break
                placed = together(name, group)
                if placed is not None:
                    break
                passed_over.append(entry)
            for entry in passed_over:
                if entry is not None:
                    heapq.heappush(local, entry)
            if name is None:
                if trial.failure_counts is None:
                    trial.failure_counts = view.reason_counts(reserved, taken, rooms)
                    if passed_over:
                        trial.failure_counts[REASON_SHARERS] += len(passed_over)
                    trial.failed_pod, trial.placed_before_failure = pod, len(trial.placed)
                if group is not None:
                    trial.unplaced.extend(group)
                    continue
                trial.unplaced.extend(m for p in shape.pods[i:] if p.uid not in sharing.placed_with_lead
                                      for m in sharing.units.get(p.uid, (p,)))
                break
            if placed is None:
                before = taken[name] if name in taken else capacity.free.get(name, {})
                room_before = room(name)
                pick = view.pick(name, before, room_before)  # a GpuPick: only fitting nodes are queued
                left = taken[name] = res.subtract(before, charged(view.request, pick, pod.device_demand))
                if room_before is not None:
                    rooms[name] = room_before.take(pick.gpus, view.request, pick.numa)
                trial.placed.append(Assignment(pod, name, pick.gpus))
            else:
                picks, left, room_after = placed
                taken[name] = left
                if room_after is not None:
                    rooms[name] = room_after
                trial.placed.extend(Assignment(p, name, pick.gpus) for p, pick in zip(group, picks))
            pick = view.pick(name, left, room(name))
            if isinstance(pick, GpuPick):
                heapq.heappush(local, (view.score(name, left, pick, room(name)), name))
    for shape in shapes:
        shape.view.restore()
    return trial


def _best_attempt(shapes: Sequence[_Shape], need: int, capacity: CapacityIndex, reserved: Collection[str],
                  outside: Collection[str] = frozenset(),
                  sharing: _Sharing = _Sharing()) -> tuple[_Attempt, _Attempt]:
    """Largest shapes first, then, if that misses the quorum and not every
    pod is needed, smallest first: (the attempt to use, the one that placed
    most -- the first on a tie -- for a failure to report)."""
    first = chosen = most = _attempt(_largest_first(shapes), capacity, reserved, outside, sharing)
    if len(first.placed) < need < sum(len(s.pods) for s in shapes):
        retry = _attempt(_smallest_first(shapes), capacity, reserved, outside, sharing)
        if len(retry.placed) > len(first.placed):
            most = retry
        if len(retry.placed) >= need:
            chosen = retry
    return chosen, most


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
                      policy: TopologyPolicy, bound_on: Collection[str],
                      sharing: _Sharing) -> tuple[_Attempt | None, int, str]:
    """The plan in the smallest domain that fits the quorum, or None, the
    most pods one domain held, and why no domain fits."""
    sizes = sorted(s.view.request.get(GPU_RESOURCE, 0) for s in shapes for _ in s.pods)
    gpus_needed = sum(sizes[:need])
    domains, labelled = _domains(capacity, policy.domain_labels, gpus_needed, bound_on)
    keys = " or ".join(policy.domain_labels) or "(none configured)"
    best_placed, best_domain = 0, ""
    for label, names in domains:
        chosen, most = _best_attempt(shapes, need, capacity, reserved, capacity.nodes.keys() - names, sharing)
        if len(chosen.placed) >= need:
            return chosen, len(chosen.placed), ""
        most_placed = len(most.placed)
        if most_placed > best_placed or not best_domain:
            best_placed, best_domain = most_placed, label
    if not labelled:
        return None, 0, f"no node carries the domain label {keys}"
    if not domains:
        return None, 0, f"no domain ({keys}) has {gpus_needed} free GPUs"
    return None, best_placed, (f"{len(domains)} domain(s) ({keys}) with {gpus_needed} free GPUs were tried; "
                               f"the best, {best_domain}, fits only {best_placed}")


def _tasks_short(placed: Sequence[Assignment], task_need: Mapping[str, int]) -> tuple[str, int, int] | None:
    """(task, placed, needed) of the first task the plan holds too few of, or None."""
    if not task_need:
        return None
    placed_of = Counter(a.pod.task for a in placed)
    return next(((task, placed_of[task], n) for task, n in sorted(task_need.items()) if placed_of[task] < n), None)


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


# Nodes named in a failure's "(node: pods, ...)" breakdown; the rest are counted.
BREAKDOWN_NODES = 5


def _failure_message(gang_key: str, need: int, attempt: _Attempt, total_nodes: int) -> str:
    """Why the attempt that placed most missed the quorum; its counts add
    up: the breakdown sums to the pods placed, and the "0/N nodes" sentence
    is about the pod that fitted nowhere, with the pods before it placed."""
    message = f"Gang {gang_key} needs {_pods(need)} placed at once"
    if attempt.placed:
        per_node = Counter(a.node_name for a in attempt.placed)
        ranked = sorted(per_node.items(), key=lambda item: (-item[1], item[0]))
        breakdown = ", ".join(f"{name}: {n}" for name, n in ranked[:BREAKDOWN_NODES])
        if len(ranked) > BREAKDOWN_NODES:
            breakdown += f", {len(ranked) - BREAKDOWN_NODES} more node(s): "
            breakdown += str(sum(n for _, n in ranked[BREAKDOWN_NODES:]))
        message += (f"; the best plan found places {len(attempt.placed)} ({breakdown}); "
                    f"with {attempt.placed_before_failure or 'none'} of them placed,")
    else:
        message += ";"
    pod = attempt.failed_pod
    return f"{message} {explain(attempt.failure_counts or {}, total_nodes, pod.name if pod else '')}"


def min_resources_beyond(gang: Gang, cluster_total: Mapping[str, int]) -> str:
    """Why the gang's minResources exceed the allocatable of all nodes
    together (a message starting with NEVER_FITS), or "" when they do not."""
    asked = gang.spec.min_resources
    beyond = ", ".join(f"{name} {res.format_amount(name, asked[name])} > "
                       f"{res.format_amount(name, cluster_total.get(name, 0))}"
                       for name in sorted(res.shortfall(asked, cluster_total)))
    return (f"{NEVER_FITS}: gang {gang.key} minResources exceed the allocatable of all nodes together: "
            f"{beyond}.") if beyond else ""


def never_fits(pods: Sequence[PodInfo], need: int, capacity: CapacityIndex,
               policy: TopologyPolicy = TopologyPolicy(), cluster_total: Mapping[str, int] | None = None) -> str:
    """Why ``need`` of ``pods`` could not be placed at once even on empty
    nodes (a message starting with NEVER_FITS), or "" when they might."""
    why = _never_fits(_shapes(pods, capacity, policy), need, len(capacity.nodes), cluster_total)
    return _never_message(pods[0].gang_key, need, why) if why else ""


def _never_message(gang_key: str, need: int, why: str) -> str:
    return f"{NEVER_FITS}: gang {gang_key} needs {_pods(need)} placed at once; {why}."


def _never_fits(shapes: Sequence[_Shape], need: int, total_nodes: int,
                cluster_total: Mapping[str, int] | None) -> str:
    """Two checks, each cheap and each a proof: what the ``need`` pods ask
    (the smallest ones, when the gang may choose) against the allocatable of
    all nodes together; and how many pods of each shape the nodes its
    static predicates allow could hold, each empty, against ``need``."""
    if cluster_total is not None:
        asked: dict[str, list[int]] = {}
        for shape in shapes:
            for name, amount in shape.view.request.items():
                asked.setdefault(name, []).extend([amount] * len(shape.pods))
        pending = sum(len(s.pods) for s in shapes)
        short = []
        for name in sorted(asked):
            amounts = sorted(asked[name] + [0] * (pending - len(asked[name])))[:need]
            if sum(amounts) > cluster_total.get(name, 0):
                short.append(f"{res.format_amount(name, sum(amounts))} {name}, the cluster has "
                             f"{res.format_amount(name, cluster_total.get(name, 0))} allocatable")
        if short:
            return (("it asks " if need == 1 else "they ask ") + ("at least " if need < pending else "")
                    + "; ".join(short))
    holdable = [min(len(s.pods), s.view.holds_when_empty) for s in shapes]
    if sum(holdable) >= need:
        return ""
    parts = []
    for shape, holds in zip(shapes, holdable):
        if holds < len(shape.pods):
            first = shape.pods[0].name
            like = f"pod {first}" if len(shape.pods) == 1 else f"{len(shape.pods)} pods like {first}"
            if holds:
                parts.append(f"{like}: room for {holds} on empty nodes")
            else:
                counts = shape.view.never_counts()
                parts.append(f"{like}: 0/{total_nodes} nodes could hold one even empty"
                             + (f": {_ranked(counts)}" if counts else ""))
    most = f"at most {sum(holdable)}" if sum(holdable) else "none"
    return f"even with every node empty {most} fit: " + "; ".join(parts)


def places_none(pods: Sequence[PodInfo], capacity: CapacityIndex, *, reserved: Collection[str] = frozenset(),
                policy: TopologyPolicy = TopologyPolicy()) -> bool:
    """Whether no node outside ``reserved`` fits even one of ``pods`` now
    (their GPU sets included), so that ``plan_gang`` would place none:
    asked of each shape's best node, without planning."""
    one_of_each = {shape_key(pod): pod for pod in pods}  # (a view stands for its shape, whichever pod asks)
    return not any(capacity.view(pod, policy).fits_outside(reserved) for pod in one_of_each.values())


def plan_gang(
    pods: Sequence[PodInfo],
    need: int,
    capacity: CapacityIndex,
    *,
    reserved: Collection[str] = frozenset(),
    policy: TopologyPolicy = TopologyPolicy(),
    bound_on: Collection[str] = frozenset(),
    cluster_total: Mapping[str, int] | None = None,
    task_need: Mapping[str, int] | None = None,
) -> GangPlan | PlanFailure:
    """Place at least ``need`` of ``pods`` at once, or explain why not.
    (Beyond the three inputs, five keyword options, each with a default
    that leaves it out: callers name only those they use.)

    ``pods`` are one gang's unbound, schedulable members and ``policy`` its
    topology policy, with its domain label keys resolved; ``bound_on`` the
    nodes of its members already bound (the rest stay in their domain).  A
    returned plan is already committed to ``capacity`` (its free map
    shrinks accordingly); a failure leaves it untouched.  Nodes in
    ``reserved`` are not used.  A gang that could not fit even on empty
    nodes (``never_fits``; ``cluster_total``, every node's allocatable
    summed, adds the check of totals) fails without planning.
    ``task_need``: task -> how many of the placed pods must be of it
    (Volcano's minTaskMember, less the members bound).
    """
    gang_key = pods[0].gang_key if pods else ""
    sharing = _sharing(pods)
    if sharing.stranded:  # (placed nowhere, reported as members that did not fit)
        stranded = {p.uid for p in sharing.stranded}
        pods = [p for p in pods if p.uid not in stranded]
    if need > len(pods):
        return PlanFailure(need, 0, {}, f"Gang {gang_key} needs {_pods(need)} placed at once; "
                                        f"only {len(pods)} are pending.")
    shapes = _shapes(pods, capacity, policy, task_need)
    total_nodes = len(capacity.nodes)
    why_never = _never_fits(shapes, need, total_nodes, cluster_total) if need else ""
    if why_never:
        return PlanFailure(need, 0, {}, _never_message(gang_key, need, why_never), never_fits=True)
    chosen = None
    if policy.domain_mode:
        chosen, most_placed, why = _plan_in_a_domain(shapes, need, capacity, reserved, policy, bound_on, sharing)
        if chosen is None and policy.domain_mode == "required":
            return PlanFailure(need, most_placed, {}, f"Gang {gang_key} needs {_pods(need)} placed at once "
                                                      f"inside one domain: {why}.")
    if chosen is None:
        chosen, most = _best_attempt(shapes, need, capacity, reserved, sharing=sharing)
        if len(chosen.placed) < need:
            counts = dict(most.failure_counts or {})
            return PlanFailure(need, len(most.placed), counts, _failure_message(gang_key, need, most, total_nodes))
    short = _tasks_short(chosen.placed, task_need or {})
    if short:
        task, placed, needed = short
        return PlanFailure(need, len(chosen.placed), dict(chosen.failure_counts or {}),
                           f"Gang {gang_key} needs {_pods(need)} placed at once, {needed} of them of task "
                           f"{task} (minTaskMember); the best plan found places {placed} of that task"
                           + (f": {explain(chosen.failure_counts or {}, total_nodes)}" if chosen.unplaced else "."))
    capacity.commit(chosen.taken, chosen.rooms)
    message = explain(chosen.failure_counts, total_nodes) if chosen.unplaced else ""
    return GangPlan(tuple(chosen.placed), tuple(chosen.unplaced) + sharing.stranded, message)
