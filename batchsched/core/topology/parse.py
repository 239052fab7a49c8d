"""A parser for the matrix ``nvidia-smi topo -m`` prints.

What it accepts, because real machines and pasted captures print it:

* anything before the header line (a prompt, a ``# source:`` note, a title)
  and everything from the first blank line after the matrix (the legends);
* indented blocks, tabs or spaces, trailing spaces, ANSI underlining on the
  header, ``X`` on the diagonal with or without padding;
* NIC columns named ``mlx5_N`` or ``NICn`` (resolved through a ``NIC Legend``
  when present), NIC rows in any order;
* the affinity columns ``CPU Affinity``, ``NUMA Affinity`` (or ``NUMA``) and
  ``GPU NUMA ID`` in any subset; values ``N/A``, ranges and comma lists;
  an empty CPU affinity cell, kept as an empty tab cell (or, in text whose
  tabs became spaces, taken to be the missing leading cell);
* ``SOC``, the name old drivers gave ``SYS``.

NUMA nodes: a GPU whose NUMA affinity is one number belongs to that node; a
range such as ``0-1`` or ``N/A`` leaves it unknown.  When no GPU has a known
NUMA node (old drivers print no ``NUMA Affinity`` column), GPUs are grouped
by CPU affinity instead: each distinct, disjoint CPU set is one NUMA node,
numbered from 0 in the order of its lowest CPU.

Anything else is a :class:`TopologyParseError` naming the line and the problem.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Mapping

from batchsched.core.topology.model import (
    MAX_GPUS, Gpu, GpuTopology, Link, Nic, NumaNode, TopologyError, parse_cpu_list,
)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TOKEN = re.compile(r"\S+")
_GPU_COLUMN = re.compile(r"GPU(\d+)$")
_NIC_LEGEND = re.compile(r"^\s*(\S+)\s*:\s*(\S+)\s*$")

CPU_AFFINITY, NUMA_AFFINITY, GPU_NUMA_ID = "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"
_AFFINITY_COLUMNS = {CPU_AFFINITY: CPU_AFFINITY, NUMA_AFFINITY: NUMA_AFFINITY, GPU_NUMA_ID: GPU_NUMA_ID,
                     "NUMA": NUMA_AFFINITY}
# Multi-word names first, so that "GPU NUMA ID" is one column and not three.
_HEADER_NAME = re.compile(r"GPU NUMA ID|CPU Affinity|NUMA Affinity|\S+")


class TopologyParseError(TopologyError):
    def __init__(self, line: int, problem: str):
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


def _header_columns(line: str) -> list[str] | None:
    """The column names if ``line`` is the matrix header, else None."""
    columns = [_AFFINITY_COLUMNS.get(name, name) for name in _HEADER_NAME.findall(line)]
    if not columns or columns[0] != "GPU0" or any(c == "X" or _is_link(c) for c in columns):
        return None  # not a header (a matrix row has X and link classes)
    return columns


def _is_link(token: str) -> bool:
    try:
        Link.parse(token)
    except TopologyError:
        return False
    return True


def parse_topo(text: str, numa_memory: Mapping[int, int] | None = None) -> GpuTopology:
    """Parse ``nvidia-smi topo -m`` output; ``numa_memory`` (bytes by NUMA
    node id) is recorded on the NUMA nodes, which the matrix cannot tell."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header_at, columns = None, None
    for number, line in enumerate(lines, 1):
        columns = _header_columns(line)
        if columns:
            header_at = number
            break
    if header_at is None or columns is None:
        raise TopologyParseError(len(lines) or 1, "no matrix header found (a line of column names "
                                                  "starting with GPU0, as `nvidia-smi topo -m` prints)")
    devices, affinities = _split_columns(columns, header_at)
    gpu_count = sum(1 for d in devices if _GPU_COLUMN.match(d))
    if gpu_count > MAX_GPUS:  # before the matrices are built: they grow with its square
        raise TopologyParseError(header_at, f"{gpu_count} GPUs: a topology may describe at most {MAX_GPUS}")
    rows: dict[str, tuple[int, list[str], list[str]]] = {}  # name -> (line, device cells, affinity cells)
    legend_from = len(lines)
    for number in range(header_at + 1, len(lines) + 1):
        line = lines[number - 1]
        if not line.strip():
            if rows:
                legend_from = number
                break
            continue
        if line.strip().startswith("Legend"):
            legend_from = number
            break
        name, cells, tail = _row(line, number, devices, affinities)
        if name in rows:
            raise TopologyParseError(number, f"second row for {name} (the first is on line {rows[name][0]})")
        rows[name] = (number, cells, tail)
    nic_names = _nic_legend(lines[legend_from:])

    links: list[list[Link | None]] = [[None] * gpu_count for _ in range(gpu_count)]
    nic_links: list[list[Link | None]] = [[None] * gpu_count for _ in devices[gpu_count:]]
    gpu_cells: list[tuple[int, list[str]]] = []
    for i in range(gpu_count):
        if f"GPU{i}" not in rows:
            raise TopologyParseError(header_at, f"the header names GPU{i} but no row for GPU{i} follows")
        number, cells, tail = rows[f"GPU{i}"]
        gpu_cells.append((number, tail))
        for j, cell in enumerate(cells):
            column = devices[j]
            if j == i:
                if cell != "X":
                    raise TopologyParseError(number, f"GPU{i}'s own cell is {cell!r}, expected X")
                continue
            if j < gpu_count:
                links[i][j] = _link(cell, number, f"the link GPU{i}-{column}")
            elif cell != "N/A":
                nic_links[j - gpu_count][i] = _link(cell, number, f"the link GPU{i}-{column}")
    for i in range(gpu_count):
        for j in range(i + 1, gpu_count):
            if links[i][j] != links[j][i]:
                raise TopologyParseError(rows[f"GPU{j}"][0], (
                    f"the link GPU{j}-GPU{i} is {links[j][i]} but line {rows[f'GPU{i}'][0]} "
                    f"says GPU{i}-GPU{j} is {links[i][j]}"))

    nics = tuple(Nic(nic_names.get(column, column), tuple(nic_links[k]))
                 for k, column in enumerate(devices[gpu_count:]))
    return assemble(_gpus(gpu_cells, affinities), links, nics, numa_memory)


def assemble(gpus: list[Gpu], links: list[list[Link | None]], nics: tuple[Nic, ...] = (),
             numa_memory: Mapping[int, int] | None = None) -> GpuTopology:
    """The topology of these GPUs, links and NICs, whoever read them (this
    parser, or the node agent through NVML): when no GPU has a known NUMA
    node, they are grouped by CPU affinity; every NUMA node a GPU belongs to
    is declared with its GPUs' CPUs and ``numa_memory`` (bytes by node id)."""
    if all(g.numa is None for g in gpus):
        gpus = [replace(g, numa=numa) for g, numa in zip(gpus, _numa_from_cpus([g.cpus for g in gpus]))]
    numa_ids = sorted({g.numa for g in gpus if g.numa is not None})
    numa_nodes = tuple(
        NumaNode(n, frozenset().union(*(g.cpus for g in gpus if g.numa == n)), (numa_memory or {}).get(n, 0))
        for n in numa_ids)
    return GpuTopology(tuple(gpus), tuple(tuple(row) for row in links), nics, numa_nodes)


def _split_columns(columns: list[str], line: int) -> tuple[list[str], list[str]]:
    """Device columns (GPUs then NICs) and the affinity columns after them."""
    affinity_names = set(_AFFINITY_COLUMNS.values())
    first_affinity = next((k for k, c in enumerate(columns) if c in affinity_names), len(columns))
    devices, affinities = columns[:first_affinity], columns[first_affinity:]
    for k, column in enumerate(affinities):
        if column not in affinity_names or column in affinities[:k]:
            raise TopologyParseError(line, f"unexpected column {column!r} among the affinity columns")
    gpu_columns = [c for c in devices if _GPU_COLUMN.match(c)]
    if gpu_columns != [f"GPU{i}" for i in range(len(gpu_columns))] or devices[:len(gpu_columns)] != gpu_columns:
        raise TopologyParseError(line, "GPU columns must come first and be GPU0, GPU1, ... in order; "
                                       f"found {' '.join(devices)}")
    if len(set(devices)) != len(devices):
        raise TopologyParseError(line, "a device column is named twice")
    return devices, affinities


def _row(line: str, number: int, devices: list[str], affinities: list[str]) -> tuple[str, list[str], list[str]]:
    tokens = list(_TOKEN.finditer(line))
    name = tokens[0].group()
    if name not in devices:
        raise TopologyParseError(number, f"{name!r} is neither a GPU nor a NIC of the header")
    cells = [t.group() for t in tokens[1:len(devices) + 1]]
    if len(cells) < len(devices):
        raise TopologyParseError(number, f"row {name} has {len(cells)} device cells, the header names "
                                         f"{len(devices)}")
    if not _GPU_COLUMN.match(name):
        return name, cells, []  # NIC rows carry no affinity columns
    rest = line[tokens[len(devices)].end():]
    if "\t" in rest:
        # Tabs separate cells, so an empty cell (no CPU affinity) stays visible;
        # the text before the first tab is what followed the last device cell.
        first, *tail = rest.split("\t")
        tail = [first.strip()] + tail if first.strip() else tail
        values = [tail[0].strip()] + [c.strip() for c in tail[1:] if c.strip()] if tail else []
    else:
        values = rest.split()
        values = [""] * (len(affinities) - len(values)) + values  # a missing cell is the leading one
    if len(values) > len(affinities):
        raise TopologyParseError(number, f"row {name} has {len(values)} affinity cells, the header names "
                                         f"{len(affinities)} ({', '.join(affinities) or 'none'})")
    return name, cells, values + [""] * (len(affinities) - len(values))


def _link(cell: str, number: int, what: str) -> Link:
    try:
        return Link.parse(cell)
    except TopologyError as exc:
        raise TopologyParseError(number, f"{what}: {exc}") from None


def _nic_legend(lines: list[str]) -> dict[str, str]:
    """``NIC0: mlx5_0`` entries of the NIC Legend, by column name."""
    names: dict[str, str] = {}
    in_legend = False
    for line in lines:
        if line.strip().startswith("NIC Legend"):
            in_legend = True
        elif in_legend and (match := _NIC_LEGEND.match(line)):
            names[match.group(1)] = match.group(2)
    return names


def _gpus(gpu_cells: list[tuple[int, list[str]]], affinities: list[str]) -> list[Gpu]:
    cpus: list[frozenset[int]] = []
    numas: list[int | None] = []
    for number, values in gpu_cells:
        cell = dict(zip(affinities, values))
        try:
            cpus.append(parse_cpu_list(cell.get(CPU_AFFINITY, "")))
        except TopologyError as exc:
            raise TopologyParseError(number, f"CPU affinity: {exc}") from None
        numa = cell.get(NUMA_AFFINITY, "")
        try:
            nodes = parse_cpu_list(numa)  # a NUMA affinity has the cpulist format too
        except TopologyError:
            raise TopologyParseError(number, f"NUMA affinity {numa!r} is not a NUMA node list") from None
        numas.append(next(iter(nodes)) if len(nodes) == 1 else None)
        gpu_numa = cell.get(GPU_NUMA_ID, "")
        if gpu_numa not in ("", "N/A") and not gpu_numa.isdigit():
            raise TopologyParseError(number, f"GPU NUMA ID {gpu_numa!r} is neither a number nor N/A")
    return [Gpu(i, numas[i], cpus[i]) for i in range(len(gpu_cells))]


def _numa_from_cpus(cpus: list[frozenset[int]]) -> list[int | None]:
    """One NUMA node per distinct CPU affinity, if those are disjoint."""
    distinct = sorted({c for c in cpus if c}, key=min)
    if any(a & b for k, a in enumerate(distinct) for b in distinct[k + 1:]):
        return [None] * len(cpus)
    return [distinct.index(c) if c else None for c in cpus]
