"""Kubernetes JSON -> the core's model (``core/model.py``).

The shell turns objects as the API server sends them into the frozen value
objects with the ``*_from_json`` functions; the core never sees a client
object.  Converting is pure, so it lives in the core and is unit-tested like
the rest of it.  Tenants write these objects: a field that makes no sense is
read as absent or bounded, or raises ValueError naming it (PodGroups).
"""
from __future__ import annotations

import functools
import re
from datetime import datetime, timezone
from typing import Any, Mapping

from batchsched.api import constants
from batchsched.api.podgroup import MAX_RECORDED_BINDINGS, PodGroupSpec, parse_spec
from batchsched.core import gangsources
from batchsched.core import resources as res
from batchsched.core.dra.demand import PodClaim
from batchsched.core.model import (
    GroupSpec, NodeInfo, NodeSelectorTerm, PodInfo, SelectorRequirement, Taint, Toleration, TopologyPolicy,
    new_pod, node_topology,
)
from batchsched.core.resources import Resources
from batchsched.core.text import clip


def parse_time(text: str | None) -> float:
    if not text:
        return 0.0
    if isinstance(text, str):
        return _parse_time_text(text)
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()


@functools.lru_cache(maxsize=4096)  # pods made together share their seconds: a list repeats a few
def _parse_time_text(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()


def _requirements(raw: list[dict] | None) -> tuple[SelectorRequirement, ...]:
    return tuple(
        SelectorRequirement(r.get("key", ""), r.get("operator", ""), tuple(r.get("values") or ()))
        for r in raw or ()
    )


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """What the pod occupies on a node, as kube-scheduler computes it.

    max(sum of app containers, each init container) + overhead, plus one
    ``pods`` slot.  Extended resources (anything but cpu/memory/storage) are
    taken from limits when larger, as the device plugin allocates by limits.
    """
    def container_request(c: Mapping[str, Any]) -> Resources:
        r = c.get("resources") or {}
        req = res.parse_resource_map(r.get("requests"))
        limits = r.get("limits")
        for name, amount in res.parse_resource_map(limits).items() if limits else ():
            if name not in req or (name not in (res.CPU, res.MEMORY, "ephemeral-storage")
                                   and amount > req[name]):
                # API defaulting: a limit with no request means request == limit
                req[name] = max(amount, req.get(name, 0))
        return req

    total: Resources = {}
    for c in spec.get("containers") or ():
        total = res.add(total, container_request(c)) if total else container_request(c)
    sidecars: Resources = {}
    for c in spec.get("initContainers") or ():
        r = container_request(c)
        if c.get("restartPolicy") == "Always":  # sidecar: runs beside the app
            sidecars = res.add(sidecars, r)
            continue
        for name, amount in res.add(r, sidecars).items():
            total[name] = max(total.get(name, 0), amount)
    if sidecars:
        total = res.add(total, sidecars)
    overhead = spec.get("overhead")
    if overhead:
        total = res.add(total, res.parse_resource_map(overhead))
    total[res.PODS] = 1
    return {k: v for k, v in total.items() if v}


# Pods of a cluster repeat a few tolerations (the API server's defaults on
# every pod): one shared instance each, made once.
_toleration = functools.lru_cache(maxsize=1024)(Toleration)


def pod_from_json(obj: Mapping[str, Any], gang_sources: frozenset[str] = frozenset({gangsources.OWN}),
                  auto_always: frozenset[str] = frozenset()) -> PodInfo:
    """``gang_sources``: the enabled gang sources, read in their precedence;
    ``auto_always``: the automatic ones that need no opt-in on the pod."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    affinity = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = tuple(
        NodeSelectorTerm(_requirements(t.get("matchExpressions")), _requirements(t.get("matchFields")))
        for t in affinity.get("nodeSelectorTerms") or ()
    )
    scheduling_group = spec.get("schedulingGroup")
    group_source, group = gangsources.pod_group(
        labels, annotations, gang_sources, auto_always,
        scheduling_group.get("podGroupName", "") if isinstance(scheduling_group, dict) else "")
    tolerations = tuple(
        _toleration(t.get("key") or "", t.get("operator") or "Equal", t.get("value") or "", t.get("effect") or "")
        for t in spec.get("tolerations") or ()
    )
    return new_pod(dict(
        uid=meta.get("uid", ""),
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        node_name=spec.get("nodeName") or "",
        phase=status.get("phase") or "Pending",
        terminating=bool(meta.get("deletionTimestamp")),
        deleted=parse_time(meta.get("deletionTimestamp")),
        requests=pod_requests(spec),
        priority=int(spec.get("priority") or 0),
        group=group,
        group_source="" if group_source == gangsources.OWN else group_source,
        group_total=gangsources.stated_count(group_source, annotations) if group else 0,
        task=gangsources.stated_task(group_source, annotations) if group else "",
        node_selector=dict(spec.get("nodeSelector") or {}),
        affinity_terms=terms,
        tolerations=tolerations,
        gated=bool(spec.get("schedulingGates")),
        created=parse_time(meta.get("creationTimestamp")),
        resource_version=meta.get("resourceVersion", ""),
        gpu_ids=parse_gpu_ids(annotations.get(constants.GPU_IDS_ANNOTATION)),
        gpu_ids_actual=parse_gpu_ids(annotations.get(constants.GPU_IDS_ACTUAL_ANNOTATION)),
        nominated_node=status.get("nominatedNodeName") or "",
        labels=dict(labels),
        priority_class=spec.get("priorityClassName") or "",
        started=parse_time(status.get("startTime")),
        preemptible=annotations.get(constants.PREEMPTIBLE_ANNOTATION, "true").lower() != "false",
        **_checkpoint(annotations.get(constants.CHECKPOINT_TIME_ANNOTATION)),
        preemption_policy=spec.get("preemptionPolicy") or "PreemptLowerPriority",
        owner_kind=_controller_kind(meta.get("ownerReferences")),
        restart_policy=spec.get("restartPolicy") or "Always",
        active_deadline_seconds=_positive_int(spec.get("activeDeadlineSeconds")),
        scheduled_condition=_scheduled_condition(status.get("conditions")),
        gpu_containers=_gpu_containers(spec),
        claims=_pod_claims(spec, status),
    ))


MAX_POD_CLAIMS = 32


def _pod_claims(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[PodClaim, ...]:
    """spec.resourceClaims, each with the claim it names (a template's from
    status.resourceClaimStatuses, written by the resourceclaim controller)."""
    entries = [c for c in _list_of(spec.get("resourceClaims"))[:MAX_POD_CLAIMS] if isinstance(c, dict)]
    if not entries:
        return ()
    made = {str(s.get("name")): s.get("resourceClaimName")
            for s in _list_of(status.get("resourceClaimStatuses")) if isinstance(s, dict)}
    claims = []
    for entry in entries:
        name, template = str(entry.get("name") or ""), str(entry.get("resourceClaimTemplateName") or "")
        if template and name in made and not made[name]:
            continue  # the controller found no claim needed
        claim = str(entry.get("resourceClaimName") or "") if not template else str(made.get(name) or "")
        claims.append(PodClaim(name, claim, template))
    return tuple(claims)


def _list_of(value: Any) -> list:
    return value if isinstance(value, list) else []


def _gpu_containers(spec: Mapping[str, Any]) -> tuple[tuple[int, str, int], ...]:
    """(index, name, nvidia.com/gpu) of each container asking GPUs, counting
    init containers first, then app containers (limits, as the device
    plugin and the extended-resource claim read them)."""
    containers = [c for key in ("initContainers", "containers") for c in spec.get(key) or () if isinstance(c, dict)]
    asking = []
    for index, c in enumerate(containers):
        r = c.get("resources") or {}
        requests, limits = r.get("requests") or {}, r.get("limits") or {}
        if constants.GPU_RESOURCE not in requests and constants.GPU_RESOURCE not in limits:
            continue  # most containers: no quantity to parse
        count = max(res.canonical(constants.GPU_RESOURCE, amount) for amount in (
            requests.get(constants.GPU_RESOURCE, 0), limits.get(constants.GPU_RESOURCE, 0)))
        if count:
            asking.append((index, str(c.get("name") or ""), count))
    return tuple(asking)


def _scheduled_condition(conditions: Any) -> tuple[str, str, str]:
    """The PodScheduled condition's (status, reason, message); () when absent
    or malformed (status is writable by tenants: nothing here may raise)."""
    if not isinstance(conditions, list):
        return ()
    for c in conditions:
        if isinstance(c, dict) and c.get("type") == "PodScheduled":
            fields = (c.get("status"), c.get("reason") or "", c.get("message") or "")
            return fields if all(isinstance(f, str) for f in fields) else ()
    return ()


# Tenants write pod annotations: the gpu-ids one is bounded before it is read.
MAX_GPU_IDS_LENGTH = 1024
MAX_GPU_ID = 4095


def _controller_kind(owners: Any) -> str:
    if not isinstance(owners, list):
        return ""
    return next((str(o.get("kind") or "") for o in owners if isinstance(o, dict) and o.get("controller")), "")


def _positive_int(value: Any) -> int | None:
    """A positive integer field; None when absent or not one (bad input
    never fails the conversion)."""
    if value is None or isinstance(value, bool):  # absent on most pods: no exception to raise
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


_RFC3339 = re.compile(r"\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d{1,9})?([Zz]|[+-]\d\d:\d\d)")


def _checkpoint(text: Any) -> dict[str, Any]:
    """PodInfo's checkpoint fields from the checkpoint-time annotation
    (tenant-written): an RFC3339 time, else ignored and said why."""
    if text is None:
        return {}
    if isinstance(text, str) and _RFC3339.fullmatch(text):
        try:
            return {"checkpoint": datetime.fromisoformat(text.upper().replace("Z", "+00:00")).timestamp()}
        except (ValueError, OverflowError):
            pass  # month 13, day 32, ...
    return {"checkpoint_problem": f"{clip(str(text), 40)!r} is not an RFC3339 time"}


def parse_gpu_ids(text: str | None) -> tuple[int, ...]:
    """The gpu-ids annotation ("0,1,2,3"); () when absent or malformed (the
    pod's GPUs then count with unknown identity, docs/topology.md)."""
    if not text or len(text) > MAX_GPU_IDS_LENGTH:
        return ()
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isascii() and p.isdigit() and int(p) <= MAX_GPU_ID for p in parts):
        return ()
    return tuple(sorted(int(p) for p in parts))


def node_from_json(obj: Mapping[str, Any]) -> NodeInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )
    allocatable = {}
    for name, q in (status.get("allocatable") or {}).items():
        try:
            allocatable[name] = res.canonical(name, q)
        except res.QuantityError:
            continue  # a malformed quantity makes that resource unavailable
    labels = meta.get("labels") or {}
    try:  # the device plugin's GPUs, unhealthy ones too (allocatable leaves those out)
        gpu_capacity = res.canonical(constants.GPU_RESOURCE,
                                     (status.get("capacity") or {}).get(constants.GPU_RESOURCE, 0))
    except res.QuantityError:
        gpu_capacity = 0
    topology, topology_error = node_topology(
        meta.get("name", ""), (meta.get("annotations") or {}).get(constants.GPU_TOPOLOGY_ANNOTATION),
        allocatable, gpu_capacity, labels)
    return NodeInfo(
        name=meta.get("name", ""),
        allocatable=allocatable,
        labels=dict(labels),
        annotations=dict(meta.get("annotations") or {}),
        taints=tuple(
            Taint(t.get("key", ""), t.get("value") or "", t.get("effect", ""))
            for t in spec.get("taints") or ()
        ),
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        topology=topology,
        topology_error=topology_error,
        gpu_capacity=gpu_capacity,
        gpu_agent=next(((str(c.get("status", "")), str(c.get("reason", "")), str(c.get("message", "")))
                        for c in status.get("conditions") or ()
                        if isinstance(c, dict) and c.get("type") == constants.GPU_READY_CONDITION), ()),
    )


def _topology_policy(spec: PodGroupSpec) -> TopologyPolicy:
    raw = spec.topology_policy
    if raw is None:
        return TopologyPolicy()
    domain = raw.domain
    return TopologyPolicy(raw.numa, raw.gpu_link, raw.exclusive_gpus, domain.mode if domain else "",
                          (domain.label_key,) if domain and domain.label_key else ())


def group_from_json(obj: Mapping[str, Any], priority: int | None = None) -> GroupSpec:
    """Convert a PodGroup; raises ValueError naming each field that makes no sense."""
    meta = obj.get("metadata") or {}
    spec = parse_spec(obj.get("spec"))
    try:
        min_resources = res.parse_resource_map(spec.min_resources)
    except res.QuantityError as exc:
        raise ValueError(f"spec.minResources: {exc}") from exc
    return GroupSpec(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        min_member=spec.min_member,
        priority=priority,
        created=parse_time(meta.get("creationTimestamp")),
        schedule_timeout_seconds=spec.schedule_timeout_seconds,
        min_resources=min_resources,
        generation=int(meta.get("generation") or 0),
        topology=_topology_policy(spec),
        priority_class=spec.priority_class_name or "",
        preemption_policy=spec.preemption_policy or "PreemptLowerPriority",
        preemptible=((meta.get("annotations") or {}).get(constants.PREEMPTIBLE_ANNOTATION, "true").lower()
                     != "false"),
        queue=spec.queue or "",
        expected_runtime_seconds=spec.expected_runtime_seconds,
        recorded_bindings=recorded_bindings(obj),
    )


def recorded_bindings(obj: Mapping[str, Any]) -> frozenset[str]:
    """The member UIDs a PodGroup's status.boundByScheduler names (what
    batchsched wrote there); anything else there names none."""
    status = obj.get("status")
    uids = status.get("boundByScheduler") if isinstance(status, dict) else None
    if not isinstance(uids, list):
        return frozenset()
    return frozenset(u for u in uids[:MAX_RECORDED_BINDINGS] if isinstance(u, str))
