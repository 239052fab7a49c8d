"""Which devices of a node are GPUs, and which topology GPU each one is.

A device is a GPU when a rule selects it:

* NVIDIA's driver, always: driver ``gpu.nvidia.com``, attribute ``type``
  ``gpu`` (or none); MIG devices (``type: mig``) are not whole GPUs;
* a DeviceClass with ``extendedResourceName: nvidia.com/gpu`` whose CEL
  selectors (``core/dra/cel.py``) all select it; none at all selects every
  device. A selector that does not compile marks the class unsupported,
  with the reason; its devices are never guessed at. A selector that fails
  on a device (a missing attribute) does not select it, and the node's
  problems name the first such failure of each class.

Each GPU maps to the node's topology (the gpu-topology annotation): by its
``uuid`` attribute, else by ``resource.kubernetes.io/pciBusID``, else by
order (device minor, ``gpu-<minor>``, against the topology's free indices).
Order is used only where identity cannot tell: a device that publishes a
uuid (or bus id) on a topology that records uuids (or bus ids) and matches
none stays off the topology, reported, rather than be mapped to a GPU it
may not be.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core.dra.selector import compile_selector
from batchsched.core.dra.model import PCI_BUS_ID_ATTRIBUTE, Device, DeviceClass, ResourceSlice, SelectorError
from batchsched.core.text import clip
from batchsched.core.topology.model import GpuTopology

if TYPE_CHECKING:
    from batchsched.core.dra.cel import Selector

NVIDIA_DRIVER = "gpu.nvidia.com"
_MINOR = re.compile(r"gpu-(\d{1,9})")
_PCI = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])")


@dataclass(frozen=True)
class GpuRule:
    """Devices every selector selects (none: every device); or NVIDIA's
    built-in rule: driver gpu.nvidia.com, attribute ``type`` "gpu" or none."""

    selectors: tuple[Selector, ...] = ()
    nvidia_builtin: bool = False

    def selects(self, driver: str, device: Device) -> bool:
        """Raises ``SelectorError`` when a selector fails on the device."""
        if self.nvidia_builtin:
            return driver == NVIDIA_DRIVER and device.attributes.get("type", "gpu") == "gpu"
        return all(selector.matches(driver, device) for selector in self.selectors)


NVIDIA_RULE = GpuRule(nvidia_builtin=True)


@dataclass(frozen=True)
class GpuSelection:
    # the supported classes with extendedResourceName nvidia.com/gpu, by name: (class name, rule)
    extended_rules: tuple[tuple[str, GpuRule], ...]
    unsupported: Mapping[str, str]  # class name -> why its selectors are not read


def class_rule(device_class: DeviceClass) -> GpuRule | str:
    """The rule a class's selectors amount to, or why they cannot be used."""
    try:
        return GpuRule(tuple(compile_selector(expression) for expression in device_class.selectors))
    except SelectorError as error:
        return str(error)


def gpu_selection(classes: Iterable[DeviceClass]) -> GpuSelection:
    extended, unsupported = [], {}
    for device_class in sorted(classes, key=lambda c: c.name):
        if device_class.extended_resource_name != GPU_RESOURCE:
            continue
        rule = class_rule(device_class)
        if isinstance(rule, str):
            unsupported[device_class.name] = rule
        else:
            extended.append((device_class.name, rule))
    return GpuSelection(tuple(extended), unsupported)


@dataclass(frozen=True)
class DraGpu:
    driver: str
    pool: str
    device: str  # gpu-<minor> for NVIDIA: the /dev minor, not the NVML index
    index: int | None = None  # the topology's GPU; None: not on the topology
    mapped_by: str = ""  # uuid | pciBusID | order ("" when unmapped)
    # The DeviceClass with extendedResourceName nvidia.com/gpu that selects it
    # (the first by name when several do); "" when none does.
    extended_class: str = ""
    source: Device | None = None  # as its slice publishes it: what claims' selectors read

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True)
class NodeDra:
    """A node's DRA GPUs (whether in use is the claims' business, see state)."""

    gpus: tuple[DraGpu, ...]
    problems: tuple[str, ...] = ()

    @property
    def extended(self) -> bool:
        """A supported class with extendedResourceName nvidia.com/gpu selects some of them."""
        return any(g.extended_class for g in self.gpus)

    @property
    def mask(self) -> int:
        """The topology indices the DRA GPUs are."""
        return sum(1 << g.index for g in self.gpus if g.index is not None)


def pci_key(text: object) -> tuple[int, ...] | None:
    """A PCI address as numbers: nvidia-smi's 00000000:07:00.0 and the
    standard attribute's 0000:07:00.0 name the same device."""
    match = _PCI.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    return tuple(int(part or "0", 16) for part in match.groups()) if match else None


def _minor_order(device: str) -> tuple:
    match = _MINOR.fullmatch(device)
    return (0, int(match.group(1)), device) if match else (1, 0, device)


def node_dra(slices: Iterable[ResourceSlice], selection: GpuSelection, topology: GpuTopology | None) -> NodeDra | None:
    """The node's DRA GPUs from its slices (the newest generation of each
    pool only, as the allocator reads them); None when it has none."""
    newest: dict[tuple[str, str], int] = {}
    slices = list(slices)
    for s in slices:
        newest[(s.driver, s.pool)] = max(newest.get((s.driver, s.pool), 0), s.generation)
    found: dict[tuple[str, str, str], tuple] = {}  # key -> (uuid, pci key)
    extended: dict[tuple[str, str, str], str] = {}  # key -> the class serving it as nvidia.com/gpu
    failures: dict[str, str] = {}  # class -> its first selector failure on this node
    sources: dict[tuple[str, str, str], Device] = {}
    for s in slices:
        if s.generation != newest[(s.driver, s.pool)]:
            continue
        for device in s.devices:
            serving = next((name for name, rule in selection.extended_rules
                            if _selects(name, rule, s.driver, device, failures)), "")
            if serving or NVIDIA_RULE.selects(s.driver, device):
                found[(s.driver, s.pool, device.name)] = (device.attributes.get("uuid"),
                                                          pci_key(device.attributes.get(PCI_BUS_ID_ATTRIBUTE)))
                sources[(s.driver, s.pool, device.name)] = device
                if serving:
                    extended[(s.driver, s.pool, device.name)] = serving
    if not found:
        return None
    keys = sorted(found, key=lambda k: (k[0], k[1], _minor_order(k[2])))
    mapped, problems = _map(keys, found, topology)
    gpus = tuple(DraGpu(*key, *mapped.get(key, (None, "")), extended.get(key, ""), sources[key]) for key in keys)
    return NodeDra(gpus, tuple(f"DeviceClass {name}: {why}" for name, why in sorted(failures.items()))
                   + tuple(problems))


def _selects(name: str, rule: GpuRule, driver: str, device: Device, failures: dict[str, str]) -> bool:
    """A selector failing on a device does not select it (as Kubernetes
    cannot allocate it); the class's first failure is kept to be reported."""
    try:
        return rule.selects(driver, device)
    except SelectorError as error:
        failures.setdefault(name, str(error))
        return False


def _map(keys: list, identity: Mapping[tuple, tuple], topology: GpuTopology | None) -> tuple[dict, list[str]]:
    if topology is None:
        return {}, []
    by_uuid = {g.uuid: g.index for g in topology.gpus if g.uuid}
    by_pci = {pci: g.index for g in topology.gpus if (pci := pci_key(g.pci_bus_id)) is not None}
    mapped: dict[tuple, tuple[int, str]] = {}
    taken: set[int] = set()

    def claim(key: tuple, index: int | None, how: str) -> None:
        if index is not None and index not in taken and key not in mapped:
            mapped[key] = (index, how)
            taken.add(index)

    for key in keys:
        claim(key, by_uuid.get(identity[key][0]), "uuid")
    for key in keys:
        claim(key, by_pci.get(identity[key][1]), "pciBusID")
    problems, free = [], [g.index for g in topology.gpus if g.index not in taken]
    for key in keys:
        if key in mapped:
            continue
        uuid, pci = identity[key]
        if (uuid and by_uuid) or (pci and by_pci):
            problems.append(f"device {key[2]} (pool {clip(key[1], 60)}) matches no GPU of the topology "
                            "by uuid or pciBusID")
        elif free:
            claim(key, free.pop(0), "order")
        else:
            problems.append(f"device {key[2]} (pool {clip(key[1], 60)}) is beyond the topology's "
                            f"{len(topology)} GPUs")
    return mapped, problems
