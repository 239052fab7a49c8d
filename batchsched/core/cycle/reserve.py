"""Stage "reserve": the node reservation for the gang that waited longest.

The first long-waiting gang that is neither hopeless nor past its
reservation's bound, nor waiting for its queue, gets nodes reserved against
the gangs after it: those where its quorum would fit once the pods it may
wait out have ended (``drained_index``, kept across cycles), with when
that is expected (``Drain``, ``ready_at``).  Runs once per cycle, before
any gang is tried.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core import resources as res
from batchsched.core.cluster import ClusterState
from batchsched.core.cycle.context import CycleContext
from batchsched.core.cycle.facts import placement_policy
from batchsched.core.gangs import Gang, GangChanges
from batchsched.core.model import GroupSpec, PodInfo
from batchsched.core.placement.capacity import CapacityIndex, KeptIndex, NodeEntry, kept_index
from batchsched.core.placement.gang import Assignment, PlanFailure, plan_gang
from batchsched.core.queueing.lending import lent_pods
from batchsched.core.queueing.runtime import KILL_GRACE_SECONDS, expected_end
from batchsched.core.queues.book import QueueBook
from batchsched.core.resources import Resources
from batchsched.core.snapshot import Snapshot
from batchsched.core.topology.accounting import room_of


def refresh_reservation(ctx: CycleContext) -> dict[str, float]:
    """Give the reservation to the first long-waiting gang that is neither
    hopeless nor past its reservation's bound, nor waiting for its queue
    (see batchsched.core.queueing.queue); the pods lent its room
    (queueing.lending.lent_pods)."""
    snapshot, gangs, queue, config = ctx.snapshot, ctx.gangs, ctx.queue, ctx.config
    cluster = snapshot.cluster
    for key in queue.reservation_candidates(snapshot.now):
        gang = gangs[key]
        if not gang.need or _waits_for_queue(ctx.book, gang):
            continue  # its quorum is bound (extra members reserve nothing), or room reserved would sit idle
        try:
            lent = lent_pods(snapshot, gangs, gang, queue, ctx.preemption) if config.lend_reserved else {}
            drained, draining = drained_index(snapshot, gangs, gang, lent)
            result = plan_gang(gang.pending, gang.need, drained, policy=placement_policy(snapshot, gang, config),
                               bound_on=bound_on(gang))
        except Exception:  # noqa: BLE001 - its own attempt reports it (InternalError); others go on
            cluster.kept(_DrainedIndex).forget()  # maybe half updated: rebuilt on next use
            result = None
        if result is None or isinstance(result, PlanFailure):
            queue.mark_hopeless(key)
            continue
        quorum = result.assignments[:gang.need]
        reserved = {a.node_name for a in quorum}
        if queue.reserve(key, reserved, snapshot.now, _awaited_end(cluster, reserved, draining.waited_out),
                         _ready_at(snapshot, quorum, draining)):
            return dict(lent)
    queue.release_reservation()
    return {}


def bound_on(gang: Gang) -> frozenset[str]:
    """The nodes of its members already bound (the rest stay in their domain)."""
    return frozenset(p.node_name for p in gang.bound_active)


class _DrainedIndex(KeptIndex):
    """The "as if drained" index, kept across cycles (``drained_index``)."""


@dataclass
class _Drainable:
    """What the kept "as if drained" index was last built for: the gangs it
    waits out, their runtime hints, the pods lent room."""

    drainable: frozenset[str] = frozenset()
    hints: dict[str, float] = field(default_factory=dict)
    lent: Mapping[str, float] = field(default_factory=dict)
    known: bool = False

    def changed_nodes(self, cluster: ClusterState, drainable: frozenset[str], hints: dict[str, float],
                      lent: Mapping[str, float]) -> set[str]:
        """The nodes whose drained entry may differ from the last call's; remembers this call's."""
        nodes: set[str] = set()
        if self.known:
            turned = (drainable ^ self.drainable) | {k for k in hints.keys() | self.hints.keys()
                                                     if hints.get(k) != self.hints.get(k)}
            nodes = {p.node_name for k in turned for p in (cluster.pods[u] for u in cluster.gang_uids(k))
                     if p.node_name}
            nodes.update(pod.node_name for uid in lent.keys() | self.lent.keys()
                         if lent.get(uid) != self.lent.get(uid)
                         and (pod := cluster.pods.get(uid)) is not None and pod.node_name)
        self.drainable, self.hints, self.lent, self.known = drainable, hints, lent, True
        return nodes


def drained_index(snapshot: Snapshot, gangs: Mapping[str, Gang], gang: Gang,
                  lent: Mapping[str, float] | None = None) -> tuple[CapacityIndex, Drain]:
    """The cluster as if the bound pods ``gang`` may wait out had ended
    (``_drained_entry``), and which pods those are: ours, of other gangs,
    not of higher priority, and those ``lent`` its reserved room
    (queueing.lending).  (Counting equal-priority pods is what makes the
    reservation useful when every gang has the default priority.)

    One index, kept across cycles, serves every head: it depends on the
    head only through the gangs it may wait out, so gangs that turned
    drainable or not since the last call (another head, a priority
    changed, they bound or ended), or whose runtime hint changed, change
    it on the nodes of their pods only; so do pods lent room or no longer."""
    cluster = snapshot.cluster
    lent = lent or {}
    holding = _holding_gangs(snapshot, gangs)
    drainable = frozenset([k for k, (priority, _) in holding.items() if priority <= gang.priority and k != gang.key])
    hints = {k: hint for k in drainable if (hint := holding[k][1])}
    nodes = cluster.kept(_Drainable).changed_nodes(cluster, drainable, hints, lent)
    draining = Drain(snapshot.scheduler_name, drainable, snapshot.groups, lent)
    return kept_index(cluster, cluster.kept(_DrainedIndex), None, _drained_entry(snapshot, draining),
                      also_changed=nodes, kept_rebuilds=DRAINED_VIEWS_KEPT_REBUILDS), draining


# The "as if drained" index keeps an unused view while keeping it current
# has cost less than this many rebuilds (capacity.drop_idle_views): head
# gangs of a few shapes take turns, and a rebuild is one cycle's cost.
DRAINED_VIEWS_KEPT_REBUILDS = 4



@dataclass
class _HoldingGangs:
    """Each gang of ours holding room now: gang key -> (priority, runtime hint)."""

    changes: GangChanges = field(default_factory=GangChanges)
    facts: dict[str, tuple[int, float | None]] = field(default_factory=dict)


def _holding_gangs(snapshot: Snapshot, gangs: Mapping[str, Gang]) -> dict[str, tuple[int, float | None]]:
    """Each gang of ours holding room now: its priority and its PodGroup's
    runtime hint (expectedRuntimeSeconds, None without).  Kept across
    cycles: only the gangs whose pods or PodGroup changed are looked up
    again (with thousands of gangs running, looking each up at every
    reservation refresh was most of its cost)."""
    cluster, groups = snapshot.cluster, snapshot.groups
    kept = cluster.kept(_HoldingGangs)
    changes, facts = kept.changes, kept.facts
    holding = cluster.holding_gang_keys()
    changed = changes.since_last(snapshot)
    if changed is None:
        facts.clear()
        changed = holding
    for key in changed:
        if key in holding:
            group = groups.get(key)
            facts[key] = (gangs[key].priority, group.expected_runtime_seconds if group is not None else None)
        else:
            facts.pop(key, None)
    changes.looked(snapshot)
    return facts


def _waits_for_queue(book: QueueBook, gang: Gang) -> bool:
    """Its queue cannot take its quorum now, or would go beyond its fair
    share with it: room reserved for a borrower would be taken back by
    reclaim, over and over (or asking raised: its own attempt reports that
    as InternalError)."""
    try:
        return isinstance(book.admission(gang), str) or not book.within_fair_share(gang)
    except Exception:  # noqa: BLE001 - the gang's attempt reports it; the reservation goes on
        return True


@dataclass(frozen=True)
class Drain:
    """The bound pods a reservation counts as gone (called on a pod), and
    from when (``end``): ours, of a ``drainable`` gang and ending by
    themselves (PodInfo.runs_to_completion), at their expected end; and
    those ``lent`` its room (pod uid -> when its holder may evict them)."""

    ours: str
    drainable: frozenset[str]
    groups: Mapping[str, GroupSpec]
    lent: Mapping[str, float]

    def __call__(self, pod: PodInfo) -> bool:
        return pod.uid in self.lent or self.waited_out(pod)

    def waited_out(self, pod: PodInfo) -> bool:
        """One it waits to end by itself."""
        return pod.scheduler_name == self.ours and pod.gang_key in self.drainable and pod.runs_to_completion

    def end(self, pod: PodInfo, now: float | None = None) -> float | None:
        """When it is expected to be gone (runtime.expected_end), or evictable if lent sooner."""
        evictable = self.lent.get(pod.uid)
        if evictable is None:
            return expected_end(pod, self.groups, now)
        end = expected_end(pod, self.groups, now) if self.waited_out(pod) else None
        evictable = evictable if now is None else max(now, evictable)
        return evictable if end is None else min(end, evictable)


def _awaited_end(cluster: ClusterState, nodes: Collection[str], draining: Callable[[PodInfo], bool]) -> float | None:
    """When the last pod the reservation waits for on ``nodes`` is killed at
    its deadline (plus the kill's grace); None when one has no known end."""
    ends = [p.ends_by for name in nodes for p in cluster.bound_pods(name) if p.holds_resources and draining(p)]
    if not ends or None in ends:
        return None
    return max(ends) + KILL_GRACE_SECONDS


def _ready_at(snapshot: Snapshot, quorum: Collection[Assignment], draining: Drain) -> float | None:
    """When the reserved quorum is expected to fit (by resource counts): on
    each of its nodes, once the pods it waits for there have ended, soonest
    expected end first, until its pods there fit; None when one it needs
    has no expected end (runtime.expected_end)."""
    cluster = snapshot.cluster
    asked: dict[str, Resources] = {}
    for assignment in quorum:
        asked[assignment.node_name] = res.add(asked.get(assignment.node_name, {}), assignment.pod.requests)
    ready = snapshot.now
    for name, request in asked.items():
        free = cluster.free(name)
        ends = [(draining.end(p, snapshot.now), p) for p in cluster.bound_pods(name)
                if p.holds_resources and draining(p)]
        for end, pod in sorted(ends, key=lambda e: (math.inf if e[0] is None else e[0], e[1].uid)):
            if not res.shortfall(request, free):
                break
            if end is None:
                return None
            free, ready = res.add(free, pod.requests), max(ready, end)
    return ready


def _drained_entry(snapshot: Snapshot, draining: Drain) -> Callable[[str], NodeEntry]:
    """A node as if its ``draining`` pods had finished; among nodes equally
    good once drained, the one expected to be drained soonest goes first
    (by its pods' runtime bounds and how long they have run; a pod without
    a bound last), then the freest now."""
    cluster = snapshot.cluster

    def entry(name: str) -> NodeEntry:
        now = cluster.free(name)
        freest = (-now.get(GPU_RESOURCE, 0), -now.get(res.CPU, 0), -now.get(res.MEMORY, 0))
        holding = [p for p in cluster.bound_pods(name) if p.holds_resources]
        gone = [p for p in holding if draining(p)]
        if not gone:
            return now, cluster.room(name), (0.0, *freest)
        ends = [draining.end(p) for p in gone]
        drained_by = math.inf if None in ends else max(ends)
        free = dict(now)
        for pod in gone:
            free = res.add(free, pod.requests)
        room = cluster.room(name)
        if room is not None:
            gone_uids = {p.uid for p in gone}
            room = room_of(snapshot.nodes[name], [p for p in holding if p.uid not in gone_uids],
                           cluster.dra_in_use_ids(name, gone_uids))
        return free, room, (drained_by, *freest)
    return entry
