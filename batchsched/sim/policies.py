"""The batchsched policy: the real decision core, driven as the shell drives
it (batchsched/shell/scheduler.py, ``Scheduler.cycle``).

Each cycle: the changes since the last cycle go to the queue
(``GangQueue.note_changes``: touched gangs, capacity freed), the cluster is
snapshotted, ``schedule_cycle`` decides with the configured preemption
policy and the preemptions in flight, and the simulator applies the plan at
once -- bindings with their GPU ids, nominations, evictions.  Like the
shell's evictor, it remembers which gangs' victims still exist, which nodes
evicted lately, and clears nominations that have not led to a binding within
``nominationTimeoutSeconds``.  Nothing is refused in the simulator (no
PodDisruptionBudgets), so no dry run is needed.
"""
from __future__ import annotations

from batchsched.config import SchedulerConfig
from batchsched.core.cycle import CyclePlan, schedule_cycle
from batchsched.core.preemption.policy import EvictionLog, PreemptionState
from batchsched.core.queueing.queue import GangQueue
from batchsched.sim.engine import SimCluster
from batchsched.sim.workload import to_unix

NAME = "batchsched"


class BatchschedPolicy:
    name = NAME

    def __init__(self, config: SchedulerConfig = SchedulerConfig()):
        self.core_config = config.core()
        self.preemption = config.preemption.policy()
        self.queue = GangQueue.from_config(self.core_config)
        self._victims_by_gang: dict[str, set[str]] = {}
        self._evicted_at: dict[str, float] = {}  # node -> when it last had an eviction
        self._nominated_at: dict[str, float] = {}  # pod uid -> when it was nominated
        self._evicted_by_priority = EvictionLog()  # for victims.maxPerNamespacePerHour
        self._offset = to_unix(0.0)  # simulated seconds -> the core's unix seconds

    def cycle(self, cluster: SimCluster, now: float) -> CyclePlan:
        self._expire_nominations(cluster, now)
        touched, freed = cluster.drain_changes()
        self.queue.note_changes(touched, freed)
        plan = schedule_cycle(cluster.snapshot(now + self._offset), self.queue, self.core_config,
                              self.preemption, self._preemption_state(cluster, now))
        for eviction in plan.evictions:
            self._victims_by_gang.setdefault(eviction.preemptor, set()).add(eviction.pod.uid)
            self._evicted_at[eviction.pod.node_name] = now
            if not eviction.reclaim:
                self._evicted_by_priority.add(now, eviction.pod.namespace)
        for nomination in plan.nominations:
            self._nominated_at[nomination.pod.uid] = now
        return plan

    def next_wakeup(self) -> float | None:
        times = [t + self.preemption.nomination_timeout_seconds for t in self._nominated_at.values()]
        retry = self.queue.next_retry_at()
        if retry is not None:
            times.append(retry - self._offset)
        return min(times, default=None)

    def _preemption_state(self, cluster: SimCluster, now: float) -> PreemptionState:
        for gang, uids in list(self._victims_by_gang.items()):
            uids.intersection_update(cluster.pods)  # a deleted victim is gone for good
            if not uids:
                del self._victims_by_gang[gang]
        cooling = frozenset(node for node, t in self._evicted_at.items()
                            if now - t < self.preemption.node_cooldown_seconds)
        return PreemptionState(cooling_nodes=cooling, in_flight=frozenset(self._victims_by_gang),
                               evicted_last_hour=self._evicted_by_priority.last_hour(now))

    def _expire_nominations(self, cluster: SimCluster, now: float) -> None:
        for uid, since in list(self._nominated_at.items()):
            pod = cluster.pods.get(uid)
            if pod is None or pod.node_name:
                del self._nominated_at[uid]  # bound or gone: nothing to clear
            elif now - since > self.preemption.nomination_timeout_seconds:
                cluster.nominate(uid, "")
                del self._nominated_at[uid]
