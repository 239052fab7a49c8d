"""One node's GPU interconnect: its GPUs, the link between every pair, its
NICs and its NUMA nodes.

Link classes, best first -- the order every choice of GPUs optimizes
(docs/topology.md explains it):

    NV<n>  n bonded NVLinks; more links are better (NV18 > NV12 > NV2 > NV1)
    PIX    PCIe through at most one bridge (the same PCIe switch)
    PXB    PCIe through several bridges, not through a host bridge
    PHB    PCIe through a host bridge (typically the CPU)
    NODE   PCIe between host bridges inside one NUMA node
    SYS    PCIe plus the link between NUMA nodes (QPI/UPI); old drivers print SOC

Every NVLink class beats every PCIe path.  The bandwidth estimates below are
rough per-direction figures, used only to compare sets of the same worst
link: 25 GB/s per NVLink (NVLink 2, 3 and 4 all run 25 GB/s per link and
direction) and a falling PCIe peer-to-peer figure per hop class.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Iterable

from batchsched.core.text import clip

if TYPE_CHECKING:
    import networkx as nx

NVLINK_GBPS = 25
_PCIE = ("SYS", "NODE", "PHB", "PXB", "PIX")  # worst first
_PCIE_GBPS = {"SYS": 10, "NODE": 14, "PHB": 16, "PXB": 20, "PIX": 22}
# A NIC this close to a GPU (PCIe switches only, no host bridge) serves it
# GPUDirect RDMA: the NIC reads and writes GPU memory peer to peer.
RDMA_LINKS = frozenset({"PIX", "PXB"})
_ALIASES = {"SOC": "SYS"}  # drivers before 384 named the inter-socket path SOC

# Bounds on what a topology may describe, so that a hostile or broken one
# costs little to refuse.  16 GPUs is the largest board built (DGX-2/HGX-2);
# GPU choice grows combinatorially with it (bench/RESULTS.md, docs/topology.md).
MAX_GPUS = 16
MAX_NVLINKS = 64  # bonded NVLinks per pair (NV18 on H100 today)
MAX_CPUS = 8192  # Linux's largest NR_CPUS: CPU ids are 0..8191
MAX_NUMA_NODES = 1024  # Linux's largest MAX_NUMNODES: NUMA ids are 0..1023


class TopologyError(ValueError):
    """A topology that makes no sense (asymmetric links, unknown class, ...)."""


@dataclass(frozen=True)
class Link:
    kind: str  # "NV" or one of the PCIe classes
    nvlinks: int = 0  # bonded NVLinks, for kind "NV"

    @staticmethod
    @lru_cache(maxsize=None)
    def parse(token: str) -> Link:
        """``NV12``, ``PIX``, ... as printed by ``nvidia-smi topo -m``."""
        text = _ALIASES.get(token, token)
        if text in _PCIE_GBPS:
            return Link(text)
        count = text[2:]
        if text.startswith("NV") and count.isascii() and count.isdigit() and 0 < int(count) <= MAX_NVLINKS:
            return Link("NV", int(count))
        raise TopologyError(f"unknown link class {token!r} (expected NV<n>, PIX, PXB, PHB, NODE or SYS)")

    @property
    def is_nvlink(self) -> bool:
        return self.kind == "NV"

    @property
    def rank(self) -> int:
        """Higher is better: SYS 1 ... PIX 5, NV<n> 5 + n."""
        return len(_PCIE) + self.nvlinks if self.is_nvlink else _PCIE.index(self.kind) + 1

    @property
    def gbps(self) -> int:
        """Estimated bandwidth per direction, GB/s."""
        return NVLINK_GBPS * self.nvlinks if self.is_nvlink else _PCIE_GBPS[self.kind]

    def __str__(self) -> str:
        return f"NV{self.nvlinks}" if self.is_nvlink else self.kind


def link_name(rank: int) -> str:
    """The class a rank stands for (inverse of ``Link.rank``)."""
    return f"NV{rank - len(_PCIE)}" if rank > len(_PCIE) else _PCIE[rank - 1]


def parse_cpu_list(text: str) -> frozenset[int]:
    """``0-19,40-59`` (the kernel's cpulist format) as a set; ``N/A`` or "" is empty.

    CPU ids are below ``MAX_CPUS`` and the ranges together span at most
    ``MAX_CPUS`` ids (a real list never repeats one), so the work is bounded.
    """
    text = text.strip()
    if text in ("", "N/A"):
        return frozenset()
    cpus: set[int] = set()
    spanned = 0
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        first = _cpu_id(low, text)
        last = _cpu_id(high, text) if dash else first
        if last < first:
            raise TopologyError(f"{clip(text, 60)!r} has a decreasing range {clip(part, 60)!r}")
        spanned += last - first + 1
        if spanned > MAX_CPUS:
            raise TopologyError(f"{clip(text, 60)!r} names more than {MAX_CPUS} CPUs")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def _cpu_id(token: str, text: str) -> int:
    # ascii: "²".isdigit() is true too
    if not (token.isascii() and token.isdigit()):
        raise TopologyError(f"{clip(text, 60)!r} is not a CPU list like 0-19,40-59")
    if len(token) > len(str(MAX_CPUS)) or int(token) >= MAX_CPUS:  # length first: int() of a long run is slow
        raise TopologyError(f"{clip(text, 60)!r} names a CPU beyond {MAX_CPUS - 1}")
    return int(token)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The inverse of ``parse_cpu_list``: sorted ranges."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


@dataclass(frozen=True)
class Gpu:
    index: int
    numa: int | None = None  # None: unknown, or an affinity spanning several NUMA nodes
    cpus: frozenset[int] = frozenset()  # CPU affinity
    uuid: str = ""
    pci_bus_id: str = ""
    mig: bool = False  # MIG mode enabled: the GPU is split into MIG devices


@dataclass(frozen=True)
class Nic:
    name: str  # mlx5_0, or the column name when no NIC legend resolves it
    links: tuple[Link | None, ...]  # to each GPU by index; None where unknown


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: frozenset[int] = frozenset()
    memory: int = 0  # bytes; 0: not declared


@dataclass(frozen=True)
class GpuTopology:
    """GPUs are numbered 0..n-1 as CUDA and nvidia-smi number them.

    ``links[i][j]`` is the link between GPU i and GPU j (None on the
    diagonal).  ``numa_nodes`` lists every NUMA node a GPU belongs to.
    """

    gpus: tuple[Gpu, ...]
    links: tuple[tuple[Link | None, ...], ...]
    nics: tuple[Nic, ...] = ()
    numa_nodes: tuple[NumaNode, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if n == 0:
            raise TopologyError("a topology needs at least one GPU")
        if n > MAX_GPUS:
            raise TopologyError(f"{n} GPUs: a topology may describe at most {MAX_GPUS}")
        if [g.index for g in self.gpus] != list(range(n)):
            raise TopologyError(f"GPU indices must be 0..{n - 1} in order")
        if len(self.links) != n or any(len(row) != n for row in self.links):
            raise TopologyError(f"the link matrix must be {n} x {n}")
        for i in range(n):
            if self.links[i][i] is not None:
                raise TopologyError(f"GPU{i} has a link to itself")
            for j in range(i + 1, n):
                if self.links[i][j] is None or self.links[i][j] != self.links[j][i]:
                    raise TopologyError(f"links GPU{i}-GPU{j} and GPU{j}-GPU{i} differ or are missing")
        for nic in self.nics:
            if len(nic.links) != n:
                raise TopologyError(f"NIC {nic.name} has {len(nic.links)} GPU links, expected {n}")
        declared = [node.id for node in self.numa_nodes]
        numa_ids = declared + [g.numa for g in self.gpus if g.numa is not None]
        if any(not 0 <= numa < MAX_NUMA_NODES for numa in numa_ids):
            raise TopologyError(f"NUMA node ids must be 0..{MAX_NUMA_NODES - 1}")
        if len(set(declared)) != len(declared):
            raise TopologyError("a NUMA node is declared twice")
        missing = {g.numa for g in self.gpus if g.numa is not None} - set(declared)
        if missing:
            raise TopologyError(f"NUMA node(s) {sorted(missing)} of some GPU are not declared")

    def __len__(self) -> int:
        return len(self.gpus)

    def link(self, i: int, j: int) -> Link:
        link = self.links[i][j]
        if link is None:
            raise ValueError(f"GPU{i} has no link to itself")
        return link

    @cached_property
    def graph(self) -> nx.Graph:
        """GPUs as nodes (attribute ``numa``), every pair as an edge with
        attributes ``link``, ``rank`` and ``gbps``."""
        import networkx as nx  # (loaded on first use: ~0.1 s of the scheduler's start otherwise)
        graph = nx.Graph()
        for gpu in self.gpus:
            graph.add_node(gpu.index, numa=gpu.numa)
        for i in range(len(self)):
            for j in range(i + 1, len(self)):
                link = self.link(i, j)
                graph.add_edge(i, j, link=link, rank=link.rank, gbps=link.gbps)
        return graph

    def nvlink_groups(self) -> list[tuple[int, ...]]:
        """GPUs that reach each other over NVLink hops, groups of two or more."""
        import networkx as nx
        nvlinked = nx.subgraph_view(self.graph, filter_edge=lambda i, j: self.link(i, j).is_nvlink)
        groups = (tuple(sorted(c)) for c in nx.connected_components(nvlinked) if len(c) > 1)
        return sorted(groups)

    @cached_property
    def rdma_gpus(self) -> int:
        """The GPUs (a bit mask) with a NIC at PIX or PXB: GPUDirect RDMA."""
        mask = 0
        for nic in self.nics:
            for index, link in enumerate(nic.links):
                if link is not None and link.kind in RDMA_LINKS:
                    mask |= 1 << index
        return mask

    def gpus_in_numa(self, numa: int) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus if g.numa == numa)
