"""Preemption that costs less (docs/preemption.md, "Least work lost" and
"Waiting before evicting"): the embedded default scenario run with
batchsched's victim choice as it is, and with its least-work-lost criterion
turned off, in the same run; with ``--waits``, instead, with
``preemptors.waitSeconds`` of the ``training`` class set to each value
(``training-critical``, the big gangs, evicts at once; 0: no wait at all).

    .venv/bin/python bench/preemption_cost.py [--seeds 1,2,3 | --seeds 1-10] [--waits 0,600,1800,3600]

"Off" replaces ``batchsched.core.preemption.cost.lost_work`` (the cost
term and the order of a gang's spare members) by zero, so
victim sets equal by priority cost fall back to the remaining tie-breakers
(GPU set quality, packing, node name; spare gang members by name).  Per
seed and variant: pods evicted (jobs hit), the GPU-hours the victims had run
since they started (what jobs without checkpoints lose), the priority-2000
gangs' median start, wait p50 / p90 over all jobs, GPU allocation (with
``--waits`` also the priority-100 and -1000 wait p90s and the aligned
multi-GPU pods); with several seeds, each variant's mean over them.  On a
terminal each run's progress shows on stderr.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchsched.core.preemption import cost, plan  # noqa: E402
from batchsched.sim.engine import Simulation  # noqa: E402
from batchsched.sim.metrics import percentile  # noqa: E402
from batchsched.sim.policies import BatchschedPolicy  # noqa: E402
from batchsched.sim.progress import TerminalProgress  # noqa: E402
from batchsched.sim.report import duration  # noqa: E402
from batchsched.sim.cluster import build_nodes  # noqa: E402
from batchsched.sim.scenario import build_scenario  # noqa: E402

BIG_GANG_PRIORITY = 2000


def run(seed: int, least_work_lost: bool = True, wait: float | None = None) -> dict[str, float]:
    """One run's figures; ``wait``: the training class's waitSeconds (None: as configured)."""
    scenario = build_scenario(seed=seed)
    config = scenario.config
    if wait is not None:
        waits = {"training": wait} if wait else {}
        preemption = config.preemption.model_copy(update={
            "preemptors": config.preemption.preemptors.model_copy(update={"wait_seconds": waits})})
        config = config.model_copy(update={"preemption": preemption})
    real = cost.lost_work
    if not least_work_lost:
        cost.lost_work = plan.lost_work = lambda pod, now: 0.0
    try:
        simulation = Simulation(build_nodes(scenario.cluster), scenario.jobs, BatchschedPolicy(config),
                                scheduler_name=config.scheduler_name)
        r = simulation.run(progress=TerminalProgress.if_terminal(sys.stderr),
                           phase=f"seed {seed}, {_variant(least_work_lost, wait)}")
    finally:
        cost.lost_work = plan.lost_work = real
    by_priority = r.waits_by_priority
    return {"pods": r.evicted_pods, "jobs": r.preempted_jobs, "lost": r.evicted_gpu_hours,
            "big": percentile(by_priority.get(BIG_GANG_PRIORITY, []), 50), "p50": percentile(r.waits, 50),
            "p90": percentile(r.waits, 90), "allocation": 100 * r.share(r.allocated_mean),
            "p90_100": percentile(by_priority.get(100, []), 90), "p90_1000": percentile(by_priority.get(1000, []), 90),
            "aligned": 100 * r.aligned_share}


def _variant(least_work_lost: bool, wait: float | None) -> str:
    return f"{wait:g} s" if wait is not None else "on" if least_work_lost else "off"


def row(label: str, variant: str, f: dict[str, float], waits: bool) -> str:
    text = (f"| {label} | {variant} | {f['pods']:.4g} ({f['jobs']:.4g}) | {f['lost']:.1f} | {duration(f['big'])} | "
            f"{duration(f['p50'])} / {duration(f['p90'])} | {f['allocation']:.1f}% |")
    if waits:
        text += f" {duration(f['p90_100'])} / {duration(f['p90_1000'])} | {f['aligned']:.1f}% |"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds, or FIRST-LAST")
    parser.add_argument("--waits", help="comma-separated waitSeconds of the training class to compare")
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last) + 1) if last else [int(s) for s in args.seeds.split(",")]
    columns = ("| seed | {} | preempted pods (jobs) | GPU-hours they had run | priority 2000 median start "
               "| wait p50 / p90 | GPU allocation |")
    waits = args.waits is not None
    if waits:
        print(columns.format("training waits") + " priority 100 / 1000 wait p90 | aligned multi-GPU pods |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        variants = [(True, float(w)) for w in args.waits.split(",")]
    else:
        print(columns.format("least work lost"))
        print("|---:|---|---:|---:|---:|---:|---:|")
        variants = [(False, None), (True, None)]
    runs: dict[tuple, list[dict[str, float]]] = {v: [] for v in variants}
    for seed in seeds:
        for variant in variants:
            runs[variant].append(run(seed, *variant))
            print(row(str(seed), _variant(*variant), runs[variant][-1], waits), flush=True)
    if len(seeds) > 1:  # the mean of each figure over the seeds
        for variant, figures in runs.items():
            mean = {k: sum(f[k] for f in figures) / len(figures) for k in figures[0]}
            print(row(f"mean of {len(seeds)}", _variant(*variant), mean, waits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
