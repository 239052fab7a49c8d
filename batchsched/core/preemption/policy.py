"""Who may preempt whom (pure).  The shell builds this from the config's
``preemption`` section (configs/scheduler.yaml, docs/preemption.md)."""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Mapping

from batchsched.core.model import GroupSpec, PodInfo

GANG_VICTIMS_WHOLE = "whole"  # a victim gang that would drop below minMember is evicted whole
GANG_VICTIMS_NEVER = "never"  # ...or not touched at all


@dataclass(frozen=True)
class PreemptionPolicy:
    enabled: bool = True
    # victims
    victim_namespaces: frozenset[str] = frozenset()  # empty: any namespace
    victim_labels: tuple[tuple[str, str], ...] = ()  # all must match; empty: any pod
    victim_priority_classes: frozenset[str] = frozenset()  # empty: any class
    min_runtime_seconds: float = 0.0
    gang_victims: str = GANG_VICTIMS_WHOLE
    # Where the preemptible: "false" annotation (tenant-written) is honoured:
    # these namespaces, "*" for all; empty: nowhere.
    opt_out_namespaces: frozenset[str] = frozenset()
    # preemptors
    preemptor_min_priority: int | None = None
    preemptor_priority_classes: frozenset[str] = frozenset()  # non-empty: only these classes
    # (PriorityClass name, seconds) sorted: how long a gang of that class waits
    # for room to free by itself before it may evict (classes not named: 0).
    preemptor_wait_seconds: tuple[tuple[str, float], ...] = ()
    # limits
    max_victims_per_cycle: int = 64
    # At most this many pods of one namespace evicted by priority preemption in
    # any hour (None: no limit); PreemptionState.evicted_last_hour counts them.
    namespace_evictions_per_hour: int | None = None
    node_cooldown_seconds: float = 30.0
    nomination_timeout_seconds: float = 120.0

    def why_not_preempt(self, spec: GroupSpec, priority: int, members: tuple[PodInfo, ...]) -> str:
        """"" if the gang may preempt, else why not."""
        if not self.enabled:
            return "preemption is disabled"
        if spec.preemption_policy == "Never" or any(p.preemption_policy == "Never" for p in members):
            return "its preemptionPolicy is Never"
        if self.preemptor_min_priority is not None and priority < self.preemptor_min_priority:
            return f"its priority {priority} is below the preemptors' minimum {self.preemptor_min_priority}"
        if self.preemptor_priority_classes:
            # the pods' classes, which admission checked, not the PodGroup's (tenant-written)
            classes = {p.priority_class for p in members}
            if not classes & self.preemptor_priority_classes:
                return "its PriorityClass is not one that may preempt"
        return ""

    def wait_before_evicting(self, members: tuple[PodInfo, ...]) -> tuple[float, str]:
        """How long a gang of ``members`` waits in the queue before it may
        evict, and the PriorityClass that says so: the least of its pods'
        classes' waits (the pods' classes, which admission checked, not the
        PodGroup's); a wait of 0 when it need not wait."""
        if not self.preemptor_wait_seconds:
            return 0.0, ""
        waits = dict(self.preemptor_wait_seconds)
        return min(((waits.get(p.priority_class, 0.0), p.priority_class) for p in members), default=(0.0, ""))

    def honours_opt_out(self, namespace: str) -> bool:
        return "*" in self.opt_out_namespaces or namespace in self.opt_out_namespaces

    def may_be_victim(self, pod: PodInfo, preemptor_priority: int, now: float,
                      group: GroupSpec | None = None, priority: int | None = None) -> bool:
        """Pod-level rules; gang-level ones (whole or not at all) are in plan.py.
        ``priority``: the pod's gang's effective priority, when it is in one of ours."""
        if not pod.holds_resources or pod.terminating or not self.evictable_once_running(
                pod, preemptor_priority, group, priority):
            return False
        return self.min_runtime_seconds <= 0 or (pod.started and now - pod.started >= self.min_runtime_seconds)

    def evictable_once_running(self, pod: PodInfo, preemptor_priority: int, group: GroupSpec | None = None,
                               priority: int | None = None) -> bool:
        """The pod-level rules that do not depend on the pod's state: a
        pending pod that passes them is a victim once it has run
        ``min_runtime_seconds``."""
        priority = pod.priority if priority is None else priority
        if priority >= preemptor_priority:
            return False
        opted_out = not pod.preemptible or (group is not None and not group.preemptible)
        if opted_out and self.honours_opt_out(pod.namespace):
            return False
        if self.victim_namespaces and pod.namespace not in self.victim_namespaces:
            return False
        if any(pod.labels.get(k) != v for k, v in self.victim_labels):
            return False
        return not self.victim_priority_classes or pod.priority_class in self.victim_priority_classes


@dataclass(frozen=True)
class PreemptionState:
    """What the shell knows about preemptions in flight (inputs to the core)."""

    cooling_nodes: frozenset[str] = frozenset()  # evicted on recently: no more for now
    # pod uid -> why the Eviction API refused it lately (a PodDisruptionBudget, say)
    refused: Mapping[str, str] = field(default_factory=dict)
    in_flight: frozenset[str] = field(default_factory=frozenset)  # gangs whose victims are still going
    # namespace -> its pods evicted by priority preemption in the last hour
    evicted_last_hour: Mapping[str, int] = field(default_factory=dict)

    def evictions_left(self, policy: PreemptionPolicy, namespace: str) -> float:
        """How many more of the namespace's pods priority preemption may evict now."""
        if policy.namespace_evictions_per_hour is None:
            return float("inf")
        return max(0, policy.namespace_evictions_per_hour - self.evicted_last_hour.get(namespace, 0))


EVICTION_BUDGET_WINDOW_SECONDS = 3600.0  # the hour of victims.maxPerNamespacePerHour


class EvictionLog:
    """The namespaces of the pods priority preemption evicted, with when:
    the shell's (and the simulator's) record for ``evicted_last_hour``."""

    def __init__(self) -> None:
        self._evicted: deque[tuple[float, str]] = deque()

    def add(self, when: float, namespace: str) -> None:
        self._evicted.append((when, namespace))

    def last_hour(self, now: float) -> Counter[str]:
        while self._evicted and now - self._evicted[0][0] >= EVICTION_BUDGET_WINDOW_SECONDS:
            self._evicted.popleft()
        return Counter(namespace for _, namespace in self._evicted)
