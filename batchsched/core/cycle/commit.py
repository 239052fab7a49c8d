"""Stage "commit": a gang placed becomes bindings, its queue's usage and its verdict.

Its queue's limits by GPU type are checked once the types are known; the
bindings (with the claims DRA needs written first) are built before
anything is recorded, so an error there leaves the queue book as it was
and the statement rolls back the rest.
"""
from __future__ import annotations

from batchsched.core.cycle.context import CycleContext
from batchsched.core.cycle.messages import scheduled_message
from batchsched.core.cycle.outcome import REASON_SCHEDULED, Binding, Verdict
from batchsched.core.cycle.place import Placing
from batchsched.core.dra import claims
from batchsched.core.dra.extended import ExtendedClaim, extended_claim
from batchsched.core.gangs import Gang
from batchsched.core.placement.fit import serves_through_extended_claim
from batchsched.core.placement.gang import Assignment, GangPlan
from batchsched.core.queues.book import REASON_QUEUE_AT_LIMIT, Admission
from batchsched.core.snapshot import Snapshot


def commit(ctx: CycleContext, gang: Gang, admission: Admission, placing: Placing) -> None:
    key, queue, result = gang.key, ctx.queue, placing.result
    assert isinstance(result, GangPlan)
    over = ctx.book.over_limit(admission.queue, result.assignments)
    if over:  # its GPU types are known once placed; the room the plan took stays taken this cycle
        queue.record_failure(key, ctx.now)
        ctx.plan.verdicts[key] = Verdict(False, REASON_QUEUE_AT_LIMIT, f"Gang {key} waits for its queue: {over}.")
        return
    queue.record_success(key)
    if result.unplaced or admission.left_out:
        queue.record_failure(key, ctx.now)  # back off retrying the members that did not fit
    snapshot = ctx.snapshot
    bindings = [Binding(a.pod.uid, a.pod.namespace, a.pod.name, a.node_name, key, a.gpu_ids, _claim_of(snapshot, a),
                        claims.allocations(snapshot.nodes[a.node_name], a.pod, a.gpu_ids, snapshot.cluster.dra.claim,
                                           snapshot.cluster.dra.classes))
                for a in result.assignments]
    ctx.book.admit(admission.queue, result.assignments)
    ctx.plan.bindings.extend(bindings)
    message = scheduled_message(gang, result, admission)
    if placing.borrowed and any(a.node_name in placing.reserved for a in result.assignments):
        reserved_until = queue.reservation.ready_at
        ctx.lent.update((a.pod.uid, reserved_until) for a in result.assignments if a.node_name in placing.reserved)
        message += (f" It borrowed room on nodes reserved for gang {placing.borrowed}, which may evict it once it "
                    "can use them (queue.lendReservedToVictims).")
    ctx.plan.verdicts[key] = Verdict(True, REASON_SCHEDULED, message)


def _claim_of(snapshot: Snapshot, assignment: Assignment) -> ExtendedClaim | None:
    """The extended-resource claim of a pod given GPUs where DRA serves them
    (raises ExtendedClaimError, its gang's verdict, when it cannot have one)."""
    node = snapshot.nodes[assignment.node_name]
    if not node.gpus_by_dra or not serves_through_extended_claim(assignment.pod):
        return None
    return extended_claim(node, assignment.pod, assignment.gpu_ids, snapshot.cluster.dra.classes)
