"""How far each policy's useful GPU allocation is from the most any policy
could reach on the same workload (issue 16, the useful-allocation target).

    .venv/bin/python bench/allocation_ceiling.py [--scenario default,philly] [--seeds 1-10]
                                                 [--policies batchsched,binpack,volcano-like]

Per scenario and seed: the ceiling (batchsched/sim/ceiling.py: a maximum
flow of the jobs' GPU-seconds into the cluster's over the arrival window,
with no packing, gang or preemption cost), then each policy's useful
allocation (allocation less held idle, as ``bench/backfill_sim.py`` and
``batchsched simulate`` report it) and its gap to the ceiling.  With
several seeds, the means follow.  The Philly mix is read from
../shared/data/traces or $BATCHSCHED_TRACE_DIR, and skipped without it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from batchsched.sim.ceiling import allocation_ceiling
from batchsched.sim.engine import SimCluster
from batchsched.sim.cluster import build_nodes
from batchsched.sim.scenario import build_scenario, run_scenario

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "data" / "traces"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="default,philly")
    parser.add_argument("--seeds", default="1-10", help="a range (1-10) or a list (1,2,3)")
    parser.add_argument("--policies", default="batchsched,binpack,volcano-like",
                        help="comma-separated; empty: the ceilings alone")
    args = parser.parse_args()
    trace_dir = Path(os.environ.get("BATCHSCHED_TRACE_DIR", SHARED_TRACES))
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last) + 1) if last else [int(s) for s in args.seeds.split(",")]
    policies = [p for p in args.policies.split(",") if p]
    print(f"{'scenario':8} {'seed':>10} {'ceiling':>8}" + "".join(f" {p:>14} {'gap':>5}" for p in policies))
    for name in args.scenario.split(","):
        if name == "philly" and not trace_dir.is_dir():
            print(f"philly: skipped, no traces at {trace_dir}", file=sys.stderr)
            continue
        rows = []
        for seed in seeds:
            scenario = build_scenario(trace="philly" if name == "philly" else None, trace_dir=trace_dir, seed=seed)
            gpus = SimCluster(build_nodes(scenario.cluster)).total_gpus
            row = [100 * allocation_ceiling(scenario.jobs, gpus)]
            for policy in policies:
                (result,) = run_scenario(scenario, [policy], seed)
                row.append(100 * result.share(result.allocated_mean - result.held_idle_mean))
            rows.append(row)
            print(_row(name, str(seed), row), flush=True)
        if len(rows) > 1:
            print(_row(name, f"mean of {len(rows)}", [statistics.fmean(c) for c in zip(*rows)]))


def _row(scenario: str, seed: str, row: list[float]) -> str:
    ceiling, useful = row[0], row[1:]
    return (f"{scenario:8} {seed:>10} {ceiling:7.1f}%"
            + "".join(f" {u:13.1f}% {u - ceiling:5.1f}" for u in useful))


if __name__ == "__main__":
    main()
