from batchsched.core.gangs import REASON_GROUP_NOT_FOUND, REASON_INVALID_GROUP, build_gangs, no_members_message
from tests.unit.helpers import gang_pods, group, node, pod, snapshot

NODES = [node("n")]


def test_a_group_collects_its_pods_and_a_lone_pod_is_a_gang_of_one():
    gangs = build_gangs(snapshot(NODES, gang_pods("g", 3) + [pod("solo", priority=7)], [group("g", min_member=3)]))
    assert list(gangs) == ["default/g", "default/pod:solo"]
    g, solo = gangs["default/g"], gangs["default/pod:solo"]
    assert len(g.pending) == 3 and g.need == 3 and g.eligible and not g.implicit
    assert solo.implicit and solo.min_member == 1 and solo.priority == 7 and solo.eligible


def test_only_our_pods_make_gangs():
    pods = [pod("theirs", scheduler="default-scheduler"), pod("ours-elsewhere", group="g", scheduler="other")]
    assert build_gangs(snapshot(NODES, pods)) == {}


def test_pods_of_another_scheduler_with_the_label_are_foreign_not_members():
    pods = gang_pods("g", 1) + [pod("taken", group="g", scheduler="default-scheduler", node_name="n"),
                                pod("done", group="g", scheduler="default-scheduler", phase="Succeeded"),
                                pod("other-gang", group="h", scheduler="default-scheduler")]
    g = build_gangs(snapshot(NODES, pods, [group("g", min_member=2)]))["default/g"]
    assert [p.name for p in g.members] == ["g-0"] and g.active == 1
    assert [p.name for p in g.foreign] == ["taken"]  # a finished pod is history, not a mistake to fix


SELECTOR = "pods with label scheduling.batchsched.io/pod-group=train and schedulerName batchsched in default"


def test_a_group_without_pods_says_what_it_looked_for_and_which_label_values_are_close():
    alone = snapshot(NODES, [pod("x", group="unrelated")]).cluster
    assert no_members_message(alone, "default", "train", 4) == f"0/4 members exist: no {SELECTOR}."
    typo = snapshot(NODES, [pod("t-0", group="trian"), pod("t-1", group="trian"), pod("t-2", group="Train"),
                            pod("u", group="unrelated"), pod("elsewhere", ns="b", group="train-1")]).cluster
    assert no_members_message(typo, "default", "train", 4) == (
        f"0/4 members exist: no {SELECTOR}; pods in default carry scheduling.batchsched.io/pod-group=Train, "
        "trian (a typo?).")


def test_a_group_whose_pods_name_another_scheduler_names_them():
    pods = [pod(f"w-{i}", group="train", scheduler="default-scheduler", node_name="n" if i < 2 else None)
            for i in range(8)] + [pod("v", group="train", scheduler="volcano")]
    assert no_members_message(snapshot(NODES, pods).cluster, "default", "train", 3) == (
        f"0/3 members exist: no {SELECTOR}; 8 pod(s) carry the gang label but schedulerName default-scheduler: "
        "w-0 (bound to n), w-1 (bound to n), w-2, w-3, w-4 and 3 more; 1 pod(s) carry the gang label but "
        "schedulerName volcano: v; they do not count toward minMember (set schedulerName: batchsched).")


def test_member_states():
    pods = [
        pod("bound", group="g", node_name="n", phase="Running"),
        pod("done", group="g", node_name="n", phase="Succeeded"),
        pod("failed", group="g", node_name="n", phase="Failed"),
        pod("leaving", group="g", node_name="n", phase="Running", deleting=True),
        pod("waiting", group="g"),
        pod("gated", group="g", gated=True),
        pod("deleted-unbound", group="g", deleting=True),
    ]
    g = build_gangs(snapshot(NODES, pods, [group("g", min_member=3)]))["default/g"]
    assert [p.name for p in g.bound_active] == ["bound"]
    assert [p.name for p in g.pending] == ["waiting"]
    assert g.gated == 1 and len(g.members) == 7
    assert g.active == 2 and not g.eligible  # a Succeeded member does not count toward minMember
    assert g.need == 2


def test_a_succeeded_member_does_not_count_toward_quorum():
    pods = [pod("a", group="g", node_name="n", phase="Succeeded"), pod("b", group="g")]
    g = build_gangs(snapshot(NODES, pods, [group("g", min_member=2)]))["default/g"]
    assert not g.eligible and g.need == 2


def test_missing_and_invalid_groups_are_problems():
    pods = [pod("a", group="missing"), pod("b", group="bad")]
    gangs = build_gangs(snapshot(NODES, pods, invalid_groups={"default/bad": "spec.minMember must be >= 1"}))
    missing, bad = gangs["default/missing"], gangs["default/bad"]
    assert (missing.problem.reason, missing.problem.message) == (REASON_GROUP_NOT_FOUND,
                                                                  "PodGroup default/missing not found")
    assert (bad.problem.reason, bad.problem.message) == (REASON_INVALID_GROUP, "spec.minMember must be >= 1")
    assert not missing.eligible and not bad.eligible


def test_priority_is_the_highest_members_lowered_by_the_groups_when_set():
    pods = gang_pods("set", 2, priority=3) + gang_pods("zero", 1, priority=5) + [
        pod("u1", group="unset", priority=2), pod("u2", group="unset", priority=9),
        pod("m", group="missing", priority=4)]
    groups = [group("set", priority=100), group("zero", priority=0), group("unset")]
    gangs = build_gangs(snapshot(NODES, pods, groups))
    assert gangs["default/set"].priority == 3  # a PodGroup never lifts a gang above its pods
    assert gangs["default/zero"].priority == 0  # but may lower it, even to 0
    assert gangs["default/unset"].priority == 9
    assert gangs["default/missing"].priority == 4


def test_signature_follows_generation_and_membership():
    base = build_gangs(snapshot(NODES, gang_pods("g", 2), [group("g", generation=1)]))["default/g"]
    same = build_gangs(snapshot(NODES, gang_pods("g", 2), [group("g", generation=1)]))["default/g"]
    newer = build_gangs(snapshot(NODES, gang_pods("g", 2), [group("g", generation=2)]))["default/g"]
    bigger = build_gangs(snapshot(NODES, gang_pods("g", 3), [group("g", generation=1)]))["default/g"]
    assert base.signature == same.signature
    assert base.signature != newer.signature and base.signature != bigger.signature
