"""Simulated jobs: a workload file (YAML or CSV, docs/simulator.md) to
``Job``s, and a job to the Pod and PodGroup objects a controller would
create, which the simulator turns into the core's model with the same
converters the shell uses."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping, get_args

from batchsched.api import constants
from batchsched.api.podgroup import MAX_INT32, PodGroupSpec, TopologyPolicySpec
from batchsched.core.queues.model import QueueInfo, queue_from_json
from batchsched.sim.files import InputError, Record, read_csv, read_yaml

# Simulated time t is this instant plus t seconds.
SIM_EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)

_JOB_FIELDS = {"name", "arrival", "duration", "pods", "minMember", "gpus", "cpu", "memory", "priority",
               "priorityClass", "namespace", "labels", "preemptible", "gpuLink", "numa", "nodeSelector",
               "controller", "queue", "runtimeHint"}
_GENERATOR_FIELDS = (_JOB_FIELDS - {"arrival"}) | {"count", "window"}
_QUEUE_FIELDS = {"name", "parent", "weight", "reclaimable", "resources", "gpuTypes"}
_GPU_LINKS = get_args(TopologyPolicySpec.model_fields["gpu_link"].annotation)
_NUMA = get_args(TopologyPolicySpec.model_fields["numa"].annotation)
_DEFAULT_TOPOLOGY = TopologyPolicySpec()
# What owns a job's pods: a Job runs them to completion (restartPolicy
# Never); a ReplicaSet (a Deployment's) keeps them running (Always).
CONTROLLERS = ("Job", "ReplicaSet")


@dataclass(frozen=True)
class Job:
    """A training job (a gang of ``pods`` pods) or an inference pod.

    It arrives at ``arrival`` (simulated seconds), starts once ``min_member``
    of its pods run, and finishes ``duration`` seconds after that; all its
    pods end then.  ``gpus``, ``cpu`` and ``memory`` are per pod.
    """

    name: str
    arrival: float
    duration: float
    pods: int = 1
    min_member: int = 1
    gpus: int = 0
    cpu: str = "1"
    memory: str = "4Gi"
    priority: int = 0
    priority_class: str = ""
    namespace: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    preemptible: bool = True
    gpu_link: str = "prefer-nvlink"
    numa: str = "none"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # label key -> allowed values: a required node affinity term (key In values)
    node_affinity: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Its pods' owner (CONTROLLERS); the simulator ends the job after
    # ``duration`` either way (for a ReplicaSet: scaled down).
    controller: str = "Job"
    queue: str = ""  # its PodGroup's spec.queue (docs/queues.md); "": the default queue
    # Its PodGroup's expectedRuntimeSeconds as a multiple of ``duration``
    # (a user's estimate of the run); 0: none
    runtime_hint: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def has_pod_group(self) -> bool:
        """Jobs of several pods, or with a topology policy, a queue or a
        runtime hint (PodGroup fields), get a PodGroup; a lone pod is a gang
        of one by itself."""
        return (self.pods > 1 or self.min_member > 1 or self.topology_policy != _DEFAULT_TOPOLOGY
                or bool(self.queue) or self.expected_runtime_seconds is not None)

    @property
    def expected_runtime_seconds(self) -> int | None:
        """Its PodGroup's hint (``runtime_hint`` x ``duration``); None: none."""
        return min(max(1, math.ceil(self.runtime_hint * self.duration)), MAX_INT32) if self.runtime_hint else None

    @property
    def topology_policy(self) -> TopologyPolicySpec:
        return TopologyPolicySpec(gpu_link=self.gpu_link, numa=self.numa)

    def pod_name(self, index: int, incarnation: int) -> str:
        """Pods recreated after a preemption get new names, as a controller's do."""
        return f"{self.name}-{index}" + (f"-r{incarnation}" if incarnation else "")


def stamp(t: float) -> str:
    return (SIM_EPOCH + timedelta(seconds=t)).isoformat().replace("+00:00", "Z")


def to_unix(t: float) -> float:
    return SIM_EPOCH.timestamp() + t


def pod_object(job: Job, index: int, incarnation: int, created: float, scheduler_name: str) -> dict[str, Any]:
    """The Pod a controller creates for member ``index`` of ``job``."""
    name = job.pod_name(index, incarnation)
    labels = dict(job.labels)
    if job.has_pod_group:
        labels[constants.POD_GROUP_LABEL] = job.name
    meta: dict[str, Any] = {"name": name, "namespace": job.namespace, "uid": f"{job.namespace}/{name}",
                            "creationTimestamp": stamp(created), "labels": labels,
                            "ownerReferences": [{"kind": job.controller, "name": job.name, "controller": True}]}
    if not job.preemptible:
        meta["annotations"] = {constants.PREEMPTIBLE_ANNOTATION: "false"}
    limits = {constants.GPU_RESOURCE: str(job.gpus)} if job.gpus else {}
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name, "priority": job.priority,
        "containers": [{"name": "main", "resources": {"requests": {"cpu": job.cpu, "memory": job.memory},
                                                      "limits": limits}}],
        "nodeSelector": dict(job.node_selector),
        "restartPolicy": "Never" if job.controller == "Job" else "Always",
    }
    if job.priority_class:
        spec["priorityClassName"] = job.priority_class
    if job.node_affinity:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": key, "operator": "In", "values": list(values)} for key, values in job.node_affinity]}]}}}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def pod_group_object(job: Job) -> dict[str, Any]:
    spec = PodGroupSpec(min_member=job.min_member, priority_class_name=job.priority_class or None,
                        topology_policy=job.topology_policy if job.topology_policy != _DEFAULT_TOPOLOGY else None,
                        queue=job.queue or None, expected_runtime_seconds=job.expected_runtime_seconds)
    meta: dict[str, Any] = {"name": job.name, "namespace": job.namespace, "generation": 1,
                            "creationTimestamp": stamp(job.arrival)}
    if not job.preemptible:
        meta["annotations"] = {constants.PREEMPTIBLE_ANNOTATION: "false"}
    return {"apiVersion": constants.API_VERSION, "kind": constants.PODGROUP_KIND, "metadata": meta,
            "spec": spec.to_json()}


# --------------------------------------------------------------------------
# workload files
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """A workload file's jobs, by arrival, and the Queues they name."""

    jobs: list[Job]
    queues: dict[str, QueueInfo]


def load_workload(path: Path, seed: int | None = None) -> list[Job]:
    """The jobs of a workload file, by arrival (``read_workload``)."""
    return read_workload(path, seed).jobs


def read_workload(path: Path, seed: int | None = None) -> Workload:
    """A workload file: YAML with ``jobs`` and/or ``generate`` (drawn with
    ``seed``, else the file's ``seed``) and optional ``queues``, or CSV with
    one job per row (docs/simulator.md).  A CSV file defines no Queue: the
    queues its ``queue`` column names are plain ones (weight 1, no quota)."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    queues: dict[str, QueueInfo] = {}
    if path.suffix.lower() == ".csv":
        jobs = [_job(r, r.seconds("arrival")) for r in read_csv(path, {"name", "arrival", "duration"}, _JOB_FIELDS)]
        queues = {j.queue: QueueInfo(j.queue) for j in jobs if j.queue}
    else:
        top = read_yaml(path)
        top.check_known({"seed", "jobs", "generate", "queues"})
        queues = _queues(top)
        rng = random.Random(seed if seed is not None else top.integer("seed", 1))
        jobs = [_job(r, r.seconds("arrival"), queues=queues) for r in top.records("jobs")]
        for generator in top.records("generate"):
            jobs += _generate(generator, rng, queues)
    if not jobs:
        raise InputError(f"{path}: line 1: no jobs")
    keys = [j.key for j in jobs]
    if len(set(keys)) < len(keys):
        duplicate = next(k for k in keys if keys.count(k) > 1)
        raise InputError(f"{path}: job {duplicate} is defined twice")
    return Workload(sorted(jobs, key=lambda j: (j.arrival, j.key)), queues)


def _queues(top: Record) -> dict[str, QueueInfo]:
    """The ``queues`` section: each entry a Queue's spec with its name,
    checked as the scheduler checks a Queue object."""
    queues: dict[str, QueueInfo] = {}
    records = top.records("queues")
    for record in records:
        record.check_known(_QUEUE_FIELDS)
        name = record.text("name")
        if name in queues:
            raise record.error("name", f"queue {name!r} is defined twice")
        spec = {k: v for k, v in record.items() if k != "name"}
        try:
            queues[name] = queue_from_json({"metadata": {"name": name}, "spec": spec})
        except ValueError as exc:
            # the Queue's spec.FIELD is this entry's FIELD
            problem = " ".join(str(exc).split()).replace("spec.", f"{record.where}.")
            raise InputError(f"{record.source}: line {record.line}: queue {name}: {problem}") from None
    for record in records:  # parents may come later in the file
        queue = queues[record.text("name")]
        if not queue.parent:
            continue
        if queue.parent not in queues:
            raise record.error("parent", f"no queue {queue.parent!r} in this file's queues")
        if queues[queue.parent].parent:
            raise record.error("parent", f"queue {queue.parent!r} has a parent itself: two levels at most")
    return queues


def _job(record: Record, arrival: float, name: str | None = None, pods: int | None = None,
         gpus: int | None = None, duration: float | None = None,
         queues: Mapping[str, QueueInfo] | None = None) -> Job:
    """A job from a record; a generator passes what it drew for the job.
    With ``queues`` (a YAML file's), the job's queue must be one of them."""
    if name is None:
        record.check_known(_JOB_FIELDS)
    queue = record.text("queue", "")
    if queue and queues is not None and queue not in queues:
        known = ", ".join(sorted(queues)) or "none: the file has no queues section"
        raise record.error("queue", f"no queue {queue!r} in this file's queues (known: {known})")
    pods = pods if pods is not None else record.integer("pods", 1, minimum=1)
    min_member = record.integer("minMember", pods, minimum=1)
    if min_member > pods:
        raise record.error("minMember", f"{min_member} is more than pods ({pods})")
    return Job(
        name=name or record.text("name"),
        arrival=arrival,
        duration=duration if duration is not None else record.seconds("duration"),
        pods=pods,
        min_member=min_member,
        gpus=gpus if gpus is not None else record.integer("gpus", 0),
        cpu=record.quantity("cpu", "cpu", "1"),
        memory=record.quantity("memory", "memory", "4Gi"),
        priority=record.integer("priority", 0, minimum=-(2**31)),
        priority_class=record.text("priorityClass", ""),
        namespace=record.text("namespace", "default"),
        labels=record.labels("labels"),
        preemptible=record.flag("preemptible", True),
        gpu_link=record.choice("gpuLink", _GPU_LINKS, "prefer-nvlink"),
        numa=record.choice("numa", _NUMA, "none"),
        node_selector=record.labels("nodeSelector"),
        controller=record.choice("controller", CONTROLLERS, "Job"),
        queue=queue,
        runtime_hint=_factor(record, "runtimeHint"),
    )


def _factor(record: Record, field: str) -> float:
    """A multiple above 0 (of the job's duration), or 0 when absent."""
    value = record.get(field)
    if value in (None, ""):
        return 0.0
    try:
        factor = float(str(value))
    except ValueError:
        factor = math.nan
    if not 0 < factor < math.inf:  # also refuses NaN
        raise record.error(field, f"must be a number above 0 (a multiple of duration), got {value!r}")
    return factor


def _generate(record: Record, rng: random.Random, queues: Mapping[str, QueueInfo]) -> list[Job]:
    """``count`` jobs named ``name-0``, ``name-1``, ... arriving uniformly at
    random in ``window``; list-valued fields are drawn per job."""
    record.check_known(_GENERATOR_FIELDS)
    prefix, count = record.text("name"), record.integer("count", minimum=1)
    start, end = _pair(record, "window")
    low, high = _pair(record, "duration")
    pods_choices, gpu_choices = _choices(record, "pods", 1, 1), _choices(record, "gpus", 0, 0)
    arrivals = sorted(rng.uniform(start, end) for _ in range(count))
    return [_job(record, round(arrival, 3), name=f"{prefix}-{i}", pods=rng.choice(pods_choices),
                 gpus=rng.choice(gpu_choices), duration=round(rng.uniform(low, high), 3), queues=queues)
            for i, arrival in enumerate(arrivals)]


def _pair(record: Record, field: str) -> tuple[float, float]:
    value = record.get(field)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value), float(value)
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value)
            or value[0] > value[1]):
        raise record.error(field, f"must be [low, high] seconds with 0 <= low <= high, or one number; got {value!r}")
    return float(value[0]), float(value[1])


def _choices(record: Record, field: str, default: int, minimum: int) -> list[int]:
    value = record.get(field, default)
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in values):
        raise record.error(field, f"must be a whole number >= {minimum} or a list of them, got {value!r}")
    return values


def describe_workload(jobs: list[Job]) -> str:
    pods = sum(j.pods for j in jobs)
    gangs = sum(1 for j in jobs if j.pods > 1)
    span = max(j.arrival for j in jobs) - min(j.arrival for j in jobs)
    return f"{len(jobs)} jobs ({gangs} multi-pod gangs), {pods} pods, arriving over {span / 3600:.1f} h"
