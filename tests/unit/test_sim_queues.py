"""Queues in the simulator: workload files with queues, the fairness
figures on hand-computed cases, the proportion-style baseline, and no
ping-pong between two queues that both want more than their share."""
import math

import pytest

from batchsched.config import SchedulerConfig
from batchsched.core.queues.model import queue_from_json
from batchsched.sim.baselines import baseline
from batchsched.sim.cluster import NodeGroup, build_nodes
from batchsched.sim.engine import simulate
from batchsched.sim.files import InputError
from batchsched.sim.metrics import jain_index
from batchsched.sim.policies import BatchschedPolicy
from batchsched.sim.report import summary
from batchsched.sim.scenario import DEFAULTS, build_scenario
from batchsched.sim.workload import Job, read_workload

GPU = "nvidia.com/gpu"
RECLAIMING = SchedulerConfig.model_validate({"preemption": {
    "enabled": True, "victims": {"gangs": "whole", "minRuntimeSeconds": 60}}})


def nodes(count: int):
    return build_nodes([NodeGroup("n", gpus=8, cpu="64", memory="512Gi", count=count)])


def queue(name: str, guaranteed: int | None = None, limit: int | None = None, weight: float = 1.0, **spec):
    quota = {k: v for k, v in (("guaranteed", guaranteed), ("limit", limit)) if v is not None}
    return queue_from_json({"metadata": {"name": name},
                            "spec": {"weight": weight, "resources": {GPU: quota}, **spec}})


def gang(name: str, queue_name: str, arrival: float, duration: float, pods: int = 1) -> Job:
    return Job(name, arrival, duration, pods=pods, min_member=pods, gpus=8, cpu="4", memory="16Gi",
               queue=queue_name)


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


# -- workload files ------------------------------------------------------------

def test_a_yaml_workload_carries_its_queues_and_each_jobs_queue(tmp_path):
    path = write(tmp_path, "w.yaml", """
queues:
  - {name: team-a, parent: org, weight: 2, resources: {nvidia.com/gpu: {guaranteed: 8, limit: 16}}}
  - {name: org, reclaimable: false, gpuTypes: {H100: {limit: 32}}}
jobs:
  - {name: a, arrival: 0, duration: 10, gpus: 8, queue: team-a}
  - {name: b, arrival: 5, duration: 10}
generate:
  - {name: g, count: 2, window: [0, 10], duration: 5, queue: org}
""")
    workload = read_workload(path)
    team = workload.queues["team-a"]
    assert (team.parent, team.weight, team.quotas[GPU].guaranteed, team.quotas[GPU].limit) == ("org", 2.0, 8, 16)
    assert not workload.queues["org"].reclaimable and workload.queues["org"].gpu_types["H100"].limit == 32
    assert {j.name: j.queue for j in workload.jobs} == {"a": "team-a", "b": "", "g-0": "org", "g-1": "org"}
    assert workload.jobs[0].has_pod_group  # a job naming a queue gets a PodGroup with spec.queue


def test_a_csv_workload_names_plain_queues_in_its_queue_column(tmp_path):
    path = write(tmp_path, "w.csv", "name,arrival,duration,gpus,queue\na,0,10,8,team-a\nb,1,10,8,\n")
    workload = read_workload(path)
    assert [j.queue for j in workload.jobs] == ["team-a", ""]
    assert list(workload.queues) == ["team-a"] and workload.queues["team-a"].quotas == {}


@pytest.mark.parametrize("text, message", [
    ("queues: [{name: q}]\njobs: [{name: a, arrival: 0, duration: 1, queue: other}]",
     "line 2: jobs[0].queue: no queue 'other' in this file's queues (known: q)"),
    ("jobs: [{name: a, arrival: 0, duration: 1, queue: other}]",
     "jobs[0].queue: no queue 'other' in this file's queues (known: none: the file has no queues section)"),
    ("queues: [{name: q}, {name: q}]\njobs: [{name: a, arrival: 0, duration: 1}]",
     "queues[1].name: queue 'q' is defined twice"),
    ("queues: [{name: q, parent: p}]\njobs: [{name: a, arrival: 0, duration: 1}]",
     "queues[0].parent: no queue 'p' in this file's queues"),
    ("queues: [{name: q, parent: p}, {name: p, parent: r}, {name: r}]\njobs: [{name: a, arrival: 0, duration: 1}]",
     "queues[0].parent: queue 'p' has a parent itself: two levels at most"),
    ("queues: [{name: q, parent: q}]\njobs: [{name: a, arrival: 0, duration: 1}]",
     "queue q: queues[0].parent: queue q cannot be its own parent"),
    ("queues: [{name: q, weight: 0}]\njobs: [{name: a, arrival: 0, duration: 1}]", "queue q: queues[0].weight"),
    ("queues: [{name: q, weight: true}]\njobs: [{name: a, arrival: 0, duration: 1}]", "queue q: queues[0].weight"),
    ("queues: [{name: q, resources: {nvidia.com/gpu: {guaranteed: 9, limit: 8}}}]\njobs: [{name: a, arrival: 0, duration: 1}]",
     "queue q: queues[0].resources.nvidia.com/gpu: guaranteed 9 is above limit 8"),
    ("queues: [{name: q, resources: {nvidia.com/gpu: {limit: lots}}}]\njobs: [{name: a, arrival: 0, duration: 1}]",
     "queue q: queues[0].resources.nvidia.com/gpu.limit"),
    ("queues: [{name: q, reclaimable: maybe}]\njobs: [{name: a, arrival: 0, duration: 1}]", "queue q: queues[0].reclaimable"),
    ("queues: [{name: q, quota: 3}]\njobs: [{name: a, arrival: 0, duration: 1}]",
     "queues[0].quota: unknown field"),
    ("queues: [{parent: p}]\njobs: [{name: a, arrival: 0, duration: 1}]", "queues[0].name: missing"),
    ("queues: {name: q}\njobs: [{name: a, arrival: 0, duration: 1}]", "queues: must be a list of mappings"),
])
def test_hostile_queues_in_a_workload_file_give_clear_input_errors(tmp_path, text, message):
    with pytest.raises(InputError) as caught:
        read_workload(write(tmp_path, "w.yaml", text))
    assert message in str(caught.value) and str(tmp_path / "w.yaml") in str(caught.value)


# -- the figures -----------------------------------------------------------------

def test_jain_index_on_hand_computed_cases():
    assert jain_index([1, 1, 1, 1]) == 1.0
    assert jain_index([1, 0, 0, 0]) == 0.25  # one has all: 1/n
    assert jain_index([1, 3]) == pytest.approx(16 / 20)  # (1+3)^2 / (2 * (1+9))
    assert jain_index([0.5, 0.5]) == 1.0  # scale does not matter
    assert math.isnan(jain_index([])) and math.isnan(jain_index([0, 0]))


def test_fairness_figures_of_a_borrower_reclaimed_by_hand():
    # 2 nodes, 16 GPUs, two queues guaranteed 8 each.  x's two 8-GPU gangs
    # start at t=0 and 1 (x borrows y's 8); y's gang arrives at t=100, within its
    # guaranteed: it reclaims one of x's gangs (minimum runtime 60 s), which
    # terminates 30 s (grace), so y starts at t=130.
    queues = {q.name: q for q in (queue("x", guaranteed=8), queue("y", guaranteed=8))}
    jobs = [gang("x0", "x", 0, 1000), gang("x1", "x", 1, 1000), gang("y0", "y", 100, 500)]
    result = simulate(nodes(2), jobs, BatchschedPolicy(RECLAIMING), queues=queues)
    q = result.queues
    # x0 (within x's 8) and y0 are guaranteed requests; x1 borrows
    assert q.guaranteed_waits == [0.0, 30.0] and q.guaranteed_unstarted == 0
    assert q.reclaim_evictions == 1 and q.priority_evictions == 0 and q.reclaimed == {("y", "x"): 1}
    assert len(q.evicted_at) == 1 and list(q.evicted_at.values())[0] == [100.0]
    # Fair shares over GPUs: before t=100 x alone asks 16, holds 16: error 0,
    # Jain 1.  In [100, 130) x holds 16 of a fair 8, y 0 of 8: error
    # (8 + 8) / 2 / 16 = 0.5, Jain over held/fair = 2, 0: 4 / (2 * 4) = 0.5.
    # From then on each holds its fair share (x's evicted gang waits for y's
    # end, then x asks only what it holds): error 0, Jain 1.
    assert q.share_error == pytest.approx(0.5 * 30 / result.end)
    assert q.jain == pytest.approx(1 - 0.5 * 30 / result.end)
    text = summary([result])
    assert "Jain's index (time mean)" in text and "x: share / fair share" in text


def test_without_queues_there_are_no_queue_figures():
    result = simulate(nodes(1), [gang("a", "", 0, 10)], BatchschedPolicy())
    assert result.queues is None and "Jain" not in summary([result])


# -- the proportion-style baseline -------------------------------------------------

def test_proportion_admits_within_guaranteed_first_borrows_idle_and_never_reclaims():
    # 3 nodes, 24 GPUs: x guaranteed 8 limited to 16, y guaranteed 16.
    queues = {q.name: q for q in (queue("x", guaranteed=8, limit=16), queue("y", guaranteed=16))}
    jobs = [gang("x0", "x", 0, 1000), gang("x1", "x", 0, 1000), gang("x2", "x", 0, 1000),
            gang("y0", "y", 10, 100), gang("y1", "y", 10, 100, pods=2)]
    result = simulate(nodes(3), jobs, baseline("proportion"), queues=queues)
    # t=0: x0 within guaranteed, x1 borrows idle; x2 is refused by x's limit
    # (16).  t=10: y0 fits the 8 idle GPUs; y1 (16, within y's guaranteed)
    # gets nothing back: no eviction; it starts once x's gangs end at 1000...
    # and y0 at 110 frees 8, x2 may not take it (limit), so y1 waits for 1000.
    assert result.evicted_pods == 0 and result.queues.reclaim_evictions == 0
    waits = dict(zip(["x0", "x1", "y0"], result.waits[:3]))
    assert waits == {"x0": 0.0, "x1": 0.0, "y0": 0.0}
    assert sorted(result.waits[3:]) == [990.0, 1000.0]  # y1 at 1000 (arrived 10), x2 at 1000


def test_proportion_orders_gangs_within_guaranteed_before_borrowers():
    # 1 node of 8 GPUs; a borrower of x (beyond x's guaranteed 0) and a
    # gang within y's guaranteed arrive together: y's goes first.
    queues = {q.name: q for q in (queue("x"), queue("y", guaranteed=8))}
    jobs = [gang("x0", "x", 0, 100), gang("y0", "y", 0, 100)]
    result = simulate(nodes(1), jobs, baseline("proportion"), queues=queues)
    assert result.waits == [0.0, 100.0] and result.queues.guaranteed_waits == [0.0]


def test_proportion_without_queues_places_as_binpack():
    jobs = [gang(f"g{i}", "", 5 * i, 100 + 10 * i, pods=1 + i % 3) for i in range(12)]
    by_binpack = simulate(nodes(3), jobs, baseline("binpack"))
    by_proportion = simulate(nodes(3), jobs, baseline("proportion"))
    assert by_proportion.waits == by_binpack.waits and by_proportion.end == by_binpack.end


# -- no ping-pong ----------------------------------------------------------------

def test_two_queues_both_over_their_share_do_not_ping_pong():
    # 4 nodes, 32 GPUs, x and y guaranteed 16 each, both asking 96 in long
    # 8-GPU gangs.  x arrives first and takes all 32; y reclaims x back to
    # its fair share (16) and no further, and then nobody evicts anything:
    # each queue is at its share, so neither may reclaim from the other.
    queues = {q.name: q for q in (queue("x", guaranteed=16), queue("y", guaranteed=16))}
    jobs = ([gang(f"x{i}", "x", i, 3600) for i in range(12)]
            + [gang(f"y{i}", "y", 600 + i, 3600) for i in range(12)])
    result = simulate(nodes(4), jobs, BatchschedPolicy(RECLAIMING), queues=queues)
    q = result.queues
    assert q.reclaimed == {("y", "x"): 2}  # one way only: two of x's gangs, 16 GPUs
    assert q.priority_evictions == 0
    assert all(len(times) == 1 for times in q.evicted_at.values())  # each gang evicted at most once
    assert max(t for times in q.evicted_at.values() for t in times) < 700  # and it stops at once
    assert result.jobs_finished == 24 and q.share_error < 0.05
