"""Baseline schedulers the simulator runs beside batchsched, each a simple,
count-only scheduler that stands for a common way of placing GPU jobs:

``spread``  kube-scheduler's default, roughly: every pod on its own, none
            of gangs (a gang's pods bind as they fit, and a job whose
            quorum is not all bound holds its GPUs idle); the node with the
            most free GPUs (then the most free cpu); GPU ids arbitrary, as
            the kubelet's device manager hands them out without topology
            hints (a seeded random choice).
``binpack`` first-fit bin packing of whole gangs: a gang binds at least its
            quorum at once or nothing; each pod on the first node, in name
            order, where it fits; the lowest free GPU ids.
``random``  a count-only gang scheduler (all or nothing, like the
            coscheduling plugin on kube-scheduler's default scoring): nodes
            as ``spread``, GPU ids at random.

``proportion`` quota admission with no reclaim, approximating Volcano's
            proportion plugin (its idea, not its code): ``binpack``'s
            placement, and a gang is admitted only within its queue's GPU
            quota.  Gangs whose queue stays within its ``guaranteed`` (Volcano's
            ``deserved``) with them go first, the queue furthest below it
            first; then the rest borrow idle GPUs up to the queue's (and its
            parent's) ``limit``.  Nothing is ever evicted: a queue gets its
            guaranteed back only as the borrowers' jobs end.  Counts
            ``nvidia.com/gpu`` only (no other resource, no GPU types), and
            takes weights into no account: Volcano divides ``deserved`` by
            weight, here it is the Queue's ``guaranteed``.

``volcano-like`` an approximation of Volcano's default session (actions
            allocate and preempt, plugins gang, priority and binpack; its
            ideas, not its code): whole gangs, each pod on the node that
            ends up fullest (most GPUs, then cpu, allocated: the binpack
            plugin with a GPU weight), the lowest free GPU ids (no topology),
            no reservation.  A gang that does not fit evicts lower-priority
            pods as Volcano's preempt action does: node by node, fullest
            first, victims of the lowest priority (then the youngest) first
            until the pod fits, and only if the whole quorum fits once they
            are gone; members of a victim gang go one by one (the legacy
            preempt action, whose gang check the shipped configs turn off),
            leaving it below its quorum.  While its victims terminate the
            gang does not preempt again, and nothing else takes the nodes it
            pipelined on in that cycle.
``kai-like`` an approximation of NVIDIA KAI Scheduler's defaults with fair
            share off (its ideas, not its code): placement as
            ``volcano-like``; preemption by victim *jobs*, as KAI's job
            solver: a victim gang goes whole (a gang left below its quorum
            would be evicted whole by KAI's stale-gang eviction), and jobs
            are added as victims cheapest first (lowest priority, then
            youngest), wherever they run, until the whole quorum fits; of
            those, the jobs with a pod on a node the quorum lands on are
            evicted.  Not modelled: KAI's consolidation (repacking running pods
            to make room), its queues and time-based fair share, and
            reservation pods for GPU sharing.

Both preempting baselines obey the scheduler config's ``preemption`` rules
of *who* (enabled, the preemptors' and victims' selectors, minimum run time,
opt-outs, ``gangs: never`` keeping gang members out); the rules of *how*
are theirs: no cooldown, no victim budget, no topology.

The others try pending pods by priority (highest first), then creation, and
skip what does not fit without blocking the rest, as kube-scheduler's queue
does; none backs off, reserves or preempts.  They honour the same static
predicates as batchsched (``batchsched.core.placement.fit``: taints, node
selectors, required node affinity) and count every resource a pod requests.
Where DRA serves a node's GPUs, a pod bound there gets the claim
kube-scheduler's DRA plugin would write, allocating the devices of its GPU
ids.
"""
from __future__ import annotations

import math
import random
from typing import Callable, Mapping, Sequence

from batchsched.api import constants
from batchsched.core import resources as res
from batchsched.core.cycle import Binding, CyclePlan, Eviction
from batchsched.core.dra.extended import extended_claim
from batchsched.core.gangs import Gang, GangIndex
from batchsched.core.model import PodInfo
from batchsched.core.placement.capacity import shape_key
from batchsched.core.placement.fit import NodeFilter
from batchsched.core.preemption.policy import GANG_VICTIMS_NEVER, PreemptionPolicy
from batchsched.core.queues.model import QueueInfo
from batchsched.core.resources import Resources
from batchsched.core.topology.choose import gpus_of, mask_of
from batchsched.sim.engine import SimCluster
from batchsched.sim.workload import to_unix

SPREAD, BINPACK, RANDOM, PROPORTION = "spread", "binpack", "random", "proportion"
VOLCANO_LIKE, KAI_LIKE = "volcano-like", "kai-like"
NAMES = (SPREAD, BINPACK, RANDOM, VOLCANO_LIKE, KAI_LIKE, PROPORTION)

# Which node a pod goes to, among those where it fits:
FIRST_FIT = "first-fit"  # the first by name
MOST_FREE = "most-free"  # the most free GPUs, then cpu (spreading)
FULLEST = "fullest"  # the fewest free GPUs, then cpu, once it is there (packing)


class CountOnlyScheduler:
    """One baseline: gangs or single pods, the node rule and the GPU-id rule."""

    def __init__(self, name: str, gangs: bool, node_rule: str, random_ids: bool, seed: int = 1):
        self.name = name
        self.gangs, self.node_rule, self.random_ids = gangs, node_rule, random_ids
        self.rng = random.Random(seed)
        self._filter: NodeFilter | None = None
        self._off_limits: set[str] = set()  # nodes no pod may take in this cycle

    def next_wakeup(self) -> float | None:
        return None  # nothing but a change in the cluster changes its decisions

    def cycle(self, cluster: SimCluster, now: float) -> CyclePlan:
        cluster.drain_changes()  # no queue state to update
        gangs = self._pending(cluster, now)
        gangs.sort(key=lambda g: (-g.priority, g.created, g.key))
        trial = _Trial(cluster)
        plan = CyclePlan()
        for gang in gangs:
            self._try(cluster, gang, trial, plan)
        return plan

    def _pending(self, cluster: SimCluster, now: float) -> list[Gang]:
        if self._filter is None or self._filter.nodes is not cluster.nodes:
            self._filter = NodeFilter(cluster.nodes)
        return [g for g in GangIndex(cluster.snapshot(now)).pending() if g.eligible]

    def _try(self, cluster: SimCluster, gang: Gang, trial: _Trial, plan: CyclePlan,
             admits: Callable[[int], bool] = lambda gpus: True) -> int | None:
        """Place what fits of the gang, if ``admits`` the GPUs that takes;
        the GPUs placed (None: not placed)."""
        if self.gangs:
            placed = self._place(gang.pending, trial)
            gpus = sum(pod.requests.get(constants.GPU_RESOURCE, 0) for pod, _, _ in placed)
            if len(placed) >= gang.need and admits(gpus):
                trial.commit()
                plan.bindings.extend(_binding(cluster, gang, *p) for p in placed)
                return gpus
            trial.discard()
            return None
        for pod in gang.pending:
            placed = self._place([pod], trial)
            trial.commit()
            plan.bindings.extend(_binding(cluster, gang, *p) for p in placed)
        return None  # pods one by one: no gang placed as one

    def _place(self, pods: Sequence[PodInfo], trial: _Trial) -> list[tuple[PodInfo, str, tuple[int, ...]]]:
        """Place pods one by one on the trial's free maps, as many as fit."""
        placed = []
        for pod in pods:
            shape = shape_key(pod)
            if trial.failed(shape):
                continue  # within a cycle room only shrinks: what failed fails again
            node = self._node_for(pod, trial)
            if node is None:
                trial.fail(shape)
                continue
            placed.append((pod, node, trial.take(node, pod.requests, self._ids)))
        return placed

    def _node_for(self, pod: PodInfo, trial: _Trial) -> str | None:
        best, best_key = None, None
        gpus = pod.requests.get(constants.GPU_RESOURCE, 0)
        for name in self._filter.evaluate(pod).feasible:  # sorted by name
            free = trial.free(name)
            if (name in self._off_limits or free.get(constants.GPU_RESOURCE, 0) < gpus
                    or res.shortfall(pod.requests, free)):
                continue
            if self.node_rule == FIRST_FIT:
                return name
            key = _node_key(self.node_rule, free)
            if best_key is None or key > best_key:
                best, best_key = name, key
        return best

    def _ids(self, free_ids: int, k: int) -> tuple[int, ...]:
        ids = gpus_of(free_ids)
        return tuple(sorted(self.rng.sample(ids, k))) if self.random_ids else ids[:k]


class ProportionScheduler(CountOnlyScheduler):
    """``proportion`` (module docstring): ``binpack`` under GPU quotas."""

    def __init__(self, default_queue: str = "default"):
        super().__init__(PROPORTION, gangs=True, node_rule=FIRST_FIT, random_ids=False)
        self.default_queue = default_queue

    def cycle(self, cluster: SimCluster, now: float) -> CyclePlan:
        cluster.drain_changes()
        queues = cluster.queues
        held: dict[str, int] = {}
        for pod in cluster.pods.values():
            if pod.holds_resources:
                self._charge(queues, held, self._queue_of(cluster, pod.gang_key),
                             pod.requests.get(constants.GPU_RESOURCE, 0))
        gangs = self._pending(cluster, now)
        trial = _Trial(cluster)
        plan = CyclePlan()

        def within_guaranteed(gang: Gang) -> bool:
            name = self._queue_of(cluster, gang.key)
            return held.get(name, 0) + _minimum_gpus(gang) <= _gpu_quota(queues, name, "guaranteed")

        def below_guaranteed(gang: Gang) -> float:  # lowest first: the queue furthest below its guaranteed
            name = self._queue_of(cluster, gang.key)
            return held.get(name, 0) / max(1, _gpu_quota(queues, name, "guaranteed"))

        guaranteed = sorted((g for g in gangs if within_guaranteed(g)),
                            key=lambda g: (below_guaranteed(g), -g.priority, g.created, g.key))
        refused = [g for g in guaranteed if not self._admit(cluster, g, trial, plan, held, "guaranteed")]
        first = {g.key for g in guaranteed}
        # then, borrowing: the rest, and those the gangs before them left beyond guaranteed
        borrowing = sorted([g for g in gangs if g.key not in first] + refused,
                           key=lambda g: (-g.priority, g.created, g.key))
        for gang in borrowing:
            self._admit(cluster, gang, trial, plan, held, "limit")
        return plan

    def _admit(self, cluster: SimCluster, gang: Gang, trial: _Trial, plan: CyclePlan, held: dict[str, int],
               ceiling: str) -> bool:
        """Place the gang if its queue (and parent) stay within ``ceiling``
        (guaranteed or limit) of GPUs with it; whether it was placed."""
        queues = cluster.queues
        name = self._queue_of(cluster, gang.key)
        chain = [name] + ([queues[name].parent] if name in queues and queues[name].parent in queues else [])
        gpus = self._try(cluster, gang, trial, plan, admits=lambda gpus: all(
            held.get(q, 0) + gpus <= _gpu_quota(queues, q, ceiling) for q in chain))
        if gpus is None:
            return False
        self._charge(queues, held, name, gpus)
        return True

    def _queue_of(self, cluster: SimCluster, gang_key: str) -> str:
        group = cluster.groups.get(gang_key)  # a lone pod has none: the default queue
        return group.queue or self.default_queue if group is not None else self.default_queue

    @staticmethod
    def _charge(queues: Mapping[str, QueueInfo], held: dict[str, int], name: str, gpus: int) -> None:
        """A queue's GPUs count against its parent's too."""
        held[name] = held.get(name, 0) + gpus
        parent = queues[name].parent if name in queues else ""
        if parent in queues:
            held[parent] = held.get(parent, 0) + gpus


class PreemptingScheduler(CountOnlyScheduler):
    """``volcano-like`` and ``kai-like`` (module docstring): packing gangs,
    and priority preemption for a gang that does not fit; ``whole_gangs``:
    a victim gang goes whole (kai-like) or member by member (volcano-like)."""

    def __init__(self, name: str, policy: PreemptionPolicy, whole_gangs: bool):
        super().__init__(name, gangs=True, node_rule=FULLEST, random_ids=False)
        self.policy, self.whole_gangs = policy, whole_gangs
        self._victims_of: dict[str, set[str]] = {}  # preemptor gang -> its victims' uids

    def cycle(self, cluster: SimCluster, now: float) -> CyclePlan:
        cluster.drain_changes()
        for gang_key, uids in list(self._victims_of.items()):
            uids.intersection_update(cluster.pods)  # a deleted victim is gone for good
            if not uids:
                del self._victims_of[gang_key]
        gangs = self._pending(cluster, now)
        gangs.sort(key=lambda g: (-g.priority, g.created, g.key))
        trial, plan = _Trial(cluster), CyclePlan()
        self._off_limits = set()
        candidates: list[PodInfo] | None = None  # the pods some preemptor may evict, found once a cycle
        for gang in gangs:
            if self._try(cluster, gang, trial, plan) is not None or not self.policy.enabled:
                continue
            if gang.key in self._victims_of or self.policy.why_not_preempt(gang.spec, gang.priority, gang.members):
                continue
            if candidates is None:
                candidates = self._candidates(cluster, to_unix(now))
            self._preempt(cluster, gang, trial, plan, candidates)
        return plan

    def _candidates(self, cluster: SimCluster, now: float) -> list[PodInfo]:
        out = []
        for pod in cluster.pods.values():
            group = cluster.groups.get(pod.gang_key)
            in_gang = group is not None and group.min_member > 1
            if in_gang and self.policy.gang_victims == GANG_VICTIMS_NEVER:
                continue
            if self.policy.may_be_victim(pod, math.inf, now, group):
                out.append(pod)
        return out

    def _preempt(self, cluster: SimCluster, gang: Gang, trial: _Trial, plan: CyclePlan,
                 candidates: list[PodInfo]) -> None:
        """Choose victims for the gang's quorum and evict them, or nothing
        when the quorum would not fit even then."""
        taken = {e.pod.uid for e in plan.evictions}
        by_gang: dict[str, list[PodInfo]] = {}
        for pod in candidates:
            if pod.priority < gang.priority and pod.uid not in taken and pod.gang_key != gang.key:
                by_gang.setdefault(pod.gang_key, []).append(pod)
        units = []
        for members in by_gang.values():
            group = cluster.groups.get(members[0].gang_key)
            whole = self.whole_gangs and group is not None and group.min_member > 1
            units.extend([tuple(members)] if whole else [(p,) for p in members])
        # the lowest priority first, then the youngest, then the smallest
        units.sort(key=lambda u: (max(p.priority for p in u), -max(p.started for p in u), len(u), u[0].uid))
        quorum = sorted(gang.pending, key=lambda p: -p.requests.get(constants.GPU_RESOURCE, 0))[:gang.need]
        chosen = (self._victims_by_job(quorum, units, trial) if self.whole_gangs
                  else self._victims_node_by_node(quorum, units, trial))
        if chosen is None:
            return  # the quorum does not fit even so: evict nothing
        victims, used = chosen
        if not victims:
            return  # it fits on room others hold in this cycle: it is tried again next cycle
        plan.evictions.extend(Eviction(v, gang.key) for v in victims)
        self._victims_of[gang.key] = {v.uid for v in victims}
        self._off_limits |= used  # pipelined: nothing else takes those nodes in this cycle

    def _victims_node_by_node(self, quorum: list[PodInfo], units: list[tuple[PodInfo, ...]],
                              trial: _Trial) -> tuple[list[PodInfo], set[str]] | None:
        """Volcano's preempt action: each pod on the fullest node where
        evicting victims there, cheapest first, makes it fit."""
        on_node: dict[str, list[tuple[PodInfo, ...]]] = {}
        for unit in units:
            for node in {p.node_name for p in unit}:
                on_node.setdefault(node, []).append(unit)
        freed: dict[str, Resources] = {}  # room the chosen victims free
        victims: dict[str, PodInfo] = {}
        used: dict[str, Resources] = {}  # what the quorum placed so far takes
        for pod in quorum:
            for node in self._by_fullness(pod, trial):
                room = res.subtract(res.add(trial.free(node), freed.get(node, {})), used.get(node, {}))
                extra = []
                for unit in on_node.get(node, ()):
                    if not res.shortfall(pod.requests, room):
                        break
                    new = [p for p in unit if p.uid not in victims]
                    if new:
                        extra.extend(new)
                        room = res.add(room, _requests_on(node, new))
                if res.shortfall(pod.requests, room):
                    continue
                for victim in extra:
                    victims[victim.uid] = victim
                    freed[victim.node_name] = res.add(freed.get(victim.node_name, {}), victim.requests)
                used[node] = res.add(used.get(node, {}), pod.requests)
                break
            else:
                return None
        return list(victims.values()), set(used)

    def _victims_by_job(self, quorum: list[PodInfo], units: list[tuple[PodInfo, ...]],
                        trial: _Trial) -> tuple[list[PodInfo], set[str]] | None:
        """KAI's job solver, roughly: victim jobs are added cheapest first,
        wherever they run, until the whole quorum fits; then only the jobs
        with a pod on a node the quorum uses are kept."""
        freed: dict[str, Resources] = {}
        for k in range(len(units) + 1):
            if k:
                for pod in units[k - 1]:
                    freed[pod.node_name] = res.add(freed.get(pod.node_name, {}), pod.requests)
            used = self._fit(quorum, trial, freed)
            if used is not None:
                kept = [u for u in units[:k] if any(p.node_name in used for p in u)]
                return [p for u in kept for p in u], used
        return None

    def _fit(self, quorum: list[PodInfo], trial: _Trial, freed: Mapping[str, Resources]) -> set[str] | None:
        """The nodes the quorum lands on, each pod on the fullest where it
        fits once ``freed`` is free too; None if some pod fits nowhere."""
        used: dict[str, Resources] = {}
        for pod in quorum:
            for node in self._by_fullness(pod, trial):
                room = res.subtract(res.add(trial.free(node), freed.get(node, {})), used.get(node, {}))
                if not res.shortfall(pod.requests, room):
                    used[node] = res.add(used.get(node, {}), pod.requests)
                    break
            else:
                return None
        return set(used)

    def _by_fullness(self, pod: PodInfo, trial: _Trial) -> list[str]:
        """The nodes the pod may go to in this cycle, fullest first."""
        return sorted((n for n in self._filter.evaluate(pod).feasible if n not in self._off_limits),
                      key=lambda n: _node_key(FULLEST, trial.free(n)), reverse=True)


def _requests_on(node: str, pods: Sequence[PodInfo]) -> Resources:
    total: Resources = {}
    for pod in pods:
        if pod.node_name == node:
            total = res.add(total, pod.requests)
    return total


def _node_key(rule: str, free: Resources) -> tuple:
    """Higher is better: the most free GPUs (then cpu), or the fewest."""
    key = (free.get(constants.GPU_RESOURCE, 0), free.get(res.CPU, 0))
    return key if rule == MOST_FREE else (-key[0], -key[1])


def _minimum_gpus(gang: Gang) -> int:
    """The GPUs of the gang's minimum: its ``need`` pending pods asking the fewest."""
    asks = sorted(pod.requests.get(constants.GPU_RESOURCE, 0) for pod in gang.pending)
    return sum(asks[:gang.need])


def _gpu_quota(queues: Mapping[str, QueueInfo], name: str, which: str) -> float:
    """A queue's ``guaranteed`` (0 when unset) or ``limit`` (no bound when unset) of GPUs."""
    quota = queues[name].quotas.get(constants.GPU_RESOURCE) if name in queues else None
    amount = getattr(quota, which) if quota is not None else None
    if amount is None:
        return 0 if which == "guaranteed" else math.inf
    return amount


def _binding(cluster: SimCluster, gang: Gang, pod: PodInfo, node: str, gpu_ids: tuple[int, ...]) -> Binding:
    """The binding, with the pod's claim where DRA serves the node's GPUs."""
    info, claim = cluster.nodes[node], None
    if info.gpus_by_dra and pod.requests.get(constants.GPU_RESOURCE, 0):
        claim = extended_claim(info, pod, gpu_ids, cluster.state.dra.classes)
    return Binding(pod.uid, pod.namespace, pod.name, node, gang.key, gpu_ids, claim)


class _Trial:
    """Free resources and GPU ids in a cycle, with one tentative change set
    (a gang's) on top that is committed or discarded, and the pod shapes
    that fitted nowhere."""

    def __init__(self, cluster: SimCluster):
        self._cluster = cluster
        self._free: dict[str, Resources] = {}  # committed in this cycle
        self._ids: dict[str, int] = {}
        self._failed: set[tuple] = set()
        self._tentative: dict[str, tuple[Resources, int | None]] = {}
        self._tentative_failed: set[tuple] = set()

    def free(self, node: str) -> Resources:
        if node in self._tentative:
            return self._tentative[node][0]
        return self._free[node] if node in self._free else self._cluster.free[node]

    def free_ids(self, node: str) -> int | None:
        if node in self._tentative:
            return self._tentative[node][1]
        return self._ids[node] if node in self._ids else self._cluster.free_ids.get(node)

    def take(self, node: str, requests: Resources,
             choose: Callable[[int, int], tuple[int, ...]]) -> tuple[int, ...]:
        """Take ``requests`` on ``node``; the GPU ids chosen (none on nodes without ids)."""
        ids = self.free_ids(node)
        gpus = requests.get(constants.GPU_RESOURCE, 0)
        chosen = choose(ids, gpus) if ids is not None and gpus else ()
        left = ids & ~mask_of(chosen) if ids is not None else None
        self._tentative[node] = (res.subtract(self.free(node), requests), left)
        return chosen

    def failed(self, shape: tuple) -> bool:
        return shape in self._failed or shape in self._tentative_failed

    def fail(self, shape: tuple) -> None:
        self._tentative_failed.add(shape)

    def commit(self) -> None:
        for node, (free, ids) in self._tentative.items():
            self._free[node] = free
            if ids is not None:
                self._ids[node] = ids
        self._failed |= self._tentative_failed
        self.discard()

    def discard(self) -> None:
        self._tentative.clear()
        self._tentative_failed.clear()  # they may have failed for the discarded room only


def baseline(name: str, seed: int = 1, default_queue: str = "default",
             preemption: PreemptionPolicy = PreemptionPolicy(enabled=False)) -> CountOnlyScheduler:
    """A baseline by name (NAMES); ``default_queue``: the queue of gangs
    naming none; ``preemption``: who may preempt whom, for the preempting ones."""
    if name == SPREAD:
        return CountOnlyScheduler(SPREAD, gangs=False, node_rule=MOST_FREE, random_ids=True, seed=seed)
    if name == BINPACK:
        return CountOnlyScheduler(BINPACK, gangs=True, node_rule=FIRST_FIT, random_ids=False, seed=seed)
    if name == RANDOM:
        return CountOnlyScheduler(RANDOM, gangs=True, node_rule=MOST_FREE, random_ids=True, seed=seed)
    if name in (VOLCANO_LIKE, KAI_LIKE):
        return PreemptingScheduler(name, preemption, whole_gangs=name == KAI_LIKE)
    if name == PROPORTION:
        return ProportionScheduler(default_queue)
    raise ValueError(f"unknown baseline {name!r} (known: {', '.join(NAMES)})")
