"""Decision throughput and cycle time of the core, in process.

    .venv/bin/python bench/throughput_core.py [--nodes 500,5000,10000] [--pods 10000]
                                              [--arrival-seconds 500] [--seed 1] [--profile NODES]
                                              [--settle-heap] [--config FILE] [--slowest N]
                                              [--cycle-seconds S]

For each cluster size: NODES x 8 GPUs (the four built-in 8-GPU boards in
turn, each node carrying its gpu-topology annotation) and the same 10,000
pods in gangs of 1 to 64 pods, arriving evenly over ``--arrival-seconds``
simulated seconds (a gang at a time), driven through the simulator exactly
as the shell drives the core: one ``schedule_cycle`` per simulated second
while anything changed or a backoff expired.  Pods run for a while and end,
so capacity churns; their durations grow with the cluster (x NODES / 5000)
so the offered load is the same share of every cluster (the header prints
it: the GPU-seconds asked over the GPU-seconds of the arrival window).

Gangs: sizes 1 (40%), 2, 4 (15% each), 8 (12%), 16 (10%), 32 (5%), 64 (3%)
pods; a lone pod asks 1, 2, 4 or 8 GPUs, a gang member 4 or 8; every pod
2 cpu and 16Gi per GPU.  Preemption is off (the scheduler's default).

Reported: cycles run; pods placed; core seconds (the time inside the
policy's cycle: note_changes, snapshot, schedule_cycle); decisions per
second (pods placed / core seconds); cycle time p50 / p99 / max.
``--profile NODES`` runs that size under cProfile and prints the top
functions by their own time and by cumulative time.  ``--settle-heap``
does what ``batchsched run`` does once its caches sync (``gc.freeze()`` and
higher collector thresholds, batchsched/shell/heap.py) after building each
cluster, and undoes it after the run; without it the collector runs with
Python's defaults.  ``--config FILE``: batchsched's scheduler config (as
for ``batchsched run``; default: the defaults).  ``--slowest N`` lists each
size's N slowest cycles (the nearest-rank p99 of ~117 burst cycles is the
second slowest) with when they ran and how many pods each placed.
``--cycle-seconds S``: at most one cycle per S simulated seconds (default
1).  The shell runs its next cycle 5 ms after the changes that wake it
(``CHANGE_BATCH_SECONDS``), so in a burst its cycles follow each other as
fast as they run and each takes what arrived meanwhile: a smaller S is
nearer what it does than the default's one cycle per second, which hands
each burst cycle ~2,000 pods.
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gc
import platform
import pstats
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchsched.config import SchedulerConfig, load_config  # noqa: E402
from batchsched.sim.cluster import NodeGroup, build_nodes, builtin_topologies  # noqa: E402
from batchsched.sim.engine import SimOptions, Simulation  # noqa: E402
from batchsched.sim.metrics import percentile  # noqa: E402
from batchsched.sim.progress import TerminalProgress  # noqa: E402
from batchsched.sim.policies import BatchschedPolicy  # noqa: E402
from batchsched.sim.workload import Job  # noqa: E402
from batchsched.shell.heap import THRESHOLDS, settle_heap  # noqa: E402

DEFAULT_GC_THRESHOLDS = gc.get_threshold()

BOARDS = ("dgx1-v100", "dgx-a100", "dgx-h100", "pcie-8gpu")
GANG_SIZES = ((1, 40), (2, 15), (4, 15), (8, 12), (16, 10), (32, 5), (64, 3))
REFERENCE_NODES = 5000


def cluster(nodes: int) -> list[NodeGroup]:
    per_board = [nodes // len(BOARDS) + (k < nodes % len(BOARDS)) for k in range(len(BOARDS))]
    return [NodeGroup(name=board, gpus=8, cpu="256", memory="2Ti", count=count,
                      topology=builtin_topologies()[board], topology_name=board)
            for board, count in zip(BOARDS, per_board) if count]


def workload(pods: int, nodes: int, seed: int, arrival_seconds: float) -> list[Job]:
    rng = random.Random(seed)
    sizes, weights = zip(*GANG_SIZES)
    jobs, total = [], 0
    while total < pods:
        size = min(rng.choices(sizes, weights)[0], pods - total)
        gpus = rng.choice((1, 2, 4, 8)) if size == 1 else rng.choice((4, 8))
        duration = rng.uniform(100, 300) * nodes / REFERENCE_NODES
        jobs.append(Job(name=f"job-{len(jobs)}", arrival=0.0, duration=round(duration, 3), pods=size,
                        min_member=size, gpus=gpus, cpu=str(2 * gpus), memory=f"{16 * gpus}Gi",
                        namespace="bench"))
        total += size
    spacing = arrival_seconds / len(jobs)
    return [dataclasses.replace(job, arrival=round(i * spacing, 3)) for i, job in enumerate(jobs)]


def offered_load(jobs: list[Job], nodes: int) -> float:
    window = max(j.arrival for j in jobs) - min(j.arrival for j in jobs)
    return sum(j.pods * j.gpus * j.duration for j in jobs) / (8 * nodes * max(window, 1.0))


class CountingPolicy(BatchschedPolicy):
    """The batchsched policy, noting when each cycle ran and what it placed."""

    def __init__(self, config: SchedulerConfig = SchedulerConfig()):
        super().__init__(config)
        self.cycles: list[tuple[float, int]] = []  # (simulated time, pods placed)

    def cycle(self, cluster, now):
        plan = super().cycle(cluster, now)
        self.cycles.append((now, len(plan.bindings)))
        return plan


def measure(nodes: int, jobs: list[Job], settle: bool = False, simulation: Simulation | None = None,
            phase: str = "", config: SchedulerConfig = SchedulerConfig(), options: SimOptions = SimOptions()) -> dict:
    """``summary`` of the run (of ``simulation``, whose policy is a CountingPolicy, when given, else one over
    ``jobs`` under ``config`` and ``options``), its progress named ``phase``."""
    simulation = simulation or Simulation(build_nodes(cluster(nodes)), jobs, CountingPolicy(config), options)
    if settle:  # as the scheduler process does once its caches sync
        settle_heap()
    try:
        return summary(nodes, simulation, phase)
    finally:
        if settle:
            gc.unfreeze()
            gc.set_threshold(*DEFAULT_GC_THRESHOLDS)


def summary(nodes: int, simulation: Simulation, phase: str = "") -> dict:
    """Run ``simulation`` and say what its cycles cost (a row of the table);
    on a terminal, its progress shows on stderr, named ``phase``."""
    started = time.perf_counter()
    result = simulation.run(progress=TerminalProgress.if_terminal(sys.stderr), phase=phase or f"{nodes} nodes")
    wall = time.perf_counter() - started
    cycles = result.cycle_seconds
    placed = result.pods - result.pods_never_placed
    core = sum(cycles)
    return {"nodes": nodes, "cycles": len(cycles), "placed": placed, "core": core, "wall": wall,
            "rate": placed / core if core else 0.0, "p50": 1000 * percentile(cycles, 50),
            "p99": 1000 * percentile(cycles, 99), "max": 1000 * max(cycles, default=0.0),
            "started": result.jobs_started, "jobs": result.jobs,
            # (when and what each cycle placed: known where the policy is a CountingPolicy)
            "slowest": sorted(zip(cycles, getattr(simulation.policy, "cycles", ())), reverse=True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="500,5000,10000", help="cluster sizes, comma separated")
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--arrival-seconds", type=float, default=500.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", type=int, metavar="NODES", help="profile this size instead")
    parser.add_argument("--slowest", type=int, default=0, metavar="N",
                        help="list each size's N slowest cycles: simulated time, ms, pods placed")
    parser.add_argument("--settle-heap", action="store_true",
                        help="once the cluster is built, gc.freeze() and raise the collector's thresholds, "
                             "as `batchsched run` does after its caches sync (batchsched/shell/heap.py)")
    parser.add_argument("--config", help="batchsched's scheduler config (default: the defaults)")
    parser.add_argument("--cycle-seconds", type=float, default=SimOptions().cycle_seconds, metavar="S",
                        help="at most one cycle per S simulated seconds (the shell's cadence is nearer 0.1)")
    args = parser.parse_args()
    config = load_config(args.config)
    options = SimOptions(cycle_seconds=args.cycle_seconds)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(measure, args.profile, workload(args.pods, args.profile, args.seed, args.arrival_seconds),
                         args.settle_heap, config=config, options=options)
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)
        return 0
    print(f"# {platform.python_implementation()} {platform.python_version()}, {platform.machine()}, "
          f"{args.pods} pods arriving over {args.arrival_seconds:g} s, seed {args.seed}, "
          f"at most a cycle per {args.cycle_seconds:g} s"
          f"{', heap settled (gc.freeze, thresholds ' + str(THRESHOLDS) + ')' if args.settle_heap else ''}")
    print("| nodes | GPUs | offered load | cycles | pods placed | jobs started | core s | decisions/s | "
          "cycle p50 ms | p99 ms | max ms | wall s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for nodes in (int(n) for n in args.nodes.split(",")):
        jobs = workload(args.pods, nodes, args.seed, args.arrival_seconds)
        m = measure(nodes, jobs, args.settle_heap, config=config, options=options)
        print(f"| {nodes} | {8 * nodes} | {100 * offered_load(jobs, nodes):.0f}% | {m['cycles']} | {m['placed']} | "
              f"{m['started']}/{m['jobs']} | "
              f"{m['core']:.1f} | {m['rate']:.0f} | {m['p50']:.1f} | {m['p99']:.1f} | {m['max']:.1f} | "
              f"{m['wall']:.1f} |", flush=True)
        if args.slowest:
            print(f"#   slowest cycles at {nodes} nodes (t, ms, pods placed): " + "; ".join(
                f"t={now:g} {1000 * seconds:.1f} ms {placed}" for seconds, (now, placed) in m["slowest"][:args.slowest]),
                flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
