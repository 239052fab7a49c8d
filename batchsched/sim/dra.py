"""DRA objects as NVIDIA's DRA driver (``gpu.nvidia.com``) publishes them,
as the API server would send them: the DeviceClass its chart ships, and one
ResourceSlice per node (one pool per node, named after it) holding a device
``gpu-<minor>`` per full GPU.  The simulator gives them to the nodes of a
cluster file marked ``gpuSource: dra`` (docs/simulator.md); the tests give
them to kwok nodes (tests/support/dra.py).

A GPU's identity (``uuid``, ``resource.kubernetes.io/pciBusID``) is what
the scheduler maps devices onto the node's topology by (docs/dra.md), so a
node's annotation and its slice must agree: ``identified`` gives a topology
the uuids and bus ids it lacks, made up from the node's name.
"""
from __future__ import annotations

import dataclasses
import uuid
from typing import Iterable

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core.dra.inventory import NVIDIA_DRIVER, pci_key
from batchsched.core.dra.model import PCI_BUS_ID_ATTRIBUTE
from batchsched.core.topology.model import GpuTopology

DRIVER = NVIDIA_DRIVER
GPU_CLASS = "gpu.nvidia.com"
API_VERSION = "resource.k8s.io/v1"
# NVIDIA's chart (deployments/helm/.../deviceclass-gpu.yaml)
GPU_CLASS_SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"


def device_class(selectors: Iterable[str] = (GPU_CLASS_SELECTOR,), name: str = GPU_CLASS) -> dict:
    """NVIDIA's DeviceClass, serving ``nvidia.com/gpu`` (extendedResourceName)."""
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in selectors],
                     "extendedResourceName": GPU_RESOURCE}}


def gpu_device(minor: int, *, uuid: str = "", pci_bus_id: str = "", pcie_root: str = "", numa: int | None = None,
               product: str = "", memory: str = "") -> dict:
    """One full GPU; attributes left empty are not published."""
    attributes: dict[str, dict] = {"type": {"string": "gpu"}}
    if product:
        attributes["productName"] = {"string": product}
    if uuid:
        attributes["uuid"] = {"string": uuid}
    if pci_bus_id:
        attributes[PCI_BUS_ID_ATTRIBUTE] = {"string": pci_bus_id}
    if pcie_root:
        attributes[PCIE_ROOT_ATTRIBUTE] = {"string": pcie_root}
    if numa is not None:
        attributes[NUMA_NODE_ATTRIBUTE] = {"int": numa}
    device = {"name": f"gpu-{minor}", "attributes": attributes}
    if memory:
        device["capacity"] = {"memory": {"value": memory}}
    return device


def resource_slice(node: str, devices: list[dict]) -> dict:
    """The node's one slice: its pool (named after the node) holds ``devices``."""
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}


def gpu_uuid(node: str, index: int) -> str:
    """A made-up GPU uuid, the same for the same node and GPU."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{index}')}"


def bus(index: int) -> int:
    """A made-up PCI bus number for the GPU ``index``."""
    return 0x07 + 0x10 * index


def identified(topology: GpuTopology, node: str) -> GpuTopology:
    """The topology with a uuid and a bus id (nvidia-smi's format) for each
    GPU, made up where it records none."""
    gpus = tuple(dataclasses.replace(g, uuid=g.uuid or gpu_uuid(node, g.index),
                                     pci_bus_id=g.pci_bus_id or f"00000000:{bus(g.index):02X}:00.0")
                 for g in topology.gpus)
    return dataclasses.replace(topology, gpus=gpus)


def standard_pci_bus_id(pci_bus_id: str) -> str:
    """nvidia-smi's ``00000000:07:00.0`` as the standard attribute writes it, ``0000:07:00.0``."""
    parts = pci_key(pci_bus_id)
    if parts is None:
        return ""
    domain, bus_number, device, function = parts
    return f"{domain:04x}:{bus_number:02x}:{device:02x}.{function}"


def node_slice(node: str, gpus: int, topology: GpuTopology | None) -> dict:
    """The slice of a node with ``gpus`` GPUs: device ``gpu-<i>`` for GPU
    ``i`` (the minor taken to be the index), with the uuid, bus id and NUMA
    node ``topology`` (identified) records, made up where there is none."""
    if topology is None:
        devices = [gpu_device(i, uuid=gpu_uuid(node, i), pci_bus_id=f"0000:{bus(i):02x}:00.0") for i in range(gpus)]
    else:
        devices = [gpu_device(g.index, uuid=g.uuid, pci_bus_id=standard_pci_bus_id(g.pci_bus_id), numa=g.numa)
                   for g in identified(topology, node).gpus]
    return resource_slice(node, devices)
