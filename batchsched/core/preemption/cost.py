"""What a victim costs: one registry of terms, compared in order (pure).

A *victim unit* is what preemption may evict at once: one pod, or a whole
gang of ours that would otherwise be left below its minMember.  Its cost,
and a set's of them, is a tuple with one entry per term of ``COST_TERMS``,
compared left to right (docs/preemption.md, "victim cost").  Each term is a
name and a key over ``Victims`` (the units, their distinct pods, the
moment), so one definition prices a unit (``unit_cost``) and a set of
units (``set_cost``): a unit costs what the set of it alone costs.

Adding a term is one line in ``COST_TERMS`` (where it goes in the order)
and, where the key is not a one-liner, a function beside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Iterable, NamedTuple, Sequence

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core.model import PodInfo


def lost_work(pod: PodInfo, now: float) -> float:
    """GPU-seconds (a pod without GPUs counts as one) the pod would lose if
    evicted at ``now``: its run since it started, or since its last
    checkpoint when that is later.  A checkpoint in the future is ignored
    (the annotation is tenant-written; the shell logs such values)."""
    since = pod.started
    if since < pod.checkpoint <= now:
        since = pod.checkpoint
    return max(0.0, now - since) * max(1, pod.requests.get(GPU_RESOURCE, 0)) if since else 0.0


@dataclass(frozen=True)
class VictimUnit:
    key: str
    pods: tuple[PodInfo, ...]
    breaks_gang: bool
    now: float = 0.0  # when it would be evicted, for the work it loses
    elastic: bool = False  # a member beyond its gang's minMember, taken alone

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(p.node_name for p in self.pods)

    @property
    def cost(self) -> tuple:
        return unit_cost(self)


class Victims(NamedTuple):
    """What a cost term is asked of: units, each of their pods once, and when."""

    units: Sequence[VictimUnit]
    pods: Sequence[PodInfo]
    now: float


@dataclass(frozen=True)
class CostTerm:
    name: str  # as docs/preemption.md says it
    key: Callable[[Victims], float]  # lower is cheaper


def _not_elastic(victims: Victims) -> int:
    """Victims that are not a spare member taken alone (an elastic unit's key is its pod's uid)."""
    elastic = {u.key for u in victims.units if u.elastic}
    return sum(1 for p in victims.pods if p.uid not in elastic)


# The order is the comparison's: earlier terms decide first.
COST_TERMS: tuple[CostTerm, ...] = (
    CostTerm("fewest gangs broken", lambda v: sum(u.breaks_gang for u in v.units)),
    CostTerm("lowest highest-victim priority", lambda v: max((p.priority for p in v.pods), default=-(2**31))),
    CostTerm("fewest victims that are not elastic", _not_elastic),
    CostTerm("fewest victims", lambda v: len(v.pods)),
    CostTerm("lowest total victim priority", lambda v: sum(p.priority for p in v.pods)),
    CostTerm("least work lost", lambda v: sum((lost_work(p, v.now) for p in v.pods), 0.0)),
)


def _fold(victims: Victims) -> tuple:
    return tuple([term.key(victims) for term in COST_TERMS])


def unit_cost(unit: VictimUnit) -> tuple:
    return _fold(Victims((unit,), unit.pods, unit.now))


def set_cost(units: Collection[VictimUnit]) -> tuple:
    """The cost of evicting ``units`` together, each pod counted once."""
    now = next(iter(units)).now if units else 0.0
    return _fold(Victims(tuple(units), distinct_pods(units), now))


def distinct_pods(units: Iterable[VictimUnit], gone: Collection[str] = ()) -> list[PodInfo]:
    """The pods of ``units``, each once (a spare member may be taken alone
    and again with its whole gang), leaving out the uids in ``gone``."""
    seen = set(gone)
    pods = []
    for unit in units:
        for pod in unit.pods:
            if pod.uid not in seen:
                seen.add(pod.uid)
                pods.append(pod)
    return pods
