"""The nvidia-smi topo -m parser on real captures, on the project's fixtures
and on malformed input."""
from __future__ import annotations

import pytest

from batchsched.core.topology.model import Link, TopologyError, format_cpu_list, parse_cpu_list
from batchsched.core.topology.parse import TopologyParseError, parse_topo
from tests.unit.topology_support import FIXTURE_NAMES, FIXTURES, fixture

# What every shared capture must parse to: GPU count, some links, NUMA node of each GPU, NICs.
CAPTURES = {
    "asus-esc8000a-e12-4x-rtx6000ada-pcie-2numa.txt": (
        4, {(0, 1): "NODE", (0, 2): "SYS", (2, 3): "NODE"}, [0, 0, 1, 1], ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]),
    "baobab-8x-rtx-a6000-nv4-pairs-2numa.txt": (
        8, {(0, 1): "NV4", (0, 2): "NODE", (0, 4): "SYS", (4, 6): "NODE", (6, 7): "NV4"}, [0] * 4 + [1] * 4,
        ["mlx5_0", "mlx5_1"]),
    "dgx-a100-8gpu-nv12-10nic-multinuma.txt": (
        8, {(0, 1): "NV12", (0, 7): "NV12", (3, 6): "NV12"}, [3, 3, 1, 1, 7, 7, 5, 5],
        [f"mlx5_{i}" for i in range(10)]),
    "dgx1-v100-8gpu-nv1-nv2-mlx5-ucxpy.txt": (  # old driver: NUMA from the two CPU affinity ranges
        8, {(0, 1): "NV1", (0, 3): "NV2", (0, 4): "NV2", (0, 5): "SYS", (1, 5): "NV2", (4, 7): "NV2"},
        [0] * 4 + [1] * 4, ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]),
    "h100-sxm-8gpu-nv18-2numa-mlengineering.txt": (
        8, {(0, 1): "NV18", (3, 4): "NV18", (6, 7): "NV18"}, [0] * 4 + [1] * 4, []),
    "pcie-8gpu-pix-node-sys-2numa-johnsblog.txt": (
        8, {(0, 1): "PIX", (0, 2): "NODE", (0, 4): "SYS", (6, 7): "PIX"}, [0] * 4 + [1] * 4, []),
    "puget-wrx90-2x-rtx6000ada-phb.txt": (2, {(0, 1): "PHB"}, [0, 0], ["mlx5_0", "mlx5_1"]),
    "titan-rtx-4gpu-nvlink-bridge-pairs-1socket.txt": (  # NUMA N/A, one CPU range: one NUMA node
        4, {(0, 1): "PHB", (0, 2): "SYS", (0, 3): "NV2", (1, 2): "NV1"}, [0] * 4, []),
}


def check_symmetric(topology) -> None:
    n = len(topology)
    for i in range(n):
        for j in range(n):
            assert (topology.links[i][j] is None) == (i == j)
            assert topology.links[i][j] == topology.links[j][i]


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_each_shared_capture_parses_to_its_known_facts(shared_dir, name):
    path = shared_dir / "data" / "topologies" / name
    if not path.exists():
        pytest.skip(f"{path} is not in this copy of ../shared")
    gpus, links, numa, nics = CAPTURES[name]
    topology = parse_topo(path.read_text())
    assert len(topology) == gpus
    for (i, j), link in links.items():
        assert str(topology.link(i, j)) == link
    assert [g.numa for g in topology.gpus] == numa
    assert [nic.name for nic in topology.nics] == nics
    check_symmetric(topology)


def test_every_matrix_in_shared_parses_and_the_rest_is_refused_by_line(shared_dir):
    """Captures added to ../shared later are covered too."""
    paths = sorted((shared_dir / "data" / "topologies").rglob("*.txt"))
    assert paths
    for path in paths:
        text = path.read_text()
        if "GPU0" in text and "X" in text:
            topology = parse_topo(text)
            assert len(topology) == sum(1 for line in text.splitlines() if line.strip().startswith("GPU")) - 1
            check_symmetric(topology)
        else:  # e.g. the MIG listing of nvidia-smi -L: no matrix
            with pytest.raises(TopologyParseError, match=r"^line \d+: no matrix header"):
                parse_topo(text)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_project_fixtures_parse(name):
    topology = fixture(name)
    check_symmetric(topology)
    assert all(g.cpus for g in topology.gpus) or "empty-cpu" in name


def test_dgx1_fixture():
    topology = fixture("dgx1-hybrid-cube-mesh-8gpu.txt")
    assert [str(topology.link(0, j)) for j in range(1, 8)] == ["NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    assert [g.numa for g in topology.gpus] == [0] * 4 + [1] * 4
    assert [n.name for n in topology.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert [str(link) for link in topology.nics[0].links] == ["PIX", "PIX", "PHB", "PHB"] + ["SYS"] * 4
    assert topology.nvlink_groups() == [tuple(range(8))]
    assert topology.numa_nodes[1].cpus == parse_cpu_list("20-39,60-79")


def test_ansi_header_tabs_and_empty_cpu_cells():
    topology = fixture("variant-ansi-header-empty-cpu-cells.txt")
    assert [g.numa for g in topology.gpus] == [0, 0, 1, 1]  # the NUMA cell after an empty CPU cell
    assert [format_cpu_list(g.cpus) for g in topology.gpus] == ["0-35", "0-35", "", ""]
    assert [n.name for n in topology.nics] == ["mlx5_0", "mlx5_1"]  # from the NIC Legend


def test_old_driver_soc_and_no_numa_column():
    topology = fixture("variant-old-driver-soc-no-numa-column.txt")  # also a shell prompt line first
    assert str(topology.link(0, 2)) == "SYS" and str(topology.link(0, 1)) == "PHB"
    assert [g.numa for g in topology.gpus] == [0, 0, 1, 1]
    assert [n.name for n in topology.nics] == ["mlx4_0"]


def test_numa_ranges_leave_the_numa_node_unknown():
    topology = fixture("variant-numa-ranges-spaces.txt")
    assert [g.numa for g in topology.gpus] == [None, None, 1]
    assert [n.id for n in topology.numa_nodes] == [1]


def test_space_separated_row_missing_its_cpu_cell_keeps_the_numa_column():
    text = ("        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
            "GPU0     X      NV4     0-7     0       N/A\n"
            "GPU1    NV4      X      1       N/A\n")
    topology = parse_topo(text)
    assert [g.numa for g in topology.gpus] == [0, 1]
    assert topology.gpus[1].cpus == frozenset()


def test_bare_numa_header_and_x_without_padding():
    text = "GPU0\tGPU1\tCPU Affinity\tNUMA\nGPU0\tX\tPIX\t0-3\t0\nGPU1\tPIX\tX\t4-7\t1\n"
    assert [g.numa for g in parse_topo(text).gpus] == [0, 1]


def test_numa_memory_is_recorded_on_the_numa_nodes():
    topology = parse_topo((FIXTURES / "pcie-switch-pairs-8gpu.txt").read_text(), {0: 2**30, 1: 2**31})
    assert [(n.id, n.memory) for n in topology.numa_nodes] == [(0, 2**30), (1, 2**31)]


@pytest.mark.parametrize("name, line, problem", [
    ("malformed-asymmetric.txt", 4, "the link GPU2-GPU0 is PIX but line 2 says GPU0-GPU2 is SYS"),
    ("malformed-unknown-link.txt", 2, "the link GPU0-GPU1: unknown link class 'NVX'"),
    ("malformed-missing-row.txt", 1, "the header names GPU1 but no row for GPU1 follows"),
    ("malformed-short-row.txt", 3, "the link GPU1-GPU2: unknown link class '0-15'"),
    ("malformed-bad-cpu-list.txt", 3, "CPU affinity: '15-0x' is not a CPU list"),
])
def test_malformed_fixtures_name_the_line_and_the_problem(name, line, problem):
    with pytest.raises(TopologyParseError) as caught:
        parse_topo((FIXTURES / name).read_text())
    assert caught.value.line == line
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"line {line}: ")


@pytest.mark.parametrize("text, line, problem", [
    ("", 1, "no matrix header found"),
    ("hello\nworld\n", 2, "no matrix header found"),
    ("\tGPU0\tGPU1\nGPU0\tX\tPIX\nGPU1\tPIX\tNV1\n", 3, "GPU1's own cell is 'NV1', expected X"),
    ("\tGPU0\tGPU1\nGPU0\tX\tPIX\nGPU0\tX\tPIX\n", 3, "second row for GPU0 (the first is on line 2)"),
    ("\tGPU0\tGPU2\nGPU0\tX\tPIX\n", 1, "GPU columns must come first and be GPU0, GPU1, ... in order"),
    ("\tGPU0\tGPU1\nGPU0\tX\tPIX\nGPU7\tPIX\tX\n", 3, "'GPU7' is neither a GPU nor a NIC of the header"),
    ("\tGPU0\tGPU1\nGPU0\tX\tPIX\nGPU1\tPIX\n", 3, "row GPU1 has 1 device cells, the header names 2"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\tX\tPIX\t0-3\t7\nGPU1\tPIX\tX\t0-3\n", 2, "row GPU0 has 2 affinity cells"),
    ("\tGPU0\tGPU1\tNUMA Affinity\nGPU0\tX\tPIX\tzero\nGPU1\tPIX\tX\t0\n", 2, "NUMA affinity 'zero'"),
    ("\tGPU0\tGPU1\tFoo\tCPU Affinity\tBar\nGPU0\tX\tPIX\n", 1, "unexpected column 'Bar'"),
    ("\tGPU0\tGPU1\nGPU0\tX\tN/A\nGPU1\tN/A\tX\n", 2, "the link GPU0-GPU1: unknown link class 'N/A'"),
])
def test_malformed_text_names_the_line_and_the_problem(text, line, problem):
    with pytest.raises(TopologyParseError) as caught:
        parse_topo(text)
    assert (caught.value.line, problem in caught.value.problem) == (line, True), str(caught.value)


def test_link_classes_are_ordered_and_every_nvlink_beats_every_pcie_path():
    order = ["SYS", "SOC", "NODE", "PHB", "PXB", "PIX", "NV1", "NV2", "NV4", "NV12", "NV18"]
    links = [Link.parse(token) for token in order]
    assert [link.rank for link in links] == sorted(link.rank for link in links)
    assert Link.parse("SOC") == Link.parse("SYS")
    assert [link.gbps for link in links] == sorted(link.gbps for link in links)
    assert min(l.rank for l in links if l.is_nvlink) > max(l.rank for l in links if not l.is_nvlink)
    with pytest.raises(TopologyError):
        Link.parse("NV0")


def test_cpu_lists_round_trip():
    assert parse_cpu_list("0-3,8,10-11") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert format_cpu_list(parse_cpu_list("10-11,0-3,8")) == "0-3,8,10-11"
    assert parse_cpu_list("N/A") == frozenset()
    with pytest.raises(TopologyError):
        parse_cpu_list("3-1")
