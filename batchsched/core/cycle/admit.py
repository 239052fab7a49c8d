"""Stage "admit": may the gang be placed at all, and which of its pods.

A gang that could not fit even on the whole cluster, or whose queue cannot
take it now (at its limit, or borrowing that others wait for), gets its
verdict here and is not placed; no eviction makes room in a queue, so it
is not offered preemption either.
"""
from __future__ import annotations

from batchsched.core.cycle.context import CycleContext
from batchsched.core.cycle.outcome import REASON_EXCEEDS_CAPACITY, Verdict
from batchsched.core.gangs import Gang
from batchsched.core.placement.gang import min_resources_beyond
from batchsched.core.queues.book import REASON_QUEUE_AT_LIMIT, REASON_QUEUE_BEYOND_FAIR_SHARE, Admission


def admit(ctx: CycleContext, gang: Gang) -> Admission | None:
    """The pods its queue admits now; None when the gang got its verdict."""
    key = gang.key
    too_big = min_resources_beyond(gang, ctx.cluster_total)
    if too_big:
        ctx.queue.record_failure(key, ctx.now)
        ctx.plan.verdicts[key] = Verdict(False, REASON_EXCEEDS_CAPACITY, too_big)
        return None
    held_back = ctx.book.borrowing(gang)
    admission = held_back or ctx.book.admission(gang)
    if isinstance(admission, str):
        ctx.queue.record_failure(key, ctx.now)
        ctx.plan.verdicts[key] = Verdict(False, REASON_QUEUE_BEYOND_FAIR_SHARE if held_back else REASON_QUEUE_AT_LIMIT,
                                         f"Gang {key} waits for its queue: {admission}.")
        return None
    return admission
