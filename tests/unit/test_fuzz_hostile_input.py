"""Fuzzing what tenants (and broken node agents) can write: whatever the
input, the readers raise only their documented error, quickly, and a cycle
over hostile PodGroups never raises and still schedules a good gang.

Example counts are modest so that the file runs in seconds."""
from __future__ import annotations

import json
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.api import constants
from batchsched.config import ConfigError, SchedulerConfig, validate_config
from batchsched.core import resources as res
from batchsched.core.cycle import REASON_SCHEDULED, schedule_cycle
from batchsched.core import gangsources
from batchsched.core.gangsources import AUTO_GANG_LABEL, jobsets
from batchsched.core.readers import group_from_json, node_from_json, pod_from_json
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.topology.annotation import from_annotation, to_document
from batchsched.core.topology.model import TopologyError
from batchsched.core.topology.parse import parse_topo
from tests.unit.helpers import gang_pods, group, node, snapshot, stamp
from tests.unit.topology_support import FIXTURES, fixture, topology_node

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def quickly(call, *args, limit: float = 1.0):  # generous: a shared, loaded machine; unbounded work took hours
    start = time.perf_counter()
    try:
        return call(*args)
    finally:
        assert time.perf_counter() - start < limit


# ---- quantities ------------------------------------------------------------------------

quantity_like = st.from_regex(
    r"[+-]?[0-9]{0,30}(\.[0-9]{0,30})?([eE][+-]?[0-9]{1,12})?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?", fullmatch=True)


@FUZZ
@given(st.sampled_from([res.CPU, res.MEMORY, constants.GPU_RESOURCE]),
       quantity_like | st.text(max_size=100) | json_scalars | st.lists(st.integers(), max_size=2))
def test_a_quantity_parses_or_is_a_quantity_error_quickly(name, value):
    try:
        amount = quickly(res.canonical, name, value)
    except res.QuantityError:
        return
    assert abs(amount) <= res.MAX_CANONICAL
    assert res.format_amount(name, amount)  # what verdict messages print


# ---- topology annotations --------------------------------------------------------------

VALID = to_document(fixture("dgx1-hybrid-cube-mesh-8gpu.txt"))


@st.composite
def mutated_documents(draw) -> str:
    """The valid document with one field, GPU or list entry replaced by anything."""
    document = json.loads(json.dumps(VALID))
    where = draw(st.sampled_from(["top", "gpu", "links", "numa"]))
    value = draw(json_values | st.text(max_size=40) | st.sampled_from(["0-4294967295", "NV99999", "SOC"]))
    if where == "top":
        document[draw(st.sampled_from(["version", "gpus", "links", "nics", "numa", "extra"]))] = value
    elif where == "gpu":
        gpu = document["gpus"][draw(st.integers(0, 7))]
        gpu[draw(st.sampled_from(["index", "numa", "cpus", "uuid", "pciBusId"]))] = value
    elif where == "links":
        document["links"][draw(st.integers(0, 6))] = value
    else:
        document.setdefault("numa", [{"id": 0}]).append(value)
    return json.dumps(document)


deep_text = st.integers(1, 40_000).map(lambda n: "[" * n + "]" * n)


@FUZZ
@given(mutated_documents() | json_values.map(json.dumps) | st.text(max_size=200) | deep_text)
def test_an_annotation_reads_or_is_a_topology_error(text):
    try:
        topology = quickly(from_annotation, text)
    except TopologyError:
        return
    assert 1 <= len(topology) <= 16


@FUZZ
@given(st.one_of(mutated_documents(), json_values.map(json.dumps), deep_text),
       json_values, st.integers(0, 64))
def test_a_node_with_any_annotation_converts(annotation, labels, gpus):
    node_info = node_from_json({
        "metadata": {"name": "n", "annotations": {constants.GPU_TOPOLOGY_ANNOTATION: annotation},
                     "labels": labels if isinstance(labels, dict) and all(
                         isinstance(v, str) for v in labels.values()) else {}},
        "status": {"allocatable": {constants.GPU_RESOURCE: str(gpus)}}})
    assert node_info.topology is None or node_info.topology_error == ""


# ---- nvidia-smi topo -m text -----------------------------------------------------------

CAPTURES = sorted(p.read_text() for p in FIXTURES.glob("*.txt"))
TOKENS = ["GPU0", "GPU1", "GPU2", "GPU17", "NIC0", "mlx5_0", "X", "NV1", "NV12", "NV0", "SYS", "SOC", "PIX",
          "PXB", "PHB", "NODE", "N/A", "0-3", "0-4294967295", "4-1", "0", "1", "CPU Affinity", "NUMA Affinity",
          "GPU NUMA ID", "Legend:", "NIC Legend:", "NIC0: mlx5_0", "\x1b[4m", "\x1b[0m", "²"]


@st.composite
def topo_texts(draw) -> str:
    if draw(st.booleans()):  # a real capture, some of its tokens changed
        lines = draw(st.sampled_from(CAPTURES)).splitlines()
        for _ in range(draw(st.integers(1, 4))):
            k = draw(st.integers(0, len(lines) - 1))
            tokens = lines[k].split("\t")
            tokens[draw(st.integers(0, len(tokens) - 1))] = draw(st.sampled_from(TOKENS) | st.text(max_size=6))
            lines[k] = "\t".join(tokens)
        return "\n".join(lines)
    lines = draw(st.lists(st.lists(st.sampled_from(TOKENS), max_size=8), max_size=8))
    separator = draw(st.sampled_from(["\t", " ", "  "]))
    return "\n".join(separator.join(line) for line in lines)


@FUZZ
@given(topo_texts() | st.text(max_size=300))
def test_topology_text_parses_or_is_a_topology_error(text):
    try:
        topology = quickly(parse_topo, text)
    except TopologyError:
        return
    assert 1 <= len(topology) <= 16


# ---- PodGroups, alone and in a cycle ---------------------------------------------------

spec_values = {
    "minMember": st.integers(-5, 200_000) | json_scalars,
    "minResources": st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "x" * 300, ""]),
                                    quantity_like | json_scalars, max_size=4) | json_values,
    "priorityClassName": st.text(max_size=300) | json_scalars,
    "scheduleTimeoutSeconds": st.integers(-1, 2**40) | json_scalars,
    "expectedRuntimeSeconds": st.integers(-1, 2**40) | json_scalars,
    "preemptionPolicy": st.sampled_from(["Never", "PreemptLowerPriority", "Sometimes"]) | json_scalars,
    "topologyPolicy": st.fixed_dictionaries({}, optional={
        "numa": st.sampled_from(["none", "best-effort", "single-numa-node", "all"]),
        "gpuLink": st.sampled_from(["any", "prefer-nvlink", "require-nvlink"]) | json_scalars,
        "exclusiveGpus": json_scalars,
        "domain": st.fixed_dictionaries({}, optional={
            "mode": st.sampled_from(["required", "preferred", "maybe"]), "labelKey": st.text(max_size=320)}),
    }) | json_values,
}
hostile_specs = st.fixed_dictionaries({}, optional=spec_values) | json_values


def podgroup(name: str, spec: object, annotations: object = None) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "creationTimestamp": stamp(0), "generation": 1,
                         "annotations": annotations if annotations is not None else {}},
            "spec": spec}


@FUZZ
@given(hostile_specs, st.none() | st.integers(-(2**40), 2**40))
def test_a_podgroup_converts_or_is_refused_with_value_or_type_error(spec, priority):
    try:
        group_from_json(podgroup("g", spec), priority)
    except (ValueError, TypeError):
        pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_specs, min_size=1, max_size=5))
def test_a_cycle_over_hostile_podgroups_never_raises_and_schedules_the_good_gang(specs):
    groups, invalid, pods = [group("good", min_member=2, created=100)], {}, gang_pods("good", 2, cpu=1, created=100)
    for k, spec in enumerate(specs):
        name = f"hostile-{k}"
        try:  # as the cache does: a PodGroup that does not convert is invalid
            groups.append(group_from_json(podgroup(name, spec)))
        except (ValueError, TypeError) as exc:
            invalid[f"default/{name}"] = str(exc)
        pods += gang_pods(name, 2, cpu=1, gpu=1)
    snap = snapshot([node("n", cpu="64", gpu=16, labels={"nvidia.com/gpu.clique": "c"})], pods, groups,
                    invalid_groups=invalid)
    plan = schedule_cycle(snap, GangQueue())
    assert plan.verdicts["default/good"].reason == REASON_SCHEDULED
    assert {b.pod_name for b in plan.bindings} >= {"good-0", "good-1"}


# ---- owners of automatic gangs, and what framework pods state -----------------------------

replicated_job = st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=300) | json_scalars,
    "replicas": st.integers(-5, 2**40) | json_scalars,
    "dependsOn": json_values,
    "template": st.fixed_dictionaries({}, optional={"spec": st.fixed_dictionaries({}, optional={
        "parallelism": st.integers(-5, 2**40) | json_scalars,
        "completions": st.integers(-5, 2**40) | json_scalars}) | json_values}) | json_values,
}) | json_values
jobset_specs = st.fixed_dictionaries({}, optional={
    "replicatedJobs": st.lists(replicated_job, max_size=70) | json_values,
    "startupPolicy": st.fixed_dictionaries({}, optional={"startupPolicyOrder": json_scalars}) | json_values,
}) | json_values


@FUZZ
@given(jobset_specs)
def test_a_jobset_sizes_its_gang_or_is_refused_with_a_value_error(spec):
    obj = {"metadata": {"name": "js", "namespace": "default", "creationTimestamp": stamp(0)}, "spec": spec}
    try:
        read = quickly(jobsets.group_from_json, obj)
    except ValueError:
        return
    assert 1 <= read.min_member <= gangsources.MAX_TOTAL_COUNT
    assert all(isinstance(name, str) and 0 <= size <= total <= gangsources.MAX_TOTAL_COUNT
               for name, size, total in read.stages)


@FUZZ
@given(st.dictionaries(st.sampled_from([gangsources.VOLCANO_TASK_ANNOTATION, constants.CHECKPOINT_TIME_ANNOTATION,
                                        "scheduling.k8s.io/group-name", "x"]),
                       st.text(max_size=400) | st.sampled_from(["2024-01-01T00:00:00Z", "9999-12-31T23:59:59Z",
                                                               "2024-13-45T99:99:99Z"]), max_size=4),
       st.dictionaries(st.sampled_from(["jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name",
                                        AUTO_GANG_LABEL]), st.text(max_size=300), max_size=3))
def test_a_pod_with_any_framework_annotations_converts(annotations, labels):
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u", "annotations": annotations,
                        "labels": labels, "creationTimestamp": stamp(0)},
           "spec": {"schedulerName": "batchsched", "containers": []}}
    info = pod_from_json(pod, frozenset(gangsources.PRECEDENCE))
    assert len(info.task) <= gangsources.MAX_GROUP_NAME and len(info.group) <= gangsources.MAX_GROUP_NAME


# ---- configuration ---------------------------------------------------------------------

durations = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70) | json_scalars
config_values = st.fixed_dictionaries({}, optional={
    "schedulerName": json_scalars,
    "queue": st.fixed_dictionaries({}, optional={
        "initialBackoffSeconds": durations, "maxBackoffSeconds": durations,
        "reservationAfterSeconds": durations, "maxGangsPerCycle": durations}) | json_values,
    "binding": st.fixed_dictionaries({}, optional={
        "parallelism": durations, "retries": durations, "partialGangTimeoutSeconds": durations}),
    "leaderElection": st.fixed_dictionaries({}, optional={
        "enabled": json_scalars, "leaseDurationSeconds": durations, "renewDeadlineSeconds": durations,
        "retryPeriodSeconds": durations}),
    "preemption": st.fixed_dictionaries({}, optional={
        "enabled": json_scalars, "nodeCooldownSeconds": durations,
        "victims": st.fixed_dictionaries({}, optional={"minRuntimeSeconds": durations})}),
    "statusMinIntervalSeconds": durations,
    "metricsBindAddress": st.text(max_size=20) | json_scalars,
    "extra": json_values,
}) | json_values


def finite_numbers(value: object) -> bool:
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, dict):
        return all(finite_numbers(v) for v in value.values())
    return True


@FUZZ
@given(config_values)
def test_a_config_validates_or_is_a_config_error(data):
    try:
        config = validate_config(data)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(config, SchedulerConfig)
    assert finite_numbers(config.model_dump())


# ---- GPU ids tenants write, as each node's room is kept --------------------------------

gpu_ids_text = (st.text(alphabet="0123456789, x-", max_size=24)
                | st.lists(st.integers(0, 3) | st.integers(0, 9) | st.integers(0, 4200), max_size=10).map(
                    lambda ids: ",".join(map(str, ids))))  # mostly in range: pods naming one id


@FUZZ
@given(st.lists(st.tuples(st.sampled_from((0, 0, 0, 1, 2)), st.sampled_from((0, 1, 1, 2, 4, 8)), gpu_ids_text,
                          st.booleans(), st.booleans()), min_size=1, max_size=24))
def test_a_node_kept_room_equals_a_scan_whatever_gpu_ids_pods_name(binds):
    """Pods bound one by one onto nodes (a DGX-1 board, two flat nodes of
    8 and 4 GPUs) with any gpu-ids annotation: ids out of range, repeated,
    named by another pod, garbage; some seen pending first, so that they
    come before pods bound earlier in the node's order (the first of two
    pods naming an id has it). Each node's free resources and room, kept
    up to date pod by pod where that is exact (``ClusterState._derive_onto``),
    equal a scan of its pods after every bind, and sometimes a pod ends."""
    from batchsched.core.cluster import ClusterState
    from batchsched.core.topology.accounting import room_of
    from tests.unit.helpers import pod

    nodes = [topology_node("n0", fixture("dgx1-hybrid-cube-mesh-8gpu.txt")),
             node("n1", cpu="64", memory="256Gi", gpu=8), node("n2", cpu="32", memory="128Gi", gpu=4)]
    state = ClusterState("batchsched", nodes)
    for i, (_, gpus, _, _, early) in enumerate(binds):
        if early:
            state.put_pod(pod(f"p{i}", cpu=1 + i % 3, memory="1Gi", gpu=gpus))
    for i, (where, gpus, ids, ends, _) in enumerate(binds):
        name = f"n{where}"
        state.free(name)  # derived now: the next bind may keep it up to date
        state.put_pod(pod(f"p{i}", cpu=1 + i % 3, memory="1Gi", gpu=gpus, node_name=name, phase="Running",
                          gpu_ids=ids))
        if ends and i % 3 == 0:
            state.put_pod(pod(f"p{i}", cpu=1 + i % 3, memory="1Gi", gpu=gpus, node_name=name, phase="Succeeded",
                              gpu_ids=ids))
        for n in nodes:
            holding = [p for p in state.bound_pods(n.name) if p.holds_resources]
            used: dict = {}
            for p in holding:
                used = res.add(used, p.requests)
            assert state.free(n.name) == res.subtract(n.allocatable, used)
            assert state.room(n.name) == room_of(state.nodes[n.name], holding)
