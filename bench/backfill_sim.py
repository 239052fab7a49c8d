"""Backfill and drain-aware reservation in the simulator (issue 16, points 1-2).

    .venv/bin/python bench/backfill_sim.py [--scenario default,philly] [--seeds 1,2,3]
                                           [--policies batchsched,binpack]

Runs ``batchsched simulate``'s scenarios (the embedded default; the
Philly-derived mix, from ../shared/data/traces or $BATCHSCHED_TRACE_DIR)
per seed and policy, and prints one row each: wait p50 and p90, the median
start of the big gangs (the embedded default: priority 2000; Philly: jobs
of 16 GPUs or more), useful GPU allocation (allocation less held idle, over
the arrival window), pods queued when arrivals stop, preempted pods and
GPU-hours idled by reservations.

The big gangs' waits are taken by wrapping the simulator's
``Recorder.started``, which every version of the simulator calls, so the
same script measures the tree before a change too (``PYTHONPATH`` set to
that tree).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

from batchsched.sim import metrics
from batchsched.sim.report import duration
from batchsched.sim.scenario import build_scenario, run_scenario

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "data" / "traces"


def big_gang(scenario: str, job) -> bool:
    if scenario == "default":
        return job.priority == 2000
    return job.pods * job.gpus >= 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="default,philly")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--policies", default="batchsched,binpack")
    parser.add_argument("--runtime-hint", type=float, help="every stated runtime hint, as a multiple of duration")
    args = parser.parse_args()
    trace_dir = Path(os.environ.get("BATCHSCHED_TRACE_DIR", SHARED_TRACES))

    starts: list[tuple[object, float]] = []  # (job, wait) of the run going on
    recorded = metrics.Recorder.started

    def started(self, job, t):
        starts.append((job, t - job.arrival))
        recorded(self, job, t)

    metrics.Recorder.started = started
    print(f"{'scenario':8} {'seed':>4} {'policy':10} {'p50':>7} {'p90':>7} {'big p50':>8} {'useful':>7} "
          f"{'queued':>6} {'evicted':>7} {'resv GPU-h':>10} {'wall':>6}")
    for name in args.scenario.split(","):
        if name == "philly" and not trace_dir.is_dir():
            print(f"philly: skipped, no traces at {trace_dir}", file=sys.stderr)
            continue
        for seed in (int(s) for s in args.seeds.split(",")):
            scenario = build_scenario(trace="philly" if name == "philly" else None, trace_dir=trace_dir,
                                      seed=seed)
            if args.runtime_hint:
                scenario = dataclasses.replace(scenario, jobs=[
                    dataclasses.replace(j, runtime_hint=args.runtime_hint) if j.runtime_hint else j
                    for j in scenario.jobs])
            for policy in args.policies.split(","):
                starts.clear()
                began = time.perf_counter()
                (result,) = run_scenario(scenario, [policy], seed)
                wall = time.perf_counter() - began
                big = [w for job, w in starts if big_gang(name, job)]
                useful = result.share(result.allocated_mean - result.held_idle_mean)
                print(f"{name:8} {seed:>4} {policy:10} {duration(metrics.percentile(result.waits, 50)):>7} "
                      f"{duration(metrics.percentile(result.waits, 90)):>7} "
                      f"{duration(statistics.median(big)) if big else '-':>8} {100 * useful:>6.1f}% "
                      f"{result.pods_unscheduled:>6} {result.evicted_pods:>7} "
                      f"{result.reserved_idle_gpu_hours:>10.1f} {wall:>5.0f}s", flush=True)


if __name__ == "__main__":
    main()
