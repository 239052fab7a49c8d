"""Indexed Jobs as automatic gangs (docs/integrations.md): no PodGroup; the
Job controller labels each pod ``batch.kubernetes.io/job-name`` and gives it
the annotation ``batch.kubernetes.io/job-completion-index``, but no pod says
how many run at once, so the gang's size is read from the Job itself.

minMember is how many pods the Job runs at once: ``parallelism``, never more
than the completions still to make.  A Job that has finished some indexes
runs fewer pods, and a replacement for a failed index must not wait for
pods that will never come back.

The Job's ``activeDeadlineSeconds`` is kept with the gang: the Job
controller ends its pods by then, a runtime bound for backfill and the
reservation (core/queueing/runtime.py)."""
from __future__ import annotations

from typing import Any, Mapping

from batchsched.core.gangsources import JOB, MAX_TOTAL_COUNT, SOURCES
from batchsched.core.gangsources.plugin import SourcePlugin, watches
from batchsched.core.model import GroupSpec
from batchsched.core.readers import parse_time

MAX_INT64 = 2**63 - 1


def group_from_json(obj: Mapping[str, Any]) -> GroupSpec | None:
    """The gang of an Indexed Job; None for any other Job (its pods are
    interchangeable: each may run alone)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if spec.get("completionMode") != "Indexed":
        return None
    parallelism = _count(spec.get("parallelism"), default=1)
    completions = _count(spec.get("completions"), default=parallelism)
    left = completions - _count((obj.get("status") or {}).get("succeeded"), default=0)
    return GroupSpec(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        min_member=min(MAX_TOTAL_COUNT, max(1, min(parallelism, left))),
        source=JOB,
        created=parse_time(meta.get("creationTimestamp")),
        job_deadline_seconds=deadline_seconds(spec.get("activeDeadlineSeconds"), "spec.activeDeadlineSeconds"),
    )


def deadline_seconds(value: Any, field: str) -> int | None:
    """A Job's ``activeDeadlineSeconds`` (an int64 > 0 the API validated);
    None when left out.  Raises ValueError naming ``field`` for anything else."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_INT64:
        raise ValueError(f"{field}: an integer from 1 to {MAX_INT64} expected")
    return value


def _count(value: Any, default: int) -> int:
    """A count the API server validated (an int32 >= 0); ``default`` when left out."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


# The Job sizes the gang; it has no status of ours to write.
PLUGIN = SourcePlugin(SOURCES[JOB], watches(SOURCES[JOB]), lambda obj, priority: group_from_json(obj))
