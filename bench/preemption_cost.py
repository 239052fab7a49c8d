"""Preemption that costs less (docs/preemption.md, "Least work lost"): the
embedded default scenario run with batchsched's victim choice as it is, and
with its least-work-lost criterion turned off, in the same run.

    .venv/bin/python bench/preemption_cost.py [--seeds 1,2,3]

"Off" replaces ``batchsched.core.preemption.plan.lost_work`` by zero, so
victim sets equal by priority cost fall back to the remaining tie-breakers
(GPU set quality, packing, node name; spare gang members by name).  Per
seed and variant: pods evicted (jobs hit), the GPU-hours the victims had run
since they started (what jobs without checkpoints lose), the priority-2000
gangs' median start, wait p50 / p90 over all jobs, GPU allocation.  On a
terminal each run's progress shows on stderr.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchsched.core.preemption import plan  # noqa: E402
from batchsched.sim.engine import Simulation  # noqa: E402
from batchsched.sim.metrics import percentile  # noqa: E402
from batchsched.sim.policies import BatchschedPolicy  # noqa: E402
from batchsched.sim.progress import TerminalProgress  # noqa: E402
from batchsched.sim.report import duration  # noqa: E402
from batchsched.sim.cluster import build_nodes  # noqa: E402
from batchsched.sim.scenario import build_scenario  # noqa: E402

BIG_GANG_PRIORITY = 2000


def run(seed: int, least_work_lost: bool) -> str:
    scenario = build_scenario(seed=seed)
    real = plan.lost_work
    if not least_work_lost:
        plan.lost_work = lambda pod, now: 0.0
    try:
        simulation = Simulation(build_nodes(scenario.cluster), scenario.jobs, BatchschedPolicy(scenario.config),
                                scheduler_name=scenario.config.scheduler_name)
        variant = "on" if least_work_lost else "off"
        r = simulation.run(progress=TerminalProgress.if_terminal(sys.stderr), phase=f"seed {seed}, {variant}")
    finally:
        plan.lost_work = real
    big = r.waits_by_priority.get(BIG_GANG_PRIORITY, [])
    return (f"| {seed} | {variant} | {r.evicted_pods} ({r.preempted_jobs}) | {r.evicted_gpu_hours:.1f} | "
            f"{duration(percentile(big, 50))} | {duration(percentile(r.waits, 50))} / "
            f"{duration(percentile(r.waits, 90))} | {100 * r.share(r.allocated_mean):.1f}% |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    print("| seed | least work lost | preempted pods (jobs) | GPU-hours they had run | priority 2000 median start "
          "| wait p50 / p90 | GPU allocation |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for seed in (int(s) for s in args.seeds.split(",")):
        for on in (False, True):
            print(run(seed, on), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
