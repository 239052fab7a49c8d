"""``batchsched topo parse`` and the cache's handling of the node annotation."""
from __future__ import annotations

import json
import subprocess
import sys

from batchsched.api import constants
from batchsched.cli import main
from batchsched.core.topology.annotation import from_annotation, to_annotation
from batchsched.shell.cache import ClusterCache
from tests.unit.cache_support import relist
from tests.unit.topology_support import FIXTURES, ROOT, fixture

DGX1 = str(FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt")


def test_annotation_format_prints_the_value_to_put_on_the_node(capsys):
    assert main(["topo", "parse", DGX1, "--format", "annotation", "--numa-memory", "0=256Gi,1=256Gi"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    topology = from_annotation(out.strip())
    assert [str(topology.link(0, j)) for j in (1, 3, 5)] == ["NV1", "NV2", "SYS"]
    assert [n.memory for n in topology.numa_nodes] == [256 * 2**30] * 2


def test_json_format_is_the_same_document_indented(capsys):
    assert main(["topo", "parse", DGX1, "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["version"] == 1 and len(document["gpus"]) == 8


def test_text_format_summarizes_nvlink_groups_and_the_numa_split(capsys):
    assert main(["topo", "parse", str(FIXTURES / "synthetic-pcie-tree-16gpu.txt")]) == 0
    out = capsys.readouterr().out
    assert "16 GPUs, 2 NIC(s)" in out
    assert "  NUMA 0: GPUs 0-7, CPUs 0-31" in out and "  NUMA 1: GPUs 8-15, CPUs 32-63" in out
    assert "  GPUs 0-1: all-to-all (NV4 x1)" in out and "  GPUs 8-9: all-to-all (NV2 x1)" in out
    assert "  mlx5_0: GPUs 0-3 (PIX)" in out
    assert "  2: GPUs 0-1 (NV4, 1 NUMA)" in out


def test_malformed_input_exits_2_with_one_line_naming_the_line(capsys):
    assert main(["topo", "parse", str(FIXTURES / "malformed-asymmetric.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"batchsched: {FIXTURES / 'malformed-asymmetric.txt'}: line 4: the link GPU2-GPU0")


def test_a_missing_file_exits_2_with_one_line(tmp_path):
    missing = tmp_path / "capture.txt"
    done = subprocess.run([sys.executable, "-m", "batchsched", "topo", "parse", str(missing)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"batchsched: {missing}: cannot read it: No such file or directory\n"
    assert done.stdout == ""


def test_bad_numa_memory_is_refused(capsys):
    assert main(["topo", "parse", DGX1, "--numa-memory", "zero=1Gi"]) == 1
    assert "is not NUMA=QUANTITY" in capsys.readouterr().err


def node_object(annotation: str, rv: str = "1") -> dict:
    return {"metadata": {"name": "n1", "uid": "u1", "resourceVersion": rv,
                         "annotations": {constants.GPU_TOPOLOGY_ANNOTATION: annotation}},
            "status": {"allocatable": {constants.GPU_RESOURCE: "8"}}}


def test_the_cache_reports_a_broken_annotation_once_and_treats_the_node_as_flat():
    cache = ClusterCache("batchsched")
    reports = []
    cache.on_bad_object = lambda kind, obj, why: reports.append((kind, why))
    relist(cache, "nodes", [node_object("{broken")])
    cache._apply_node("MODIFIED", node_object("{broken", rv="2"))  # a heartbeat: no new report
    assert cache.nodes["n1"].topology is None
    assert reports == [("Node", cache.nodes["n1"].topology_error)]
    assert "annotation scheduling.batchsched.io/gpu-topology is invalid: not JSON" in reports[0][1]
    dgx1 = fixture("dgx1-hybrid-cube-mesh-8gpu.txt")
    cache._apply_node("MODIFIED", node_object(to_annotation(dgx1), rv="3"))
    assert cache.nodes["n1"].topology == dgx1 and len(reports) == 1
