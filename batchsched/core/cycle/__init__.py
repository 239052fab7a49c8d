"""One scheduling cycle: from a Snapshot to bindings and per-gang verdicts.

The cycle is a sequence of named stages over one ``CycleContext``
(docs/architecture.md, "The cycle"):

1. ``order``: verdicts for the gangs that cannot be tried (missing or
   invalid PodGroup, quorum not reached, timeouts), partial gangs started
   over, gangs woken where room was freed;
2. ``reserve``: the reservation for the gang that waited longest;
3. per gang, in queue order, inside a ``Statement`` (undone whole if the
   attempt raises): ``admit`` (size, queue) -> ``place`` (filter, score,
   GPUs and devices) -> ``preempt`` (or reclaim) when it does not fit, or
   ``commit`` when it does.

Every gang tried is planned against one running copy of free resources, so
gangs placed in the same cycle never share capacity.  A gang is bound whole
(at least its quorum) or not at all.

Verdicts cover the gangs decided in this cycle; a gang still backing off,
or beyond ``max_gangs_per_cycle`` (``GangQueue.attempts``), gets none and
keeps its previous one.
"""
from __future__ import annotations

import dataclasses

from batchsched.core.config import CoreConfig
from batchsched.core.cycle.admit import admit
from batchsched.core.cycle.commit import commit
from batchsched.core.cycle.context import CycleContext
from batchsched.core.cycle.facts import placement_policy
from batchsched.core.cycle.order import retry_where_freed, room_taken_before_its_turn, start_over_partial_gangs, \
    waiting_gangs
from batchsched.core.cycle.outcome import (REASON_CLAIMS_NOT_READY, REASON_EXCEEDS_CAPACITY, REASON_INTERNAL_ERROR,
                                           REASON_PARTIAL_TIMEOUT, REASON_QUORUM_NOT_REACHED, REASON_SCHEDULE_TIMEOUT,
                                           REASON_SCHEDULED, REASON_UNSCHEDULABLE, Binding, CyclePlan, Eviction,
                                           GangReset, Nomination, Verdict)
from batchsched.core.cycle.place import place
from batchsched.core.cycle.preempt import unplaced
from batchsched.core.cycle.reserve import refresh_reservation
from batchsched.core.cycle.statement import Statement
from batchsched.core.gangs import GangIndex
from batchsched.core.placement.fragmentation import node_choice
from batchsched.core.placement.gang import GangPlan
from batchsched.core.preemption.plan import NominationHolds
from batchsched.core.preemption.policy import PreemptionPolicy, PreemptionState
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.queues.book import QueueBook
from batchsched.core.snapshot import Snapshot
from batchsched.core.text import clip

__all__ = ["schedule_cycle", "placement_policy", "Binding", "CyclePlan", "Eviction", "GangReset", "Nomination",
           "Verdict", "REASON_CLAIMS_NOT_READY", "REASON_EXCEEDS_CAPACITY", "REASON_INTERNAL_ERROR",
           "REASON_PARTIAL_TIMEOUT", "REASON_QUORUM_NOT_REACHED", "REASON_SCHEDULE_TIMEOUT", "REASON_SCHEDULED",
           "REASON_UNSCHEDULABLE"]


def schedule_cycle(snapshot: Snapshot, queue: GangQueue, config: CoreConfig = CoreConfig(),
                   preemption: PreemptionPolicy = PreemptionPolicy(enabled=False),
                   preemption_state: PreemptionState = PreemptionState()) -> CyclePlan:
    ctx = open_cycle(snapshot, queue, config, preemption, preemption_state)
    waiting_gangs(ctx)
    starting_over = start_over_partial_gangs(ctx)
    retry_where_freed(ctx)
    # The holder's would-be victims on its reserved nodes, and those that
    # borrow its room in this cycle (queueing.lending).
    ctx.lent = refresh_reservation(ctx)
    for key in ctx.book.in_turn(queue.attempts(snapshot.now, config.max_gangs_per_cycle),
                                lambda key: ctx.gangs[key].first_in_line):
        if key not in starting_over:
            attempt(ctx, key)
    return dataclasses.replace(ctx.plan, reservation=queue.reservation)


def open_cycle(snapshot: Snapshot, queue: GangQueue, config: CoreConfig, preemption: PreemptionPolicy,
               preemption_state: PreemptionState) -> CycleContext:
    holds = NominationHolds.from_snapshot(snapshot)
    return CycleContext(snapshot, queue, config, preemption, preemption_state, GangIndex(snapshot),
                        QueueBook(snapshot, config), Statement(CyclePlan()), holds, holds.withheld(),
                        node_choice(snapshot.cluster, config))  # every cycle: its mix is kept with hysteresis


def attempt(ctx: CycleContext, key: str) -> None:
    """Try one gang inside a statement (one whose room was taken before its
    turn is not tried, and takes nothing).  One gang's unforeseen failure (a
    bug, a value no check foresaw) is that gang's verdict, and all it
    tentatively placed, evicted or took is undone: the gangs after it are
    tried on the room there was before it."""
    try:
        gang = ctx.gangs[key]
        if room_taken_before_its_turn(ctx, gang):  # most gangs tried in a burst: it takes nothing
            ctx.queue.resume_backoff(key)
            return
    except Exception as exc:  # noqa: BLE001 - isolated per gang, reported in its verdict
        _failed(ctx, key, exc)
        return
    statement = ctx.statement
    statement.checkpoint(ctx.capacity)
    try:
        admission = admit(ctx, gang)
        if admission is not None:
            placing = place(ctx, gang, admission)
            if isinstance(placing.result, GangPlan):
                commit(ctx, gang, admission, placing)
            else:
                unplaced(ctx, gang, placing)
    except Exception as exc:  # noqa: BLE001 - isolated per gang, reported in its verdict
        statement.rollback()
        _failed(ctx, key, exc)
    else:
        statement.keep()


def _failed(ctx: CycleContext, key: str, exc: Exception) -> None:
    ctx.queue.record_failure(key, ctx.now)
    ctx.plan.verdicts[key] = Verdict(False, REASON_INTERNAL_ERROR, (
        f"Gang {key} could not be tried: {type(exc).__name__}: {clip(str(exc), 300)}; "
        "it is retried after a backoff."))
