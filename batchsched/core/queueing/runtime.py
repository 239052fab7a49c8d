"""Runtime bounds: until when a bound pod is expected to run (docs/queueing.md,
"Backfill" and "Which nodes are reserved").

A pod's bound is the shorter of two enforced deadlines: its own
``activeDeadlineSeconds``, which the kubelet enforces (it kills the pod then,
and the pod takes up to the kill's grace to go), and its owner Job's, which
the Job controller enforces by deleting the Job's pods (known for the Jobs
and JobSets read as automatic gangs: ``GroupSpec.job_deadline_seconds``).
The Job's clock starts at its ``startTime``, before any of its pods
started, so counting it from the pod's own start can only end later than
the Job controller does: a safe bound.  Without either, the bound is its
PodGroup's ``expectedRuntimeSeconds``, a hint nobody enforces: a gang that
backfilled on a hint and overruns it is the reserved gang's first victim
(batchsched.core.cycle).
"""
from __future__ import annotations

from typing import Mapping

from batchsched.core.model import GroupSpec, PodInfo

# A pod killed at its activeDeadlineSeconds may take this long to go
# (Kubernetes' default terminationGracePeriodSeconds).
KILL_GRACE_SECONDS = 30.0


def runtime_bound(pod: PodInfo, groups: Mapping[str, GroupSpec]) -> float | None:
    """How long the pod runs at most once started, in seconds: its enforced
    deadline and the kill's grace, else its PodGroup's hint; None: unbounded."""
    group = groups.get(pod.gang_key)
    deadline = _enforced_deadline(pod, group)
    if deadline is not None:
        return deadline + KILL_GRACE_SECONDS
    return None if group is None else group.expected_runtime_seconds


def expected_end(pod: PodInfo, groups: Mapping[str, GroupSpec], now: float | None = None) -> float | None:
    """When the bound pod is expected to be gone; None: no bound, or not
    started (with ``now``, a pod bound but not started yet is taken to start
    now: the kubelet has yet to write its startTime)."""
    bound = runtime_bound(pod, groups)
    if bound is None:
        return None
    if pod.started:
        return pod.started + bound
    return now + bound if now is not None and pod.node_name else None


def overran_hint(pod: PodInfo, groups: Mapping[str, GroupSpec], now: float) -> bool:
    """Whether the pod runs past its PodGroup's hint (a deadline is the
    kubelet's or the Job controller's to enforce, not ours)."""
    if _enforced_deadline(pod, groups.get(pod.gang_key)) is not None:
        return False
    end = expected_end(pod, groups)
    return end is not None and now > end


def _enforced_deadline(pod: PodInfo, group: GroupSpec | None) -> int | None:
    """The shorter of the pod's and its owner Job's activeDeadlineSeconds."""
    deadlines = [d for d in (pod.active_deadline_seconds, group.job_deadline_seconds if group else None)
                 if d is not None]
    return min(deadlines, default=None)
