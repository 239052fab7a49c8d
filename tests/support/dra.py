"""DRA objects as NVIDIA's driver (gpu.nvidia.com) publishes them, built
from a topology capture: the DeviceClass its chart ships, one ResourceSlice
per node (one pool per node, named after it), and claims allocated "by
someone else" (tests write status.allocation as kube-scheduler would).

``identified`` gives a capture's topology the GPU uuids and PCI bus ids the
slices publish, so the node's gpu-topology annotation and its slices agree.
Device names are ``gpu-<minor>``; the minors here run opposite to the
topology's (CUDA/NVML) indices, as the /dev minor and the NVML index need
not agree on a real node, so mapping by name or order would be wrong.
"""
from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Iterable

from batchsched.core.topology.model import GpuTopology

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
API_VERSION = "resource.k8s.io/v1"
# NVIDIA's chart (deployments/helm/.../deviceclass-gpu.yaml)
GPU_CLASS_SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}')}"


def bus(index: int) -> int:
    return 0x07 + 0x10 * index


def identified(topology: GpuTopology, node: str) -> GpuTopology:
    """The topology with each GPU's uuid and bus id (nvidia-smi's format)."""
    gpus = tuple(dataclasses.replace(g, uuid=gpu_uuid(node, g.index), pci_bus_id=f"00000000:{bus(g.index):02X}:00.0")
                 for g in topology.gpus)
    return dataclasses.replace(topology, gpus=gpus)


def minor(topology: GpuTopology, index: int) -> int:
    return len(topology) - 1 - index


def device_class(selectors: Iterable[str] = (GPU_CLASS_SELECTOR,), name: str = GPU_CLASS) -> dict:
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in selectors],
                     "extendedResourceName": "nvidia.com/gpu"}}


def gpu_device(topology: GpuTopology, node: str, index: int, *, with_uuid: bool = True, with_pci: bool = True,
               product: str = "Tesla V100-SXM2-16GB", memory: str = "16Gi") -> dict:
    gpu = topology.gpus[index]
    attributes: dict[str, Any] = {"type": {"string": "gpu"}, "productName": {"string": product},
                                  "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{bus(index) & 0xf0:02x}"}}
    if with_uuid:
        attributes["uuid"] = {"string": gpu_uuid(node, index)}
    if with_pci:
        attributes["resource.kubernetes.io/pciBusID"] = {"string": f"0000:{bus(index):02x}:00.0"}
    if gpu.numa is not None:
        attributes["resource.kubernetes.io/numaNode"] = {"int": gpu.numa}
    return {"name": f"gpu-{minor(topology, index)}", "attributes": attributes,
            "capacity": {"memory": {"value": memory}}}


def resource_slice(node: str, topology: GpuTopology, indices: Iterable[int] | None = None, **device: Any) -> dict:
    """The node's one slice: the GPUs ``indices`` (default all) of ``topology``."""
    chosen = range(len(topology)) if indices is None else indices
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [gpu_device(topology, node, i, **device) for i in chosen]}}


def claim(name: str, count: int) -> dict:
    return {"apiVersion": API_VERSION, "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": count}}]}}}


def allocation(node: str, devices: Iterable[str]) -> dict:
    """status.allocation for ``devices`` of the node's pool, as kube-scheduler writes it."""
    return {"devices": {"results": [{"request": "gpus", "driver": DRIVER, "pool": node, "device": d}
                                    for d in devices]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
