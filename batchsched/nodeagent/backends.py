"""Where the node agent reads the GPUs from: NVML (``nvidia-ml-py``) where the
driver's library loads, else the text of ``nvidia-smi topo -m`` plus
``nvidia-smi -q -x``.  Both give a GpuTopology with uuids and PCI bus ids,
built by the same ``assemble`` the ``topo parse`` command uses, so both agree
with ``batchsched topo parse`` on the same machine (tests/unit/test_node_agent_reporter.py).
"""
from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from batchsched.core.topology.model import MAX_CPUS, Gpu, GpuTopology, Link, TopologyError
from batchsched.core.topology.parse import assemble, parse_topo


class Backend(Protocol):
    name: str

    def read(self) -> GpuTopology:
        """The node's topology; raises TopologyError saying what went wrong."""


# nvmlDeviceGetTopologyCommonAncestor levels, as `nvidia-smi topo -m` names them
# (INTERNAL: two GPUs on one board, which nvidia-smi prints as PIX).
_PCIE_BY_LEVEL = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_AFFINITY_WORDS = MAX_CPUS // 64
_MEMINFO_TOTAL = re.compile(r"MemTotal:\s*(\d+)\s*kB")


def numa_memory(sys_root: Path = Path("/sys")) -> dict[int, int]:
    """Bytes of memory by NUMA node id, from the kernel (empty where sysfs
    does not say: the annotation then leaves memory out)."""
    memory = {}
    for meminfo in (sys_root / "devices" / "system" / "node").glob("node*/meminfo"):
        node = meminfo.parent.name[len("node"):]
        match = _MEMINFO_TOTAL.search(meminfo.read_text(errors="replace"))
        if node.isdigit() and match:
            memory[int(node)] = int(match.group(1)) * 1024
    return memory


def _text(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """GPUs, NVLinks, PCIe paths, NUMA nodes and MIG mode through NVML.

    NVML numbers GPUs as nvidia-smi does.  An NVLink to an NVSwitch joins
    the GPU to every other switched GPU, so a pair's link count is its direct
    links plus the fewer of the two GPUs' switch links (what nvidia-smi
    prints: NV12 between every pair of a DGX A100).  NVML does not see NICs;
    the text backend reports them.
    """

    name = "nvml"

    def __init__(self, nvml: Any, sys_root: Path = Path("/sys")):
        self.nvml = nvml  # the pynvml module, or a stand-in with its functions
        self.sys_root = sys_root

    def read(self) -> GpuTopology:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise TopologyError(f"NVML did not start: {exc}") from None
        try:
            return self._read()
        except nvml.NVMLError as exc:
            raise TopologyError(f"NVML: {exc}") from None
        finally:
            nvml.nvmlShutdown()

    def _read(self) -> GpuTopology:
        nvml = self.nvml
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        bus_ids = [_text(nvml.nvmlDeviceGetPciInfo(h).busId).upper() for h in handles]
        index_by_bus = {bus: i for i, bus in enumerate(bus_ids)}
        gpus = [Gpu(i, self._optional(nvml.nvmlDeviceGetNumaNodeId, h), self._cpus(h),
                    _text(nvml.nvmlDeviceGetUUID(h)), bus_ids[i], self._mig(h)) for i, h in enumerate(handles)]
        n = len(handles)
        direct = [[0] * n for _ in range(n)]
        switched = [0] * n
        for i, handle in enumerate(handles):
            for link in range(nvml.NVML_NVLINK_MAX_LINKS):
                if self._optional(nvml.nvmlDeviceGetNvLinkState, handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                remote = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).upper()
                kind = self._optional(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
                if kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                    switched[i] += 1
                elif remote in index_by_bus:
                    direct[i][index_by_bus[remote]] += 1
        links: list[list[Link | None]] = [[None] * n for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                nvlinks = direct[i][j] + min(switched[i], switched[j])
                if nvlinks:
                    links[i][j] = links[j][i] = Link("NV", nvlinks)
                else:
                    level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                    links[i][j] = links[j][i] = Link.parse(_PCIE_BY_LEVEL.get(level, "SYS"))
        return assemble(gpus, links, (), numa_memory(self.sys_root))

    def _optional(self, function: Callable, *args: Any) -> Any:
        """None where the driver or GPU does not support the query."""
        try:
            return function(*args)
        except self.nvml.NVMLError:
            return None

    def _cpus(self, handle: Any) -> frozenset[int]:
        words = self._optional(self.nvml.nvmlDeviceGetCpuAffinity, handle, _AFFINITY_WORDS) or ()
        return frozenset(64 * w + bit for w, word in enumerate(words) for bit in range(64) if word >> bit & 1)

    def _mig(self, handle: Any) -> bool:
        mode = self._optional(self.nvml.nvmlDeviceGetMigMode, handle)
        return bool(mode) and mode[0] == self.nvml.NVML_DEVICE_MIG_ENABLE


class TextBackend:
    """``nvidia-smi topo -m`` (links, NICs, affinities) plus ``nvidia-smi -q -x``
    (uuids, PCI bus ids, MIG mode), for nodes where NVML does not load."""

    name = "text"

    def __init__(self, nvidia_smi: str = "nvidia-smi", sys_root: Path = Path("/sys"), timeout: float = 60):
        self.nvidia_smi = nvidia_smi
        self.sys_root = sys_root
        self.timeout = timeout

    def _run(self, *args: str) -> str:
        try:
            done = subprocess.run([self.nvidia_smi, *args], capture_output=True, text=True, timeout=self.timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TopologyError(f"{self.nvidia_smi} {' '.join(args)}: {exc}") from None
        if done.returncode != 0:
            raise TopologyError(f"{self.nvidia_smi} {' '.join(args)} exited {done.returncode}: "
                                f"{done.stderr.strip()[:200]}")
        return done.stdout

    def read(self) -> GpuTopology:
        return with_identities(parse_topo(self._run("topo", "-m"), numa_memory(self.sys_root)),
                               self._run("-q", "-x"))


def with_identities(topology: GpuTopology, query_xml: str) -> GpuTopology:
    """The topology with each GPU's uuid, PCI bus id and MIG mode from
    ``nvidia-smi -q -x`` (which lists the GPUs in the matrix's order)."""
    try:
        root = ElementTree.fromstring(query_xml)
    except ElementTree.ParseError as exc:
        raise TopologyError(f"nvidia-smi -q -x: not XML: {exc}") from None
    entries = root.findall("gpu")
    if len(entries) != len(topology):
        raise TopologyError(f"nvidia-smi -q -x lists {len(entries)} GPUs, the topology matrix {len(topology)}")
    gpus = tuple(Gpu(gpu.index, gpu.numa, gpu.cpus, (entry.findtext("uuid") or "").strip(),
                     (entry.findtext("pci/pci_bus_id") or entry.get("id") or "").strip().upper(),
                     (entry.findtext("mig_mode/current_mig") or "").strip() == "Enabled")
                 for gpu, entry in zip(topology.gpus, entries))
    return GpuTopology(gpus, topology.links, topology.nics, topology.numa_nodes)


def default_backend(nvidia_smi: str = "nvidia-smi", sys_root: Path = Path("/sys")) -> Backend:
    """NVML when its library loads, else the nvidia-smi text."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return TextBackend(nvidia_smi, sys_root)
    pynvml.nvmlShutdown()
    return NvmlBackend(pynvml, sys_root)


def backend_named(name: str, nvidia_smi: str, sys_root: Path) -> Backend:
    if name == "auto":
        return default_backend(nvidia_smi, sys_root)
    if name == "nvml":
        import pynvml
        return NvmlBackend(pynvml, sys_root)
    return TextBackend(nvidia_smi, sys_root)


BACKENDS: Mapping[str, str] = {"auto": "NVML if the driver's library loads, else nvidia-smi",
                               "nvml": "NVML (nvidia-ml-py)", "text": "nvidia-smi topo -m and -q -x"}
