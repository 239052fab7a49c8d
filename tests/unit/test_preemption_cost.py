"""Preemption that costs less: among victims of equal priority cost, those
losing the least work (run time, or since a checkpoint-time annotation), and
the per-namespace eviction budget (docs/preemption.md)."""
import asyncio
import logging
from dataclasses import replace

import pydantic
import pytest

from batchsched.api.constants import CHECKPOINT_TIME_ANNOTATION
from batchsched.config import SchedulerConfig
from batchsched.core.readers import pod_from_json
from batchsched.core.preemption.plan import lost_work
from batchsched.core.preemption.policy import EvictionLog, PreemptionPolicy, PreemptionState
from tests.unit.helpers import T0, gang_pods, group, node, pod, snapshot
from tests.unit.test_cache import new_cache, pod_json
from tests.unit.test_preemption import POLICY, cycle

HOUR = 3600.0
NOW = 10 * HOUR  # snapshot time, seconds after T0


def running(name: str, node_name: str, started: float, gpu: int = 4, ns: str = "default", **fields):
    """A priority-10 pod on ``node_name`` since ``started`` (seconds after T0)."""
    return replace(pod(name, ns=ns, gpu=gpu, node_name=node_name, phase="Running", priority=10,
                       scheduler="default-scheduler"), started=T0 + started, **fields)


def victims(plan) -> list[str]:
    return sorted(e.pod.name for e in plan.evictions)


def test_of_two_equally_costly_victims_the_one_that_ran_less_goes():
    pods = [running("old", "a", started=0), running("young", "b", started=NOW - 600),
            pod("solo", gpu=4, priority=100)]
    for nodes in ([node("a", gpu=4), node("b", gpu=4)], [node("b", gpu=4), node("a", gpu=4)]):
        plan = cycle(snapshot(nodes, pods, now=NOW))
        assert victims(plan) == ["young"]  # 10 minutes lost, not 10 hours, whichever node comes first


def test_a_recent_checkpoint_makes_the_older_pod_the_cheaper_victim():
    nodes = [node("a", gpu=4), node("b", gpu=4)]
    saved = running("old", "a", started=0, checkpoint=T0 + NOW - 60)  # saved a minute ago
    plan = cycle(snapshot(nodes, [saved, running("young", "b", started=NOW - 600),
                                  pod("solo", gpu=4, priority=100)], now=NOW))
    assert victims(plan) == ["old"]


def test_a_checkpoint_in_the_future_or_before_the_start_counts_the_run_since_the_start():
    p = running("p", "a", started=NOW - 600, gpu=2)
    now = T0 + NOW
    assert lost_work(p, now) == 600 * 2  # GPU-seconds
    assert lost_work(replace(p, checkpoint=now + HOUR), now) == 600 * 2  # hostile: ignored
    assert lost_work(replace(p, checkpoint=now - 2 * HOUR), now) == 600 * 2  # an earlier run's
    assert lost_work(replace(p, checkpoint=now - 100), now) == 100 * 2
    assert lost_work(replace(p, gpu_ids=(), requests={}), now) == 600  # no GPUs: counts as one
    assert lost_work(replace(p, started=0.0), now) == 0  # not started: nothing to lose


def test_lost_work_ranks_after_the_priority_cost():
    # "old" has the lower priority: it goes whatever it loses
    nodes = [node("a", gpu=4), node("b", gpu=4)]
    cheap = replace(running("old", "a", started=0), priority=5)
    plan = cycle(snapshot(nodes, [cheap, running("young", "b", started=NOW - 60),
                                  pod("solo", gpu=4, priority=100)], now=NOW))
    assert victims(plan) == ["old"]


@pytest.mark.parametrize("value, problem, checkpoint", [
    ("2026-12-02T01:00:00Z", "", 1796173200.0), ("2026-12-02T03:00:00.5+02:00", "", 1796173200.5),
    ("2026-12-02 01:00:00", "is not an RFC3339 time", 0), ("2026-12-02T01:00:00", "is not an RFC3339 time", 0),
    ("2026-13-40T01:00:00Z", "is not an RFC3339 time", 0), ("yesterday", "is not an RFC3339 time", 0),
    ("9" * 10_000, "is not an RFC3339 time", 0)])
def test_the_checkpoint_annotation_is_rfc3339_or_ignored(value, problem, checkpoint):
    obj = pod_json("p", "u1", node="a")
    obj["metadata"]["annotations"] = {CHECKPOINT_TIME_ANNOTATION: value}
    converted = pod_from_json(obj)
    assert converted.checkpoint == checkpoint
    assert (problem in converted.checkpoint_problem) if problem else not converted.checkpoint_problem
    assert len(converted.checkpoint_problem) < 80  # a hostile value is quoted short


def test_the_cache_logs_an_ignored_checkpoint_once_per_value(caplog):
    cache = asyncio.run(new_cache())
    obj = pod_json("p", "u1", node="a")
    caplog.set_level(logging.WARNING, logger="batchsched.shell.handlers.pods")
    for value in ("soon", "soon", "2999-01-01T00:00:00Z", "2020-01-01T00:00:00Z"):
        obj["metadata"]["annotations"] = {CHECKPOINT_TIME_ANNOTATION: value}
        obj["metadata"]["resourceVersion"] = value
        cache._apply_pod("MODIFIED", obj)
    lines = [r.getMessage() for r in caplog.records if CHECKPOINT_TIME_ANNOTATION in r.getMessage()]
    assert len(lines) == 2, lines
    assert "'soon' is not an RFC3339 time" in lines[0] and "in the future" in lines[1]


# --- the eviction budget per namespace and hour -----------------------------------

BUDGET = replace(POLICY, namespace_evictions_per_hour=2)


def test_a_namespace_past_its_budget_gives_no_victims_and_the_verdict_says_so():
    nodes = [node("a", gpu=4)]
    pods = [running("inf", "a", started=0, ns="serving"), pod("solo", gpu=4, priority=100)]
    spent = PreemptionState(evicted_last_hour={"serving": 2})
    plan = cycle(snapshot(nodes, pods, now=NOW), BUDGET, spent)
    assert victims(plan) == []
    message = plan.verdicts["default/pod:solo"].message
    assert "Namespace(s) serving reached their eviction budget (maxPerNamespacePerHour=2)" in message
    assert victims(cycle(snapshot(nodes, pods, now=NOW), BUDGET, PreemptionState(evicted_last_hour={"serving": 1}))) \
        == ["inf"]


def test_the_budget_counts_the_victims_of_earlier_preemptors_in_the_cycle():
    nodes = [node("a", gpu=4), node("b", gpu=4), node("c", gpu=4)]
    pods = [running(f"inf-{n}", n, started=0, ns="serving") for n in "abc"]
    pods += [replace(pod(f"solo-{k}", gpu=4, priority=100), created=T0 + k) for k in range(3)]
    plan = cycle(snapshot(nodes, pods, now=NOW), BUDGET)
    assert len(plan.evictions) == 2 and {e.pod.namespace for e in plan.evictions} == {"serving"}
    assert "reached their eviction budget" in plan.verdicts["default/pod:solo-2"].message


def test_a_victim_gang_beyond_the_budget_is_not_taken():
    nodes = [node("a", gpu=8)]
    members = [replace(p, started=T0) for p in gang_pods("old", 3, gpu=2, priority=10, node_name="a",
                                                        phase="Running", ns="serving")]
    pods = members + [pod("solo", gpu=4, priority=100)]
    groups = [group("old", ns="serving", min_member=3)]
    assert len(cycle(snapshot(nodes, pods, groups, now=NOW)).evictions) == 3
    plan = cycle(snapshot(nodes, pods, groups, now=NOW), BUDGET)
    assert plan.evictions == []


def test_reclaim_is_not_limited_by_the_budget():
    assert BUDGET.namespace_evictions_per_hour == 2
    state = PreemptionState(evicted_last_hour={"serving": 5})
    assert state.evictions_left(BUDGET, "serving") == 0 and state.evictions_left(BUDGET, "other") == 2
    assert state.evictions_left(POLICY, "serving") == float("inf")


def test_the_eviction_log_forgets_after_an_hour():
    log = EvictionLog()
    log.add(0.0, "a")
    log.add(100.0, "a")
    log.add(200.0, "b")
    assert log.last_hour(3599.0) == {"a": 2, "b": 1}
    assert log.last_hour(3650.0) == {"a": 1, "b": 1}
    assert log.last_hour(4000.0) == {}


def test_the_budget_is_configured_and_validated():
    config = SchedulerConfig.model_validate({"preemption": {"victims": {"maxPerNamespacePerHour": 20}}})
    assert config.preemption.policy().namespace_evictions_per_hour == 20
    assert SchedulerConfig().preemption.policy().namespace_evictions_per_hour is None
    for bad in (-1, "many", 1.5):
        with pytest.raises(pydantic.ValidationError):
            SchedulerConfig.model_validate({"preemption": {"victims": {"maxPerNamespacePerHour": bad}}})


def test_preemptor_waits_are_configured_and_validated():
    config = SchedulerConfig.model_validate({"preemption": {"preemptors": {"waitSeconds": {"training": 1800}}}})
    assert config.preemption.policy().preemptor_wait_seconds == (("training", 1800.0),)
    assert SchedulerConfig().preemption.policy().preemptor_wait_seconds == ()
    for bad in ({"training": -1}, {"": 5}, {"training": "soon"}, {"training": float("nan")}, {"t": 1e12}):
        with pytest.raises(pydantic.ValidationError):
            SchedulerConfig.model_validate({"preemption": {"preemptors": {"waitSeconds": bad}}})


def test_a_cost_term_added_to_the_registry_decides_for_units_and_sets_alike(monkeypatch):
    """The victim cost is one list of terms: a unit costs what the set of it
    alone costs, and a term put first (here: victims in namespace "keep"
    are dearer) orders both the candidate units and the chosen set."""
    from batchsched.core.preemption import cost
    from batchsched.core.preemption.cost import COST_TERMS, CostTerm, VictimUnit, set_cost, unit_cost

    pods = [running("old", "a", started=0), running("young", "b", started=NOW - 600, ns="keep")]
    units = [VictimUnit(p.uid, (p,), False, T0 + NOW) for p in pods]
    assert [unit_cost(u) for u in units] == [set_cost([u]) for u in units]
    assert len(unit_cost(units[0])) == len(COST_TERMS)
    solo = pod("solo", gpu=4, priority=100)
    nodes = [node("a", gpu=4), node("b", gpu=4)]
    assert victims(cycle(snapshot(nodes, pods + [solo], now=NOW))) == ["young"]  # least work lost
    kept = CostTerm("fewest victims in namespace keep", lambda v: sum(p.namespace == "keep" for p in v.pods))
    monkeypatch.setattr(cost, "COST_TERMS", (kept,) + COST_TERMS)
    assert unit_cost(units[1]) > unit_cost(units[0]) and set_cost(units) == (1,) + set_cost(units)[1:]
    assert victims(cycle(snapshot(nodes, pods + [solo], now=NOW))) == ["old"]
