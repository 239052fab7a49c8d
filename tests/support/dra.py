"""DRA objects as NVIDIA's driver (gpu.nvidia.com) publishes them, built
from a topology capture with the builders the simulator uses
(batchsched/sim/dra.py): the DeviceClass its chart ships, one ResourceSlice
per node (one pool per node, named after it), and claims allocated "by
someone else" (tests write status.allocation as kube-scheduler would).

``identified`` gives a capture's topology the GPU uuids and PCI bus ids the
slices publish, so the node's gpu-topology annotation and its slices agree.
Device names are ``gpu-<minor>``; the minors here run opposite to the
topology's (CUDA/NVML) indices, as the /dev minor and the NVML index need
not agree on a real node, so mapping by name or order would be wrong.
"""
from __future__ import annotations

from typing import Any, Iterable

from batchsched.core.topology.model import GpuTopology
from batchsched.sim import dra as nvidia
from batchsched.sim.dra import (  # noqa: F401 - the tests' names for them
    API_VERSION, DRIVER, GPU_CLASS, GPU_CLASS_SELECTOR, bus, device_class, gpu_uuid, identified,
)


def minor(topology: GpuTopology, index: int) -> int:
    return len(topology) - 1 - index


def gpu_device(topology: GpuTopology, node: str, index: int, *, with_uuid: bool = True, with_pci: bool = True,
               product: str = "Tesla V100-SXM2-16GB", memory: str = "16Gi") -> dict:
    return nvidia.gpu_device(minor(topology, index), uuid=gpu_uuid(node, index) if with_uuid else "",
                             pci_bus_id=f"0000:{bus(index):02x}:00.0" if with_pci else "",
                             pcie_root=f"pci0000:{bus(index) & 0xf0:02x}", numa=topology.gpus[index].numa,
                             product=product, memory=memory)


def resource_slice(node: str, topology: GpuTopology, indices: Iterable[int] | None = None, **device: Any) -> dict:
    """The node's one slice: the GPUs ``indices`` (default all) of ``topology``."""
    chosen = range(len(topology)) if indices is None else indices
    return nvidia.resource_slice(node, [gpu_device(topology, node, i, **device) for i in chosen])


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
