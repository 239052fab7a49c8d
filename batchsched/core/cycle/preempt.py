"""Stage "preempt or reclaim": a gang that does not fit makes room, or waits.

In this order, each only while nothing was nominated yet: the gangs past
their runtime hints on the nodes it holds reserved (whatever their
priority); lower-priority pods, once it has waited its PriorityClass's
waitSeconds; the room its queue lent (reclaim, whatever the victims'
priority).  Victims are chosen by ``preemption.plan`` (victim-cost terms:
``preemption.cost``); the nominated room is the preemptor's from then on,
in this cycle too.  The stage writes the gang's verdict.
"""
from __future__ import annotations

from typing import Collection, Mapping

from batchsched.core import resources as res
from batchsched.core.cycle.context import CycleContext
from batchsched.core.cycle.messages import held_reservation_note
from batchsched.core.cycle.outcome import REASON_EXCEEDS_CAPACITY, REASON_UNSCHEDULABLE, Eviction, Nomination, Verdict
from batchsched.core.cycle.place import Placing, give
from batchsched.core.gangs import Gang
from batchsched.core.placement.gang import PlanFailure
from batchsched.core.preemption.plan import NoPreemption, PreemptionRoom, VictimRules, plan_preemption
from batchsched.core.queueing.queue import Reservation
from batchsched.core.queueing.runtime import overran_hint
from batchsched.core.queues.reclaim import Reclaim, awaited_reclaim, flows_said, reclaim_for
from batchsched.core.resources import Resources
from batchsched.core.snapshot import Snapshot


def unplaced(ctx: CycleContext, gang: Gang, placing: Placing) -> None:
    """The verdict of a gang whose plan failed, after making room if it may."""
    key, queue, failure = gang.key, ctx.queue, placing.result
    assert isinstance(failure, PlanFailure)
    queue.record_failure(key, ctx.now)
    message = _why_unplaced(ctx, key, failure)
    nominated_before = len(ctx.plan.nominations)
    if gang.need and ctx.preemption.enabled and not failure.never_fits:  # no eviction could make it fit
        message += " " + _make_room(ctx, gang, placing.off_limits)
    if len(ctx.plan.nominations) == nominated_before:
        give(ctx.capacity, placing.own_holds, res.subtract)  # its claims stand; new ones would replace them
        if ctx.config.hold_borrowing and ctx.preemption.enabled and not failure.never_fits and gang.need \
                and not placing.own_holds and key not in ctx.preemption_state.in_flight:
            ctx.book.note_unplaced(gang)  # what others borrow now would be reclaimed for it
    reason = REASON_EXCEEDS_CAPACITY if failure.never_fits else REASON_UNSCHEDULABLE
    ctx.plan.verdicts[key] = Verdict(False, reason, message)


def _why_unplaced(ctx: CycleContext, key: str, failure: PlanFailure) -> str:
    queue, message = ctx.queue, failure.message
    awaited = awaited_reclaim(ctx.book, key)
    if awaited:  # the room it was nominated to is still held by the queues it reclaims from
        message = f"Gang {key} is waiting for reclaim from {flows_said(awaited)}. {message}"
    if queue.reservation_expired(key):
        message += (f" Its node reservation was released after it outlasted its bound (the pods it "
                    f"waited for, or maxReservationSeconds={ctx.config.max_reservation_seconds:g}); it "
                    "gets none until its pods or PodGroup change.")
    if queue.reservation is not None and queue.reservation.gang_key == key:
        message += " " + held_reservation_note(queue.reservation, ctx.now)
    return message


def _make_room(ctx: CycleContext, gang: Gang, off_limits: Collection[str]) -> str:
    """Overran gangs first, then by priority once it waited, then reclaim;
    the sentence its verdict gets."""
    plan, key = ctx.plan, gang.key
    nominated_before = len(plan.nominations)
    overran = _overran_hints(ctx.snapshot, ctx.gangs, gang, ctx.queue.reservation)
    said = (_preempt(ctx, gang, off_limits, overran=overran) + " ") if overran else ""
    if len(plan.nominations) == nominated_before:
        wait, priority_class = ctx.preemption.wait_before_evicting(gang.members)
        waited = ctx.queue.waited(key, ctx.now)
        if waited < wait:
            said += (f"It may evict lower-priority pods once it has waited {wait:g}s for room to free "
                     f"by itself (preemption.preemptors.waitSeconds of PriorityClass {priority_class}); "
                     f"it has waited {waited:.0f}s.")
        else:
            said += _preempt(ctx, gang, off_limits)
    reclaim = reclaim_for(ctx.book, gang) if len(plan.nominations) == nominated_before else None
    if reclaim is not None:  # its queue takes back what it lent, whatever the victims' priority
        reclaimed = _preempt(ctx, gang, off_limits, reclaim)
        said = reclaimed if len(plan.nominations) > nominated_before else f"{said} {reclaimed}"
    return said


def _preempt(ctx: CycleContext, gang: Gang, off_limits: Collection[str], reclaim: Reclaim | None = None,
             overran: frozenset[str] = frozenset()) -> str:
    """Plan evictions for ``gang`` (by priority; with ``reclaim`` the room
    its queue lent; with ``overran`` only those gangs, past their runtime
    hints on its reserved nodes); returns the sentence its verdict gets."""
    policy, capacity, evicting = ctx.preemption, ctx.capacity, ctx.statement.evicting
    victims_of = reclaim if reclaim is not None else (overran.__contains__ if overran else None)
    outcome = plan_preemption(ctx.snapshot, ctx.gangs, gang, policy, ctx.preemption_state,
                              PreemptionRoom(capacity.free, capacity.node_filter, ctx.holds.going_for(gang.key),
                                             capacity.rooms or {}, off_limits),
                              VictimRules(policy.max_victims_per_cycle - len(evicting), evicting, victims_of,
                                          budgeted=bool(overran) and reclaim is None))
    said = "" if reclaim is None else f"Queue {reclaim.queue} is below its fair share and reclaims: "
    if overran:
        said = "Gangs past their expectedRuntimeSeconds on its reserved nodes go first: "
    if isinstance(outcome, NoPreemption):
        return said + outcome.message
    too_much = reclaim.beyond(outcome.victims) if reclaim is not None else ""
    if too_much:
        return f"Gang {gang.key}: {too_much}."
    evicting.update(p.uid for p in outcome.victims)
    ctx.plan.evictions.extend(Eviction(p, gang.key, reclaim is not None) for p in outcome.victims)
    ctx.plan.nominations.extend(Nomination(pod, node) for pod, node in outcome.nominations)
    # The nominated room is the preemptor's from now on, in this cycle too.
    nominated: dict[str, Resources] = {}
    for pod, node in outcome.nominations:
        nominated[node] = res.add(nominated.get(node, {}), pod.requests)
    give(capacity, nominated, res.subtract)
    return said + outcome.message


def _overran_hints(snapshot: Snapshot, gangs: Mapping[str, Gang], gang: Gang,
                   reservation: Reservation | None) -> frozenset[str]:
    """The gangs the reservation ``gang`` holds waits for that run past
    their runtime hints on its nodes: its first victims, whatever their
    priority (docs/queueing.md, "Backfill")."""
    if reservation is None or reservation.gang_key != gang.key:
        return frozenset()
    cluster, now = snapshot.cluster, snapshot.now
    return frozenset(p.gang_key for name in reservation.nodes for p in cluster.bound_pods(name)
                     if p.holds_resources and p.gang_key != gang.key and p.scheduler_name == snapshot.scheduler_name
                     and p.gang_key in gangs and gangs[p.gang_key].priority <= gang.priority
                     and overran_hint(p, snapshot.groups, now))
