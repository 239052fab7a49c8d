"""What the reporter writes on its node, decided from what it read (pure).

The topology annotation is written only when it changes, and only when the
node advertises as many GPUs as the agent sees: a count that disagrees means
the driver, the device plugin (or DRA driver) and the hardware tell different
stories, and a topology the scheduler would then trust could place pods on
GPUs that do not exist.  The node condition says which.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from batchsched.api import constants
from batchsched.core.dra.inventory import NVIDIA_RULE
from batchsched.core.dra.model import ResourceSlice
from batchsched.core.resources import canonical
from batchsched.core.topology.annotation import to_annotation
from batchsched.core.topology.model import GpuTopology

GPU_READY_CONDITION = "BatchschedGPUReady"


@dataclass(frozen=True)
class Report:
    annotation: str | None  # the value to write; None: leave the node's annotation as it is
    ready: bool  # the condition's status
    reason: str
    message: str


def advertised_gpus(node: Mapping[str, Any], slices: Iterable[ResourceSlice]) -> tuple[int, str]:
    """How many GPUs the node advertises, and through what: the device
    plugin's nvidia.com/gpu capacity, else the node's DRA GPU devices."""
    capacity = ((node.get("status") or {}).get("capacity") or {}).get(constants.GPU_RESOURCE)
    if capacity is not None:
        try:
            return canonical(constants.GPU_RESOURCE, capacity), f"{constants.GPU_RESOURCE} capacity"
        except ValueError:
            return 0, f"{constants.GPU_RESOURCE} capacity {str(capacity)[:40]!r}, not a count"
    name = (node.get("metadata") or {}).get("name", "")
    devices = sum(1 for s in slices if s.node == name
                  for d in s.devices if NVIDIA_RULE.selects(s.driver, d.attributes))
    if devices:
        return devices, "DRA devices of gpu.nvidia.com"
    return 0, f"no {constants.GPU_RESOURCE} capacity and no DRA GPU devices: is the device plugin or DRA driver running?"


def decide(node: Mapping[str, Any], topology: GpuTopology | None, problem: str,
           slices: Iterable[ResourceSlice] = ()) -> Report:
    """``topology``: what the agent read, None with ``problem`` saying why not."""
    if topology is None:
        return Report(None, False, "TopologyUnreadable", f"the GPU topology could not be read: {problem}")
    advertised, source = advertised_gpus(node, slices)
    if advertised != len(topology):
        return Report(None, False, "GPUCountMismatch",
                      f"the driver shows {len(topology)} GPUs but the node advertises {advertised} ({source}); "
                      f"the {constants.GPU_TOPOLOGY_ANNOTATION} annotation is left as it is")
    value = to_annotation(topology)
    current = ((node.get("metadata") or {}).get("annotations") or {}).get(constants.GPU_TOPOLOGY_ANNOTATION)
    return Report(None if current == value else value, True, "TopologyReported",
                  f"{len(topology)} GPUs, as advertised ({source}); topology annotation up to date")


def current_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (node.get("status") or {}).get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == GPU_READY_CONDITION:
            return condition
    return None
