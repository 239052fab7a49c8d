"""GPU topology end to end: nodes annotated by `batchsched topo parse`'s own
code, the real scheduler process, and the gpu-ids the API server merges into
the pods from the Binding."""
from __future__ import annotations

from pathlib import Path

import pytest

from batchsched.api import constants
from batchsched.core.topology.annotation import to_annotation
from batchsched.core.topology.parse import parse_topo
from tests.support.kube import wait_for
from tests.support.metrics import sample
from tests.support.objects import pod, pod_group

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topologies"
# (DGX-1, PCIe server) captures: the project's fixtures, and the real ones in ../shared
SOURCES = {
    "fixtures": (FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt", FIXTURES / "pcie-switch-pairs-8gpu.txt"),
    "shared": ("dgx1-v100-8gpu-nv1-nv2-mlx5-ucxpy.txt", "pcie-8gpu-pix-node-sys-2numa-johnsblog.txt"),
}
# The hybrid cube mesh, as both captures have it: which pairs are NVLink.
DGX1_NVLINK = {(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3), (2, 6), (3, 7),
               (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)}


@pytest.fixture(params=sorted(SOURCES))
def captures(request) -> tuple[str, str]:
    """Annotation values for a DGX-1 and a PCIe server, made by our own parser."""
    paths = SOURCES[request.param]
    if request.param == "shared":
        shared = request.getfixturevalue("shared_dir")  # skips, saying why, without ../shared
        paths = tuple(shared / "data" / "topologies" / name for name in paths)
    return tuple(to_annotation(parse_topo(Path(p).read_text())) for p in paths)


def topology_node(env, name: str, annotation: str, **kwargs) -> str:
    return env.add_node(name, gpus=8, annotations={constants.GPU_TOPOLOGY_ANNOTATION: annotation}, **kwargs)


def gpu_ids(env, name: str) -> tuple[int, ...] | None:
    """The ids the scheduler chose for a bound pod (None while unbound)."""
    p = env.pods().get(name)
    if not p or not p["spec"].get("nodeName"):
        return None
    text = (p["metadata"].get("annotations") or {}).get(constants.GPU_IDS_ANNOTATION)
    return tuple(int(i) for i in text.split(",")) if text else ()


def bound_pod(env, name: str, node: str, ids: str, gpus: int) -> None:
    """A pod of ours bound before the scheduler starts, holding GPUs ``ids``."""
    p = pod(name, env.namespace, gpus=gpus, cpu="1")
    p["spec"]["nodeName"] = node
    p["metadata"]["annotations"] = {constants.GPU_IDS_ANNOTATION: ids}
    env.create(p)


def test_a_four_gpu_pod_gets_an_nvlink_quad_in_one_numa_node(env, start_scheduler, captures):
    dgx_annotation, pcie_annotation = captures
    dgx = topology_node(env, "dgx1", dgx_annotation)
    topology_node(env, "pcie", pcie_annotation)
    env.create(pod("quad", env.namespace, gpus=4, cpu="1"))
    proc = start_scheduler()
    ids = wait_for("quad bound", lambda: gpu_ids(env, "quad"))
    assert env.bound()["quad"] == dgx
    assert ids == (0, 1, 2, 3)  # NUMA 0 of the DGX-1
    assert all((i, j) in DGX1_NVLINK for i in ids for j in ids if i < j)
    wait_for("the aligned placement counted", lambda: sample(
        proc.get("/metrics")[1], "batchsched_multi_gpu_pods_bound_total", 'aligned="true"') == 1)


def test_a_two_gpu_pod_on_a_partly_used_node_gets_an_nvlink_pair(env, start_scheduler, captures):
    dgx = topology_node(env, "dgx1", captures[0])
    for gpu in (0, 1, 2, 4):  # leaves 3, 5, 6, 7: its lowest pair, 3-5, is PCIe (SYS)
        bound_pod(env, f"held-{gpu}", dgx, str(gpu), gpus=1)
    env.create(pod("pair", env.namespace, gpus=2, cpu="1"))
    start_scheduler()
    ids = wait_for("pair bound", lambda: gpu_ids(env, "pair"))
    assert ids in DGX1_NVLINK and ids == (5, 6)


def test_a_hard_domain_gang_lands_inside_one_domain_or_not_at_all(env, start_scheduler, captures):
    domain_of = {}
    for clique, count in (("a", 2), ("b", 3)):
        for i in range(count):
            node = topology_node(env, f"{clique}{i}", captures[0],
                                 labels={constants.GPU_CLIQUE_LABEL: f"{env.id}-{clique}"})
            domain_of[node] = clique
    required = {"topologyPolicy": {"domain": {"mode": "required"}}}
    # 4 whole nodes fit the cluster (5 are free) but no single clique: never bound
    env.create(pod_group("wide", env.namespace, 4, **required))
    env.create(pod_group("fits", env.namespace, 3, **required))
    for name, size in (("wide", 4), ("fits", 3)):
        for i in range(size):
            env.create(pod(f"{name}-{i}", env.namespace, group=name, gpus=8, cpu="1"))
    start_scheduler()
    wait_for("fits bound", lambda: len([p for p in env.bound() if p.startswith("fits-")]) == 3)
    assert {domain_of[n] for p, n in env.bound().items() if p.startswith("fits-")} == {"b"}
    condition = wait_for("wide's verdict", lambda: next(
        (c for c in (env.podgroup("wide").get("status") or {}).get("conditions") or ()
         if c["type"] == "Scheduled" and c["reason"] == "Unschedulable"), None))
    assert "inside one domain" in condition["message"], condition["message"]
    assert not [p for p in env.bound() if p.startswith("wide-")]


def test_a_small_pod_keeps_off_a_free_clique_while_a_whole_node_gang_waits(env, start_scheduler, captures):
    """keepCliquesWhole (on by default): nodes alike, so without it best fit
    ties and the first name, a clique node, would win (checked: with
    keepCliquesWhole false the pod goes to a0)."""
    clique = [topology_node(env, f"a{i}", captures[0], labels={constants.GPU_CLIQUE_LABEL: f"{env.id}-a"})
              for i in range(2)]
    outside = topology_node(env, "z", captures[0])
    assert sorted(clique + [outside])[-1] == outside
    env.create(pod_group("big", env.namespace, 4))  # 4 whole nodes of 3: it waits
    for i in range(4):
        env.create(pod(f"big-{i}", env.namespace, group="big", gpus=8, cpu="1"))
    env.create(pod("small", env.namespace, gpus=2, cpu="1"))
    start_scheduler()
    wait_for("small bound", lambda: "small" in env.bound())
    assert env.bound()["small"] == outside
    assert not [p for p in env.bound() if p.startswith("big-")]


def test_gpu_ids_survive_a_restart_and_a_broken_annotation_means_flat(env, start_scheduler):
    dgx = topology_node(env, "dgx1", to_annotation(parse_topo(
        (FIXTURES / "dgx1-hybrid-cube-mesh-8gpu.txt").read_text())))
    broken = topology_node(env, "broken", '{"version": 1, "gpus": "eight"}', labels={"kind": "broken"})
    env.create(pod("first", env.namespace, gpus=2, cpu="1", node_selector={"kubernetes.io/hostname": dgx}))
    scheduler = start_scheduler()
    assert wait_for("first bound", lambda: gpu_ids(env, "first")) == (0, 3)
    scheduler.kill()
    env.create(pod("second", env.namespace, gpus=2, cpu="1", node_selector={"kubernetes.io/hostname": dgx}))
    env.create(pod("flat", env.namespace, gpus=2, cpu="1", node_selector={"kind": "broken"}))
    start_scheduler()
    assert wait_for("second bound", lambda: gpu_ids(env, "second")) == (1, 2)  # the next NV2 pair, not 0 or 3
    assert wait_for("flat bound", lambda: gpu_ids(env, "flat")) == (0, 1)  # lowest ids on a flat node
    events = wait_for("the node's event", lambda: [
        e for e in env.kube.get("/api/v1/namespaces/default/events")["items"]
        if e["involvedObject"].get("name") == broken and e["reason"] == "InvalidGpuTopology"])
    assert "gpus must be a non-empty list" in events[0]["message"]
