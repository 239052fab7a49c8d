"""The native gang API of Kubernetes v1.37 (``scheduling.k8s.io/v1beta1``,
gate ``GenericWorkload``; KEP-4671): a PodGroup with
``spec.schedulingPolicy.gang.minCount`` (``basic`` asks no gang), pods
joining through ``spec.schedulingGroup.podGroupName``.  ``minCount`` may
change while the gang exists (workload scaling): the reflector sees the new
spec and the gang is judged on it at the next cycle.  Its status has
conditions only; the one a scheduler writes is ``PodGroupInitiallyScheduled``
(True once the gang was first placed, and terminal; False with reason
``Unschedulable`` while it waits)."""
from __future__ import annotations

from typing import Annotated, Any, Mapping

from pydantic import Field

from batchsched.api.podgroup import ApiModel, validate_spec
from batchsched.core.gangsources import NATIVE, SOURCES
from batchsched.core.gangsources.foreign import MAX_MIN_MEMBER, group_spec
from batchsched.core.gangsources.plugin import SourcePlugin, watches, writes_status
from batchsched.core.model import GroupSpec

INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"
# Our phases in which the gang's quorum has been placed.
PLACED_PHASES = frozenset({"Scheduled", "Running", "Succeeded", "Failed"})


class Gang(ApiModel):
    min_count: Annotated[int, Field(ge=1, le=MAX_MIN_MEMBER, strict=True)] = Field(alias="minCount")


class SchedulingPolicy(ApiModel):
    gang: Gang | None = None
    basic: dict | None = None


class Spec(ApiModel):
    scheduling_policy: SchedulingPolicy | None = Field(None, alias="schedulingPolicy")
    priority_class_name: str | None = Field(None, alias="priorityClassName", max_length=253)


def group_from_json(obj: Mapping[str, Any], priority: int | None = None) -> GroupSpec:
    """Raises ValueError naming each field that makes no sense."""
    spec = validate_spec(Spec, obj.get("spec"))
    policy = spec.scheduling_policy
    if policy is not None and policy.gang is not None and policy.basic is not None:
        raise ValueError("spec.schedulingPolicy: gang and basic both set (the API allows one)")
    min_count = policy.gang.min_count if policy is not None and policy.gang is not None else 0
    return group_spec(obj, NATIVE, min_count, None, priority, spec.priority_class_name or "")


def status(phase: str, reason: str, message: str, written: Mapping[str, Any] | None, now: str) -> dict:
    """``status.conditions`` with PodGroupInitiallyScheduled; once True it
    stays (the API defines it terminal), so the written one is kept."""
    for condition in (written or {}).get("conditions") or ():
        if condition.get("type") == INITIALLY_SCHEDULED and condition.get("status") == "True":
            return {"conditions": [condition]}
    if phase in PLACED_PHASES:
        condition = {"type": INITIALLY_SCHEDULED, "status": "True", "reason": "Scheduled",
                     "message": message[:32768], "lastTransitionTime": now}
    else:
        condition = {"type": INITIALLY_SCHEDULED, "status": "False", "reason": "Unschedulable",
                     "message": (f"{reason}: {message}" if reason else message)[:32768], "lastTransitionTime": now}
        previous = next((c for c in (written or {}).get("conditions") or ()
                         if c.get("type") == INITIALLY_SCHEDULED and c.get("status") == "False"), None)
        if previous is not None and previous.get("lastTransitionTime"):
            condition["lastTransitionTime"] = previous["lastTransitionTime"]  # still False: not a transition
    return {"conditions": [condition]}


PLUGIN = SourcePlugin(SOURCES[NATIVE], watches(SOURCES[NATIVE]) + writes_status(SOURCES[NATIVE]), group_from_json,
                      lambda f: status(f.phase, f.reason, f.message, f.written, f.now))
