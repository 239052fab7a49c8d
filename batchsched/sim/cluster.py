"""Simulated nodes: a cluster file (YAML or CSV, docs/simulator.md) to the
core's ``NodeInfo``, made from Node objects as the API server sends them, so
the decision core reads allocatable, labels and the GPU topology annotation
exactly as in a cluster.  Nodes whose GPUs NVIDIA's DRA driver serves
(``gpuSource: dra``) get its DeviceClass and a ResourceSlice each instead of
device-plugin allocatable, made from the same JSON (batchsched/sim/dra.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Mapping

import yaml

from batchsched.api import constants
from batchsched.core.dra.model import (
    MAX_DEVICES_PER_SLICE, DeviceClass, ResourceSlice, class_from_json, slice_from_json,
)
from batchsched.core.model import NodeInfo
from batchsched.core.readers import node_from_json
from batchsched.core.topology.annotation import from_annotation, from_document, to_annotation
from batchsched.core.topology.model import GpuTopology, TopologyError
from batchsched.core.topology.parse import parse_topo
from batchsched.sim import dra
from batchsched.sim.files import InputError, Record, read_csv, read_yaml

DEFAULTS = Path(__file__).parent / "defaults"  # the embedded scenario, shipped as package data
NO_TOPOLOGY = "none"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
DEVICE_PLUGIN, DRA = "device-plugin", "dra"  # gpuSource: who serves the node's nvidia.com/gpu
_FIELDS = {"name", "count", "gpus", "cpu", "memory", "pods", "topology", "labels", "gpuSource"}


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
    gpu_source: str = DEVICE_PLUGIN  # DRA: NVIDIA's DRA driver publishes the GPUs

    @property
    def by_dra(self) -> bool:
        return self.gpu_source == DRA and self.gpus > 0

    def node_names(self) -> list[str]:
        return [self.name] if self.count == 1 else [f"{self.name}-{i}" for i in range(self.count)]

    def node_topology(self, name: str) -> GpuTopology | None:
        """The node's topology annotation; on a DRA node with the GPUs'
        uuids and bus ids, which its slice publishes too."""
        if self.topology is None or not self.by_dra:
            return self.topology
        return dra.identified(self.topology, name)

    def node_objects(self) -> list[dict]:
        """The Node objects, as the API server would send them."""
        allocatable = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        if self.gpus and not self.by_dra:  # no device plugin on a DRA node: its GPUs are in its slice
            allocatable[constants.GPU_RESOURCE] = str(self.gpus)
        labels = {INSTANCE_TYPE_LABEL: self.topology_name if self.topology else self.name, **self.labels}
        objects = []
        for name in self.node_names():
            topology = self.node_topology(name)
            annotations = {constants.GPU_TOPOLOGY_ANNOTATION: to_annotation(topology)} if topology else {}
            objects.append({"metadata": {"name": name, "labels": {**labels, "kubernetes.io/hostname": name},
                                         "annotations": annotations},
                            "status": {"capacity": allocatable, "allocatable": allocatable,
                                       "conditions": [{"type": "Ready", "status": "True"}]}})
        return objects

    def resource_slices(self) -> list[dict]:
        """On DRA nodes, each node's ResourceSlice, as NVIDIA's driver publishes it."""
        if not self.by_dra:
            return []
        return [dra.node_slice(name, self.gpus, self.node_topology(name)) for name in self.node_names()]


@dataclass(frozen=True)
class DraObjects:
    """The DRA objects of a simulated cluster, as the scheduler's cache holds them."""

    classes: tuple[DeviceClass, ...] = ()
    slices: tuple[ResourceSlice, ...] = ()


def build_nodes(groups: list[NodeGroup]) -> dict[str, NodeInfo]:
    nodes: dict[str, NodeInfo] = {}
    for group in groups:
        for obj in group.node_objects():
            node = node_from_json(obj)
            if node.name in nodes:
                raise InputError(f"node {node.name} is defined twice")
            nodes[node.name] = node
    return nodes


def build_dra(groups: list[NodeGroup]) -> DraObjects:
    """NVIDIA's DeviceClass and the slices of the DRA nodes (none without any)."""
    slices = tuple(slice_from_json(obj) for group in groups for obj in group.resource_slices())
    return DraObjects((class_from_json(dra.device_class()),), slices) if slices else DraObjects()


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
    gpu_source = record.choice("gpuSource", (DEVICE_PLUGIN, DRA), DEVICE_PLUGIN)
    if gpu_source == DRA and gpus > MAX_DEVICES_PER_SLICE:
        raise record.error("gpus", f"a DRA node's slice holds at most {MAX_DEVICES_PER_SLICE} devices, got {gpus}")
    return NodeGroup(
        name=record.text("name"), gpus=gpus, cpu=record.quantity("cpu", "cpu", "64"),
        memory=record.quantity("memory", "memory", "512Gi"), count=record.integer("count", 1, minimum=1),
        pods=record.integer("pods", 110, minimum=1), topology=topology,
        topology_name=topology_name if topology is not None else NO_TOPOLOGY, labels=record.labels("labels"),
        gpu_source=gpu_source)


def describe_cluster(groups: list[NodeGroup]) -> str:
    """``48 nodes, 384 GPUs: 12 dgx1-v100, ...`` (and ``, 128 through DRA`` when some are)"""
    kinds: dict[str, int] = {}
    for g in groups:
        kind = g.topology_name if g.topology is not None else f"{g.gpus}-GPU, no topology"
        kinds[kind] = kinds.get(kind, 0) + g.count
    nodes = sum(g.count for g in groups)
    gpus = sum(g.count * g.gpus for g in groups)
    by_dra = sum(g.count * g.gpus for g in groups if g.by_dra)
    through_dra = f", {by_dra} through DRA" if by_dra else ""
    return f"{nodes} nodes, {gpus} GPUs{through_dra}: " + ", ".join(f"{n} {k}" for k, n in kinds.items())

