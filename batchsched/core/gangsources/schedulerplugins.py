"""scheduler-plugins' PodGroup (``scheduling.x-k8s.io/v1alpha1``): its spec
read into a GroupSpec, and its status in its own vocabulary.

``scheduleTimeoutSeconds`` is validated but has nothing to bound here: in
scheduler-plugins it is how long members already placed wait at Permit for
the rest; batchsched binds the quorum at once, never holding members that
wait (a gang left partly bound is ``binding.partialGangTimeoutSeconds``'s).
Failing the gang after it, as our own PodGroup's field does, would fail a
Trainer job (60 s by default) that scheduler-plugins only retries.
"""
from __future__ import annotations

from typing import Annotated, Any, Mapping

from pydantic import Field

from batchsched.api.podgroup import MAX_INT32, MAX_MIN_RESOURCES, ApiModel, Quantity, ResourceName, validate_spec
from batchsched.core.gangsources import SCHEDULER_PLUGINS, SOURCES
from batchsched.core.gangsources.foreign import MAX_MIN_MEMBER, group_spec
from batchsched.core.gangsources.plugin import SourcePlugin, watches, writes_status
from batchsched.core.model import GroupSpec
from batchsched.core.status import Counters


class Spec(ApiModel):
    min_member: Annotated[int, Field(ge=0, le=MAX_MIN_MEMBER, strict=True)] = Field(0, alias="minMember")
    min_resources: dict[ResourceName, Quantity] | None = Field(None, alias="minResources",
                                                                 max_length=MAX_MIN_RESOURCES)
    schedule_timeout_seconds: Annotated[int, Field(ge=0, le=MAX_INT32, strict=True)] | None = Field(
        None, alias="scheduleTimeoutSeconds")


def group_from_json(obj: Mapping[str, Any]) -> GroupSpec:
    """Raises ValueError naming each field that makes no sense."""
    spec = validate_spec(Spec, obj.get("spec"))
    return group_spec(obj, SCHEDULER_PLUGINS, spec.min_member, spec.min_resources)


# Our phase (core/status.py) -> theirs: Pending is "cannot allocate enough
# resources" there, Scheduling "minMember scheduled, fewer running".
PHASES = {"Pending": "Pending", "Queued": "Pending", "Scheduled": "Scheduling", "Running": "Running",
          "Succeeded": "Finished", "Failed": "Failed"}


def status(phase: str, counters: Counters, min_member: int, schedule_start_time: str | None) -> dict:
    """``status`` as scheduler-plugins' PodGroup has it (no conditions there:
    why a gang waits goes to Events and its pods' PodScheduled condition).
    A gang with some but fewer than minMember members bound is Unknown, their
    word for "part scheduled, the rest cannot be"."""
    theirs = PHASES[phase]
    if theirs == "Pending" and 0 < counters.bound < min_member:
        theirs = "Unknown"
    out: dict = {"phase": theirs, "running": counters.running, "succeeded": counters.succeeded,
                 "failed": counters.failed}
    if schedule_start_time:
        out["scheduleStartTime"] = schedule_start_time
    return out


# Its PodGroup names no PriorityClass: the members' priority holds.
PLUGIN = SourcePlugin(SOURCES[SCHEDULER_PLUGINS], watches(SOURCES[SCHEDULER_PLUGINS])
                      + writes_status(SOURCES[SCHEDULER_PLUGINS]), lambda obj, priority: group_from_json(obj),
                      lambda f: status(f.phase, f.counters, f.min_member, f.start_time), names_priority_class=False)
