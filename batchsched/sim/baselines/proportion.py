"""The ``proportion`` baseline (batchsched/sim/baselines/__init__.py):
``binpack`` under GPU quotas, no reclaim."""
from __future__ import annotations

import math
from typing import Mapping

from batchsched.api import constants
from batchsched.core.cycle import CyclePlan
from batchsched.core.gangs import Gang
from batchsched.core.queues.model import QueueInfo
from batchsched.sim.baselines.count_only import FIRST_FIT, CountOnlyScheduler, Trial
from batchsched.sim.engine import SimCluster


class ProportionScheduler(CountOnlyScheduler):
    """``proportion`` (module docstring): ``binpack`` under GPU quotas."""

    def __init__(self, name: str = "proportion", default_queue: str = "default"):
        super().__init__(name, gangs=True, node_rule=FIRST_FIT, random_ids=False)
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
        trial = Trial(cluster)
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

    def _admit(self, cluster: SimCluster, gang: Gang, trial: Trial, plan: CyclePlan, held: dict[str, int],
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
