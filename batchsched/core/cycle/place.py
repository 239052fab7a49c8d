"""Stage "place": the admitted pods on the running free map.

The gang gets back the room nominated to it (its own claims), then is
planned (``plan_gang``: filter, score, GPUs and devices) off the nodes
reserved against it and those of GPU types its queue is at the limit of;
failing that, on the reserved nodes too where it backfills (ends before the
reserved gang is expected to fit) or may borrow them (the holder may evict
it by then, queueing.lending).  A plan found is already taken from the
capacity index.
"""
from __future__ import annotations

from typing import Callable, Collection, Mapping, NamedTuple

from batchsched.core import resources as res
from batchsched.core.cycle.context import CycleContext
from batchsched.core.cycle.facts import placement_policy
from batchsched.core.cycle.reserve import bound_on
from batchsched.core.gangs import Gang
from batchsched.core.model import PodInfo
from batchsched.core.placement.capacity import CapacityIndex
from batchsched.core.placement.fit import REASON_RESERVED
from batchsched.core.placement.gang import GangPlan, PlanFailure, plan_gang
from batchsched.core.queueing.lending import may_borrow
from batchsched.core.queueing.queue import Reservation
from batchsched.core.queueing.runtime import runtime_bound
from batchsched.core.queues.book import Admission
from batchsched.core.resources import Resources
from batchsched.core.snapshot import Snapshot


class Placing(NamedTuple):  # (a tuple: made for every gang placed, cheaply)
    result: GangPlan | PlanFailure
    reserved: frozenset[str]  # nodes reserved against it
    off_limits: Collection[str]  # those and the nodes its queue may not use now
    own_holds: Mapping[str, Resources]  # the room nominated to it, given back for the attempt
    borrowed: str  # the gang whose reserved room it borrows ("": none)


def place(ctx: CycleContext, gang: Gang, admission: Admission) -> Placing:
    key, queue = gang.key, ctx.queue
    reserved = queue.reserved_against(key)
    off_limits = _off_limits(reserved, admission)
    own_holds = _released_for(ctx.withheld, ctx.holds.withheld(key)) if key in ctx.holds.claims else {}
    give(ctx.capacity, own_holds, res.add)
    result = _plan(ctx, gang, admission.pods, off_limits)
    borrowed = ""
    if isinstance(result, PlanFailure) and reserved:
        in_time = backfills(ctx.snapshot, admission.pods, queue.reservation)
        if not in_time and ctx.config.lend_reserved and may_borrow(
                ctx.snapshot, ctx.gangs, gang, admission.pods, queue, ctx.preemption,
                ctx.preemption_state, ctx.lent):
            borrowed = queue.reservation.gang_key
        if in_time or borrowed:
            # It ends before the reserved gang is expected to fit, or that
            # gang may evict it by then: the reserved nodes are its too
            # (other nodes were tried first).
            result = _plan(ctx, gang, admission.pods, _off_limits(frozenset(), admission))
    return Placing(result, reserved, off_limits, own_holds, borrowed)


def _plan(ctx: CycleContext, gang: Gang, pods: list[PodInfo], off_limits: Collection[str]) -> GangPlan | PlanFailure:
    return plan_gang(pods, gang.need, ctx.capacity, reserved=off_limits, cluster_total=ctx.cluster_total,
                     task_need=gang.task_need, policy=placement_policy(ctx.snapshot, gang, ctx.config),
                     bound_on=bound_on(gang))


def backfills(snapshot: Snapshot, pods: Collection[PodInfo], reservation: Reservation | None) -> bool:
    """Whether ``pods`` may run on the reserved nodes meanwhile: each ends by
    itself within its runtime bound (runtime.runtime_bound), counted from
    now, by the time the reserved gang is expected to fit.  A pod without a
    bound never backfills, nor does any while that time is unknown."""
    ready_at = reservation.ready_at if reservation is not None else None
    if ready_at is None:
        return False
    for pod in pods:
        bound = runtime_bound(pod, snapshot.groups)
        if bound is None or not pod.runs_to_completion or snapshot.now + bound > ready_at:
            return False
    return True


def _off_limits(reserved: frozenset[str], admission: Admission) -> Collection[str]:
    """The nodes a gang may not use: those reserved for a gang ahead of it,
    and those of GPU types its queue is at the limit of (each with why)."""
    if not admission.excluded:
        return reserved
    return {**dict.fromkeys(reserved, REASON_RESERVED), **admission.excluded}


def give(capacity: CapacityIndex, amounts: Mapping[str, Resources], op: Callable) -> None:
    """Add (op=res.add) or take back (res.subtract) room on nodes of the index."""
    if amounts:
        capacity.commit({node: op(capacity.free[node], amount) for node, amount in amounts.items()})


def _released_for(withheld_from_all: Mapping[str, Resources],
                  withheld_from_gang: Mapping[str, Resources]) -> dict[str, Resources]:
    """The room a claimant gets back on top of what every gang may use."""
    return {node: res.subtract(amount, withheld_from_gang.get(node, {}))
            for node, amount in withheld_from_all.items()}
