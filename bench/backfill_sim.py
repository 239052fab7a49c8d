"""Backfill and drain-aware reservation in the simulator (issue 16, points 1-2).

    .venv/bin/python bench/backfill_sim.py [--scenario default,philly] [--seeds 1,2,3 | --seeds 1-10]
                                           [--policies batchsched,binpack]

Runs ``batchsched simulate``'s scenarios (the embedded default; the
Philly-derived mix, from ../shared/data/traces or $BATCHSCHED_TRACE_DIR)
per seed and policy, and prints one row each: wait p50 and p90, the median
start of the big gangs (the embedded default: priority 2000; Philly: jobs
of 16 GPUs or more), useful GPU allocation (allocation less held idle, over
the arrival window), pods queued when arrivals stop, preempted pods, the
GPU-hours of victims' runs they threw away, GPU-hours idled by reservations
and aligned multi-GPU pods.  With several seeds, each scenario and
policy's mean over them follows: single seeds of these scenarios are
chaotic (one gang starting a cycle sooner moves who is where for hours).

The big gangs' waits are taken by wrapping the simulator's
``Recorder.started``, which every version of the simulator calls, so the
same script measures the tree before a change too (``PYTHONPATH`` set to
that tree).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
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
    first, _, last = args.seeds.partition("-")
    seeds = range(int(first), int(last) + 1) if last else [int(s) for s in args.seeds.split(",")]
    print(f"{'scenario':8} {'seed':>10} {'policy':12} {'p50':>7} {'p90':>7} {'big p50':>8} {'useful':>7} "
          f"{'queued':>6} {'evicted':>7} {'lost GPU-h':>10} {'resv GPU-h':>10} {'aligned':>7} {'wall':>6}")
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    for name in args.scenario.split(","):
        if name == "philly" and not trace_dir.is_dir():
            print(f"philly: skipped, no traces at {trace_dir}", file=sys.stderr)
            continue
        for seed in seeds:
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
                big = [w for job, w in starts if big_gang(name, job)]
                figures = {"p50": metrics.percentile(result.waits, 50), "p90": metrics.percentile(result.waits, 90),
                           "big": statistics.median(big) if big else math.nan,
                           "useful": 100 * result.share(result.allocated_mean - result.held_idle_mean),
                           "queued": result.pods_unscheduled, "evicted": result.evicted_pods,
                           "lost": result.evicted_gpu_hours, "reserved": result.reserved_idle_gpu_hours,
                           "aligned": 100 * result.aligned_share, "wall": time.perf_counter() - began}
                runs.setdefault((name, policy), []).append(figures)
                print(_row(name, str(seed), policy, figures), flush=True)
    if len(seeds) > 1:
        for (name, policy), figures in runs.items():
            mean = {k: statistics.fmean(f[k] for f in figures if not math.isnan(f[k])) if any(
                not math.isnan(f[k]) for f in figures) else math.nan for k in figures[0]}
            print(_row(name, f"mean of {len(figures)}", policy, mean))


def _row(scenario: str, seed: str, policy: str, f: dict[str, float]) -> str:
    big = "-" if math.isnan(f["big"]) else duration(f["big"])
    return (f"{scenario:8} {seed:>10} {policy:12} {duration(f['p50']):>7} {duration(f['p90']):>7} {big:>8} "
            f"{f['useful']:>6.1f}% {f['queued']:>6.4g} {f['evicted']:>7.4g} {f['lost']:>10.1f} "
            f"{f['reserved']:>10.1f} {f['aligned']:>6.1f}% {f['wall']:>5.0f}s")

if __name__ == "__main__":
    main()
