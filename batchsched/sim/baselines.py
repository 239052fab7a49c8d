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

The first three try pending pods by priority (highest first), then creation, and
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
from batchsched.core.cycle import Binding, CyclePlan
from batchsched.core.dra.extended import extended_claim
from batchsched.core.gangs import Gang, GangIndex
from batchsched.core.model import PodInfo
from batchsched.core.placement.capacity import shape_key
from batchsched.core.placement.fit import NodeFilter
from batchsched.core.queues.model import QueueInfo
from batchsched.core.resources import Resources
from batchsched.core.topology.choose import gpus_of, mask_of
from batchsched.sim.engine import SimCluster

SPREAD, BINPACK, RANDOM, PROPORTION = "spread", "binpack", "random", "proportion"
NAMES = (SPREAD, BINPACK, RANDOM, PROPORTION)


class CountOnlyScheduler:
    """One baseline: gangs or single pods, the node rule and the GPU-id rule."""

    def __init__(self, name: str, gangs: bool, first_fit: bool, random_ids: bool, seed: int = 1):
        self.name = name
        self.gangs, self.first_fit, self.random_ids = gangs, first_fit, random_ids
        self.rng = random.Random(seed)
        self._filter: NodeFilter | None = None

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
            if free.get(constants.GPU_RESOURCE, 0) < gpus or res.fits(pod.requests, free):
                continue
            if self.first_fit:
                return name
            key = (free.get(constants.GPU_RESOURCE, 0), free.get(res.CPU, 0))
            if best_key is None or key > best_key:
                best, best_key = name, key
        return best

    def _ids(self, free_ids: int, k: int) -> tuple[int, ...]:
        ids = gpus_of(free_ids)
        return tuple(sorted(self.rng.sample(ids, k))) if self.random_ids else ids[:k]


class ProportionScheduler(CountOnlyScheduler):
    """``proportion`` (module docstring): ``binpack`` under GPU quotas."""

    def __init__(self, default_queue: str = "default"):
        super().__init__(PROPORTION, gangs=True, first_fit=True, random_ids=False)
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


def baseline(name: str, seed: int = 1, default_queue: str = "default") -> CountOnlyScheduler:
    """A baseline by name (NAMES); ``default_queue``: the queue of gangs naming none."""
    if name == SPREAD:
        return CountOnlyScheduler(SPREAD, gangs=False, first_fit=False, random_ids=True, seed=seed)
    if name == BINPACK:
        return CountOnlyScheduler(BINPACK, gangs=True, first_fit=True, random_ids=False, seed=seed)
    if name == RANDOM:
        return CountOnlyScheduler(RANDOM, gangs=True, first_fit=False, random_ids=True, seed=seed)
    if name == PROPORTION:
        return ProportionScheduler(default_queue)
    raise ValueError(f"unknown baseline {name!r} (known: {', '.join(NAMES)})")
