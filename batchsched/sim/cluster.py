"""Simulated nodes: a cluster file (YAML or CSV, docs/simulator.md) to the
core's ``NodeInfo``, made from Node objects as the API server sends them, so
the decision core reads allocatable, labels and the GPU topology annotation
exactly as in a cluster."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Mapping

import yaml

from batchsched.api import constants
from batchsched.core.model import NodeInfo, node_from_json
from batchsched.core.topology.annotation import from_annotation, from_document, to_annotation
from batchsched.core.topology.model import GpuTopology, TopologyError
from batchsched.core.topology.parse import parse_topo
from batchsched.sim.files import InputError, Record, read_csv, read_yaml

DEFAULTS = Path(__file__).parent / "defaults"  # the embedded scenario, shipped as package data
NO_TOPOLOGY = "none"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
_FIELDS = {"name", "count", "gpus", "cpu", "memory", "pods", "topology", "labels"}


@dataclass(frozen=True)
class NodeGroup:
    """``count`` alike nodes, named ``name-0``, ``name-1``, ... (or ``name`` alone)."""

    name: str
    gpus: int
    cpu: str = "64"
    memory: str = "512Gi"
    count: int = 1
    pods: int = 110
    topology: GpuTopology | None = None
    topology_name: str = NO_TOPOLOGY  # what the file said, for the summary
    labels: Mapping[str, str] = field(default_factory=dict)

    def node_names(self) -> list[str]:
        return [self.name] if self.count == 1 else [f"{self.name}-{i}" for i in range(self.count)]

    def node_objects(self) -> list[dict]:
        """The Node objects, as the API server would send them."""
        annotations = {}
        if self.topology is not None:
            annotations[constants.GPU_TOPOLOGY_ANNOTATION] = to_annotation(self.topology)
        allocatable = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        if self.gpus:
            allocatable[constants.GPU_RESOURCE] = str(self.gpus)
        labels = {INSTANCE_TYPE_LABEL: self.topology_name if self.topology else self.name, **self.labels}
        return [{"metadata": {"name": name, "labels": {**labels, "kubernetes.io/hostname": name},
                              "annotations": annotations},
                 "status": {"capacity": allocatable, "allocatable": allocatable,
                            "conditions": [{"type": "Ready", "status": "True"}]}}
                for name in self.node_names()]


def build_nodes(groups: list[NodeGroup]) -> dict[str, NodeInfo]:
    nodes: dict[str, NodeInfo] = {}
    for group in groups:
        for obj in group.node_objects():
            node = node_from_json(obj)
            if node.name in nodes:
                raise InputError(f"node {node.name} is defined twice")
            nodes[node.name] = node
    return nodes


@lru_cache(maxsize=None)
def builtin_topologies() -> dict[str, GpuTopology]:
    """The named topologies of batchsched/sim/defaults/topologies.yaml."""
    documents = yaml.safe_load((DEFAULTS / "topologies.yaml").read_text())
    return {name: from_document(document) for name, document in documents.items()}


def resolve_topology(value: str, relative_to: Path) -> GpuTopology | None:
    """A built-in topology's name, ``none``, or a file: an ``nvidia-smi topo
    -m`` capture, or the annotation's JSON (``.json``); raises TopologyError
    or OSError."""
    if value == NO_TOPOLOGY:
        return None
    if value in builtin_topologies():
        return builtin_topologies()[value]
    path = relative_to / value
    if not path.is_file():
        raise TopologyError(f"{value!r} is neither a built-in topology ({', '.join(builtin_topologies())}, "
                            f"{NO_TOPOLOGY}) nor a file")
    text = path.read_text()
    return from_annotation(text.strip()) if path.suffix == ".json" else parse_topo(text)


def load_cluster(path: Path) -> list[NodeGroup]:
    """The node groups of a cluster file: YAML with a ``nodes`` list, or CSV
    with one group per row (docs/simulator.md)."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if path.suffix.lower() == ".csv":
        records = list(read_csv(path, {"name", "gpus"}, _FIELDS))
    else:
        top = read_yaml(path)
        top.check_known({"nodes"})
        records = top.records("nodes")
    if not records:
        raise InputError(f"{path}: line 1: no nodes")
    return [_node_group(r, path.parent) for r in records]


def _node_group(record: Record, base: Path) -> NodeGroup:
    record.check_known(_FIELDS)
    gpus = record.integer("gpus")
    topology_name = record.text("topology", NO_TOPOLOGY)
    try:
        topology = resolve_topology(topology_name, base)
    except (TopologyError, OSError) as exc:
        raise record.error("topology", str(exc)) from None
    if topology is not None and len(topology) != gpus:
        raise record.error("topology", f"{topology_name} has {len(topology)} GPUs but gpus is {gpus}")
    return NodeGroup(
        name=record.text("name"), gpus=gpus, cpu=record.quantity("cpu", "cpu", "64"),
        memory=record.quantity("memory", "memory", "512Gi"), count=record.integer("count", 1, minimum=1),
        pods=record.integer("pods", 110, minimum=1), topology=topology,
        topology_name=topology_name if topology is not None else NO_TOPOLOGY, labels=record.labels("labels"))


def describe_cluster(groups: list[NodeGroup]) -> str:
    """``48 nodes, 384 GPUs: 12 dgx1-v100, ...``"""
    kinds: dict[str, int] = {}
    for g in groups:
        kind = g.topology_name if g.topology is not None else f"{g.gpus}-GPU, no topology"
        kinds[kind] = kinds.get(kind, 0) + g.count
    nodes = sum(g.count for g in groups)
    gpus = sum(g.count * g.gpus for g in groups)
    return f"{nodes} nodes, {gpus} GPUs: " + ", ".join(f"{n} {k}" for k, n in kinds.items())

