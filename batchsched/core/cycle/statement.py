"""What one gang's attempt tentatively decides, undone whole if it fails.

As KAI's Statement (Checkpoint/Rollback) or Volcano's Commit/Discard: the
cycle opens a statement before it tries a gang; what the attempt places,
evicts, nominates or takes of the capacity index (``CapacityIndex.undo``
records each node's entry before its first change) is kept when the
attempt returns, and all of it is put back when it raises, so a failed
attempt leaves the cycle with exactly the room it had before.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from batchsched.core.cycle.outcome import CyclePlan
from batchsched.core.placement.capacity import CapacityIndex


@dataclass
class Statement:
    plan: CyclePlan
    evicting: set[str] = field(default_factory=set)  # victims chosen earlier in this cycle
    # At the checkpoint: the plan's bindings, evictions and nominations, the victims, the index.
    _lengths: tuple[int, int, int] = field(default=(0, 0, 0), init=False)
    _evicting: frozenset[str] = field(default=frozenset(), init=False)
    _capacity: CapacityIndex | None = field(default=None, init=False)

    def checkpoint(self, capacity: CapacityIndex) -> None:
        """Open: what follows, until ``keep`` or ``rollback``, is one attempt's."""
        plan = self.plan
        self._lengths = (len(plan.bindings), len(plan.evictions), len(plan.nominations))
        self._evicting = frozenset(self.evicting)
        self._capacity = capacity
        capacity.undo = {}

    def keep(self) -> None:
        self._capacity.undo = None
        self._capacity = None

    def rollback(self) -> None:
        """Drop the attempt's bindings, evictions and nominations and put
        back the room it gave or took (verdicts are the caller's)."""
        bindings, evictions, nominations = self._lengths
        plan = self.plan
        del plan.bindings[bindings:], plan.evictions[evictions:], plan.nominations[nominations:]
        self.evicting.intersection_update(self._evicting)
        capacity, self._capacity = self._capacity, None
        capacity.rollback()
