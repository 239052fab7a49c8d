"""Builders for the objects tests create: simulated GPU nodes, pods, PodGroups."""
from __future__ import annotations

from typing import Any, Mapping

from batchsched.api import constants
from batchsched.api.podgroup import ObjectMeta, PodGroup, PodGroupSpec

SIMULATED_LABEL = "batchsched.io/simulated"  # kwok manages nodes with this label


def gpu_node(name: str, *, gpus: int = 8, cpu: str = "64", memory: str = "512Gi", pods: int = 110,
             labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None,
             taints: list[dict] | None = None, extra: Mapping[str, str] | None = None) -> dict:
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), **(extra or {})}
    if gpus:
        resources[constants.GPU_RESOURCE] = str(gpus)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {SIMULATED_LABEL: "true", "kubernetes.io/hostname": name,
                                              **(labels or {})},
                     "annotations": {"kwok.x-k8s.io/node": "fake", **(annotations or {})}},
        "spec": {"taints": taints or []},
        "status": {"capacity": dict(resources), "allocatable": dict(resources),
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "simulated"}]},
    }


def pod(name: str, namespace: str, *, group: str | None = None, cpu: str | None = None,
        memory: str | None = None, gpus: int = 0, scheduler: str = constants.DEFAULT_SCHEDULER_NAME,
        priority_class: str | None = None, node_selector: Mapping[str, str] | None = None,
        tolerations: list[dict] | None = None, labels: Mapping[str, str] | None = None,
        extra_limits: Mapping[str, str] | None = None) -> dict:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = dict(extra_limits or {})
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    if gpus:
        limits[constants.GPU_RESOURCE] = str(gpus)
    meta_labels = dict(labels or {})
    if group:
        meta_labels[constants.POD_GROUP_LABEL] = group
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "registry.example/train:1",
                        "resources": {"requests": requests, "limits": limits}}],
        "terminationGracePeriodSeconds": 0,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": meta_labels}, "spec": spec}


def pod_group(name: str, namespace: str, min_member: int, **spec: Any) -> dict:
    """A PodGroup built with the API's own types (spec fields by their JSON names)."""
    return PodGroup(metadata=ObjectMeta(name=name, namespace=namespace),
                    spec=PodGroupSpec.model_validate({"minMember": min_member, **spec})).to_json()


def priority_class(name: str, value: int, **extra: Any) -> dict:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value, **extra}


def configmap(name: str, **data: str) -> dict:
    """The smallest object a test can write (to see a write pass or not)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data or {"k": "v"}}
