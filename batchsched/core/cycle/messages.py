"""The sentences of a cycle's verdicts that more than one stage writes."""
from __future__ import annotations

from datetime import datetime, timezone

from batchsched.core.gangs import Gang, foreign_note, members_selector
from batchsched.core.placement.gang import GangPlan
from batchsched.core.queueing.queue import Reservation
from batchsched.core.queues.book import Admission
from batchsched.core.text import clip


def quorum_message(gang: Gang, scheduler_name: str) -> str:
    """How many members exist against minMember, what makes a pod one, and
    the pods that carry the label but name another scheduler."""
    message = f"{gang.active}/{gang.min_member} members exist"
    if not gang.implicit:
        message += f" ({members_selector(gang.spec.namespace, gang.spec.name, scheduler_name, gang.spec.source)})"
    if gang.gated:
        message += f"; {gang.gated} more held by scheduling gates"
    if gang.claims_waiting:
        shown = "; ".join(f"pod {name}: {why}" for name, why in gang.claims_waiting[:3])
        more = len(gang.claims_waiting) - 3
        message += (f"; {len(gang.claims_waiting)} more wait for their ResourceClaims ({shown}"
                    + (f"; and {more} more" if more > 0 else "") + ")")
    if gang.tasks_short:
        message += "; " + ", ".join(f"task {clip(task, 80)} has {live}/{need} members"
                                    for task, live, need in gang.tasks_short[:5]) + " (minTaskMember)"
    if gang.foreign:
        message += f"; {foreign_note(gang.foreign, scheduler_name)}"
    return message


def scheduled_message(gang: Gang, result: GangPlan, admission: Admission) -> str:
    placed = len(result.assignments)
    if gang.need:
        nodes = len({a.node_name for a in result.assignments})
        message = f"Gang {gang.key}: {placed} pod(s) placed on {nodes} node(s)"
    else:
        message = f"Gang {gang.key} has its quorum bound; {placed} more pod(s) placed"
    if admission.left_out:
        message += f"; {admission.left_out} more wait for their queue: {admission.left_out_why}"
    if result.unplaced:  # unplaced_message is a full sentence
        return f"{message}; {len(result.unplaced)} more do not fit: {result.unplaced_message}"
    return message + "."


def held_reservation_note(reservation: Reservation, now: float) -> str:
    """What its holder's verdict says of the reservation: the nodes and when
    it is expected to fit there (a time, not a countdown: a verdict that
    changed every cycle would be written every cycle; so is one that is
    past, which stays at now while what it waits for is late)."""
    names = sorted(reservation.nodes)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if reservation.ready_at is None:
        when = "when they will have drained is unknown (a pod it waits for there has no runtime bound)"
    elif reservation.ready_at <= now:
        when = "it was expected to fit there by now"
    else:
        try:
            stamp = datetime.fromtimestamp(reservation.ready_at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        except (OverflowError, OSError, ValueError):  # a deadline of 2^62 s is valid in the API
            stamp = "a time past the year 9999"
        when = f"it is expected to fit there by {stamp}"
    return f"It holds a reservation of {len(names)} node(s) while they drain ({shown}); {when}."
