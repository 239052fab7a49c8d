"""Stage "order": which gangs this cycle decides, and which it tries.

Gangs that cannot be tried get their verdict here (missing or invalid
PodGroup, queue problems, quorum not reached, schedule or partial-gang
timeout); the rest go to the queue (``GangQueue.sync``), which says which
are tried and in what order.  After room was freed the gangs it may help
leave their backoff (``retry_where_freed``); one so woken whose room was
taken before its turn is not tried (``room_taken_before_its_turn``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping

from batchsched.core import resources as res
from batchsched.core.cycle.context import CycleContext
from batchsched.core.cycle.facts import one_pod_per_shape, placement_policy, shortest_bound
from batchsched.core.cycle.messages import quorum_message
from batchsched.core.cycle.outcome import (REASON_CLAIMS_NOT_READY, REASON_PARTIAL_TIMEOUT, REASON_QUORUM_NOT_REACHED,
                                           REASON_SCHEDULE_TIMEOUT, GangReset, Verdict)
from batchsched.core.gangs import Gang
from batchsched.core.model import PodInfo
from batchsched.core.placement.capacity import shape_key
from batchsched.core.placement.gang import places_none
from batchsched.core.queueing.lending import may_borrow
from batchsched.core.queueing.queue import Reservation
from batchsched.core.resources import Resources
from batchsched.core.snapshot import Snapshot


def waiting_gangs(ctx: CycleContext) -> list[Gang]:
    """The pending gangs that may be tried (synced into the queue); the
    others get their verdict."""
    snapshot, queue, verdicts = ctx.snapshot, ctx.queue, ctx.plan.verdicts
    waiting = []
    for gang in ctx.gangs.pending():  # gangs with nothing to place (or only gated pods) wait
        queue_problem = ctx.book.problem(gang) if gang.problem is None else None
        if gang.problem is not None:
            verdicts[gang.key] = Verdict(False, gang.problem.reason, gang.problem.message)
        elif queue_problem is not None:
            verdicts[gang.key] = Verdict(False, queue_problem.reason, queue_problem.message)
        elif not gang.eligible and gang.key in queue.started_over:
            verdicts[gang.key] = Verdict(False, REASON_PARTIAL_TIMEOUT, (f"{queue.started_over[gang.key]} "
                f"Waiting for its pods: {quorum_message(gang, snapshot.scheduler_name)}."))
        elif not gang.eligible:
            waits_for_claims = (bool(gang.claims_waiting) and not gang.tasks_short
                                and gang.active + len(gang.claims_waiting) >= gang.min_member)
            verdicts[gang.key] = Verdict(False, REASON_CLAIMS_NOT_READY if waits_for_claims
                                         else REASON_QUORUM_NOT_REACHED,
                                         quorum_message(gang, snapshot.scheduler_name))
        else:
            waiting.append(gang)
    queue.sync(waiting, ctx.now)
    _time_out(ctx, waiting)
    return waiting


def _time_out(ctx: CycleContext, waiting: list[Gang]) -> None:
    """Gangs past their PodGroup's scheduleTimeoutSeconds stop being tried."""
    queue, now = ctx.queue, ctx.now
    for gang in waiting:
        timeout = gang.spec.schedule_timeout_seconds
        if timeout and gang.need and not queue.timed_out(gang.key) and queue.waited(gang.key, now) > timeout:
            queue.time_out(gang.key)
        if queue.timed_out(gang.key):
            ctx.plan.verdicts[gang.key] = Verdict(False, REASON_SCHEDULE_TIMEOUT, (
                f"Gang {gang.key} was not scheduled within scheduleTimeoutSeconds={timeout}; "
                "it is retried when its pods or PodGroup change."))


def start_over_partial_gangs(ctx: CycleContext) -> set[str]:
    """Gangs partly bound for longer than ``partial_gang_timeout`` (a
    binding refused over and over, say): their bound members are evicted
    so that the gang starts over whole, rather than holding GPUs it cannot
    use forever."""
    queue, plan, timeout = ctx.queue, ctx.plan, ctx.config.partial_gang_timeout
    keys = set()
    for key in queue.partial_expired(ctx.now, timeout):
        gang = ctx.gangs[key]
        message = (f"Gang {key} stayed partly bound ({len(gang.bound_active)}/{gang.min_member}) for more than "
                   f"{timeout:g}s (binding.partialGangTimeoutSeconds); its {len(gang.bound_active)} bound "
                   "member(s) are evicted so that it starts over when its pods return.")
        plan.resets.append(GangReset(key, gang.bound_active, message))
        plan.verdicts[key] = Verdict(False, REASON_PARTIAL_TIMEOUT, message)
        queue.started_over[key] = message
        keys.add(key)
    return keys


@dataclass
class _CycleMark:
    """The cluster's change clock at the last cycle: nodes changed since may have freed room."""

    mark: int | None = None


def retry_where_freed(ctx: CycleContext) -> None:
    """After capacity was freed, the gangs it may help: a node changed since
    the last cycle (every node the first time) has room now for one of a
    backed-off gang's pending pods, or would have for a hopeless gang once
    every pod of ours that ends by itself had ended.  Resources only, so
    never a false no; churn on nodes that cannot take even one of its pods
    leaves a gang's backoff and hopeless mark alone."""
    snapshot, gangs = ctx.snapshot, ctx.gangs
    cluster = snapshot.cluster
    kept = cluster.kept(_CycleMark)
    mark, kept.mark = kept.mark, cluster.mark

    @functools.cache
    def changed() -> list[str]:
        names = cluster.nodes if mark is None else cluster.changed_since(mark)
        return [name for name in names if name in cluster.nodes]

    def drained(name: str) -> Resources:
        free = cluster.free(name)
        for pod in cluster.bound_pods(name):
            if pod.holds_resources and pod.scheduler_name == snapshot.scheduler_name and pod.runs_to_completion:
                free = res.add(free, pod.requests)
        return free

    ctx.queue.retry_if_freed(_fits_one_pod(snapshot, gangs, lambda: [cluster.free(name) for name in changed()]),
                             _fits_one_pod(snapshot, gangs, lambda: [drained(name) for name in changed()]))


def _fits_one_pod(snapshot: Snapshot, gangs: Mapping[str, Gang],
                  rooms: Callable[[], list[Resources]]) -> Callable[[str], bool]:
    """Whether one of a gang's pending pods fits one of ``rooms`` (computed
    at the first question, answers kept per pod shape, ``shape_key``)."""
    fits_by_shape: dict[tuple, bool] = {}

    def fits(pod: PodInfo) -> bool:
        shape = shape_key(pod)
        if shape not in fits_by_shape:
            fits_by_shape[shape] = any(not res.shortfall(pod.requests, room) for room in known())
        return fits_by_shape[shape]

    known = functools.cache(rooms)
    return lambda key: any(fits(p) for p in one_pod_per_shape(snapshot, gangs[key]))


def room_taken_before_its_turn(ctx: CycleContext, gang: Gang) -> bool:
    """A gang that freed room woke from its backoff (``retry_where_freed``)
    finds, at its turn, no node with room for even one of its pods: gangs
    before it in this cycle took the room, or it is on nodes reserved
    against it.  Its attempt could only fail, with nothing else to do (it
    may not evict, holds no nominated room), so it is not made: when one
    node frees, the gangs woken by it do not all fail there in turn."""
    snapshot, queue, preemption = ctx.snapshot, ctx.queue, ctx.preemption
    if not queue.woken_by_freed(gang.key, snapshot.now) or not gang.need or gang.key in ctx.holds.claims:
        return False
    if preemption.enabled and (ctx.book.active or not preemption.why_not_preempt(gang.spec, gang.priority,
                                                                             gang.members)):
        return False
    reserved = queue.reserved_against(gang.key)
    if reserved and (_one_pod_backfills(snapshot, gang, queue.reservation) or (
            ctx.config.lend_reserved and may_borrow(snapshot, ctx.gangs, gang, gang.pending, queue, preemption,
                                                    ctx.preemption_state, ctx.lent))):
        reserved = frozenset()
    return places_none(one_pod_per_shape(snapshot, gang), ctx.capacity, reserved=reserved,
                       policy=placement_policy(snapshot, gang, ctx.config))


def _one_pod_backfills(snapshot: Snapshot, gang: Gang, reservation: Reservation | None) -> bool:
    """Whether one of the gang's pending pods alone backfills (``place.backfills``):
    the one with the shortest runtime bound among those that end by themselves."""
    ready_at = reservation.ready_at if reservation is not None else None
    if ready_at is None:
        return False
    shortest = shortest_bound(snapshot, gang)
    return shortest is not None and snapshot.now + shortest <= ready_at
