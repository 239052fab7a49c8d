"""Tenant-written fields never buy a gang more than its pods were admitted with (issue 11, point 4)."""
from batchsched.core.config import CoreConfig
from batchsched.core.cycle import schedule_cycle
from batchsched.core.gangs import GangIndex
from batchsched.core.preemption.policy import PreemptionPolicy
from batchsched.core.queueing.queue import GangQueue
from tests.unit.helpers import gang_pods, group, node, pod, snapshot

CONFIG = CoreConfig()


def test_a_podgroup_naming_a_critical_class_does_not_lift_the_gang_above_its_pods():
    pods = gang_pods("greedy", 2, cpu=1, priority=10) + gang_pods("honest", 2, cpu=1, priority=100)
    groups = [group("greedy", min_member=2, priority=2_000_000_000, created=0),  # system-cluster-critical
              group("honest", min_member=2, created=5)]
    snap = snapshot([node("n", cpu="2")], pods, groups)
    gangs = GangIndex(snap)
    assert gangs["default/greedy"].priority == 10
    plan = schedule_cycle(snap, GangQueue.from_config(CONFIG), CONFIG)
    assert {b.gang_key for b in plan.bindings} == {"default/honest"}


def test_a_podgroup_may_lower_its_gang():
    snap = snapshot([node("n")], gang_pods("g", 1, priority=100), [group("g", priority=5)])
    assert GangIndex(snap)["default/g"].priority == 5


def test_the_podgroup_priority_class_does_not_make_a_gang_a_preemptor():
    policy = PreemptionPolicy(preemptor_priority_classes=frozenset({"training"}))
    members = tuple(gang_pods("g", 1, priority=100))
    spec = group("g")
    spec_naming_training = type(spec)(**{**spec.__dict__, "priority_class": "training"})
    assert policy.why_not_preempt(spec_naming_training, 100, members) == "its PriorityClass is not one that may preempt"


def test_the_opt_out_annotation_is_honoured_only_where_configured():
    victim = pod("inf", ns="team-a", gpu=1, node_name="n", phase="Running", priority=1)
    opted_out = type(victim)(**{**victim.__dict__, "preemptible": False})
    assert PreemptionPolicy().may_be_victim(opted_out, 100, 0.0)  # default: honoured nowhere
    assert not PreemptionPolicy(opt_out_namespaces=frozenset({"team-a"})).may_be_victim(opted_out, 100, 0.0)
    assert PreemptionPolicy(opt_out_namespaces=frozenset({"team-b"})).may_be_victim(opted_out, 100, 0.0)
    assert not PreemptionPolicy(opt_out_namespaces=frozenset({"*"})).may_be_victim(opted_out, 100, 0.0)


def test_victims_are_judged_by_their_gangs_effective_priority():
    from batchsched.core.preemption.plan import victim_units
    from batchsched.core.preemption.policy import PreemptionState
    # pods admitted at 500, their PodGroup lowers the gang to 50: a gang at 100 may preempt it
    running = [replace_running(p) for p in gang_pods("low", 2, gpu=4, priority=500)]
    preemptor = gang_pods("p", 1, gpu=8, priority=100)
    snap = snapshot([node("n", gpu=8)], running + preemptor, [group("low", min_member=2, priority=50), group("p")])
    gangs = GangIndex(snap)
    units = victim_units(snap, gangs, gangs["default/p"], PreemptionPolicy(), PreemptionState())
    assert [u.key for u in units] == ["gang:default/low"]


def replace_running(p):
    from dataclasses import replace
    return replace(p, node_name="n", phase="Running")
