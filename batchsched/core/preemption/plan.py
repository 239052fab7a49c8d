"""Choosing victims for a gang that does not fit (pure).

The gang's quorum is placed pod by pod (largest first) on a hypothetical
free map in which the victims chosen so far are gone and pods already
terminating count as gone.  For each pod, every statically feasible node is
priced by the cheapest set of *victim units* that makes the pod fit there,
and the cheapest node wins (ties: the tightest fit).  A unit is one pod, or a
whole gang of ours that would otherwise be left bound below its minMember —
such a gang is evicted whole or not at all.

Cost, compared in this order (docs/preemption.md; the terms are
``cost.COST_TERMS``):
1. victims of equal or higher priority: never (they are not candidates);
2. fewest gangs broken (whole-gang units);
3. lowest highest-victim priority;
4. fewest victims that are not elastic (a gang's members beyond its
   minMember, placed as room allows: the first victims, since the gang
   runs on without them);
5. fewest victims;
6. lowest total victim priority;
7. least work lost (``lost_work``: GPU-seconds since each victim's start or
   its last checkpoint).

A spare member of a gang is a unit of its own (an elastic one) and also in
its whole gang's unit: victims, their cost and the room they free count
each pod once.
Nothing is evicted unless the whole quorum fits once the victims are gone,
and never more victims than are left of ``max_victims_per_cycle`` in the
cycle (``budget``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Mapping

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core import resources as res
from batchsched.core.gangs import Gang
from batchsched.core.model import NodeInfo, PodInfo, TopologyPolicy
from batchsched.core.placement.capacity import pack_score
from batchsched.core.placement.fit import NodeFilter
from batchsched.core.placement.gpus import GpuPick, charged, pick_gpus, static_reason
from batchsched.core.preemption.cost import VictimUnit, distinct_pods, lost_work, set_cost
from batchsched.core.preemption.policy import GANG_VICTIMS_NEVER, PreemptionPolicy, PreemptionState
from batchsched.core.resources import Resources
from batchsched.core.snapshot import Snapshot
from batchsched.core.topology.accounting import GpuRoom, charged_numa
from batchsched.core.topology.choose import mask_of

def _freed_on(node: str, units: Iterable[VictimUnit], gone: Collection[str] = ()) -> Resources:
    """What evicting ``units`` frees on ``node``, beyond the pods in ``gone``."""
    freed: Resources = {}
    for pod in distinct_pods(units, gone):
        if pod.node_name == node:
            freed = res.add(freed, pod.requests)
    return freed


@dataclass(frozen=True)
class PreemptionPlan:
    gang_key: str
    victims: tuple[PodInfo, ...]
    nominations: tuple[tuple[PodInfo, str], ...]  # (preemptor pod, node)
    message: str


@dataclass(frozen=True)
class NoPreemption:
    message: str


def victim_units(snapshot: Snapshot, gangs: Mapping[str, Gang], preemptor: Gang, policy: PreemptionPolicy,
                 state: PreemptionState, rules: VictimRules | None = None) -> list[VictimUnit]:
    """Every unit that may be evicted for ``preemptor``, cheapest first.
    With ``rules.reclaim`` (a queue taking back room lent, docs/queues.md)
    the victims are our gangs it accepts, whatever their priority."""
    excluded, reclaim = (rules.excluded, rules.reclaim) if rules is not None else ((), None)
    now = snapshot.now
    units: list[VictimUnit] = []
    by_gang: dict[str, list[PodInfo]] = {}
    above = preemptor.priority if reclaim is None else _ANY_PREEMPTOR
    left = _evictions_left(snapshot, policy, state, excluded) if rules is None or rules.namespace_budgets else None
    for pod in _victim_candidates(snapshot, policy, state):
        if pod.uid in excluded or pod.gang_key == preemptor.key or (left is not None and left(pod.namespace) < 1):
            continue
        gang = gangs.get(pod.gang_key) if pod.scheduler_name == snapshot.scheduler_name else None
        if reclaim is not None and (gang is None or not reclaim(pod.gang_key)):
            continue
        group = gang.spec if gang is not None and not gang.implicit else None
        if not policy.may_be_victim(pod, above, now, group, gang.priority if gang else None):
            continue
        if group is not None and group.min_member > 1:
            by_gang.setdefault(pod.gang_key, []).append(pod)
        else:
            units.append(VictimUnit(pod.uid, (pod,), False, now))
    for key, candidates in by_gang.items():
        gang = gangs[key]
        # Spare members an earlier preemptor of this cycle takes are spare no more.
        taken = sum(1 for p in gang.bound_active if p.uid in excluded)
        spare = len(gang.bound_active) - taken - gang.min_member
        # Members beyond minMember may go one by one (those losing the least work first)...
        singles = sorted(candidates, key=lambda p: (lost_work(p, now), p.name))[:max(0, spare)]
        for pod in singles:
            units.append(VictimUnit(pod.uid, (pod,), False, now, elastic=True))
        # ...but taking more breaks the gang: then all of it, or none.
        if policy.gang_victims == GANG_VICTIMS_NEVER or len(candidates) < len(gang.bound_active):
            continue
        if left is not None and _beyond_budget(candidates, left):
            continue
        units.append(VictimUnit(f"gang:{key}", tuple(candidates), True, now))
    units.sort(key=lambda u: (u.cost, u.key))
    return units


def _evictions_left(snapshot: Snapshot, policy: PreemptionPolicy, state: PreemptionState,
                    excluded: Collection[str]) -> Callable[[str], float] | None:
    """How many more pods of a namespace priority preemption may evict in
    this cycle: its hourly budget less the last hour's evictions and those
    of earlier preemptors in the cycle (``excluded``); None: no budget."""
    if policy.namespace_evictions_per_hour is None:
        return None
    taken = Counter(snapshot.pods[uid].namespace for uid in excluded if uid in snapshot.pods)
    return lambda namespace: state.evictions_left(policy, namespace) - taken[namespace]


def _beyond_budget(victims: Iterable[PodInfo], left: Callable[[str], float]) -> str:
    """The first namespace that evicting ``victims`` takes past its budget ("" if none)."""
    counts = Counter(p.namespace for p in victims)
    return next((ns for ns, n in sorted(counts.items()) if n > left(ns)), "")


def _spent_namespaces(snapshot: Snapshot, policy: PreemptionPolicy, state: PreemptionState,
                      excluded: Collection[str]) -> list[str]:
    """Namespaces with candidate victims that their eviction budget keeps."""
    left = _evictions_left(snapshot, policy, state, excluded)
    if left is None:
        return []
    return sorted({p.namespace for p in _victim_candidates(snapshot, policy, state) if left(p.namespace) < 1})


@dataclass
class _Candidates:
    """``_victim_candidates``'s answer and what it is for (ClusterState.kept)."""

    snapshot: Snapshot | None = None
    policy: PreemptionPolicy | None = None
    state: PreemptionState | None = None
    pods: list[PodInfo] = field(default_factory=list)


def _victim_candidates(snapshot: Snapshot, policy: PreemptionPolicy, state: PreemptionState) -> list[PodInfo]:
    """The pods, in ``pods`` order, that some preemptor may evict: every
    pod-level rule that does not depend on the preemptor holds.  Computed
    once per snapshot, policy and state: a cycle asks for every gang that
    does not fit."""
    kept = snapshot.cluster.kept(_Candidates)
    if kept.snapshot is snapshot and kept.policy is policy and kept.state is state:
        return kept.pods
    kept.pods = [pod for pod in snapshot.pods.values()
                 if pod.uid not in state.refused and pod.node_name not in state.cooling_nodes
                 and pod.node_name in snapshot.nodes and policy.may_be_victim(pod, _ANY_PREEMPTOR, snapshot.now)]
    kept.snapshot, kept.policy, kept.state = snapshot, policy, state
    return kept.pods


_ANY_PREEMPTOR = float("inf")  # a priority above every pod's


def _cheapest_on_node(request: Resources, free: Resources, node: str, candidates: list[VictimUnit],
                      gone: Collection[str]) -> list[VictimUnit] | None:
    """The cheapest units on ``node`` whose eviction makes ``request`` fit;
    ``free`` already counts the pods in ``gone``."""
    taken: list[VictimUnit] = []
    room = dict(free)
    counted = set(gone)
    for unit in candidates:
        if not res.shortfall(request, room):
            break
        new = [p for p in distinct_pods([unit], counted) if p.node_name == node]
        if new:  # else every pod of it here is already counted
            taken.append(unit)
            for pod in new:
                counted.add(pod.uid)
                room = res.add(room, pod.requests)
    if res.shortfall(request, room):
        return None
    # Reprieve: keep back every unit (dearest first) the pod can do without.
    for unit in sorted(taken, key=lambda u: u.cost, reverse=True):
        rest = [u for u in taken if u is not unit]
        if not res.shortfall(request, res.add(free, _freed_on(node, rest, gone))):
            taken = rest
    return taken


@dataclass(frozen=True)
class PreemptionRoom:
    """Where a preemptor plans: ``free``, what the gang may use now (and
    ``node_filter`` over its nodes); ``going``, terminating room that will
    be the gang's once it is gone (NominationHolds.going_for); ``rooms``,
    the nodes' GPU ids and NUMA room, when they are tracked;
    ``off_limits``, nodes it may not use."""

    free: Mapping[str, Resources]
    node_filter: NodeFilter
    going: Mapping[str, Resources]
    rooms: Mapping[str, GpuRoom]
    off_limits: Collection[str] = ()


@dataclass(frozen=True)
class VictimRules:
    """Which victims it may take: ``budget``, how many are left of
    ``max_victims_per_cycle`` in this cycle; ``excluded``, victims of
    earlier preemptors in this cycle; ``reclaim``, the victim gangs a
    reclaim may take (victim_units), whatever their priority;
    ``budgeted``, the namespaces' eviction budgets apply to those too (a
    reclaim's victims are not counted against them, docs/preemption.md)."""

    budget: int
    excluded: Collection[str] = ()
    reclaim: Callable[[str], bool] | None = None
    budgeted: bool = False

    @property
    def namespace_budgets(self) -> bool:
        return self.reclaim is None or self.budgeted


def plan_preemption(snapshot: Snapshot, gangs: Mapping[str, Gang], gang: Gang, policy: PreemptionPolicy,
                    state: PreemptionState, where: PreemptionRoom, rules: VictimRules) -> PreemptionPlan | NoPreemption:
    """The victims that make room for ``gang``'s quorum, and where each of
    its pods goes once they are gone; or why there are none."""
    why_not = policy.why_not_preempt(gang.spec, gang.priority, gang.members)
    if why_not:
        return NoPreemption(f"Gang {gang.key} may not preempt: {why_not}.")
    if gang.key in state.in_flight:
        return NoPreemption(f"Gang {gang.key} is waiting for the pods it preempted to terminate.")
    units = victim_units(snapshot, gangs, gang, policy, state, rules)
    search = _Search.start(snapshot, where, units)
    quorum = sorted(gang.pending, key=lambda p: (-p.requests.get(GPU_RESOURCE, 0),
                                                 -p.requests.get(res.CPU, 0), p.created, p.name))
    for pod in quorum[:gang.need]:
        best = search.cheapest_node(pod, gang.spec.topology, where, state.cooling_nodes)
        if best is None:
            return NoPreemption(_nowhere_message(snapshot, gang, policy, state, rules))
        search.take(pod, *best)
    victims = tuple(distinct_pods(search.chosen.values()))
    too_many = _beyond_budgets(snapshot, gang, policy, state, rules, victims)
    if too_many:
        return NoPreemption(too_many)
    nodes = sorted({n for _, n in search.nominations})
    if victims:
        message = (f"Gang {gang.key} is preempting {len(victims)} pod(s) on {', '.join(nodes)}: "
                   + ", ".join(sorted(p.key for p in victims)[:10]) + (" ..." if len(victims) > 10 else ""))
    else:
        message = f"Gang {gang.key} waits for terminating pods on {', '.join(nodes)}."
    return PreemptionPlan(gang.key, victims, tuple(search.nominations), message)


@dataclass
class _Search:
    """The hypothetical cluster a preemptor's quorum is placed on, pod by
    pod: free room and GPU room with the victims chosen so far and every
    terminating pod gone."""

    snapshot: Snapshot
    room: dict[str, Resources]
    gpu_room: dict[str, GpuRoom]
    by_node: dict[str, list[VictimUnit]]  # candidate units with a pod on the node
    chosen: dict[str, VictimUnit] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)  # the pods of the chosen units
    nominations: list[tuple[PodInfo, str]] = field(default_factory=list)

    @classmethod
    def start(cls, snapshot: Snapshot, where: PreemptionRoom, units: list[VictimUnit]) -> _Search:
        room: dict[str, Resources] = {name: dict(f) for name, f in where.free.items()}
        for node, soon in where.going.items():
            room[node] = res.add(room.get(node, {}), soon)
        by_node: dict[str, list[VictimUnit]] = {}
        for unit in units:
            for node in unit.nodes:
                by_node.setdefault(node, []).append(unit)
        gpu_room = dict(where.rooms)
        for pod in snapshot.cluster.terminating_pods():  # their GPUs count as free, like their room
            if pod.node_name in gpu_room:
                gpu_room[pod.node_name] = _without(gpu_room[pod.node_name], snapshot.nodes[pod.node_name], [pod])
        return cls(snapshot, room, gpu_room, by_node)

    def cheapest_node(self, pod: PodInfo, topology: TopologyPolicy, where: PreemptionRoom,
                      cooling: Collection[str]) -> tuple[str, list[VictimUnit], GpuPick | None] | None:
        """The node where the cheapest victims (with those chosen) make
        ``pod`` fit, then the best GPU set, then the tightest fit."""
        nodes, room, gone = self.snapshot.nodes, self.room, self.gone
        best: tuple | None = None
        for node in where.node_filter.evaluate(pod).feasible:
            if node in where.off_limits or node in cooling or static_reason(nodes[node], pod.requests, topology):
                continue
            candidates = [u for u in self.by_node.get(node, ()) if distinct_pods([u], gone)]
            extra = _cheapest_on_node(pod.requests, room[node], node, candidates, gone)
            if extra is None:
                continue
            fitted = self._with_gpus(nodes[node], pod.requests, topology, extra, candidates)
            if fitted is None:
                continue
            extra, pick = fitted
            after = res.add(room[node], _freed_on(node, extra, gone))
            rank = (set_cost(list(self.chosen.values()) + extra), pick.quality if pick else (),
                    pack_score(nodes[node], pod.requests, after), node)
            if best is None or rank < best[0]:
                best = (rank, node, extra, pick)
        return best[1:] if best is not None else None

    def _with_gpus(self, node: NodeInfo, request: Resources, topology_policy: TopologyPolicy, extra: list[VictimUnit],
                   candidates: list[VictimUnit]) -> tuple[list[VictimUnit], GpuPick | None] | None:
        """Make the victims on ``node`` give the pod GPUs its gang's topology
        policy accepts, and among equally cheap victim sets prefer the one that
        frees the best-connected set; None when no victim set does."""
        gpu_room, free, gone = self.gpu_room.get(node.name), self.room[node.name], self.gone
        if gpu_room is None or not request.get(GPU_RESOURCE, 0):
            return extra, None

        def pick_for(units: list[VictimUnit]) -> GpuPick | str:
            pods = [p for p in distinct_pods(units, gone) if p.node_name == node.name]
            return pick_gpus(node, _without(gpu_room, node, pods), request, topology_policy)

        pick = pick_for(extra)
        if isinstance(pick, str):  # the policy needs more room than the counts do
            more = list(extra)
            for unit in candidates:
                if unit not in more:
                    more.append(unit)
                    pick = pick_for(more)
                    if not isinstance(pick, str):
                        break
            if isinstance(pick, str):
                return None
            extra = more
        ideal = pick_for(candidates)
        if isinstance(ideal, str) or ideal.gpus == pick.gpus:
            return extra, pick
        wanted = mask_of(ideal.gpus)
        holding = [u for u in candidates if any(mask_of(p.gpu_ids) & wanted for p in u.pods
                                                if p.node_name == node.name)]
        room = res.add(free, _freed_on(node.name, holding, gone))
        topping = _cheapest_on_node(request, room, node.name, [u for u in candidates if u not in holding],
                                    set(gone) | {p.uid for p in distinct_pods(holding)})
        if topping is None:
            return extra, pick
        aligned = holding + topping
        aligned_pick = pick_for(aligned)
        if (not isinstance(aligned_pick, str) and set_cost(aligned) <= set_cost(extra)
                and aligned_pick.quality <= pick.quality):
            return aligned, aligned_pick
        return extra, pick

    def take(self, pod: PodInfo, node: str, extra: list[VictimUnit], pick: GpuPick | None) -> None:
        """Evict ``extra`` and place ``pod`` on ``node`` (with ``pick``'s GPUs)."""
        room, gpu_room, nodes = self.room, self.gpu_room, self.snapshot.nodes
        for victim in distinct_pods(extra, self.gone):
            where = victim.node_name
            room[where] = res.add(room.get(where, {}), victim.requests)
            if where in gpu_room:
                gpu_room[where] = _without(gpu_room[where], nodes[where], [victim])
            self.gone.add(victim.uid)
        self.chosen.update((unit.key, unit) for unit in extra)
        room[node] = res.subtract(room[node], charged(pod.requests, pick, pod.device_demand))
        if pick is not None:
            gpu_room[node] = gpu_room[node].take(pick.gpus, pod.requests, pick.numa)
        self.nominations.append((pod, node))


def _nowhere_message(snapshot: Snapshot, gang: Gang, policy: PreemptionPolicy, state: PreemptionState,
                     rules: VictimRules) -> str:
    message = (f"Gang {gang.key} would not fit even after evicting every pod policy allows; "
               "nothing was evicted.")
    spent = _spent_namespaces(snapshot, policy, state, rules.excluded) if rules.namespace_budgets else []
    if spent:
        message += (f" Namespace(s) {', '.join(spent[:5])} reached their eviction budget "
                    f"(maxPerNamespacePerHour={policy.namespace_evictions_per_hour}).")
    if state.refused:
        uid, why = next(iter(sorted(state.refused.items())))
        message += (f" {len(state.refused)} candidate victim(s) could not be evicted lately, "
                    f"e.g. {snapshot.pods[uid].key if uid in snapshot.pods else uid}: {why}")
    return message


def _beyond_budgets(snapshot: Snapshot, gang: Gang, policy: PreemptionPolicy, state: PreemptionState,
                    rules: VictimRules, victims: tuple[PodInfo, ...]) -> str:
    """Why ``victims`` are too many (a namespace's hourly budget, the
    cycle's victims left); "" when they are not."""
    left = _evictions_left(snapshot, policy, state, rules.excluded) if rules.namespace_budgets else None
    spent = _beyond_budget(victims, left) if left is not None else ""
    if spent:
        return (f"Gang {gang.key} would evict more pods of namespace {spent} than the "
                f"{left(spent):.0f} left of its eviction budget "
                f"(maxPerNamespacePerHour={policy.namespace_evictions_per_hour}); nothing was evicted.")
    if len(victims) > rules.budget:
        limit = f"maxVictimsPerCycle={policy.max_victims_per_cycle}"
        if rules.budget < policy.max_victims_per_cycle:
            limit = f"the {rules.budget} left of {limit} in this cycle"
        return (f"Gang {gang.key} would need {len(victims)} victims, more than {limit}; "
                "nothing was evicted.")
    return ""


def _without(room: GpuRoom, node: NodeInfo, pods: Iterable[PodInfo]) -> GpuRoom:
    """``room`` once ``pods`` (bound to ``node``) are gone."""
    for pod in pods:
        asked = pod.requests.get(GPU_RESOURCE, 0)
        named = [g for g in sorted(set(pod.gpu_ids)) if not room.free >> g & 1][:asked]
        room = room.give(named, pod.requests, charged_numa(node, named, asked))
    return room


@dataclass
class NominationHolds:
    """Room claimed by preemptors whose victims are still going.

    On a node with free room F, room G held by terminating pods and claims C
    (the requests of pending pods nominated there), the claims are served
    first from G: a claimant's own claim is its own, everyone else may use
    only ``F - max(0, C - G)`` now, and a preemptor planning evictions may
    count on ``max(0, G - others' claims)`` of the terminating room.
    """

    claims: dict[str, dict[str, Resources]] = field(default_factory=dict)  # gang -> node -> claim
    going: dict[str, Resources] = field(default_factory=dict)  # node -> held by terminating pods

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> "NominationHolds":
        holds = cls()
        for pod in snapshot.cluster.terminating_pods():
            if pod.node_name in snapshot.nodes:
                holds.going[pod.node_name] = res.add(holds.going.get(pod.node_name, {}), pod.requests)
        for pod in snapshot.cluster.nominated_pods():
            if pod.nominated_node in snapshot.nodes:
                node_claims = holds.claims.setdefault(pod.gang_key, {})
                node_claims[pod.nominated_node] = res.add(node_claims.get(pod.nominated_node, {}), pod.requests)
        return holds

    def _others(self, gang_key: str | None) -> dict[str, Resources]:
        out: dict[str, Resources] = {}
        for key, node_claims in self.claims.items():
            if key != gang_key:
                for node, amount in node_claims.items():
                    out[node] = res.add(out.get(node, {}), amount)
        return out

    def withheld(self, gang_key: str | None = None) -> dict[str, Resources]:
        """Free room that gang (None: a gang with no claim) may not use now."""
        return {node: _positive(res.subtract(claim, self.going.get(node, {})))
                for node, claim in self._others(gang_key).items()}

    def going_for(self, gang_key: str) -> dict[str, Resources]:
        """Terminating room that will be the gang's to use once it is gone."""
        others = self._others(gang_key)
        return {node: _positive(res.subtract(going, others.get(node, {}))) for node, going in self.going.items()}


def _positive(amounts: Resources) -> Resources:
    return {k: v for k, v in amounts.items() if v > 0}
