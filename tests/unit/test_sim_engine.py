"""The simulator's event loop, its accounting and the batchsched policy on
tiny clusters whose outcome can be worked out by hand."""
import ast
import math

import pytest

from batchsched.config import SchedulerConfig
from batchsched.sim import policies
from batchsched.sim.baselines import baseline
from batchsched.sim.cluster import NodeGroup, build_nodes, builtin_topologies
from batchsched.sim.engine import SimCluster, Simulation, SimulationError, simulate
from batchsched.sim.metrics import percentile, window_mean
from batchsched.sim.policies import BatchschedPolicy
from batchsched.sim.report import summary
from batchsched.sim.workload import Job, pod_object
from tests.unit.test_core_boundary import ROOT, imported_modules

PREEMPTING = SchedulerConfig.model_validate({"preemption": {
    "enabled": True, "victims": {"matchLabels": {"workload": "inference"}, "minRuntimeSeconds": 60},
    "preemptors": {"priorityClassNames": ["training"]}}})


def nodes(count: int = 2, board: str | None = "dgx-a100", gpus: int = 8):
    topology = builtin_topologies()[board] if board else None
    return build_nodes([NodeGroup("n", gpus=gpus, cpu="64", memory="512Gi", count=count, topology=topology,
                                  topology_name=board or "none")])


def training(name: str, arrival: float, duration: float, pods: int = 1, gpus: int = 8, **kw) -> Job:
    return Job(name, arrival, duration, pods=pods, min_member=pods, gpus=gpus, cpu="4", memory="16Gi",
               priority=1000, priority_class="training", **kw)


def test_a_job_that_does_not_fit_waits_for_the_one_before_it_to_finish():
    jobs = [training("a", 0, 100, pods=2), training("b", 10, 50)]
    result = simulate(nodes(), jobs, BatchschedPolicy())
    # a binds in the first cycle (t=0) and holds all 16 GPUs until t=100; b's
    # cycle at t=10 fails, a's end frees capacity, b binds at t=100, ends at 150
    assert sorted(result.waits) == [0.0, 90.0]
    assert result.jobs_finished == 2 and result.end == 150.0
    assert result.allocated_mean == 16  # over the arrival window [0, 10]
    assert result.held_idle_mean == 0 and result.allocated_peak == 16
    assert result.multi_gpu_pods == 3 and result.aligned_pods == 3  # whole NVSwitch boards
    assert result.pods_never_placed == 0 and result.evicted_pods == 0


def test_the_batchsched_policy_runs_the_real_cycle(monkeypatch):
    calls = []
    real = policies.schedule_cycle
    monkeypatch.setattr(policies, "schedule_cycle", lambda *a, **kw: calls.append(a[0].now) or real(*a, **kw))
    result = simulate(nodes(), [training("a", 5, 10)], BatchschedPolicy())
    assert result.jobs_started == 1 and len(calls) == len(result.cycle_seconds) == 1


@pytest.mark.parametrize("policy", ["batchsched", "binpack", "random", "volcano-like", "kai-like"])
def test_gang_policies_never_bind_a_gang_partially(policy):
    jobs = [training(f"g{i}", 7 * i, 60 + 13 * i, pods=1 + i % 4, gpus=(2, 4, 8)[i % 3]) for i in range(40)]
    chosen = BatchschedPolicy() if policy == "batchsched" else baseline(policy, seed=3)
    simulation = Simulation(nodes(4), jobs, chosen)
    real_apply, partial = simulation._apply, []

    def apply_and_check(plan):
        real_apply(plan)
        for run in simulation.runs.values():
            bound = simulation._bound_members(run)
            if 0 < bound < run.job.min_member:
                partial.append((simulation.now, run.job.name, bound))

    simulation._apply = apply_and_check
    result = simulation.run()
    assert partial == []
    assert result.jobs_finished == len(jobs) and result.held_idle_mean == 0


def test_spread_binds_pods_of_a_gang_as_they_fit_and_holds_gpus_idle():
    # two 8-GPU nodes, one taken until t=100: the 2-pod gang gets one pod bound at t=1 and waits
    jobs = [training("first", 0, 100), training("gang", 1, 50, pods=2), training("cpu-only", 21, 1, gpus=0)]
    result = simulate(nodes(), jobs, baseline("spread"))
    assert sorted(result.waits) == [0.0, 0.0, 99.0]
    assert result.window == (0.0, 21.0)
    assert result.allocated_mean == pytest.approx((8 * 1 + 16 * 20) / 21)
    assert result.held_idle_mean == pytest.approx(8 * 20 / 21)  # the bound member holds 8 GPUs idle


def test_preemption_evicts_inference_and_the_victim_is_recreated():
    infer = Job("infer", 0, 1000, gpus=8, cpu="4", memory="16Gi", priority=100,
                labels={"workload": "inference"})
    train = training("train", 200, 100)
    simulation = Simulation(nodes(1), [infer, train], BatchschedPolicy(PREEMPTING))
    result = simulation.run()
    assert result.evicted_pods == 1 and result.preempted_jobs == 1
    assert result.evicted_gpu_hours == 8 * 200 / 3600  # its 8 GPUs had run 200 s
    # the victim terminates for 30 s, then train binds; infer comes back when train ends
    runs = simulation.runs
    assert runs["default/train"].started == 230.0
    assert runs["default/infer"].started == 0.0
    assert result.end == 330.0 + 800.0  # infer resumes at 330 for the 800 s it had left
    assert result.jobs_finished == 2


def test_the_cluster_refuses_what_does_not_fit():
    cluster = SimCluster(nodes(1))
    job = training("a", 0, 10, gpus=4)
    first = cluster.add_pod(pod_object(job, 0, 0, 0, "batchsched"))
    second = cluster.add_pod(pod_object(job, 1, 0, 0, "batchsched"))
    cluster.bind(first.uid, "n", (0, 1, 2, 3), 0)
    with pytest.raises(SimulationError, match="not all of them free"):
        cluster.bind(second.uid, "n", (3, 4, 5, 6), 0)
    with pytest.raises(SimulationError, match="not pending"):
        cluster.bind(first.uid, "n", (4, 5, 6, 7), 0)


def test_allocation_and_stranded_gpus_follow_bindings_and_deletions():
    cluster = SimCluster(nodes(2, board=None))
    assert (cluster.total_gpus, cluster.allocated_gpus, cluster.stranded) == (16, 0, 0)
    pod = cluster.add_pod(pod_object(training("a", 0, 10, gpus=3), 0, 0, 0, "batchsched"))
    cluster.bind(pod.uid, "n-0", (0, 1, 2), 0)
    assert (cluster.allocated_gpus, cluster.stranded) == (3, 5)  # n-0: 5 free, no 8-GPU pod fits
    cluster.delete(pod.uid)
    assert (cluster.allocated_gpus, cluster.stranded, cluster.capacity_freed) == (0, 0, True)


def test_window_mean_and_percentile_by_hand():
    series = [(0.0, 4), (10.0, 8), (20.0, 0)]  # 4 on [0,10), 8 on [10,20), 0 after
    assert window_mean(series, 1, 0, 20) == 6
    assert window_mean(series, 1, 5, 15) == 6
    assert window_mean(series, 1, 15, 30) == 8 * 5 / 15
    assert percentile([5, 1, 3, 2, 4], 50) == 3 and percentile([5, 1, 3, 2, 4], 99) == 5
    assert math.isnan(percentile([], 50))


def test_a_gang_that_can_never_fit_ends_the_run_unplaced():
    result = simulate(nodes(1), [training("huge", 0, 10, pods=3)], BatchschedPolicy())
    assert result.jobs_started == 0 and result.pods_never_placed == 3 and result.pods_unscheduled == 3


def test_the_simulator_drives_the_core_without_the_shell():
    sim = ROOT / "batchsched" / "sim"
    offenders = [f"{path.name}: {module}" for path in sorted(sim.glob("*.py"))
                 for module in imported_modules(ast.parse(path.read_text()), "batchsched.sim")
                 if module.split(".")[0] in ("asyncio", "aiohttp", "kubernetes")
                 or module.startswith("batchsched.shell")]
    assert offenders == []


def _reservation_scene(controller: str):
    """Two 6-GPU pods of ``controller`` fill most of two nodes until t=1000;
    a gang of two whole nodes waits from t=1 (reserving both after 60 s);
    1-GPU pods from t=100 would fit in the 2 GPUs left on each."""
    jobs = ([training(f"hold-{i}", 0, 1000, gpus=6, controller=controller) for i in range(2)]
            + [training("big", 1, 100, pods=2)]
            + [training(f"small-{i}", 100 + i, 50, gpus=1) for i in range(2)])
    return {p: simulate(nodes(), jobs, BatchschedPolicy() if p == "batchsched" else baseline(p, seed=1))
            for p in ("batchsched", "binpack")}


def test_gpu_hours_idled_by_a_reservation_are_reported():
    results = _reservation_scene("Job")
    # 4 GPUs (2 per reserved node) idle from t=100, when the small pods come,
    # until the holders end at t=1000: 1 GPU-hour (and a cycle's worth more).
    assert 1.0 <= results["batchsched"].reserved_idle_gpu_hours < 1.01
    assert results["binpack"].reserved_idle_gpu_hours == 0
    assert "GPU-hours idled by reservations" in summary(list(results.values()))


def test_no_reservation_idles_gpus_behind_deployment_pods():
    result = _reservation_scene("ReplicaSet")["batchsched"]
    assert result.reserved_idle_gpu_hours == 0
    assert sorted(result.waits)[:4] == [0.0, 0.0, 0.0, 0.0]  # the small pods go at once
