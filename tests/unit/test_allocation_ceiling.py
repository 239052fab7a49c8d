"""The allocation ceiling (batchsched/sim/ceiling.py): worked out by hand on
small workloads, and never below what a simulated policy reached."""
import pytest

from batchsched.sim.baselines import baseline
from batchsched.sim.ceiling import allocation_ceiling
from batchsched.sim.engine import simulate
from batchsched.sim.policies import BatchschedPolicy
from batchsched.sim.workload import Job
from tests.unit.test_sim_engine import nodes, training

# No GPUs: they only set the arrival window, [0, 1000]
WINDOW = [Job("first-arrival", 0, 10), Job("last-arrival", 1000, 10)]


@pytest.mark.parametrize("jobs, gpus, share", [
    ([training("a", 0, 100)], 8, 0.1),                      # demand: 800 of 8,000 GPU-seconds
    ([training("a", 0, 300, pods=2)], 8, 0.6),              # 4,800 of work, 8 GPUs at a time: 600 s of it
    ([training("a", 0, 500), training("b", 0, 500), training("c", 0, 500)], 8, 1.0),  # the cluster's size
    ([training("a", 0, 2000)], 16, 0.5),                    # the job's width: 8 of 16 GPUs
    ([training("a", 600, 2000, pods=2)], 8, 0.4),           # it arrives late: 400 s of the window left
    ([training("a", 0, 2000), training("b", 700, 2000, pods=4)], 16, (8 * 700 + 16 * 300) / 16000),
])
def test_worked_out_by_hand(jobs, gpus, share):
    assert allocation_ceiling(jobs + WINDOW, gpus) == pytest.approx(share)


def test_an_empty_window_has_no_ceiling():
    assert allocation_ceiling([], 8) == 0.0
    assert allocation_ceiling([training("a", 5, 100)], 8) == 0.0


@pytest.mark.parametrize("policy", ["batchsched", "binpack", "volcano-like"])
def test_no_policy_gets_above_it(policy):
    jobs = [training(f"g{i}", 37 * i, 200 + 91 * (i % 7), pods=1 + i % 3, gpus=(1, 2, 4, 8)[i % 4])
            for i in range(60)]
    result = simulate(nodes(3), jobs, BatchschedPolicy() if policy == "batchsched" else baseline(policy, seed=1))
    useful = result.share(result.allocated_mean - result.held_idle_mean)
    ceiling = allocation_ceiling(jobs, result.gpus)
    assert 0.5 < useful <= ceiling + 1e-9  # loaded enough that the bound is tight-ish, never passed
