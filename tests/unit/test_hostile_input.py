"""Every value read from an object is bounded: hostile quantities, topology
annotations, CPU lists, gpu-ids and configs are refused quickly with a clear
error, and one gang that makes the core fail does not stop the others."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from batchsched.config import ConfigError, load_config, validate_config
from batchsched.core import resources as res
from batchsched.core.cycle import REASON_INTERNAL_ERROR, schedule_cycle
from batchsched.core.readers import MAX_GPU_ID, MAX_GPU_IDS_LENGTH, parse_gpu_ids
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.topology.annotation import MAX_ANNOTATION_BYTES, MAX_NESTING, from_annotation, to_annotation
from batchsched.core.topology.model import MAX_CPUS, MAX_GPUS, Gpu, GpuTopology, Link, TopologyError, parse_cpu_list
from batchsched.core.topology.parse import parse_topo
from tests.unit.helpers import gang_pods, group, node, snapshot
from tests.unit.topology_support import fixture, topology_node

ROOT = Path(__file__).resolve().parents[2]


def fast(call, *args, limit: float = 1.0):
    """``call(*args)``, which must return or raise within ``limit`` seconds (generous: this
    machine is shared; the unbounded work took hours or all memory)."""
    start = time.perf_counter()
    try:
        return call(*args)
    finally:
        assert time.perf_counter() - start < limit, f"{call.__name__}{args!r:.80} took too long"


# ---- quantities -------------------------------------------------------------------


@pytest.mark.parametrize("text", ["1e5000", "1e999999999", "1E-999999999", "9" * 65, "1e65"])
def test_quantities_with_huge_exponents_or_text_are_refused_at_once(text):
    with pytest.raises(res.QuantityError):
        fast(res.parse_quantity, text)


def test_quantities_are_bounded_by_magnitude_in_canonical_units():
    assert res.canonical(res.MEMORY, str(res.MAX_CANONICAL)) == 2**63 - 1
    assert res.canonical(res.CPU, "9223372036854775") == 9223372036854775000  # millicores
    for name, quantity in [(res.MEMORY, str(2**63)), (res.CPU, "1e20"), (res.MEMORY, "8Ei"),
                           (res.MEMORY, 2**63), ("nvidia.com/gpu", -(2**63))]:
        with pytest.raises(res.QuantityError, match="exceeds"):
            res.canonical(name, quantity)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e300, True, None, [1], {"a": 1}])
def test_non_quantities_are_quantity_errors(value):
    with pytest.raises(res.QuantityError):
        res.canonical(res.CPU, value)


def test_a_podgroup_with_a_hostile_quantity_is_refused_naming_the_field():
    for quantity in ["1e5000", "1e20", 10**30, "x" * 100]:
        with pytest.raises(ValueError, match="spec.minResources"):
            group("g", min_resources={"cpu": quantity})
    with pytest.raises(ValueError, match="spec.minResources"):
        group("g", min_resources={f"example.com/r{i}": 1 for i in range(33)})


# ---- topology annotations -------------------------------------------------------


def test_an_oversized_annotation_is_refused_before_parsing():
    text = json.dumps({"version": 1, "padding": "x" * MAX_ANNOTATION_BYTES})
    with pytest.raises(TopologyError, match=f"at most {MAX_ANNOTATION_BYTES}"):
        fast(from_annotation, text)


@pytest.mark.parametrize("nested", [
    "[" * 100_000 + "]" * 100_000,  # the parser would recurse past the interpreter's limit
    '{"version": 1, "gpus": ' + "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1) + "}",
])
def test_deeply_nested_json_is_refused_without_recursion(nested):
    with pytest.raises(TopologyError, match=f"nested deeper than {MAX_NESTING}"):
        fast(from_annotation, nested[:MAX_ANNOTATION_BYTES] if len(nested) > MAX_ANNOTATION_BYTES else nested)


def test_brackets_inside_strings_do_not_count_as_nesting():
    document = json.loads(to_annotation(fixture("pcie-switch-pairs-8gpu.txt")))
    document["gpus"][0]["uuid"] = "[[[[[[[[[[[[[[[[[[[[[[[[\\\"{{{{{{{{{{{{{{{{{{"
    assert len(from_annotation(json.dumps(document))) == 8


def test_a_node_with_a_deeply_nested_annotation_is_flat_and_says_why():
    node_info = topology_node("deep", annotation="[" * 10_000 + "]" * 10_000, gpus=8)
    assert node_info.topology is None and "nested deeper than" in node_info.topology_error


def test_a_topology_of_more_than_max_gpus_is_refused_before_its_matrix_is_built():
    n = MAX_GPUS + 18  # the 34-GPU annotation of the review
    document = {"version": 1, "gpus": [{"index": i} for i in range(n)],
                "links": [" ".join(["NV1"] * (n - 1 - i)) for i in range(n - 1)]}
    with pytest.raises(TopologyError, match=f"at most {MAX_GPUS}"):
        fast(from_annotation, json.dumps(document))
    assert "at most 16" in topology_node("big", annotation=json.dumps(document), gpus=n).topology_error
    links = tuple(tuple(None if i == j else Link("NV", 1) for j in range(n)) for i in range(n))
    with pytest.raises(TopologyError, match=f"at most {MAX_GPUS}"):
        GpuTopology(tuple(Gpu(i) for i in range(n)), links)


def test_nvidia_smi_output_with_too_many_gpus_is_refused_naming_the_header():
    n = MAX_GPUS + 1
    header = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\tCPU Affinity"
    rows = ["GPU%d\t" % i + "\t".join("X" if i == j else "SYS" for j in range(n)) + "\t0-3" for i in range(n)]
    with pytest.raises(TopologyError, match=f"line 1: {n} GPUs: a topology may describe at most {MAX_GPUS}"):
        parse_topo("\n".join([header] + rows))


@pytest.mark.parametrize("field, value, problem", [
    ("numa", 10**30, "must be a non-negative integer"),
    ("numa", 5000, "NUMA node ids must be"),
    ("cpus", "0-4294967295", "beyond 8191"),
])
def test_hostile_gpu_fields_are_refused(field, value, problem):
    document = json.loads(to_annotation(fixture("pcie-switch-pairs-8gpu.txt")))
    document["gpus"][0][field] = value
    if field == "numa":
        document["numa"].append({"id": value})
    with pytest.raises(TopologyError, match=problem):
        fast(from_annotation, json.dumps(document))


def test_a_huge_nvlink_count_is_an_unknown_link_class():
    with pytest.raises(TopologyError, match="unknown link class"):
        Link.parse("NV" + "9" * 40)
    assert Link.parse("NV18").gbps == 450


# ---- CPU lists ---------------------------------------------------------------------


def test_cpu_lists_are_bounded_in_ids_and_size():
    assert len(parse_cpu_list(f"0-{MAX_CPUS - 1}")) == MAX_CPUS
    for text in [str(MAX_CPUS), "9" * 100, ",".join(["0-4095"] * 3), "1²", "0-4294967295"]:
        with pytest.raises(TopologyError):
            fast(parse_cpu_list, text)


# ---- gpu-ids -----------------------------------------------------------------------


def test_hostile_gpu_ids_annotations_name_no_gpu():
    assert parse_gpu_ids("0,1,2,3") == (0, 1, 2, 3)
    assert parse_gpu_ids(f"{MAX_GPU_ID}") == (MAX_GPU_ID,)
    for text in [f"{MAX_GPU_ID + 1}", "1" * 5000, ",".join(["1"] * MAX_GPU_IDS_LENGTH), "0,²", "-1"]:
        assert fast(parse_gpu_ids, text) == ()


def test_a_node_claiming_a_huge_gpu_count_hands_out_gpus_by_count_only():
    from batchsched.core.topology.accounting import gpu_id_count
    assert gpu_id_count(node("flat", gpu=8)) == 8
    assert gpu_id_count(node("bogus", gpu=2**62)) == 0  # no 2^62-bit masks


# ---- one gang failing --------------------------------------------------------------


def test_a_gang_whose_attempt_raises_gets_internal_error_and_the_others_are_scheduled():
    # A value no check refused (built past group_from_json): the core's
    # message formatting raises on a 5000-digit amount.
    broken = replace(group("broken", min_member=1, created=0), min_resources={res.CPU: 10**5000})
    good = group("good", min_member=2, created=10)
    snap = snapshot([node("n", cpu="8")], gang_pods("broken", 1, cpu=1, created=0) + gang_pods("good", 2, cpu=1),
                    [broken, good])
    queue = GangQueue(initial_backoff=1, max_backoff=4)
    plan = schedule_cycle(snap, queue)
    verdict = plan.verdicts["default/broken"]
    assert (verdict.scheduled, verdict.reason) == (False, REASON_INTERNAL_ERROR)
    assert "ValueError" in verdict.message
    assert sorted(b.pod_name for b in plan.bindings) == ["good-0", "good-1"]
    assert not queue.ready("default/broken", snap.now)  # backed off


def test_a_gang_whose_planning_raises_is_passed_over_by_the_reservation_too():
    # A request of the wrong type (built past pod_from_json) makes planning
    # raise, in the reservation pass (both gangs have waited long enough) and
    # in the attempt.
    broken = [replace(p, requests={res.CPU: "1000"}) for p in gang_pods("broken", 1, cpu=1, created=0)]
    snap = snapshot([node("n", cpu="8")], broken + gang_pods("good", 2, cpu=1, created=10),
                    [group("broken", created=0), group("good", min_member=2, created=10)], now=1000)
    queue = GangQueue(initial_backoff=1, max_backoff=4, reservation_after_seconds=0)
    for key in ("default/broken", "default/good"):
        queue.set_waiting_since(key, snap.now - 1)
    plan = schedule_cycle(snap, queue)
    assert plan.verdicts["default/broken"].reason == REASON_INTERNAL_ERROR
    assert "TypeError" in plan.verdicts["default/broken"].message
    assert sorted(b.pod_name for b in plan.bindings) == ["good-0", "good-1"]


# ---- configuration -----------------------------------------------------------------


@pytest.mark.parametrize("key, value", [
    ("leaderElection.leaseDurationSeconds", ".inf"), ("leaderElection.leaseDurationSeconds", ".nan"),
    ("leaderElection.leaseDurationSeconds", "-1"), ("queue.maxBackoffSeconds", ".inf"),
    ("queue.reservationAfterSeconds", "-1"), ("statusMinIntervalSeconds", ".nan"),
    ("preemption.victims.minRuntimeSeconds", "-.inf"), ("binding.partialGangTimeoutSeconds", "1e12"),
])
def test_non_finite_negative_or_absurd_durations_are_refused_naming_the_key(tmp_path, key, value):
    path = tmp_path / "bad.yaml"
    *parents, leaf = key.split(".")
    text = "".join(f"{'  ' * depth}{part}:\n" for depth, part in enumerate(parents))
    path.write_text(text + f"{'  ' * len(parents)}{leaf}: {value}\n")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as caught:
        load_config(path)
    assert "\n" not in str(caught.value)


def test_an_unreadable_config_is_a_config_error(tmp_path):
    (tmp_path / "broken.yaml").write_text("queue: [\n")
    for path in (tmp_path / "broken.yaml", tmp_path / "missing.yaml"):
        with pytest.raises(ConfigError, match=str(path)):
            load_config(path)
    with pytest.raises(ConfigError, match="top level"):
        validate_config(["not", "a", "mapping"])


def test_batchsched_run_with_a_bad_config_exits_with_one_line_and_no_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"leaderElection": {"leaseDurationSeconds": float("inf")}}))
    done = subprocess.run([sys.executable, "-m", "batchsched", "run", "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr == (f"batchsched: config {path}: leaderElection.leaseDurationSeconds: "
                           "Input should be a finite number, not inf\n")


@pytest.mark.parametrize("data, expected", [
    ({"queue": {"maxBackofSeconds": 3}}, "queue.maxBackofSeconds: unknown key; did you mean maxBackoffSeconds?"),
    ({"schedulerNme": "x"}, "schedulerNme: unknown key; did you mean schedulerName?"),
    ({"preemption": {"victims": {"matchLabel": {}}}},
     "preemption.victims.matchLabel: unknown key; did you mean matchLabels?"),
    ({"binding": {"zzz": 1}}, "binding.zzz: unknown key; the keys here are parallelism, "
                              "partialGangTimeoutSeconds, retries"),
    ({"queue": 3}, "queue: should be a mapping of keys, not 3"),
    ({"logLevel": "info"}, "logLevel: Input should be 'DEBUG', 'INFO', 'WARNING' or 'ERROR', not 'info'"),
    ({"leaderElection": {"leaseDurationSeconds": 1}},
     "leaderElection: need retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds"),
    ({"metricsBindAddress": "8080"}, 'for port 8080 on every interface write ":8080"'),
])
def test_config_errors_name_the_file_the_key_path_and_the_fix(tmp_path, data, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"config {path}: ")
    assert expected in message
    assert "pydantic" not in message and "http" not in message and "\n" not in message


@pytest.mark.parametrize("text, expected", [("8080", ":8080"), ("0", "0"), ('"127.0.0.1:9090"', "127.0.0.1:9090")])
def test_a_bare_port_number_is_the_metrics_port_on_every_interface(tmp_path, text, expected):
    path = tmp_path / "port.yaml"
    path.write_text(f"metricsBindAddress: {text}\n")
    assert load_config(path).metrics_bind_address == expected


def test_readiness_names_a_watch_that_is_out_of_step():
    from batchsched.config import SchedulerConfig
    from batchsched.shell.replica import _readiness
    from batchsched.shell.scheduler import Scheduler

    scheduler = Scheduler(kube=None, config=SchedulerConfig())  # type: ignore[arg-type]  # nothing is sent
    scheduler.ready.set()
    not_ready = _readiness(scheduler, None)
    assert not_ready() == ""
    nodes = next(r for r in scheduler.reflectors if r.kind == "nodes")
    nodes.error = "cache update failed: RecursionError: maximum recursion depth exceeded"
    assert not_ready() == ("nodes watch not synced since its last error (cache update failed: RecursionError: "
                           "maximum recursion depth exceeded)")
