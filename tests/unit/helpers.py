"""Build core model objects from small Kubernetes-shaped dicts, so every
test also exercises the JSON conversion the shell relies on."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Iterable

from batchsched.api.constants import GPU_IDS_ANNOTATION, GPU_RESOURCE, POD_GROUP_LABEL
from batchsched.core.model import GroupSpec, NodeInfo, PodInfo
from batchsched.core.readers import group_from_json, node_from_json, pod_from_json
from batchsched.core.snapshot import Snapshot

EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)
T0 = EPOCH.timestamp()


def stamp(seconds: float) -> str:
    """An RFC 3339 timestamp ``seconds`` after EPOCH."""
    return (EPOCH + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def node(name: str, cpu="8", memory="32Gi", gpu: int = 0, pods=110, labels=None,
         taints: Iterable[tuple[str, str, str]] = (), unschedulable=False, ready=True) -> NodeInfo:
    allocatable = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    if gpu:
        allocatable[GPU_RESOURCE] = str(gpu)
    return node_from_json({
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"unschedulable": unschedulable,
                 "taints": [{"key": k, "value": v, "effect": e} for k, v, e in taints]},
        "status": {"allocatable": allocatable,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    })


def pod(name: str, ns="default", cpu=None, memory=None, gpu: int = 0, group: str | None = None,
        scheduler="batchsched", node_name: str | None = None, phase="Pending", priority=0,
        created: float = 0.0, node_selector=None, tolerations=(), affinity_terms=None,
        gated=False, deleting=False, gpu_ids: str | None = None, extra_limits=None,
        restart_policy: str | None = None, owner: str | None = None, deadline: int | None = None,
        started: float | None = None) -> PodInfo:
    requests, limits = {}, {}
    if cpu is not None:
        requests["cpu"] = str(cpu)
    if memory is not None:
        requests["memory"] = str(memory)
    if gpu:
        limits[GPU_RESOURCE] = str(gpu)
    limits.update(extra_limits or {})
    spec = {
        "schedulerName": scheduler,
        "priority": priority,
        "containers": [{"name": "main", "resources": {"requests": requests, "limits": limits}}],
        "nodeSelector": node_selector or {},
        "tolerations": list(tolerations),
    }
    if node_name:
        spec["nodeName"] = node_name
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    if gated:
        spec["schedulingGates"] = [{"name": "wait"}]
    if affinity_terms:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": affinity_terms}}}
    meta = {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}",
            "creationTimestamp": stamp(created), "labels": {POD_GROUP_LABEL: group} if group else {}}
    if deleting:
        meta["deletionTimestamp"] = stamp(created + 1)
    if gpu_ids is not None:
        meta["annotations"] = {GPU_IDS_ANNOTATION: gpu_ids}
    if owner:  # its controller's kind
        meta["ownerReferences"] = [{"kind": owner, "name": f"{name}-owner", "controller": True}]
    status = {"phase": phase}
    if started is not None:
        status["startTime"] = stamp(started)
    return pod_from_json({"metadata": meta, "spec": spec, "status": status})


def group(name: str, ns="default", min_member=1, created: float = 0.0, priority: int | None = None,
          timeout: int | None = None, min_resources=None, generation=1,
          expected_runtime: int | None = None) -> GroupSpec:
    spec = {"minMember": min_member}
    if timeout is not None:
        spec["scheduleTimeoutSeconds"] = timeout
    if expected_runtime is not None:
        spec["expectedRuntimeSeconds"] = expected_runtime
    if min_resources:
        spec["minResources"] = min_resources
    return group_from_json({
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": stamp(created),
                     "generation": generation},
        "spec": spec,
    }, priority=priority)


def gang_pods(group_name: str, count: int, ns="default", **kwargs) -> list[PodInfo]:
    return [pod(f"{group_name}-{i}", ns=ns, group=group_name, **kwargs) for i in range(count)]


def snapshot(nodes: Iterable[NodeInfo], pods: Iterable[PodInfo] = (), groups: Iterable[GroupSpec] = (),
             now: float = 0.0, invalid_groups=None) -> Snapshot:
    return Snapshot(
        nodes={n.name: n for n in nodes},
        pods={p.uid: p for p in pods},
        groups={g.key: g for g in groups},
        now=T0 + now,
        invalid_groups=invalid_groups or {},
    )
