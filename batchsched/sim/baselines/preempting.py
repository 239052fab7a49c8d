"""The ``volcano-like`` and ``kai-like`` baselines
(batchsched/sim/baselines/__init__.py): packing gangs, and priority
preemption for a gang that does not fit."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from batchsched.api import constants
from batchsched.core import resources as res
from batchsched.core.cycle import CyclePlan, Eviction
from batchsched.core.gangs import Gang
from batchsched.core.model import PodInfo
from batchsched.core.preemption.policy import GANG_VICTIMS_NEVER, PreemptionPolicy
from batchsched.core.resources import Resources
from batchsched.sim.baselines.count_only import FULLEST, CountOnlyScheduler, Trial, node_key
from batchsched.sim.engine import SimCluster
from batchsched.sim.workload import to_unix


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
        trial, plan = Trial(cluster), CyclePlan()
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

    def _preempt(self, cluster: SimCluster, gang: Gang, trial: Trial, plan: CyclePlan,
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
                              trial: Trial) -> tuple[list[PodInfo], set[str]] | None:
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
                        trial: Trial) -> tuple[list[PodInfo], set[str]] | None:
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

    def _fit(self, quorum: list[PodInfo], trial: Trial, freed: Mapping[str, Resources]) -> set[str] | None:
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

    def _by_fullness(self, pod: PodInfo, trial: Trial) -> list[str]:
        """The nodes the pod may go to in this cycle, fullest first."""
        return sorted((n for n in self._filter.evaluate(pod).feasible if n not in self._off_limits),
                      key=lambda n: node_key(FULLEST, trial.free(n)), reverse=True)


def _requests_on(node: str, pods: Sequence[PodInfo]) -> Resources:
    total: Resources = {}
    for pod in pods:
        if pod.node_name == node:
            total = res.add(total, pod.requests)
    return total
