"""The node annotation ``scheduling.batchsched.io/gpu-topology``: a node's
topology as compact, versioned JSON (docs/topology.md documents the schema).

Version 1::

    {"version": 1,
     "gpus": [{"index": 0, "numa": 0, "cpus": "0-19,40-59",
               "uuid": "GPU-...", "pciBusId": "00000000:07:00.0", "mig": true}, ...],
     "links": ["NV1 NV1 NV2 NV2 SYS SYS SYS", "NV2 NV1 SYS NV2 SYS SYS", ...],
     "nics": [{"name": "mlx5_0", "links": "PIX PIX PHB PHB SYS SYS SYS SYS"}],
     "numa": [{"id": 0, "cpus": "0-19,40-59", "memory": 274877906944}]}

``links[i]`` lists the links from GPU i to GPUs i+1..n-1, so an n-GPU node
has n-1 rows.  ``numa``, ``cpus``, ``uuid``, ``pciBusId``, ``mig`` (MIG mode on), ``nics`` and
``memory`` are optional; a NIC link of ``-`` is unknown.  Unknown keys are
ignored, so a newer writer may add some without breaking older readers.

Bounds (docs/topology.md): at most ``MAX_ANNOTATION_BYTES`` of text, JSON
nested at most ``MAX_NESTING`` deep (a valid document is 3 deep), at most
``MAX_GPUS`` GPUs and the CPU, NUMA and NVLink bounds of the model; anything
beyond is refused with a TopologyError before the costly work.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from itertools import accumulate
from typing import Any

from batchsched.core.resources import MAX_CANONICAL
from batchsched.core.topology.model import (
    MAX_GPUS, Gpu, GpuTopology, Link, Nic, NumaNode, TopologyError, format_cpu_list, parse_cpu_list,
)

SCHEMA_VERSION = 1
_UNKNOWN_LINK = "-"
MAX_ANNOTATION_BYTES = 32 * 1024  # a 16-GPU node with NICs writes about 4 KiB
MAX_NESTING = 8
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def to_document(topology: GpuTopology) -> dict[str, Any]:
    n = len(topology)
    gpus = []
    for gpu in topology.gpus:
        entry: dict[str, Any] = {"index": gpu.index}
        if gpu.numa is not None:
            entry["numa"] = gpu.numa
        if gpu.cpus:
            entry["cpus"] = format_cpu_list(gpu.cpus)
        if gpu.uuid:
            entry["uuid"] = gpu.uuid
        if gpu.pci_bus_id:
            entry["pciBusId"] = gpu.pci_bus_id
        if gpu.mig:
            entry["mig"] = True
        gpus.append(entry)
    document: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "gpus": gpus,
        "links": [" ".join(str(topology.link(i, j)) for j in range(i + 1, n)) for i in range(n - 1)],
    }
    if topology.nics:
        document["nics"] = [{"name": nic.name, "links": " ".join(str(x) if x else _UNKNOWN_LINK for x in nic.links)}
                            for nic in topology.nics]
    if topology.numa_nodes:
        document["numa"] = [{"id": node.id, "cpus": format_cpu_list(node.cpus),
                             **({"memory": node.memory} if node.memory else {})} for node in topology.numa_nodes]
    return document


def to_annotation(topology: GpuTopology) -> str:
    return json.dumps(to_document(topology), separators=(",", ":"))


@lru_cache(maxsize=1024)
def from_annotation(text: str) -> GpuTopology:
    """Read the annotation; raises TopologyError saying what is wrong.

    Cached: nodes that carry the same annotation share one topology object,
    and an unchanged annotation is not parsed again on every node update.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    _check(size <= MAX_ANNOTATION_BYTES, f"{size} bytes: the annotation may hold at most {MAX_ANNOTATION_BYTES}")
    _check(_nesting(text) <= MAX_NESTING, f"JSON nested deeper than {MAX_NESTING} levels")
    try:
        document = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or an integer of too many digits
        raise TopologyError(f"not JSON: {exc}") from None
    return from_document(document)


def _nesting(text: str) -> int:
    """How deep the JSON text nests arrays and objects (brackets inside
    strings do not count), found without parsing it: the parser recurses."""
    steps = (1 if bracket in "[{" else -1 for bracket in _BRACKET.findall(_JSON_STRING.sub("", text)))
    return max(accumulate(steps), default=0)


def from_document(document: Any) -> GpuTopology:
    _check(isinstance(document, dict), "the value must be a JSON object")
    version = document.get("version")
    _check(version == SCHEMA_VERSION, f"version {version!r} is not supported (this reads version {SCHEMA_VERSION})")
    raw_gpus = document.get("gpus")
    _check(isinstance(raw_gpus, list) and raw_gpus, "gpus must be a non-empty list")
    n = len(raw_gpus)
    _check(n <= MAX_GPUS, f"{n} GPUs: a topology may describe at most {MAX_GPUS}")
    gpus = [_gpu(k, raw) for k, raw in enumerate(raw_gpus)]
    rows = document.get("links")
    _check(isinstance(rows, list) and len(rows) == n - 1 and all(isinstance(r, str) for r in rows),
           f"links must be a list of {n - 1} strings, one per GPU but the last")
    links: list[list[Link | None]] = [[None] * n for _ in range(n)]
    for i, row in enumerate(rows):
        cells = row.split()
        _check(len(cells) == n - 1 - i, f"links[{i}] must list {n - 1 - i} links (GPU{i} to GPU{i + 1}..GPU{n - 1})")
        for j, cell in enumerate(cells, i + 1):
            links[i][j] = links[j][i] = Link.parse(cell)
    nics = tuple(_nic(k, raw, n) for k, raw in enumerate(_list(document, "nics")))
    numa_nodes = tuple(_numa(k, raw) for k, raw in enumerate(_list(document, "numa")))
    return GpuTopology(tuple(gpus), tuple(tuple(row) for row in links), nics, numa_nodes)


def _check(condition: bool, problem: str) -> None:
    if not condition:
        raise TopologyError(problem)


def _list(document: dict, key: str) -> list:
    value = document.get(key, [])
    _check(isinstance(value, list), f"{key} must be a list")
    return value


def _int(raw: dict, key: str, where: str) -> int | None:
    value = raw.get(key)
    _check(value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and 0 <= value <= MAX_CANONICAL),
           f"{where}.{key} must be a non-negative integer, at most {MAX_CANONICAL}")
    return value


def _gpu(k: int, raw: Any) -> Gpu:
    where = f"gpus[{k}]"
    _check(isinstance(raw, dict), f"{where} must be an object")
    _check(raw.get("index") == k, f"{where}.index must be {k}")
    return Gpu(k, _int(raw, "numa", where), parse_cpu_list(str(raw.get("cpus", ""))),
               str(raw.get("uuid", "")), str(raw.get("pciBusId", "")), raw.get("mig") is True)


def _nic(k: int, raw: Any, gpu_count: int) -> Nic:
    where = f"nics[{k}]"
    _check(isinstance(raw, dict) and isinstance(raw.get("name"), str) and isinstance(raw.get("links"), str),
           f"{where} must be an object with a name and links")
    cells = raw["links"].split()
    _check(len(cells) == gpu_count, f"{where}.links must list {gpu_count} links, one per GPU")
    return Nic(raw["name"], tuple(None if c == _UNKNOWN_LINK else Link.parse(c) for c in cells))


def _numa(k: int, raw: Any) -> NumaNode:
    where = f"numa[{k}]"
    _check(isinstance(raw, dict), f"{where} must be an object")
    node_id = _int(raw, "id", where)
    _check(node_id is not None, f"{where}.id is missing")
    return NumaNode(node_id, parse_cpu_list(str(raw.get("cpus", ""))), _int(raw, "memory", where) or 0)
