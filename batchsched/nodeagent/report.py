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

GPU_READY_CONDITION = constants.GPU_READY_CONDITION


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
                  for d in s.devices if NVIDIA_RULE.selects(s.driver, d))
    if devices:
        return devices, "DRA devices of gpu.nvidia.com"
    return 0, (f"no {constants.GPU_RESOURCE} capacity and no DRA GPU devices: "
               "is the device plugin or DRA driver running?")


@dataclass(frozen=True)
class KubeletView:
    """What the verifier last learnt from the kubelet (None: not asked yet)."""
    allocatable: int | None = None  # nvidia.com/gpu devices it can hand out
    verification: str = "not run yet"  # the last verification's result, in words


def decide(node: Mapping[str, Any], topology: GpuTopology | None, problem: str,
           slices: Iterable[ResourceSlice] = (), kubelet: KubeletView = KubeletView()) -> Report:
    """``topology``: what the agent read, None with ``problem`` saying why not.

    The condition's message is the node's side of "why is my GPU pod Pending
    or slow": driver, advertised GPUs, kubelet allocatable, topology, last
    verification, each with its finding; the reason names the first failed check.
    """
    if topology is None:
        return Report(None, False, "TopologyUnreadable",
                      f"driver: the GPU topology could not be read: {problem}")
    advertised, source = advertised_gpus(node, slices)
    checks = [f"driver: {len(topology)} GPUs visible", f"advertised: {advertised} ({source})"]
    if advertised != len(topology):
        return Report(None, False, "GPUCountMismatch", "; ".join(checks + [
            f"topology: the {constants.GPU_TOPOLOGY_ANNOTATION} annotation is left as it is, "
            "the GPU counts disagree"]))
    value = to_annotation(topology)
    current = ((node.get("metadata") or {}).get("annotations") or {}).get(constants.GPU_TOPOLOGY_ANNOTATION)
    # the kubelet's allocatable counts device-plugin GPUs only: DRA's are not in it
    plugin = source.startswith(constants.GPU_RESOURCE)
    allocatable_ok = kubelet.allocatable is None or not plugin or kubelet.allocatable == len(topology)
    checks += [f"kubelet allocatable: {'not known yet' if kubelet.allocatable is None else kubelet.allocatable}"
               + ("" if allocatable_ok else f", not the {len(topology)} visible (unhealthy GPUs?)"),
               "topology: annotation matches the driver (checked every pass)",
               f"last verification: {kubelet.verification}"]
    return Report(None if current == value else value, allocatable_ok,
                  "TopologyReported" if allocatable_ok else "AllocatableMismatch", "; ".join(checks))


def current_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (node.get("status") or {}).get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == GPU_READY_CONDITION:
            return condition
    return None
