"""Reserved room lent to the pods its holder may evict (docs/queueing.md,
"Lending to the holder's victims").

While nodes drain for the reservation's holder, their free room idles
unless a gang backfills: it ends by itself before the holder is expected
to fit.  A pod the holder may evict under the preemption policy delays it
only by its eviction (and the pod's own grace period), however long it
would run: so such a pod may use that room too, as long as the holder may
evict it by the time it is expected to fit.  The holder's plan then counts
it as gone once it may evict it, so the reservation stays where it is
(rather than moving off a node the moment something borrows it).

Only pods that are victims one by one borrow: single pods, or members of a
PodGroup of minMember 1 (``victim_units`` evicts those alone).  And only as
many as the holder may evict at once, counting those lent room before:
within its namespaces' eviction budgets and ``maxVictimsPerCycle``.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Collection, Mapping

from batchsched.core.gangs import Gang
from batchsched.core.model import PodInfo
from batchsched.core.preemption.policy import PreemptionPolicy, PreemptionState
from batchsched.core.queueing.queue import GangQueue, Reservation
from batchsched.core.queueing.runtime import expected_end
from batchsched.core.snapshot import Snapshot


def may_borrow(snapshot: Snapshot, gangs: Mapping[str, Gang], gang: Gang, pods: Collection[PodInfo],
               queue: GangQueue, policy: PreemptionPolicy, state: PreemptionState,
               lent: Mapping[str, float]) -> bool:
    """Whether ``pods`` of ``gang`` may use the free room on the nodes
    reserved against it: the holder may evict each of them once bound, by
    the time it is expected to fit, together with the pods ``lent`` that
    room before (``lent_pods``, and those that borrowed since)."""
    reservation = queue.reservation
    holder = gangs.get(reservation.gang_key) if reservation is not None else None
    if holder is None or reservation.ready_at is None or not policy.enabled or not pods or not _one_by_one(gang):
        return False
    if policy.why_not_preempt(holder.spec, holder.priority, holder.members):
        return False  # "" when it may
    evictable_at = max(snapshot.now + policy.min_runtime_seconds, _may_evict_from(holder, queue, policy, snapshot.now))
    if evictable_at > reservation.ready_at:
        return False
    group = None if gang.implicit else gang.spec
    if not all(policy.evictable_once_running(p, holder.priority, group, gang.priority) for p in pods):
        return False
    if len(lent) + len(pods) > policy.max_victims_per_cycle:
        return False
    namespaces = Counter(p.namespace for uid in lent if (p := snapshot.pods.get(uid)) is not None)
    namespaces.update(p.namespace for p in pods)
    return all(state.evictions_left(policy, ns) >= n for ns, n in namespaces.items())


def lent_pods(snapshot: Snapshot, gangs: Mapping[str, Gang], holder: Gang, queue: GangQueue,
              policy: PreemptionPolicy) -> dict[str, float]:
    """The pods on the nodes reserved for ``holder`` that it may evict and
    that started there since it got them (the ones that borrowed, and any
    like them, but those that end by themselves within a bound), each with
    the time from which it may evict them: its plan counts them as gone
    then.  No more than it may evict at once (``maxVictimsPerCycle``),
    soonest evictable first.  Those it may not evict for now (the hour's
    eviction budget spent, a PodDisruptionBudget refusing) still count: it
    keeps its nodes and evicts them once it may, or its reservation runs
    out (``maxReservationSeconds``).  Empty unless ``holder`` holds the
    reservation and may preempt."""
    reservation: Reservation | None = queue.reservation
    if reservation is None or reservation.gang_key != holder.key or not policy.enabled \
            or policy.why_not_preempt(holder.spec, holder.priority, holder.members):
        return {}
    from_ = _may_evict_from(holder, queue, policy, snapshot.now)
    candidates: list[tuple[float, str]] = []
    cluster = snapshot.cluster
    for name in reservation.nodes:
        for pod in cluster.bound_pods(name):
            # A startTime has whole seconds: one that started in the second
            # the reservation began reads as started before it.  So both are
            # compared in whole seconds.
            if pod.scheduler_name != snapshot.scheduler_name or not pod.holds_resources or pod.terminating \
                    or (pod.started and pod.started < math.floor(reservation.since)):
                continue
            if pod.runs_to_completion and expected_end(pod, snapshot.groups, snapshot.now) is not None:
                continue  # waited out to its end (cycle.Drain): it needs no eviction, nor a place among them
            gang = gangs.get(pod.gang_key)
            if gang is None or not _one_by_one(gang) or not policy.evictable_once_running(
                    pod, holder.priority, None if gang.implicit else gang.spec, gang.priority):
                continue
            # started is 0.0 until the kubelet reports a startTime: counted
            # from when it could have started at the earliest, a time that
            # does not move on with every cycle while it has not.
            started = pod.started or max(pod.created, reservation.since)
            candidates.append((max(started + policy.min_runtime_seconds, from_), pod.uid))
    return {uid: evictable for evictable, uid in sorted(candidates)[:policy.max_victims_per_cycle]}


def _one_by_one(gang: Gang) -> bool:
    """Its pods are evicted one by one (plan.victim_units)."""
    return gang.implicit or gang.spec.min_member <= 1


def _may_evict_from(holder: Gang, queue: GangQueue, policy: PreemptionPolicy, now: float) -> float:
    """When the holder has waited long enough to evict (its PriorityClass's
    ``preemptors.waitSeconds``)."""
    wait, _ = policy.wait_before_evicting(holder.members)
    return now - queue.waited(holder.key, now) + wait
