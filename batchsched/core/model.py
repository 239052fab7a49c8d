"""The decision core's view of the cluster: plain, immutable value objects.

The shell turns Kubernetes JSON (as the API server sends it) into these with
the ``*_from_json`` functions of ``core/readers.py``; the core never sees a
client object.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Mapping

from batchsched.api import constants
from batchsched.core import gangsources
from batchsched.core.dra.demand import DeviceDemand, PodClaim
from batchsched.core.dra.inventory import NodeDra
from batchsched.core.resources import Resources
from batchsched.core.topology.annotation import from_annotation
from batchsched.core.topology.model import GpuTopology, TopologyError

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# Controllers that keep their pods running and replace any that ends.
ENDLESS_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "DaemonSet", "ReplicationController"})


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{{{self.key}: {self.value}}}" if self.value else f"{{{self.key}: }}"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty matches every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class SelectorRequirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return present and value in self.values
        if op == "NotIn":
            return not present or value not in self.values
        if op == "Exists":
            return present
        if op == "DoesNotExist":
            return not present
        if op in ("Gt", "Lt") and present and len(self.values) == 1:
            try:
                left, right = int(value), int(self.values[0])
            except (TypeError, ValueError):
                return False
            return left > right if op == "Gt" else left < right
        return False


@dataclass(frozen=True)
class NodeSelectorTerm:
    """Requirements ANDed together; a pod's terms are ORed."""

    match_expressions: tuple[SelectorRequirement, ...] = ()
    match_fields: tuple[SelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str], node_name: str) -> bool:
        if not self.match_expressions and not self.match_fields:
            return False  # an empty term matches nothing (API semantics)
        fields = {"metadata.name": node_name}
        return all(r.matches(labels) for r in self.match_expressions) and all(
            r.matches(fields) for r in self.match_fields
        )


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    scheduler_name: str = constants.DEFAULT_SCHEDULER_NAME
    node_name: str = ""
    phase: str = "Pending"
    terminating: bool = False
    deleted: float = 0.0  # metadata.deletionTimestamp, unix seconds (0: not being deleted, or not known)
    requests: Resources = field(default_factory=dict)
    priority: int = 0
    group: str = ""  # PodGroup name ("" = not in a group)
    group_source: str = ""  # whose PodGroup: "" ours, else a foreign gang source (core/gangsources)
    group_total: int = 0  # the size its pods state (Kueue's total-count, LWS's size; 0: none valid)
    task: str = ""  # its role in a Volcano gang (annotation volcano.sh/task-spec), for minTaskMember
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity_terms: tuple[NodeSelectorTerm, ...] = ()  # required node affinity
    tolerations: tuple[Toleration, ...] = ()
    gated: bool = False  # has spec.schedulingGates
    created: float = 0.0  # unix seconds
    resource_version: str = ""
    gpu_ids: tuple[int, ...] = ()  # from the gpu-ids annotation, once bound (the shell keeps only trusted ones)
    gpu_ids_actual: tuple[int, ...] = ()  # the GPUs the kubelet gave it, per the node agent (gpu-ids-actual)
    nominated_node: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    priority_class: str = ""
    started: float = 0.0  # status.startTime (0: not started)
    preemptible: bool = True  # False: annotation scheduling.batchsched.io/preemptible=false
    # Its last checkpoint (annotation scheduling.batchsched.io/checkpoint-time),
    # unix seconds; 0: none, or the value made no sense (checkpoint_problem says why).
    checkpoint: float = 0.0
    checkpoint_problem: str = ""
    preemption_policy: str = "PreemptLowerPriority"  # or Never, from its PriorityClass
    # This process made (or saw being made) the pod's binding, while the pod
    # was in the gang it is in now: the pod may give that gang precedence
    # (core/gangs.py).  A pod created with spec.nodeName, bound by anyone
    # else, or found bound at a start, is not (a start believes only its
    # PodGroup's status: GroupSpec.recorded_bindings).
    bound_by_scheduler: bool = False
    owner_kind: str = ""  # kind of its controller (the ownerReference with controller: true)
    restart_policy: str = "Always"
    active_deadline_seconds: int | None = None
    # Its PodScheduled condition as (status, reason, message), () when it has none:
    # the shell writes it for pending pods only when it changes.
    scheduled_condition: tuple[str, str, str] = ()
    # (index, name, nvidia.com/gpu) of each container asking GPUs, init
    # containers first (kube-scheduler's numbering of extended-resource requests)
    gpu_containers: tuple[tuple[int, str, int], ...] = ()
    claims: tuple[PodClaim, ...] = ()  # spec.resourceClaims
    # What its claims ask, joined by ClusterState while it awaits placement
    # (core/dra/demand.py); None: it has no claims, or is placed.
    device_demand: DeviceDemand | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def awaits_placement(self) -> bool:
        """Unbound, live, and not held back by scheduling gates: a scheduler's to place."""
        return not self.node_name and not self.terminal and not self.terminating and not self.gated

    @property
    def holds_resources(self) -> bool:
        """A bound pod counts against its node until it is terminal."""
        return bool(self.node_name) and not self.terminal

    @property
    def runs_to_completion(self) -> bool:
        """Whether the pod ends by itself (docs/queueing.md, "Which pods
        drain"): not kept running by a controller, and either killed at a
        deadline or with containers that are not restarted once they exit."""
        if self.owner_kind in ENDLESS_OWNERS:
            return False
        return self.active_deadline_seconds is not None or self.restart_policy in ("Never", "OnFailure")

    @property
    def ends_by(self) -> float | None:
        """When the kubelet kills it at its activeDeadlineSeconds; None if it
        has none or has not started."""
        if self.active_deadline_seconds is None or not self.started:
            return None
        return self.started + self.active_deadline_seconds

    @functools.cached_property  # read for every pod by every pass over pods; the instance is frozen
    def gang_key(self) -> str:
        """The gang this pod belongs to: its PodGroup, or itself alone."""
        if self.group:
            return gangsources.gang_key(self.namespace, self.group_source, self.group)
        return f"{self.namespace}/pod:{self.name}"


_POD_FIELDS = frozenset(PodInfo.__dataclass_fields__)
_BLANK_POD_STATE = dict(PodInfo("", "", "").__dict__)


def new_pod(fields: dict[str, Any]) -> PodInfo:
    """A PodInfo of the blank one's defaults and ``fields``, made without
    ``__init__`` (which sets each of its forty fields through setattr);
    the caller names only PodInfo fields (a test holds pod_from_json to it)."""
    new = object.__new__(PodInfo)
    state = new.__dict__
    state.update(_BLANK_POD_STATE)
    state.update(fields)
    return new


def pod_with(pod: PodInfo, **changes: Any) -> PodInfo:
    """``dataclasses.replace(pod, **changes)`` at a fifth of its cost: the
    shell does it for every watch event of a bound pod, and ``replace``
    runs ``__init__`` over every field.  Values cached on the instance
    (``gang_key``, the shape key) are not carried over: a change may void them."""
    unknown = changes.keys() - _POD_FIELDS
    if unknown:
        raise TypeError(f"PodInfo has no field {', '.join(sorted(unknown))}")
    new = object.__new__(PodInfo)
    state = new.__dict__
    state.update({name: value for name, value in pod.__dict__.items() if name in _POD_FIELDS})
    state.update(changes)
    return new


@dataclass(frozen=True)
class NodeInfo:
    name: str
    allocatable: Resources
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    # From the gpu-topology annotation; None: topology unknown, GPUs treated as flat.
    topology: GpuTopology | None = None
    topology_error: str = ""  # why a present annotation was not used
    gpu_capacity: int = 0  # the device plugin's nvidia.com/gpu capacity (unhealthy GPUs too)
    # Its DRA GPUs (ResourceSlices), joined by ClusterState (``with_dra``); None: none.
    dra: NodeDra | None = None
    # nvidia.com/gpu is served through DRA here (``with_dra``): then
    # ``allocatable`` counts the DRA GPUs a class serves it with.
    gpus_by_dra: bool = False
    # The node agent's BatchschedGPUReady condition: (status, reason, message); (): no agent reports.
    gpu_agent: tuple[str, str, str] = ()


@dataclass(frozen=True)
class TopologyPolicy:
    """A PodGroup's spec.topologyPolicy (docs/topology.md)."""

    numa: str = "none"
    gpu_link: str = "prefer-nvlink"
    exclusive_gpus: bool = False  # never on time-sliced or MPS-shared GPUs
    domain_mode: str = ""  # "" (no domain rule), required or preferred
    domain_labels: tuple[str, ...] = ()  # the domain's label keys; empty: the scheduler's configured ones
    # Prefer GPUs with GPUDirect RDMA (a NIC at PIX/PXB): set by the cycle for
    # gangs of two or more pods, whose pods talk across nodes; not a PodGroup field.
    rdma: bool = False


@dataclass(frozen=True)
class GroupSpec:
    """A PodGroup as the core needs it (see batchsched.api.podgroup)."""

    namespace: str
    name: str
    min_member: int = 1
    priority: int | None = None  # from spec.priorityClassName; None: take the members'
    source: str = ""  # "" our PodGroup, else the foreign gang source it was read from
    created: float = 0.0
    schedule_timeout_seconds: int | None = None
    min_resources: Resources = field(default_factory=dict)
    generation: int = 0
    topology: TopologyPolicy = TopologyPolicy()
    priority_class: str = ""
    preemption_policy: str = "PreemptLowerPriority"  # or Never: this gang never preempts
    preemptible: bool = True  # False: its pods are never victims
    queue: str = ""  # spec.queue; "": the configured default queue
    # A JobSet's replicated Jobs: (name, pods it runs at once, completions in
    # all) in order; min_member is then what the stages still run, only of
    # those started when it starts them in turn (core/gangsources/jobsets.py).
    stages: tuple[tuple[str, int, int], ...] = ()
    stages_in_turn: bool = False
    # Volcano's minTaskMember: (task, members of it the gang needs), sorted;
    # a pod's task is its annotation volcano.sh/task-spec.
    min_task_members: tuple[tuple[str, int], ...] = ()
    expected_runtime_seconds: int | None = None  # spec.expectedRuntimeSeconds: a hint (core/queueing/runtime.py)
    # The owner Job's activeDeadlineSeconds (of a JobSet: the longest of its
    # replicated Jobs', if each has one): enforced by the Job controller
    # (core/queueing/runtime.py).
    job_deadline_seconds: int | None = None
    # UIDs of members its status.boundByScheduler names as bound by
    # batchsched: tenants cannot write status, so this outlives a restart
    # (docs/binding.md).  Only our own PodGroups have such a place.
    recorded_bindings: frozenset[str] = frozenset()

    @property
    def key(self) -> str:
        return gangsources.gang_key(self.namespace, self.source, self.name)


def annotated_topology(node: NodeInfo) -> GpuTopology | None:
    """The topology the node's annotation describes, whether or not its GPU
    count matches what the node advertises (None: absent or invalid)."""
    annotation = node.annotations.get(constants.GPU_TOPOLOGY_ANNOTATION)
    if annotation is None:
        return None
    try:
        return from_annotation(annotation)
    except TopologyError:
        return None


def with_dra(node: NodeInfo, dra: NodeDra | None) -> NodeInfo:
    """The node as the scheduler uses it: with its DRA GPUs, and its
    topology checked against them and the device plugin's GPUs together
    (a node may serve some GPUs each way)."""
    if dra is None and node.dra is None:
        return node
    gpus = len(dra.gpus) if dra is not None else 0
    topology, topology_error = node_topology(
        node.name, node.annotations.get(constants.GPU_TOPOLOGY_ANNOTATION), node.allocatable, node.gpu_capacity,
        node.labels, gpus)
    if topology is None and dra is not None and dra.mask:  # the GPUs are flat: no index means anything
        dra = dataclasses.replace(dra, gpus=tuple(dataclasses.replace(g, index=None, mapped_by="") for g in dra.gpus))
    # kube-scheduler's rule: DRA serves the extended resource only where the
    # node does not advertise it (on a node that does, the device plugin does).
    by_dra = dra is not None and dra.extended and not node.allocatable.get(constants.GPU_RESOURCE, 0)
    allocatable = node.allocatable
    if by_dra:
        allocatable = {**allocatable, constants.GPU_RESOURCE: sum(1 for g in dra.gpus if g.extended_class)}
    return dataclasses.replace(node, dra=dra, topology=topology, topology_error=topology_error,
                               allocatable=allocatable, gpus_by_dra=by_dra)


def device_plugin_gpus(node: NodeInfo) -> int:
    """The node's nvidia.com/gpu from the device plugin (none where DRA serves it)."""
    return 0 if node.gpus_by_dra else node.allocatable.get(constants.GPU_RESOURCE, 0)


def gpu_replicas(labels: Mapping[str, str]) -> int | None:
    """How many pods share each GPU, from GPU feature discovery's labels: 1
    when not shared (time-slicing, MPS, replicas > 1); None when shared by a
    count the labels do not give."""
    replicas = labels.get(constants.GPU_REPLICAS_LABEL, "1")
    if replicas.isascii() and replicas.isdigit() and int(replicas) > 1:
        return int(replicas)
    return None if labels.get(constants.GPU_SHARING_STRATEGY_LABEL, "none") in ("time-slicing", "mps") else 1


def has_mig_devices(labels: Mapping[str, str], allocatable: Mapping[str, int]) -> bool:
    """The node's GPUs are carved into MIG devices."""
    return labels.get(constants.MIG_STRATEGY_LABEL) == "single" or any(
        name.startswith(constants.MIG_RESOURCE_PREFIX) for name in allocatable)


def node_topology(node_name: str, annotation: str | None, allocatable: Mapping[str, int], capacity: int,
                   labels: Mapping[str, str], dra_gpus: int = 0) -> tuple[GpuTopology | None, str]:
    """The node's topology, or None and why a present annotation is unusable.

    Each nvidia.com/gpu is one GPU, or one of ``replicas`` shares of one on
    a node that shares them.  The topology must cover every allocatable GPU
    and describe no more than the node has: its capacity (which counts
    unhealthy GPUs too), else its allocatable.  Where the count cannot tell
    (MIG devices, or sharing without a replica count), only the topology's
    own bounds hold.  ``dra_gpus`` more GPUs are served through DRA.
    """
    if annotation is None:
        return None, ""
    where = f"node {node_name}: annotation {constants.GPU_TOPOLOGY_ANNOTATION}"
    try:
        topology = from_annotation(annotation)
    except TopologyError as exc:
        return None, f"{where} is invalid: {exc}"
    replicas = gpu_replicas(labels)
    if replicas is None or has_mig_devices(labels, allocatable):
        return topology, ""
    gpus = allocatable.get(constants.GPU_RESOURCE, 0) + dra_gpus * replicas
    capacity += dra_gpus * replicas
    shares = f" ({replicas} replicas per GPU)" if replicas > 1 else ""
    through_dra = f", {dra_gpus} of them through DRA" if dra_gpus else ""
    if gpus > len(topology) * replicas:
        return None, (f"{where} describes {len(topology)} GPUs but the node allocates {gpus} "
                      f"{constants.GPU_RESOURCE}{shares}{through_dra}")
    if len(topology) * replicas > max(gpus, capacity):
        return None, (f"{where} describes {len(topology)} GPUs, more than the node has: {max(gpus, capacity)} "
                      f"{constants.GPU_RESOURCE}{shares}{through_dra}")
    return topology, ""
