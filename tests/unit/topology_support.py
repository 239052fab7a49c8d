"""Topologies for the tests: the project's fixtures and the shared captures."""
from __future__ import annotations

from pathlib import Path

from batchsched.api import constants
from batchsched.core.model import NodeInfo
from batchsched.core.readers import node_from_json
from batchsched.core.topology.annotation import to_annotation
from batchsched.core.topology.model import GpuTopology
from batchsched.core.topology.parse import parse_topo

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "topologies"
SHARED_TOPOLOGIES = ROOT.parent / "shared" / "data" / "topologies"

# Well-formed fixtures of this project (the variants exercise parser quirks).
FIXTURE_NAMES = sorted(p.name for p in FIXTURES.glob("*.txt") if not p.name.startswith("malformed-"))


def fixture(name: str) -> GpuTopology:
    return parse_topo((FIXTURES / name).read_text())


def topology_node(name: str, topology: GpuTopology | None = None, *, gpus: int | None = None,
                  cpu: str = "64", memory: str = "512Gi", labels=None, annotation: str | None = None,
                  extra=None, capacity: int | None = None) -> NodeInfo:
    """A Ready node carrying ``topology`` (or a raw ``annotation``) the way the API server sends it;
    ``capacity``: its status.capacity nvidia.com/gpu, when it differs from allocatable."""
    annotations = {}
    if topology is not None:
        annotations[constants.GPU_TOPOLOGY_ANNOTATION] = to_annotation(topology)
    if annotation is not None:
        annotations[constants.GPU_TOPOLOGY_ANNOTATION] = annotation
    count = gpus if gpus is not None else (len(topology) if topology else 8)
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110", **(extra or {})}
    if count:
        allocatable[constants.GPU_RESOURCE] = str(count)
    status = {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]}
    if capacity is not None:
        status["capacity"] = {**allocatable, constants.GPU_RESOURCE: str(capacity)}
    return node_from_json({"metadata": {"name": name, "labels": labels or {}, "annotations": annotations},
                           "status": status})
