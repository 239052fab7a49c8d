"""The node agent's reporter: NVML and nvidia-smi text give the annotation
`batchsched topo parse` gives for the same machine."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from batchsched.api import constants
from batchsched.cli import main
from batchsched.core.dra.model import slice_from_json
from batchsched.core.topology.annotation import from_annotation, to_annotation, to_document
from batchsched.core.topology.model import TopologyError
from batchsched.core.topology.parse import parse_topo
from batchsched.nodeagent.backends import NvmlBackend, TextBackend, numa_memory, with_identities
from batchsched.nodeagent.report import KubeletView, decide
from tests.support.nvml import FakeNvml, bus_id_of, fake_nvidia_smi, query_xml, uuid_of
from tests.unit.topology_support import FIXTURE_NAMES, FIXTURES, SHARED_TOPOLOGIES

SHARED_NAMES = sorted(p.name for p in SHARED_TOPOLOGIES.glob("*.txt")) if SHARED_TOPOLOGIES.is_dir() else []
CAPTURES = [FIXTURES / name for name in FIXTURE_NAMES] + [SHARED_TOPOLOGIES / name for name in SHARED_NAMES]


def shared_captures_present() -> None:
    if not SHARED_NAMES:
        pytest.skip(f"{SHARED_TOPOLOGIES} is absent (the shared captures live outside the repository); "
                    "the project's own fixtures still ran")


def test_the_shared_captures_are_found_when_present():
    shared_captures_present()
    assert len(SHARED_NAMES) >= 8


def parse_document(capture: Path, memory: dict[int, int] | None = None) -> dict:
    """What `batchsched topo parse --format annotation` prints for the capture."""
    return json.loads(to_annotation(parse_topo(capture.read_text(), memory)))


def without_identities(document: dict) -> dict:
    for gpu in document["gpus"]:
        gpu.pop("uuid"), gpu.pop("pciBusId")
    return document


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A /sys with two NUMA nodes of 256 GiB and 128 GiB."""
    for node, kib in ((0, 268435456), (1, 134217728)):
        folder = tmp_path / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "meminfo").write_text(f"Node {node} MemTotal:       {kib} kB\nNode {node} MemFree:  1 kB\n")
    return tmp_path


MEMORY = {0: 256 * 2**30, 1: 128 * 2**30}


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_nvml_gives_the_annotation_topo_parse_gives_for_the_capture(capture: Path, sysfs: Path):
    expected = parse_document(capture, MEMORY)
    expected.pop("nics", None)  # NVML does not see NICs
    document = to_document(NvmlBackend(FakeNvml(parse_topo(capture.read_text())), sysfs).read())
    assert [(g["uuid"], g["pciBusId"]) for g in document["gpus"]] == [
        (uuid_of(i), bus_id_of(i)) for i in range(len(document["gpus"]))]
    assert without_identities(document) == expected


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_nvidia_smi_text_gives_the_annotation_topo_parse_gives_for_the_capture(capture: Path, sysfs: Path,
                                                                            tmp_path: Path):
    topology = parse_topo(capture.read_text())
    fake = fake_nvidia_smi(tmp_path, capture, query_xml(topology))
    document = to_document(TextBackend(str(fake), sysfs).read())
    assert [g["uuid"] for g in document["gpus"]] == [uuid_of(i) for i in range(len(topology))]
    assert without_identities(document) == parse_document(capture, MEMORY)


def test_nvswitch_links_pair_every_gpu_at_the_switch_link_count(sysfs):
    topology = parse_topo((SHARED_TOPOLOGIES / "h100-sxm-8gpu-nv18-2numa-mlengineering.txt").read_text()) \
        if SHARED_NAMES else parse_topo((FIXTURES / "synthetic-nvswitch-16gpu-4numa.txt").read_text())
    fake = FakeNvml(topology)
    assert all(remote[1] == fake.NVML_NVLINK_DEVICE_TYPE_SWITCH for remote in fake.nvlinks[0])
    read = NvmlBackend(fake, sysfs).read()
    assert {str(read.link(0, j)) for j in range(1, len(read))} == {str(topology.link(0, 1))}


def test_mig_mode_is_reported_by_both_backends(sysfs, tmp_path):
    capture = FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt"
    topology = parse_topo(capture.read_text())
    by_nvml = NvmlBackend(FakeNvml(topology, mig=frozenset({2})), sysfs).read()
    by_text = with_identities(topology, query_xml(topology, mig=frozenset({2})))
    for read in (by_nvml, by_text):
        assert [g.mig for g in read.gpus] == [i == 2 for i in range(8)]
        assert from_annotation(to_annotation(read)).gpus[2].mig


def test_nvml_failing_to_start_is_a_topology_error(sysfs):
    class NoDriver(FakeNvml):
        def nvmlInit(self):
            self._fail(9)  # NVML_ERROR_DRIVER_NOT_LOADED

    with pytest.raises(TopologyError, match="NVML did not start"):
        NvmlBackend(NoDriver(parse_topo((FIXTURES / FIXTURE_NAMES[0]).read_text())), sysfs).read()


def test_a_query_listing_other_gpus_than_the_matrix_is_refused():
    topology = parse_topo((FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt").read_text())
    four = replace(topology, gpus=topology.gpus[:4], links=tuple(row[:4] for row in topology.links[:4]), nics=())
    with pytest.raises(TopologyError, match="lists 4 GPUs, the topology matrix 8"):
        with_identities(topology, query_xml(four))
    with pytest.raises(TopologyError, match="not XML"):
        with_identities(topology, "<nvidia_smi_log>")


def test_a_failing_nvidia_smi_is_a_topology_error(tmp_path, sysfs):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n")
    script.chmod(0o755)
    with pytest.raises(TopologyError, match="exited 9: NVIDIA-SMI has failed"):
        TextBackend(str(script), sysfs).read()
    with pytest.raises(TopologyError, match="No such file"):
        TextBackend(str(tmp_path / "absent"), sysfs).read()


def test_numa_memory_reads_the_kernel(sysfs, tmp_path):
    assert numa_memory(sysfs) == MEMORY
    assert numa_memory(tmp_path / "nothing") == {}


def test_once_print_prints_the_annotation_without_contacting_a_cluster(tmp_path, capsys, sysfs, monkeypatch):
    capture = FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt"
    topology = parse_topo(capture.read_text())
    script = fake_nvidia_smi(tmp_path, capture, query_xml(topology))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    assert main(["node-agent", "--once", "--print", "--backend", "text", "--nvidia-smi", str(script),
                 "--sys-root", str(sysfs)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert without_identities(json.loads(out)) == parse_document(capture, MEMORY)
    assert json.loads(out)["gpus"][0]["uuid"] == uuid_of(0)


def node_json(gpus: str | None, annotation: str | None = None) -> dict:
    return {"metadata": {"name": "n1", "annotations": {constants.GPU_TOPOLOGY_ANNOTATION: annotation}
                         if annotation else {}},
            "status": {"capacity": {constants.GPU_RESOURCE: gpus} if gpus is not None else {}}}


def test_the_annotation_is_written_only_when_it_changes():
    topology = parse_topo((FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt").read_text())
    first = decide(node_json("8"), topology, "")
    assert first.ready and first.annotation == to_annotation(topology)
    assert decide(node_json("8", first.annotation), topology, "").annotation is None


def test_dra_gpu_devices_are_the_advertised_count_without_a_device_plugin():
    topology = parse_topo((FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt").read_text())
    slices = [slice_from_json({"metadata": {"name": "s"}, "spec": {
        "nodeName": "n1", "driver": "gpu.nvidia.com", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}} for i in range(count)]}})
        for count in (8,)]
    assert decide(node_json(None), topology, "", slices).ready
    refused = decide(node_json(None), topology, "", slices[:0])
    assert (refused.ready, refused.reason) == (False, "GPUCountMismatch")
    assert "is the device plugin or DRA driver running?" in refused.message
    unreadable = decide(node_json("8"), None, "nvml: NVML did not start")
    assert (unreadable.ready, unreadable.reason, unreadable.annotation) == (False, "TopologyUnreadable", None)


def test_the_condition_is_the_nodes_checklist_and_fails_on_allocatable_short_of_the_visible_gpus():
    topology = parse_topo((FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt").read_text())
    report = decide(node_json("8"), topology, "", kubelet=KubeletView(8, "3 pods with GPU ids, 0 holding other GPUs"))
    assert report.ready and report.message == (
        "driver: 8 GPUs visible; advertised: 8 (nvidia.com/gpu capacity); kubelet allocatable: 8; "
        "topology: annotation matches the driver (checked every pass); "
        "last verification: 3 pods with GPU ids, 0 holding other GPUs")
    short = decide(node_json("8"), topology, "", kubelet=KubeletView(7))
    assert (short.ready, short.reason) == (False, "AllocatableMismatch")
    assert "kubelet allocatable: 7, not the 8 visible (unhealthy GPUs?)" in short.message
    assert short.annotation is not None  # the topology is still true: it is written
