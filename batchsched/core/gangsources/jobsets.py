"""JobSets as automatic gangs (docs/integrations.md): no PodGroup; the JobSet
controller makes one Job per replica of each replicated Job and labels each
Job and its pods ``jobset.sigs.k8s.io/jobset-name`` and
``jobset.sigs.k8s.io/replicatedjob-name``, but no pod says how many run at
once, so the gang's size is read from the JobSet itself.

A replicated Job runs ``replicas`` x ``min(parallelism, completions)`` pods
at once (the Job API's defaults: parallelism 1, completions = parallelism).

* Started together (the default, ``startupPolicyOrder: AnyOrder``, no
  ``dependsOn``): the whole JobSet is one gang, minMember the sum.
* Started in turn (``InOrder``, or any ``dependsOn``): the controller
  creates a replicated Job's Jobs only once those before it are Ready (or
  Complete), so one gang of everything would wait forever for pods nobody
  makes.  The gang is then the stages whose pods are live: minMember is
  their sum, so with the earlier stages bound the new stage is placed
  whole, and a stage whose pods all ended no longer counts.

Where every replicated Job's template has an ``activeDeadlineSeconds``, the
longest of them is the gang's Job deadline (core/queueing/runtime.py): each
of its pods is ended by then by its own Job's controller.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any, Iterable, Mapping

from batchsched.core.gangsources import JOBSET, MAX_TOTAL_COUNT, SOURCES
from batchsched.core.gangsources.jobs import deadline_seconds
from batchsched.core.gangsources.plugin import SourcePlugin, watches
from batchsched.core.model import GroupSpec, PodInfo
from batchsched.core.readers import parse_time

REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
MAX_REPLICATED_JOBS = 64


def group_from_json(obj: Mapping[str, Any]) -> GroupSpec:
    """The gang of a JobSet.  Raises ValueError for a spec the JobSet API
    would not take (its CRD validates it; this guards a laxer one)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise ValueError("spec: a mapping expected")
    replicated = spec.get("replicatedJobs")
    if not isinstance(replicated, list) or not 1 <= len(replicated) <= MAX_REPLICATED_JOBS:
        raise ValueError(f"spec.replicatedJobs: 1 to {MAX_REPLICATED_JOBS} entries expected")
    stages = tuple(_stage(i, job) for i, job in enumerate(replicated))
    deadlines = [deadline_seconds(_template_spec(i, job).get("activeDeadlineSeconds"),
                                  f"spec.replicatedJobs[{i}].template.spec.activeDeadlineSeconds")
                 for i, job in enumerate(replicated)]
    startup = spec.get("startupPolicy") or {}
    in_turn = (isinstance(startup, dict) and startup.get("startupPolicyOrder") == "InOrder") or any(
        isinstance(job, dict) and job.get("dependsOn") for job in replicated)
    return GroupSpec(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        min_member=min(MAX_TOTAL_COUNT, max(1, sum(size for _, size, _ in stages))),
        source=JOBSET,
        created=parse_time(meta.get("creationTimestamp")),
        stages=stages,
        stages_in_turn=in_turn,
        job_deadline_seconds=None if None in deadlines else max(deadlines),
    )


def started(spec: GroupSpec, members: Iterable[PodInfo]) -> GroupSpec:
    """``spec`` of a JobSet with its minMember what its stages still run at
    once (at least 1): a stage's pods at once, never more than its
    completions left (members that Succeeded are done: a replacement for a
    failed one must not wait for them); of a JobSet started in turn, only
    the stages with a live member.  Any other spec as it is."""
    if not spec.stages:
        return spec
    live, succeeded = set(), Counter()
    for pod in members:
        stage = pod.labels.get(REPLICATED_JOB_LABEL)
        if pod.phase == "Succeeded":
            succeeded[stage] += 1
        elif not pod.terminal:
            live.add(stage)
    size = sum(min(at_once, max(0, completions - succeeded[name])) for name, at_once, completions in spec.stages
               if name in live or not spec.stages_in_turn)
    return replace(spec, min_member=min(MAX_TOTAL_COUNT, max(1, size)))


def _stage(index: int, job: Any) -> tuple[str, int, int]:
    if not isinstance(job, dict) or not isinstance(job.get("name"), str):
        raise ValueError(f"spec.replicatedJobs[{index}]: a name expected")
    template = _template_spec(index, job)
    parallelism = _count(template.get("parallelism"), 1, f"spec.replicatedJobs[{index}].template.spec.parallelism")
    completions = _count(template.get("completions"), parallelism,
                         f"spec.replicatedJobs[{index}].template.spec.completions")
    replicas = _count(job.get("replicas"), 1, f"spec.replicatedJobs[{index}].replicas")
    return (job["name"], min(MAX_TOTAL_COUNT, replicas * min(parallelism, completions)),
            min(MAX_TOTAL_COUNT, replicas * completions))


def _template_spec(index: int, job: dict) -> dict:
    """A replicated Job's Job spec ({} when left out)."""
    template = job.get("template")
    template = template.get("spec") if isinstance(template, dict) else None
    if template is not None and not isinstance(template, dict):
        raise ValueError(f"spec.replicatedJobs[{index}].template.spec: a mapping expected")
    return template or {}


def _count(value: Any, default: int, field: str) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOTAL_COUNT:
        raise ValueError(f"{field}: a count from 0 to {MAX_TOTAL_COUNT} expected")
    return value


# The JobSet sizes the gang; its status is the JobSet controller's.
PLUGIN = SourcePlugin(SOURCES[JOBSET], watches(SOURCES[JOBSET]), lambda obj, priority: group_from_json(obj))
