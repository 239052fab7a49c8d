"""``batchsched topo parse``: a capture of ``nvidia-smi topo -m`` as JSON, as
the node annotation's value, or as a summary a person reads."""
from __future__ import annotations

import json

from batchsched.core import resources as res
from batchsched.core.topology.annotation import to_annotation, to_document
from batchsched.core.topology.choose import choose_gpus
from batchsched.core.topology.model import GpuTopology, format_cpu_list, link_name
from batchsched.core.topology.parse import parse_topo

FORMATS = ("text", "json", "annotation")


def parse_numa_memory(text: str) -> dict[int, int]:
    """``0=256Gi,1=256Gi`` -> bytes by NUMA node id."""
    memory: dict[int, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        node, _, quantity = part.partition("=")
        if not node.strip().isdigit() or not quantity:
            raise ValueError(f"--numa-memory: {part!r} is not NUMA=QUANTITY, e.g. 0=256Gi")
        memory[int(node)] = res.canonical(res.MEMORY, quantity.strip())
    return memory


def render(text: str, output: str, numa_memory: str = "") -> str:
    """The output of ``topo parse`` for the capture ``text``; raises
    TopologyError (naming the line) on malformed input."""
    topology = parse_topo(text, parse_numa_memory(numa_memory))
    if output == "annotation":
        return to_annotation(topology) + "\n"
    if output == "json":
        return json.dumps(to_document(topology), indent=2) + "\n"
    return describe(topology)


def describe(topology: GpuTopology) -> str:
    n = len(topology)
    everyone = (1 << n) - 1
    lines = [f"{n} GPU{'s' if n > 1 else ''}" + (f", {len(topology.nics)} NIC(s)" if topology.nics else "")]
    lines.append("NUMA split:")
    for node in topology.numa_nodes:
        memory = f", memory {res.format_amount(res.MEMORY, node.memory)}" if node.memory else ""
        lines.append(f"  NUMA {node.id}: GPUs {format_cpu_list(topology.gpus_in_numa(node.id))}, "
                     f"CPUs {format_cpu_list(node.cpus) or 'unknown'}{memory}")
    unknown = [g.index for g in topology.gpus if g.numa is None]
    if unknown:
        lines.append(f"  unknown: GPUs {format_cpu_list(unknown)}")
    lines.append("NVLink groups:")
    groups = topology.nvlink_groups()
    for group in groups:
        pairs = [(i, j) for i in group for j in group if i < j]
        linked = [topology.link(i, j) for i, j in pairs if topology.link(i, j).is_nvlink]
        kinds = ", ".join(f"{k} x{sum(1 for x in linked if str(x) == k)}"
                          for k in sorted({str(x) for x in linked}, key=lambda k: int(k[2:])))
        shape = "all-to-all" if len(linked) == len(pairs) else f"{len(linked)} of {len(pairs)} pairs linked"
        lines.append(f"  GPUs {format_cpu_list(group)}: {shape} ({kinds})")
    if not groups:
        lines.append("  none: every pair of GPUs talks over PCIe" if n > 1 else "  none (one GPU)")
    if topology.nics:
        lines.append("NICs (closest GPUs):")
        for nic in topology.nics:
            known = [(link.rank, i) for i, link in enumerate(nic.links) if link is not None]
            best = max((rank for rank, _ in known), default=None)
            closest = [i for rank, i in known if rank == best]
            where = f"GPUs {format_cpu_list(closest)} ({link_name(best)})" if closest else "unknown"
            lines.append(f"  {nic.name}: {where}")
    lines.append("Links:")
    width = max(4, len(f"GPU{n - 1}")) + 2
    lines.append(" " * width + "".join(f"GPU{j}".ljust(width) for j in range(n)).rstrip())
    for i in range(n):
        cells = "".join(("X" if i == j else str(topology.link(i, j))).ljust(width) for j in range(n))
        lines.append(f"GPU{i}".ljust(width) + cells.rstrip())
    if n > 1:
        lines.append("Best set per size (worst link, NUMA nodes):")
    for k in range(2, n + 1):
        choice = choose_gpus(topology, everyone, k)
        lines.append(f"  {k}: GPUs {format_cpu_list(choice.gpus)} ({link_name(choice.worst)}, "
                     f"{choice.numa_nodes} NUMA)")
    return "\n".join(lines) + "\n"
