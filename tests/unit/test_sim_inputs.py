"""Cluster and workload files: what they describe, and malformed ones
refused with the file, line and field named."""
from pathlib import Path

import pytest

from batchsched.api import constants
from batchsched.sim.cluster import build_nodes, builtin_topologies, load_cluster
from batchsched.sim.files import InputError
from batchsched.sim.workload import load_workload, pod_group_object
from tests.unit.topology_support import FIXTURES


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_yaml_cluster_becomes_nodes_carrying_their_topology(tmp_path):
    (tmp_path / "captures").mkdir()
    (tmp_path / "captures" / "dgx1.txt").write_text((FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt").read_text())
    path = write(tmp_path, "cluster.yaml", """
nodes:
  - {name: a100, count: 2, gpus: 8, cpu: 128, memory: 1Ti, topology: dgx-a100, labels: {zone: a}}
  - {name: old, gpus: 8, topology: captures/dgx1.txt}
  - {name: cpu, gpus: 0}
""")
    nodes = build_nodes(load_cluster(path))
    assert sorted(nodes) == ["a100-0", "a100-1", "cpu", "old"]
    a100 = nodes["a100-1"]
    assert a100.allocatable[constants.GPU_RESOURCE] == 8 and a100.allocatable["cpu"] == 128_000
    assert a100.labels["zone"] == "a" and a100.labels["node.kubernetes.io/instance-type"] == "dgx-a100"
    assert a100.topology == builtin_topologies()["dgx-a100"]  # read back from the annotation
    assert constants.GPU_TOPOLOGY_ANNOTATION in a100.annotations
    assert str(nodes["old"].topology.link(0, 3)) == "NV2"
    assert nodes["cpu"].topology is None and constants.GPU_RESOURCE not in nodes["cpu"].allocatable


def test_a_csv_cluster(tmp_path):
    path = write(tmp_path, "cluster.csv", "name,count,gpus,cpu,memory,topology,labels\n"
                                          "pcie,3,8,96,512Gi,pcie-8gpu,rack=r1;zone=b\n"
                                          "small,1,2,,,pcie-2gpu,\n")
    nodes = build_nodes(load_cluster(path))
    assert sorted(nodes) == ["pcie-0", "pcie-1", "pcie-2", "small"]
    assert nodes["pcie-2"].labels["rack"] == "r1" and len(nodes["small"].topology) == 2


@pytest.mark.parametrize("name, text, message", [
    ("bad.yaml", "nodes:\n  - name: a\n    gpus: 8\n    memory: lots\n",
     "bad.yaml: line 2: nodes[0].memory: invalid quantity 'lots'"),
    ("bad.yaml", "nodes:\n  - name: a\n    gpus: 4\n    topology: dgx-h100\n",
     "bad.yaml: line 2: nodes[0].topology: dgx-h100 has 8 GPUs but gpus is 4"),
    ("bad.yaml", "nodes:\n  - name: a\n    gpus: 8\n    gpu: 8\n", "line 2: nodes[0].gpu: unknown field"),
    ("bad.yaml", "nodes:\n  - name: a\n    gpus: eight\n", "line 2: nodes[0].gpus: must be a whole number"),
    ("bad.yaml", "nodes: [\n", "bad.yaml: line 2: not valid YAML"),
    ("bad.csv", "name,gpus,topology\na,8,dgx-a100\nb,8,no-such-board\n",
     "bad.csv: line 3: topology: 'no-such-board' is neither a built-in topology"),
    ("bad.csv", "name,gpus,colour\na,8,red\n", "bad.csv: line 1: unknown column 'colour'"),
    ("bad.csv", "name,count\na,2\n", "bad.csv: line 1: the header lacks the column(s) gpus"),
])
def test_malformed_cluster_files_name_the_line_and_field(tmp_path, name, text, message):
    with pytest.raises(InputError) as caught:
        load_cluster(write(tmp_path, name, text))
    assert message in str(caught.value)


def test_duplicate_nodes_are_refused(tmp_path):
    path = write(tmp_path, "c.yaml", "nodes:\n  - {name: a-0, gpus: 1}\n  - {name: a, count: 2, gpus: 1}\n")
    with pytest.raises(InputError, match="node a-0 is defined twice"):
        build_nodes(load_cluster(path))


WORKLOAD = """
seed: 7
jobs:
  - {name: big, arrival: 60, duration: 3600, pods: 4, gpus: 8, priority: 2000, priorityClass: training}
  - {name: lone, arrival: 0, duration: 10, gpus: 1, labels: {workload: inference}, preemptible: false}
generate:
  - {name: infer, count: 5, window: [100, 200], duration: [10, 20], gpus: [1, 2], namespace: serve}
"""


def test_a_yaml_workload_lists_and_draws_jobs_by_arrival(tmp_path):
    path = write(tmp_path, "w.yaml", WORKLOAD)
    jobs = load_workload(path)
    assert [j.name for j in jobs[:2]] == ["lone", "big"]
    big = jobs[1]
    assert (big.pods, big.min_member, big.gpus, big.priority, big.has_pod_group) == (4, 4, 8, 2000, True)
    assert not jobs[0].has_pod_group and not jobs[0].preemptible
    drawn = jobs[2:]
    assert len(drawn) == 5 and all(100 <= j.arrival <= 200 and 10 <= j.duration <= 20 for j in drawn)
    assert {j.gpus for j in drawn} <= {1, 2} and {j.namespace for j in drawn} == {"serve"}
    assert load_workload(path) == jobs  # the file's seed
    assert load_workload(path, seed=8) != jobs


def test_a_csv_workload(tmp_path):
    path = write(tmp_path, "w.csv", "name,arrival,duration,pods,minMember,gpus,cpu,memory,labels\n"
                                    "a,0,60,3,2,4,8,64Gi,team=x\n"
                                    "b,5,30,,,,,,\n")
    a, b = load_workload(path)
    assert (a.pods, a.min_member, a.gpus, a.cpu, a.memory, dict(a.labels)) == (3, 2, 4, "8", "64Gi", {"team": "x"})
    assert (b.pods, b.gpus, b.cpu) == (1, 0, "1")


@pytest.mark.parametrize("name, text, message", [
    ("w.csv", "name,arrival,duration,gpus\na,0,60,1\nb,5,30,two\n", "w.csv: line 3: gpus: must be a whole number"),
    ("w.csv", "name,arrival,duration\na,soon,60\n", "w.csv: line 2: arrival: must be a number of seconds"),
    ("w.csv", "name,arrival,duration,pods,minMember\na,0,60,2,3\n", "line 2: minMember: 3 is more than pods (2)"),
    ("w.csv", "name,arrival,duration\na,0,60\na,1,60\n", "w.csv: job default/a is defined twice"),
    ("w.yaml", "jobs:\n  - {name: a, arrival: 0, duration: 5, gpuLink: fast}\n",
     "w.yaml: line 2: jobs[0].gpuLink: must be one of"),
    ("w.yaml", "jobs:\n  - {name: a, arrival: 0}\n", "line 2: jobs[0].duration: missing"),
    ("w.yaml", "generate:\n  - name: x\n    count: 2\n    window: [5, 1]\n    duration: 3\n",
     "line 2: generate[0].window: must be [low, high]"),
    ("w.yaml", "jobs: []\nextra: 1\n", "w.yaml: line 1: extra: unknown field"),
    ("w.yaml", "jobs: []\n", "w.yaml: line 1: no jobs"),
    ("w.csv", "name,arrival,duration,runtimeHint\na,0,60,0\n",
     "w.csv: line 2: runtimeHint: must be a number above 0 (a multiple of duration), got '0'"),
    ("w.yaml", "jobs:\n  - {name: a, arrival: 0, duration: 5, runtimeHint: .nan}\n",
     "line 2: jobs[0].runtimeHint: must be a number above 0"),
])
def test_malformed_workload_files_name_the_line_and_field(tmp_path, name, text, message):
    with pytest.raises(InputError) as caught:
        load_workload(write(tmp_path, name, text))
    assert message in str(caught.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_workload(tmp_path / "nope.yaml")


def test_a_runtime_hint_is_the_podgroups_expected_runtime(tmp_path):
    path = write(tmp_path, "w.csv", "name,arrival,duration,runtimeHint\nhinted,0,100,1.5\nplain,0,100,\n")
    hinted, plain = sorted(load_workload(path), key=lambda j: j.name)
    assert hinted.expected_runtime_seconds == 150 and hinted.has_pod_group  # the hint is the PodGroup's
    assert pod_group_object(hinted)["spec"]["expectedRuntimeSeconds"] == 150
    assert plain.expected_runtime_seconds is None and not plain.has_pod_group
