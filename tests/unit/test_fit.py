from batchsched.core.placement.fit import (
    REASON_NODE_AFFINITY, REASON_NOT_READY, REASON_UNSCHEDULABLE, NodeFilter, fit_reasons,
    resource_reasons, static_reasons,
)
from tests.unit.helpers import node, pod

GPU_TAINT = ("nvidia.com/gpu", "present", "NoSchedule")
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_a_plain_pod_fits_a_plain_node():
    assert fit_reasons(pod("p", cpu=1), node("n"), node("n").allocatable) == []


def test_unschedulable_and_not_ready_nodes():
    assert static_reasons(pod("p"), node("n", unschedulable=True)) == [REASON_UNSCHEDULABLE]
    assert static_reasons(pod("p"), node("n", ready=False)) == [REASON_NOT_READY]


def test_a_pod_tolerating_the_lifecycle_taints_passes_unschedulable_and_not_ready():
    tolerant = pod("p", tolerations=[{"operator": "Exists"}])
    assert static_reasons(tolerant, node("n", unschedulable=True, ready=False)) == []


def test_untolerated_taints_use_the_taint_text_and_prefer_no_schedule_is_ignored():
    tainted = node("n", taints=[GPU_TAINT])
    assert static_reasons(pod("p"), tainted) == ["node(s) had untolerated taint {nvidia.com/gpu: present}"]
    assert static_reasons(pod("p", tolerations=[TOLERATE_GPU]), tainted) == []
    assert static_reasons(pod("p"), node("n", taints=[("k", "v", "PreferNoSchedule")])) == []
    assert static_reasons(pod("p"), node("n", taints=[("k", "", "NoExecute")])) == [
        "node(s) had untolerated taint {k: }"]


def test_the_standard_unschedulable_taint_is_an_ordinary_taint():
    cordoned = node("n", taints=[("node.kubernetes.io/unschedulable", "", "NoSchedule")])
    assert static_reasons(pod("p"), cordoned) == [
        "node(s) had untolerated taint {node.kubernetes.io/unschedulable: }"]
    toleration = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}
    assert static_reasons(pod("p", tolerations=[toleration]), cordoned) == []


def test_node_selector_and_required_affinity():
    labelled = node("n", labels={"pool": "gpu", "zone": "a"})
    assert static_reasons(pod("p", node_selector={"pool": "gpu"}), labelled) == []
    assert static_reasons(pod("p", node_selector={"pool": "cpu"}), labelled) == [REASON_NODE_AFFINITY]
    term_b = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}
    term_a = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    assert static_reasons(pod("p", affinity_terms=[term_b]), labelled) == [REASON_NODE_AFFINITY]
    assert static_reasons(pod("p", affinity_terms=[term_b, term_a]), labelled) == []  # terms ORed


def test_resource_reasons_one_per_short_resource():
    assert resource_reasons({"cpu": 4000, "memory": 10, "pods": 1}, {"cpu": 1000, "memory": 5, "pods": 0}) == [
        "Insufficient cpu", "Insufficient memory", "Too many pods"]


def test_a_resource_the_node_does_not_advertise_is_zero():
    assert fit_reasons(pod("p", gpu=1), node("n"), node("n").allocatable) == ["Insufficient nvidia.com/gpu"]


def test_static_failures_are_reported_before_resources():
    full = {"cpu": 0, "memory": 0, "pods": 0}
    assert fit_reasons(pod("p", cpu=1), node("n", unschedulable=True), full) == [REASON_UNSCHEDULABLE]


def test_node_filter_caches_per_placement_constraints():
    nodes = {n.name: n for n in [node("a", taints=[GPU_TAINT]), node("b")]}
    node_filter = NodeFilter(nodes)
    first = node_filter.evaluate(pod("p1", cpu=1))
    assert first.feasible == ("b",)
    assert first.rejected == {"a": "node(s) had untolerated taint {nvidia.com/gpu: present}"}
    assert node_filter.evaluate(pod("p2", cpu=3)) is first  # same constraints, other requests
    assert node_filter.evaluate(pod("p3", tolerations=[TOLERATE_GPU])).feasible == ("a", "b")
