"""The state one cycle's stages share (``CycleContext``).

As kube-scheduler's CycleState or KAI's Session: the snapshot, the policy
set (config, preemption policy and state), the per-cycle structures the stages read and write (the gangs, the
queue book, the nominated room, the capacity index, the pods lent reserved
room) and the open ``Statement``.  A stage takes the context and the gang
it works on; what it decides goes into ``ctx.plan`` through the statement.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from batchsched.core.config import CoreConfig
from batchsched.core.cycle.outcome import CyclePlan
from batchsched.core.cycle.statement import Statement
from batchsched.core.gangs import GangIndex
from batchsched.core.placement.capacity import CapacityIndex, cluster_capacity
from batchsched.core.placement.fragmentation import NodeChoice
from batchsched.core.preemption.plan import NominationHolds
from batchsched.core.preemption.policy import PreemptionPolicy, PreemptionState
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.queues.book import QueueBook
from batchsched.core.resources import Resources
from batchsched.core.snapshot import Snapshot


@dataclass
class CycleContext:
    snapshot: Snapshot
    queue: GangQueue
    # the policy set, as the operator configured it, for the whole cycle
    config: CoreConfig
    preemption: PreemptionPolicy
    preemption_state: PreemptionState
    gangs: GangIndex
    book: QueueBook
    statement: Statement
    # Room nominated to preemptors waiting for their victims is theirs alone.
    holds: NominationHolds
    withheld: Mapping[str, Resources]  # what no gang without a claim there may use
    choice: NodeChoice | None
    # The pods that borrow the reservation holder's room (queueing.lending):
    # pod uid -> when the holder may evict them.
    lent: dict[str, float] = field(default_factory=dict)
    _capacity: CapacityIndex | None = None

    def __post_init__(self) -> None:
        self.plan: CyclePlan = self.statement.plan  # what the cycle decided so far
        self.cluster_total: Mapping[str, int] = self.snapshot.cluster.total_allocatable  # every node's allocatable

    @property
    def now(self) -> float:
        return self.snapshot.now

    @property
    def capacity(self) -> CapacityIndex:
        """The running free map, built for the first gang tried: a cycle that
        tries none (bindings being confirmed, pods ending) leaves the kept
        index to catch up on every node changed meanwhile at once, later."""
        if self._capacity is None:
            self._capacity = cluster_capacity(self.snapshot.cluster, self.withheld, self.choice)
        return self._capacity
