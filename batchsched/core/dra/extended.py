"""The extended-resource claim of a pod placed where DRA serves nvidia.com/gpu.

kube-scheduler (v1.37, DRAExtendedResource) gives a pod that asks
``nvidia.com/gpu`` on a node without the device plugin a ResourceClaim of
its own: one request per container asking it, named
``container-<i>-request-<j>`` (``i`` counts init containers first, then app
containers; ``j`` the container's DRA-served extended resources, only
nvidia.com/gpu here, so 0), each asking the serving DeviceClass for exactly
that container's count.  batchsched writes the same claim, allocated with
the devices of the GPU ids its topology chooser picked (the shell's claim
writer, ``shell/claims.py``, does the writing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core.dra.model import AllocatedDevice, DeviceClass
from batchsched.core.model import NodeInfo, PodInfo
from batchsched.core.topology.accounting import dra_gpus_by_id


class ExtendedClaimError(ValueError):
    """The pod cannot be served through the extended-resource path (the message says why)."""


@dataclass(frozen=True)
class ClaimRequest:
    name: str  # container-<i>-request-0
    container: str
    count: int


@dataclass(frozen=True)
class ExtendedClaim:
    node: str
    device_class: str
    requests: tuple[ClaimRequest, ...]
    devices: tuple[AllocatedDevice, ...]  # each result names its request
    class_config: tuple[str, ...] = ()  # the class's opaque configs, as JSON (DeviceClass.config)


def request_name(container_index: int) -> str:
    return f"container-{container_index}-request-0"


def reuses_init_gpus(pod: PodInfo) -> bool:
    """Whether the GPUs a non-sidecar init container of ``pod`` asks are
    reused by the containers after it (what its containers ask does not add
    up to what the pod holds): one request per container would ask more
    devices than the pod holds, so this version writes no claim for it."""
    return sum(count for _, _, count in pod.gpu_containers) != pod.requests.get(GPU_RESOURCE, 0)


def extended_claim(node: NodeInfo, pod: PodInfo, gpu_ids: tuple[int, ...],
                   classes: Mapping[str, DeviceClass]) -> ExtendedClaim:
    """The claim giving ``pod`` the devices of ``gpu_ids`` on ``node`` (where
    DRA serves nvidia.com/gpu), dealt to its containers in their order, with
    the serving class's config (``classes``: the DeviceClasses by name)."""
    asked = pod.requests.get(GPU_RESOURCE, 0)
    by_id = dra_gpus_by_id(node)
    gpus = [by_id[i] for i in gpu_ids if i in by_id]
    if len(gpus) != asked:
        raise ExtendedClaimError(f"pod {pod.key} got {len(gpus)} of its {asked} GPU(s) as DRA devices on "
                                 f"{node.name}")
    if reuses_init_gpus(pod):  # placement leaves such nodes out (placement.fit.static_reasons)
        raise ExtendedClaimError(f"pod {pod.key} asks {GPU_RESOURCE} in an init container; on {node.name} "
                                 "DRA serves it, and this version writes no claim for such a pod")
    serving = {g.extended_class for g in gpus}
    if len(serving) != 1:
        raise ExtendedClaimError(f"the GPUs picked for pod {pod.key} on {node.name} are served by several "
                                 f"DeviceClasses ({', '.join(sorted(serving))})")
    requests, devices, dealt = [], [], iter(gpus)
    for index, container, count in pod.gpu_containers:
        request = ClaimRequest(request_name(index), container, count)
        requests.append(request)
        devices.extend(AllocatedDevice(request.name, g.driver, g.pool, g.device)
                       for g in (next(dealt) for _ in range(count)))
    name = serving.pop()
    device_class = classes.get(name)
    return ExtendedClaim(node.name, name, tuple(requests), tuple(devices),
                         device_class.config if device_class is not None else ())
