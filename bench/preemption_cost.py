"""Preemption that costs less (docs/preemption.md, "Least work lost" and
"Waiting before evicting"): the embedded default scenario run with
batchsched's victim choice as it is, and with its least-work-lost criterion
turned off, in the same run; with ``--waits``, instead, with
``preemptors.waitSeconds`` of the ``training`` class set to each value
(``training-critical``, the big gangs, evicts at once; 0: no wait at all).

    .venv/bin/python bench/preemption_cost.py [--seeds 1,2,3] [--waits 0,600,1800,3600]

"Off" replaces ``batchsched.core.preemption.plan.lost_work`` by zero, so
victim sets equal by priority cost fall back to the remaining tie-breakers
(GPU set quality, packing, node name; spare gang members by name).  Per
seed and variant: pods evicted (jobs hit), the GPU-hours the victims had run
since they started (what jobs without checkpoints lose), the priority-2000
gangs' median start, wait p50 / p90 over all jobs, GPU allocation (with
``--waits`` also the priority-100 and -1000 wait p90s and the aligned
multi-GPU pods).  On a terminal each run's progress shows on stderr.
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


def run(seed: int, least_work_lost: bool = True, wait: float | None = None) -> str:
    """One row; ``wait``: the training class's waitSeconds (None: as configured)."""
    scenario = build_scenario(seed=seed)
    config = scenario.config
    if wait is not None:
        waits = {"training": wait} if wait else {}
        preemption = config.preemption.model_copy(update={
            "preemptors": config.preemption.preemptors.model_copy(update={"wait_seconds": waits})})
        config = config.model_copy(update={"preemption": preemption})
    real = plan.lost_work
    if not least_work_lost:
        plan.lost_work = lambda pod, now: 0.0
    variant = f"{wait:g} s" if wait is not None else "on" if least_work_lost else "off"
    try:
        simulation = Simulation(build_nodes(scenario.cluster), scenario.jobs, BatchschedPolicy(config),
                                scheduler_name=config.scheduler_name)
        r = simulation.run(progress=TerminalProgress.if_terminal(sys.stderr), phase=f"seed {seed}, {variant}")
    finally:
        plan.lost_work = real
    big = r.waits_by_priority.get(BIG_GANG_PRIORITY, [])
    row = (f"| {seed} | {variant} | {r.evicted_pods} ({r.preempted_jobs}) | {r.evicted_gpu_hours:.1f} | "
           f"{duration(percentile(big, 50))} | {duration(percentile(r.waits, 50))} / "
           f"{duration(percentile(r.waits, 90))} | {100 * r.share(r.allocated_mean):.1f}% |")
    if wait is None:
        return row
    p90 = [duration(percentile(r.waits_by_priority.get(p, []), 90)) for p in (100, 1000)]
    return row + f" {p90[0]} / {p90[1]} | {100 * r.aligned_share:.1f}% |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--waits", help="comma-separated waitSeconds of the training class to compare")
    args = parser.parse_args()
    columns = ("| seed | {} | preempted pods (jobs) | GPU-hours they had run | priority 2000 median start "
               "| wait p50 / p90 | GPU allocation |")
    if args.waits:
        print(columns.format("training waits") + " priority 100 / 1000 wait p90 | aligned multi-GPU pods |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    else:
        print(columns.format("least work lost"))
        print("|---:|---|---:|---:|---:|---:|---:|")
    for seed in (int(s) for s in args.seeds.split(",")):
        if args.waits:
            for wait in (float(w) for w in args.waits.split(",")):
                print(run(seed, wait=wait), flush=True)
        else:
            for on in (False, True):
                print(run(seed, on), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
