"""Volcano's PodGroup (``scheduling.volcano.sh/v1beta1``): its spec read into
a GroupSpec, and its status in its own vocabulary.

``queue`` names the batchsched Queue the gang is admitted through
(docs/queues.md; Volcano's ``default`` queue is batchsched's default one too).
``minTaskMember`` counts members by their task (annotation
``volcano.sh/task-spec``): the gang is ready only when each task has that
many live members, and a plan binds only if, with the members already bound,
it holds that many of each; minMember is at least their sum (the tasks are
disjoint sets of pods).  ``networkTopology`` and ``subGroupPolicy`` are not
read.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Mapping

from pydantic import Field

from batchsched.api.podgroup import MAX_MIN_RESOURCES, ApiModel, Quantity, ResourceName, validate_spec
from batchsched.core.gangsources import SOURCES, VOLCANO
from batchsched.core.gangsources.foreign import MAX_MIN_MEMBER, group_spec
from batchsched.core.gangsources.plugin import SourcePlugin, watches, writes_status
from batchsched.core.model import GroupSpec
from batchsched.core.status import Counters

# A Queue's name: a DNS-1123 subdomain, as object names are.
QueueName = Annotated[str, Field(min_length=1, max_length=253,
                                 pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")]
MAX_TASKS = 64
Count = Annotated[int, Field(ge=0, le=MAX_MIN_MEMBER, strict=True)]


class Spec(ApiModel):
    min_member: Count = Field(0, alias="minMember")
    min_task_member: dict[Annotated[str, Field(max_length=253)], Count] | None = Field(
        None, alias="minTaskMember", max_length=MAX_TASKS)
    min_resources: dict[ResourceName, Quantity] | None = Field(None, alias="minResources",
                                                                 max_length=MAX_MIN_RESOURCES)
    priority_class_name: Annotated[str, Field(max_length=253)] | None = Field(None, alias="priorityClassName")
    queue: QueueName | None = None


def group_from_json(obj: Mapping[str, Any], priority: int | None = None) -> GroupSpec:
    """``priority``: the value of its priorityClassName's PriorityClass.
    Raises ValueError naming each field that makes no sense."""
    spec = validate_spec(Spec, obj.get("spec"))
    read = group_spec(obj, VOLCANO, spec.min_member, spec.min_resources, priority, spec.priority_class_name or "")
    tasks = tuple(sorted((task, count) for task, count in (spec.min_task_member or {}).items() if count))
    if tasks:
        read = replace(read, min_task_members=tasks,
                       min_member=max(read.min_member, min(MAX_MIN_MEMBER, sum(c for _, c in tasks))))
    return replace(read, queue=spec.queue) if spec.queue else read


# Volcano's reasons for an Unschedulable condition, where ours has a match.
REASONS = {"QuorumNotReached": "NotEnoughTasks", "Unschedulable": "NotEnoughResources",
           "ExceedsClusterCapacity": "NotEnoughResources"}


def status(phase: str, counters: Counters, reason: str, message: str) -> dict:
    """``status`` as Volcano's PodGroup has it.  batchsched admits every
    PodGroup it can read, so one waiting for its quorum or for room is
    Inqueue (Volcano's controllers create pods only past Pending); Running
    once minMember members are bound, as Volcano counts it; Completed once
    they succeeded; Unknown for a gang that failed or is partly bound.
    ``running`` counts the bound members, as Volcano counts allocated tasks.
    (Conditions get their lastTransitionTime from the status writer.)"""
    if reason == "InvalidPodGroup":
        theirs = "Pending"
    elif phase in ("Scheduled", "Running"):
        theirs = "Running"
    elif phase == "Succeeded":
        theirs = "Completed"
    elif phase == "Failed" or counters.bound:
        theirs = "Unknown"
    else:
        theirs = "Inqueue"
    if theirs in ("Running", "Completed"):
        condition = {"type": "Scheduled", "status": "True", "reason": "Scheduled",
                     "message": message or "minMember pods are bound"}
    else:
        condition = {"type": "Unschedulable", "status": "True", "reason": REASONS.get(reason, reason or "Waiting"),
                     "message": message}
    return {"phase": theirs, "running": counters.bound, "succeeded": counters.succeeded, "failed": counters.failed,
            "conditions": [condition]}


# Its CRD has no status subresource: the status is patched on the object.
PLUGIN = SourcePlugin(SOURCES[VOLCANO], watches(SOURCES[VOLCANO]) + writes_status(SOURCES[VOLCANO]), group_from_json,
                      lambda f: status(f.phase, f.counters, f.reason, f.message))
