"""PodGroup status from its members: phase, counters and conditions (pure).

Phases (see docs/podgroup.md):

* ``Pending``   fewer than minMember active members exist (quorum not reached)
* ``Queued``    the quorum exists and waits for room; the Unschedulable
                condition says why
* ``Scheduled`` at least minMember members are bound, fewer are Running
* ``Running``   at least minMember members are Running
* ``Succeeded`` at least minMember members Succeeded and none is still active
* ``Failed``    members failed so that minMember can no longer be reached
                (running + succeeded + pending < minMember), or the gang hit
                scheduleTimeoutSeconds (condition reason ScheduleTimeout)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from batchsched.core.model import PodInfo

PHASES = ("Pending", "Queued", "Scheduled", "Running", "Succeeded", "Failed")


@dataclass(frozen=True)
class Counters:
    bound: int = 0  # bound and not yet finished
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    pending: int = 0  # unbound, not finished, not being deleted


def count_members(members: Iterable[PodInfo]) -> Counters:
    bound = running = succeeded = failed = pending = 0
    for pod in members:
        if pod.phase == "Succeeded":
            succeeded += 1
        elif pod.phase == "Failed":
            failed += 1
        elif pod.terminating:
            continue
        elif pod.node_name:
            bound += 1
            running += pod.phase == "Running"
        else:
            pending += 1
    return Counters(bound, running, succeeded, failed, pending)


def phase_of(counters: Counters, min_member: int, timed_out: bool = False) -> str:
    c = counters
    if c.running >= min_member:
        return "Running"
    if c.bound >= min_member:
        return "Scheduled"
    active = c.bound + c.pending
    if c.succeeded >= min_member and active == 0:
        return "Succeeded"
    if timed_out or (c.failed and active + c.succeeded < min_member):
        return "Failed"
    if c.succeeded and c.succeeded + c.bound >= min_member:
        # the quorum already ran; the rest are finishing
        return "Running" if c.running else "Scheduled"
    if active < min_member:
        return "Pending"
    return "Queued"


def conditions_for(phase: str, verdict_reason: str, verdict_message: str,
                   scheduled_message: str = "") -> list[dict]:
    """The Scheduled and Unschedulable conditions (without timestamps).

    A condition's reason never names the opposite of its status: a gang
    whose quorum the last cycle placed, but whose bindings are not seen yet,
    is ``Scheduled=False`` reason ``Binding``; one not failing to fit is
    ``Unschedulable=False`` reason ``Schedulable`` (or what it waits for).
    Timestamps are added by the shell, which keeps lastTransitionTime stable
    while a condition's status does not change.
    """
    if phase in ("Scheduled", "Running", "Succeeded"):
        return [
            {"type": "Scheduled", "status": "True", "reason": "Scheduled",
             "message": scheduled_message or "minMember pods are bound"},
            {"type": "Unschedulable", "status": "False", "reason": "Schedulable", "message": ""},
        ]
    if verdict_reason == "Scheduled":  # placed by the last cycle; its bindings are on their way
        return [
            {"type": "Scheduled", "status": "False", "reason": "Binding", "message": verdict_message},
            {"type": "Unschedulable", "status": "False", "reason": "Schedulable", "message": ""},
        ]
    reason = verdict_reason or ("QuorumNotReached" if phase == "Pending" else "Waiting")
    return [
        {"type": "Scheduled", "status": "False", "reason": reason, "message": verdict_message},
        {"type": "Unschedulable", "status": "True" if verdict_reason else "False", "reason": reason,
         "message": verdict_message},
    ]
