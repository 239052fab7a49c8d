"""Every message true and consistent (issue 17 point 3): on random small
clusters and gangs, the numbers a verdict states add up, explain agrees with
the cycle on gangs that can never fit, and conditions never contradict
their own status."""
import re
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsched.core.cycle import schedule_cycle
from batchsched.core.explain import explain_gang
from batchsched.core.status import PHASES, conditions_for
from tests.unit.helpers import group, node, pod, snapshot
from tests.unit.test_cycle import CONFIG, new_queue

GPU_TAINT = ("nvidia.com/gpu", "present", "NoSchedule")

nodes_strategy = st.lists(st.builds(
    dict, cpu=st.integers(1, 8), gpu=st.sampled_from([0, 4, 8]), pods=st.integers(1, 6),
    tainted=st.booleans(), unschedulable=st.sampled_from([False, False, False, True]),
    zone=st.sampled_from(["a", "b"])), min_size=1, max_size=4)
shape_strategy = st.builds(dict, cpu=st.integers(1, 4), gpu=st.sampled_from([0, 0, 1, 2, 4, 8, 16]),
                           zone=st.sampled_from([None, None, "a", "c"]), tolerate=st.booleans())
gangs_strategy = st.lists(st.builds(
    dict, shapes=st.lists(shape_strategy, min_size=1, max_size=2), size=st.integers(1, 5),
    extra=st.integers(-1, 2)), min_size=1, max_size=3)
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def build(nodes_spec, gangs_spec):
    nodes = [node(f"n{i}", cpu=str(n["cpu"]), gpu=n["gpu"], pods=n["pods"], labels={"zone": n["zone"]},
                  taints=[GPU_TAINT] if n["tainted"] else [], unschedulable=n["unschedulable"])
             for i, n in enumerate(nodes_spec)]
    pods, groups = [], []
    for g, spec in enumerate(gangs_spec):
        for j in range(spec["size"]):
            shape = spec["shapes"][j % len(spec["shapes"])]
            pods.append(pod(f"g{g}-{j}", group=f"g{g}", cpu=shape["cpu"], gpu=shape["gpu"], created=g,
                            node_selector={"zone": shape["zone"]} if shape["zone"] else None,
                            tolerations=[TOLERATE_GPU] if shape["tolerate"] else ()))
        # extra < 0: one member more than exist, so the quorum is not reached
        groups.append(group(f"g{g}", min_member=max(1, spec["size"] - spec["extra"]), created=g))
    return snapshot(nodes, pods, groups)


def check_failure_counts_add_up(message: str, nodes: int) -> None:
    needs = re.search(r"needs (\d+) pods? placed at once", message)
    assert needs and int(needs.group(1)) > 0, message
    for total in re.findall(r"0/(\d+) nodes", message):
        assert int(total) == nodes, message
    available = re.search(r"0/\d+ nodes are available(?: for pod \S+)?: (.*)\.$", message)
    if available:
        counts = [int(n) for n in re.findall(r"(?:^|, )(\d+) ", available.group(1))]
        assert all(0 < n <= nodes for n in counts) and sum(counts) >= nodes, message
    for part in re.findall(r"0/\d+ nodes could hold one even empty: ([^;]*?)\.?(?:;|$)", message):
        counts = [int(n) for n in re.findall(r"(?:^|, )(\d+) ", part)]
        assert all(0 < n <= nodes for n in counts) and sum(counts) >= nodes, message
    places = re.search(r"the best plan found places (\d+) \(([^)]*)\); with (\d+|none) of them placed", message)
    if places:
        placed, before = int(places.group(1)), int(places.group(3).replace("none", "0"))
        per_node = [int(n) for n in re.findall(r": (\d+)", places.group(2))]
        assert sum(per_node) == placed and 0 <= before <= placed < int(needs.group(1)), message
        assert places.group(3) != "0", message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes_strategy, gangs_strategy)
def test_verdict_numbers_add_up_and_explain_agrees_on_gangs_that_never_fit(nodes_spec, gangs_spec):
    snap = build(nodes_spec, gangs_spec)
    plan = schedule_cycle(snap, new_queue(), CONFIG)
    for key, verdict in plan.verdicts.items():
        assert "needs 0" not in verdict.message
        if verdict.reason in ("Unschedulable", "ExceedsClusterCapacity"):
            check_failure_counts_add_up(verdict.message, len(nodes_spec))
        assert (verdict.reason == "ExceedsClusterCapacity") == verdict.message.startswith("Exceeds cluster capacity")
        report = explain_gang(snap, key)
        assert "needs 0" not in str(report) and "needs 0" not in report.verdict
        if verdict.reason == "ExceedsClusterCapacity":
            assert report.data["neverFits"]["message"] == verdict.message == report.verdict
        elif verdict.reason in ("Unschedulable", "Scheduled"):
            assert "neverFits" not in report.data, (verdict, report.data)
        if verdict.reason == "QuorumNotReached":
            assert report.data["reason"] == "QuorumNotReached"
            assert "placed at once" not in str(report)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(PHASES), st.sampled_from(["", "Scheduled", "Unschedulable", "ExceedsClusterCapacity",
                                                 "QuorumNotReached", "ScheduleTimeout", "InvalidPodGroup"]))
def test_no_condition_names_the_opposite_of_its_status(phase, reason):
    conditions = {c["type"]: c for c in conditions_for(phase, reason, "why")}
    assert set(conditions) == {"Scheduled", "Unschedulable"}
    for c in conditions.values():
        if c["reason"] in ("Scheduled", "Unschedulable"):  # a reason that names a condition type says it holds
            assert conditions[c["reason"]]["status"] == "True", conditions
        if c["reason"] == "Schedulable":
            assert conditions["Unschedulable"]["status"] == "False", conditions
    assert conditions["Unschedulable"]["reason"] != "Scheduled", conditions
    assert Counter(c["status"] for c in conditions.values())["True"] <= 1, conditions
