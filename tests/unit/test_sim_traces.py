"""Trace replay inputs (they read ../shared and skip without it)."""
import pytest

from batchsched.sim.scenario import build_scenario, run_scenario
from batchsched.sim.traces import alibaba, arrival_spacing, philly


@pytest.fixture
def trace_dir(shared_dir):
    return shared_dir / "data" / "traces"


def test_arrival_spacing_fills_the_cluster_as_arrivals_end():
    # pods of 1, 2 and 4 GPUs lasting 100, 10 and 1 s, arriving at 0, s, 2s:
    # at the last arrival the first still runs while s < 50, the second while s < 10
    assert arrival_spacing([1, 2, 4], [100.0, 10.0, 1.0], target_gpus=6) == pytest.approx(10.0)
    assert arrival_spacing([1, 2, 4], [100.0, 10.0, 1.0], target_gpus=4) == pytest.approx(50.0)
    assert arrival_spacing([1, 2, 4], [100.0, 10.0, 1.0], target_gpus=7) == 0.0  # all of them fit


def test_alibaba_nodes_and_pods(trace_dir):
    groups, jobs = alibaba(trace_dir)
    assert sum(g.count for g in groups) == 1213 and sum(g.gpus for g in groups) == 6212
    assert len(jobs) == 7064 and sum(j.gpus for j in jobs) == 7433
    kinds = {g.topology_name for g in groups}
    assert {"dgx1-v100", "dgx-a100", "pcie-2gpu", "pcie-4gpu", "none"} <= kinds
    assert all(g.topology_name == "dgx1-v100" for g in groups
               if g.labels["alibaba.com/gpu-model"].startswith("V100") and g.gpus == 8)
    assert [j.arrival for j in jobs] == sorted(j.arrival for j in jobs)


def test_alibaba_sample_keeps_the_share_of_each_model(trace_dir):
    groups, jobs = alibaba(trace_dir, max_pods=706, seed=2)
    assert len(jobs) == 706 and 110 <= len(groups) <= 130  # a tenth of 1213, at least one per model
    assert alibaba(trace_dir, max_pods=706, seed=2)[1] == jobs


def test_philly_jobs_are_gangs_of_equal_pods(trace_dir):
    jobs = philly(trace_dir)
    assert len(jobs) == 160
    gpus = sorted({(j.pods, j.gpus) for j in jobs})
    assert gpus == [(1, 1), (1, 4), (1, 6), (1, 8), (2, 6), (2, 8), (3, 8), (4, 8), (6, 8)]
    assert all(300 <= j.duration <= 86400 for j in jobs)


def test_a_small_alibaba_replay_runs_every_policy(trace_dir):
    scenario = build_scenario(trace="alibaba", trace_dir=trace_dir, max_pods=150)
    results = run_scenario(scenario)
    assert [r.policy for r in results] == ["batchsched", "spread", "binpack", "random", "volcano-like", "kai-like",
                                          "proportion"]
    assert all(r.jobs == 150 and r.jobs_started > 0 for r in results)


def test_a_smaller_philly_mix_is_its_first_jobs(trace_dir):
    scenario = build_scenario(trace="philly", trace_dir=trace_dir, max_pods=20)
    everything = philly(trace_dir)
    assert sum(j.pods for j in scenario.jobs) <= 20 < sum(j.pods for j in everything[:len(scenario.jobs) + 1])
    assert scenario.jobs == everything[:len(scenario.jobs)]
