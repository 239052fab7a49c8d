"""The count-only baselines: ``spread``, ``binpack`` and ``random``
(batchsched/sim/baselines/__init__.py), and what the others build on: the
trial free maps of one cycle (``Trial``), the node rules, the bindings."""
from __future__ import annotations

import random
from typing import Callable, Sequence

from batchsched.api import constants
from batchsched.core import resources as res
from batchsched.core.cycle import Binding, CyclePlan
from batchsched.core.dra.extended import extended_claim
from batchsched.core.gangs import Gang, GangIndex
from batchsched.core.model import PodInfo
from batchsched.core.placement.capacity import shape_key
from batchsched.core.placement.fit import NodeFilter
from batchsched.core.resources import Resources
from batchsched.core.topology.choose import gpus_of, mask_of
from batchsched.sim.engine import SimCluster

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
        trial = Trial(cluster)
        plan = CyclePlan()
        for gang in gangs:
            self._try(cluster, gang, trial, plan)
        return plan

    def _pending(self, cluster: SimCluster, now: float) -> list[Gang]:
        if self._filter is None or self._filter.nodes is not cluster.nodes:
            self._filter = NodeFilter(cluster.nodes)
        return [g for g in GangIndex(cluster.snapshot(now)).pending() if g.eligible]

    def _try(self, cluster: SimCluster, gang: Gang, trial: Trial, plan: CyclePlan,
             admits: Callable[[int], bool] = lambda gpus: True) -> int | None:
        """Place what fits of the gang, if ``admits`` the GPUs that takes;
        the GPUs placed (None: not placed)."""
        if self.gangs:
            placed = self._place(gang.pending, trial)
            gpus = sum(pod.requests.get(constants.GPU_RESOURCE, 0) for pod, _, _ in placed)
            if len(placed) >= gang.need and admits(gpus):
                trial.commit()
                plan.bindings.extend(binding(cluster, gang, *p) for p in placed)
                return gpus
            trial.discard()
            return None
        for pod in gang.pending:
            placed = self._place([pod], trial)
            trial.commit()
            plan.bindings.extend(binding(cluster, gang, *p) for p in placed)
        return None  # pods one by one: no gang placed as one

    def _place(self, pods: Sequence[PodInfo], trial: Trial) -> list[tuple[PodInfo, str, tuple[int, ...]]]:
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

    def _node_for(self, pod: PodInfo, trial: Trial) -> str | None:
        best, best_key = None, None
        gpus = pod.requests.get(constants.GPU_RESOURCE, 0)
        for name in self._filter.evaluate(pod).feasible:  # sorted by name
            free = trial.free(name)
            if (name in self._off_limits or free.get(constants.GPU_RESOURCE, 0) < gpus
                    or res.shortfall(pod.requests, free)):
                continue
            if self.node_rule == FIRST_FIT:
                return name
            key = node_key(self.node_rule, free)
            if best_key is None or key > best_key:
                best, best_key = name, key
        return best

    def _ids(self, free_ids: int, k: int) -> tuple[int, ...]:
        ids = gpus_of(free_ids)
        return tuple(sorted(self.rng.sample(ids, k))) if self.random_ids else ids[:k]


def spread(name: str, seed: int) -> CountOnlyScheduler:
    return CountOnlyScheduler(name, gangs=False, node_rule=MOST_FREE, random_ids=True, seed=seed)


def binpack(name: str, seed: int) -> CountOnlyScheduler:
    return CountOnlyScheduler(name, gangs=True, node_rule=FIRST_FIT, random_ids=False, seed=seed)


def random_gangs(name: str, seed: int) -> CountOnlyScheduler:
    return CountOnlyScheduler(name, gangs=True, node_rule=MOST_FREE, random_ids=True, seed=seed)


def node_key(rule: str, free: Resources) -> tuple:
    """Higher is better: the most free GPUs (then cpu), or the fewest."""
    key = (free.get(constants.GPU_RESOURCE, 0), free.get(res.CPU, 0))
    return key if rule == MOST_FREE else (-key[0], -key[1])


def binding(cluster: SimCluster, gang: Gang, pod: PodInfo, node: str, gpu_ids: tuple[int, ...]) -> Binding:
    """The binding, with the pod's claim where DRA serves the node's GPUs."""
    info, claim = cluster.nodes[node], None
    if info.gpus_by_dra and pod.requests.get(constants.GPU_RESOURCE, 0):
        claim = extended_claim(info, pod, gpu_ids, cluster.state.dra.classes)
    return Binding(pod.uid, pod.namespace, pod.name, node, gang.key, gpu_ids, claim)


class Trial:
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
