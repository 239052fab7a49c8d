"""`batchsched explain` reports (pure)."""
from dataclasses import replace

from batchsched.core.explain import explain_gang, explain_waiting, gang_key_for
from batchsched.core.model import TopologyPolicy
from tests.unit.helpers import gang_pods, group, node, pod, snapshot
from tests.unit.test_dra import cache  # noqa: F401  (a fixture)
from tests.unit.topology_support import fixture, topology_node


def test_report_answers_the_gpu_checklist_and_names_each_node():
    snap = snapshot([node("cpu", cpu="8"), node("gpu", gpu=8)], gang_pods("g", 2, gpu=8),
                    [group("g", min_member=2)])
    text = str(explain_gang(snap, "default/g"))
    assert "pods asking nvidia.com/gpu in limits: 2/2" in text
    assert "nodes advertising nvidia.com/gpu: 1/2 (8 allocatable, 8 free)" in text
    assert "cpu: Insufficient nvidia.com/gpu" in text
    assert "gpu: fits (1 such pod(s), GPUs 0,1,2,3,4,5,6,7 for the first)" in text
    assert "The gang needs 2 of its 2 pending pod(s) placed at once." in text
    assert text.endswith("Exceeds cluster capacity: gang default/g needs 2 pods placed at once; "
                         "they ask 16 nvidia.com/gpu, the cluster has 8 allocatable.")


def test_report_names_pods_asking_no_gpu_and_a_misspelt_resource_name():
    pods = [pod("g-0", gpu=8, group="g"), pod("g-1", group="g", extra_limits={"nvidia.com/gpus": "8"}),
            pod("g-2", cpu="1", group="g")]
    text = str(explain_gang(snapshot([node("gpu", gpu=8)], pods, [group("g", min_member=3)]), "default/g"))
    assert "pods asking nvidia.com/gpu in limits: 1/3" in text
    assert "-> 2 pod(s) ask no nvidia.com/gpu; they ask nvidia.com/gpus: a misspelt resource name?" in text
    text = str(explain_gang(snapshot([node("gpu", gpu=8)], [pod("h-0", cpu="1", group="h")],
                                     [group("h", min_member=1)]), "default/h"))
    assert "-> 1 pod(s) ask no nvidia.com/gpu; intended? GPUs are asked in resources.limits" in text


def test_every_pod_asking_a_gpu_gets_no_hint():
    snap = snapshot([node("gpu", gpu=8)], gang_pods("g", 2, gpu=4), [group("g", min_member=2)])
    assert "ask no" not in str(explain_gang(snap, "default/g"))


def test_report_flags_missing_device_plugin_and_quorum():
    snap = snapshot([node("cpu")], gang_pods("g", 1, gpu=1), [group("g", min_member=2)])
    text = str(explain_gang(snap, "default/g"))
    assert "quorum not reached: 1 active members, minMember 2" in text
    assert "no node advertises GPUs" in text


def test_report_applies_the_gangs_topology_policy():
    """Only PCIe paths left free on a PCIe server: counts fit, require-nvlink does not."""
    pcie = topology_node("pcie", fixture("pcie-switch-pairs-8gpu.txt"))
    spec = replace(group("g", min_member=1), topology=TopologyPolicy(gpu_link="require-nvlink"))
    text = str(explain_gang(snapshot([pcie], [pod("g-0", gpu=2, group="g")], [spec]), "default/g"))
    assert "pcie: node(s) had no free GPUs all joined by NVLink" in text
    assert "room for 0 such pod(s)" in text


def test_targets_name_a_podgroup_a_pod_gang_or_a_lone_pod():
    snap = snapshot([node("gpu", gpu=8)], [*gang_pods("g", 2, ns="a", gpu=8), pod("solo", ns="a", gpu=1)],
                    [group("g", ns="a", min_member=2)])
    assert gang_key_for(snap, "a", "g") == gang_key_for(snap, "a", "podgroup/g") == "a/g"
    assert gang_key_for(snap, "a", "pod/g-1") == "a/g"
    assert gang_key_for(snap, "a", "pod/solo") == "a/pod:solo"
    assert gang_key_for(snap, "b", "pod/solo") == "b/pod:solo"  # unknown there: explain says so
    assert gang_key_for(snap, "a", "other/g") == "other/g"
    lone = explain_gang(snap, "a/pod:solo")
    assert str(lone).startswith("Gang a/pod:solo: minMember 1")
    assert not explain_gang(snap, "b/pod:solo").data["found"]


def test_the_list_view_has_one_verdict_per_waiting_gang_and_the_data_matches_the_text():
    snap = snapshot([node("gpu", gpu=8)],
                    [*gang_pods("big", 2, ns="a", gpu=8), *gang_pods("short", 1, ns="a", gpu=1),
                     pod("solo", ns="b", gpu=1), pod("placed", ns="a", gpu=1, node_name="gpu", phase="Running")],
                    [group("big", ns="a", min_member=2), group("short", ns="a", min_member=2)])
    reports = explain_waiting(snap, "a")
    assert [(r.data["gang"], r.verdict) for r in reports] == [
        ("a/big", "Exceeds cluster capacity: gang a/big needs 2 pods placed at once; "
                  "they ask 16 nvidia.com/gpu, the cluster has 8 allocatable."),
        ("a/short", "quorum not reached: 1 active members, minMember 2 (members that Succeeded or Failed "
                    "do not count)"),
    ]
    assert [r.data["gang"] for r in explain_waiting(snap, None)] == ["a/big", "a/short", "b/pod:solo"]
    big = reports[0].data
    assert big["members"] == {"total": 2, "bound": 0, "pending": 2, "gated": 0}
    assert big["gpuChecklist"]["gpusFree"] == 7 and big["shapes"][0]["room"] == 0
    assert {"node": "gpu", "fits": 0, "reasons": ["Insufficient nvidia.com/gpu"]} in big["shapes"][0]["nodes"]


def test_the_need_is_said_once_for_the_gang_and_never_as_zero_or_beyond_the_pods():
    nodes = [node("gpu-0", gpu=8), node("gpu-1", gpu=8)]
    busy = pod("busy", gpu=8, node_name="gpu-0", phase="Running")
    waiting = explain_gang(snapshot(nodes, [busy, *gang_pods("g", 2, gpu=8)], [group("g", min_member=2)]), "default/g")
    assert waiting.verdict == "needs 2 of its 2 pending pod(s) placed at once; room now for 1 like g-0"
    assert "neverFits" not in waiting.data and "reason" not in waiting.data
    # too few pods: no "room for 8 ... needs 4", the quorum is the verdict
    few = explain_gang(snapshot(nodes, gang_pods("g", 2, gpu=1), [group("g", min_member=4)]), "default/g")
    assert few.data["reason"] == "QuorumNotReached" and "needs" not in str(few)
    # the quorum bound: members beyond it are needed 0 at once, which is not said so
    bound = [replace(p, node_name="gpu-1", phase="Running") for p in gang_pods("g", 2, gpu=1)]
    extra = explain_gang(snapshot(nodes, [busy, *bound, pod("g-2", group="g", gpu=8)], [group("g", min_member=2)]),
                         "default/g")
    assert "needs 0" not in str(extra) and "needs 0" not in extra.verdict
    assert extra.verdict == "has its quorum bound; 1 more pod(s) are placed as room allows; room now for 0 like g-2"


def test_the_node_agents_condition_is_the_nodes_side_of_the_checklist():
    from batchsched.api import constants
    from batchsched.core.readers import node_from_json

    def agent_node(name: str, status: str, reason: str, message: str):
        return node_from_json({"metadata": {"name": name}, "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"},
                           {"type": constants.GPU_READY_CONDITION, "status": status, "reason": reason,
                            "message": message}]}})

    nodes = [agent_node("good", "True", "TopologyReported", "driver: 8 GPUs visible"),
             agent_node("bad", "False", "GPUCountMismatch", "driver: 8 GPUs visible; advertised: 4"),
             node("plain", gpu=8)]
    report = explain_gang(snapshot(nodes, gang_pods("g", 1, gpu=8), [group("g")]), "default/g")
    text = str(report)
    assert "nodes checked by the node agent (BatchschedGPUReady): 2, 1 not ready" in text
    assert "-> node bad: GPUCountMismatch: driver: 8 GPUs visible; advertised: 4" in text
    assert report.data["gpuChecklist"]["nodeAgent"]["notReady"] == [
        {"node": "bad", "reason": "GPUCountMismatch", "message": "driver: 8 GPUs visible; advertised: 4"}]
    assert "node agent" not in str(explain_gang(snapshot([node("plain", gpu=8)], gang_pods("g", 1, gpu=8),
                                                         [group("g")]), "default/g"))


def test_the_elastic_part_of_a_gang_is_shown_apart():
    pods = gang_pods("g", 2, gpu=8, node_name="gpu", phase="Running") + gang_pods("g", 4, gpu=8)[2:]
    snap = snapshot([node("gpu", gpu=8), node("gpu2", gpu=8)], pods, [group("g", min_member=2)])
    report = explain_gang(snap, "default/g")
    assert "  elastic: 2 member(s) beyond minMember 2 (0 bound, 2 pending): placed as room allows, the first " \
           "victims at their priority" in str(report)
    assert report.data["elastic"] == {"members": 2, "bound": 0, "pending": 2}
    whole = explain_gang(snapshot([node("gpu", gpu=8)], pods, [group("g", min_member=4)]), "default/g")
    assert "elastic" not in str(whole) and "elastic" not in whole.data


def test_report_names_a_dra_node_filtered_out_for_a_pod_reusing_an_init_containers_gpus(cache):
    from batchsched.core.cycle import schedule_cycle
    from batchsched.core.placement.fit import REASON_DRA_INIT_GPUS
    from batchsched.core.queueing.queue import GangQueue
    from tests.support import dra
    from tests.unit.test_dra import NODE, TOPOLOGY, listed, node_json
    from tests.unit.test_dra_extended import init_gpus_pod_json

    listed(cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)], pods=[init_gpus_pod_json("w")])
    snap = cache.snapshot(0)
    report = explain_gang(snap, "ns/pod:w")
    assert f"  {NODE}: {REASON_DRA_INIT_GPUS}" in report.lines
    assert report.data["shapes"][0]["nodes"] == [{"node": NODE, "fits": 0, "reasons": [REASON_DRA_INIT_GPUS]}]
    assert report.verdict == schedule_cycle(snap, GangQueue()).verdicts["ns/pod:w"].message
    assert REASON_DRA_INIT_GPUS in report.verdict
