"""A stand-in for the pynvml module that answers NVML's queries the way a
machine with a given topology would: the node agent's NVML backend runs
against it where no GPU is present.  Errors and constants are pynvml's own."""
from __future__ import annotations

import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pynvml

from batchsched.core.topology.model import GpuTopology

_LEVEL_BY_PCIE = {"PIX": pynvml.NVML_TOPOLOGY_SINGLE, "PXB": pynvml.NVML_TOPOLOGY_MULTIPLE,
                  "PHB": pynvml.NVML_TOPOLOGY_HOSTBRIDGE, "NODE": pynvml.NVML_TOPOLOGY_NODE,
                  "SYS": pynvml.NVML_TOPOLOGY_SYSTEM}


NVSWITCH_BUS_ID = "00000000:E0:00.0"


def uuid_of(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-00000000{index:04x}"


def bus_id_of(index: int) -> str:
    return f"00000000:{index + 0x10:02X}:00.0"


class FakeNvml:
    """What NVML would answer on a machine with ``topology``.  A board whose
    GPUs all pair with the same NVLink count, more links than one GPU has,
    is an NVSwitch board: every link goes to a switch, as on a DGX."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_NVLINK_DEVICE_TYPE_SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self, topology: GpuTopology, mig: frozenset[int] = frozenset()):
        self.topology = topology
        self.mig = mig
        self.running = False
        n = len(topology)
        counts = {topology.link(i, j).nvlinks for i in range(n) for j in range(i + 1, n)}
        switched = (n > 2 and len(counts) == 1 and 0 not in counts
                    and counts.pop() * (n - 1) > self.NVML_NVLINK_MAX_LINKS)
        # per GPU, one (remote bus id, remote type) per NVLink
        self.nvlinks = [[(NVSWITCH_BUS_ID, pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)]
                        * topology.link(i, (i + 1) % n).nvlinks
                        if switched else
                        [(bus_id_of(j), pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)
                         for j in range(n) if j != i for _ in range(topology.link(i, j).nvlinks)]
                        for i in range(n)]

    def _fail(self, code: int = pynvml.NVML_ERROR_NOT_SUPPORTED):
        raise pynvml.NVMLError(code)

    def nvmlInit(self) -> None:
        self.running = True

    def nvmlShutdown(self) -> None:
        self.running = False

    def nvmlDeviceGetCount(self) -> int:
        assert self.running, "NVML queried before nvmlInit"
        return len(self.topology)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetPciInfo(self, handle: int):
        return SimpleNamespace(busId=bus_id_of(handle).encode())

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return uuid_of(handle)

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        numa = self.topology.gpus[handle].numa
        return self._fail() if numa is None else numa

    def nvmlDeviceGetCpuAffinity(self, handle: int, words: int) -> list[int]:
        mask = [0] * words
        for cpu in self.topology.gpus[handle].cpus:
            mask[cpu // 64] |= 1 << cpu % 64
        return mask

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        return [1, 1] if handle in self.mig else self._fail()

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        if link >= len(self.nvlinks[handle]):
            self._fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int):
        return SimpleNamespace(busId=self.nvlinks[handle][link][0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        return self.nvlinks[handle][link][1]

    def nvmlDeviceGetTopologyCommonAncestor(self, first: int, second: int) -> int:
        return _LEVEL_BY_PCIE[self.topology.link(first, second).kind]


def query_xml(topology: GpuTopology, mig: frozenset[int] = frozenset()) -> str:
    """``nvidia-smi -q -x`` of that machine, as much as the agent reads."""
    gpus = "".join(
        f'<gpu id="{bus_id_of(i)}"><product_name>Fake</product_name><uuid>{uuid_of(i)}</uuid>'
        f'<pci><pci_bus_id>{bus_id_of(i)}</pci_bus_id></pci>'
        f'<mig_mode><current_mig>{"Enabled" if i in mig else "Disabled"}</current_mig></mig_mode></gpu>'
        for i in range(len(topology)))
    return f'<?xml version="1.0" ?><nvidia_smi_log><driver_version>550.0</driver_version>{gpus}</nvidia_smi_log>'


def fake_nvidia_smi(folder: Path, capture: Path, xml: str) -> Path:
    """An nvidia-smi that prints the capture for `topo -m` and the XML for `-q -x`."""
    (folder / "query.xml").write_text(xml)
    script = folder / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport sys\n"
                      f"path = {str(capture)!r} if sys.argv[1:] == ['topo', '-m'] else "
                      f"{str(folder / 'query.xml')!r} if sys.argv[1:] == ['-q', '-x'] else None\n"
                      "if path is None: sys.exit('unexpected arguments %r' % sys.argv[1:])\n"
                      "sys.stdout.write(open(path).read())\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script
