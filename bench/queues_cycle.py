"""Cycle time with queues: the workload of bench/throughput_core.py, its
jobs spread over Queue objects, against the same run without any.

    .venv/bin/python bench/queues_cycle.py [--nodes 5000] [--queues 50] [--pods 10000]
                                           [--arrival-seconds 500] [--seed 1] [--settle-heap]
                                           [--profile]

Queues: ``--queues`` leaf queues under ``--queues // 10`` parents (two
levels); each leaf guaranteed an equal part of the GPUs, limited to three
times that, weights 1 to 4 in turn; each parent limited to 60% of the
cluster.  Every job (lone pods included) names a leaf queue, in turn, so
limits bind, queues are ordered by share every cycle and every placement
is charged.  Reported as bench/throughput_core.py does, one row each;
``--settle-heap`` as there (the garbage collector as ``batchsched run``
sets it once its caches sync).
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batchsched.core.queues.model import QueueInfo, queue_from_json  # noqa: E402
from batchsched.sim.cluster import build_nodes  # noqa: E402
from batchsched.sim.engine import Simulation  # noqa: E402
from throughput_core import CountingPolicy, cluster, measure, workload  # noqa: E402

GPU = "nvidia.com/gpu"


def queues(count: int, gpus: int) -> dict[str, QueueInfo]:
    parents = max(1, count // 10)
    share = gpus // count
    objects = [{"metadata": {"name": f"org-{p}"}, "spec": {"resources": {GPU: {"limit": gpus * 6 // 10}}}}
               for p in range(parents)]
    objects += [{"metadata": {"name": f"team-{i}"},
                 "spec": {"parent": f"org-{i % parents}", "weight": 1 + i % 4,
                          "resources": {GPU: {"guaranteed": share, "limit": 3 * share}}}} for i in range(count)]
    return {q.name: q for q in map(queue_from_json, objects)}


def run(nodes: int, jobs, with_queues: int, settle: bool = False) -> dict:
    if with_queues:
        jobs = [dataclasses.replace(job, queue=f"team-{i % with_queues}") for i, job in enumerate(jobs)]
    simulation = Simulation(build_nodes(cluster(nodes)), jobs, CountingPolicy())
    if with_queues:
        simulation.cluster.queues = queues(with_queues, 8 * nodes)
    return measure(nodes, jobs, settle, simulation, phase=f"{with_queues} queues, {nodes} nodes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--queues", type=int, default=50)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--arrival-seconds", type=float, default=500.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settle-heap", action="store_true", help="as bench/throughput_core.py --settle-heap")
    parser.add_argument("--profile", action="store_true", help="cProfile the run with --queues instead")
    args = parser.parse_args()
    jobs = workload(args.pods, args.nodes, args.seed, args.arrival_seconds)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(run, args.nodes, jobs, args.queues, args.settle_heap)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
        return 0
    print("| queues | nodes | cycles | pods placed | jobs started | core s | cycle p50 ms | p99 ms | max ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for count in (0, args.queues):
        m = run(args.nodes, jobs, count, args.settle_heap)
        print(f"| {count} | {args.nodes} | {m['cycles']} | {m['placed']} | {m['started']}/{m['jobs']} | "
              f"{m['core']:.1f} | {m['p50']:.1f} | {m['p99']:.1f} | {m['max']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
