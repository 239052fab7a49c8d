"""Fragmentation-aware node choice (docs/topology.md, "Fragmentation-aware
node choice and NVLink cliques"), off and on in the same run.

    .venv/bin/python bench/fragmentation_sim.py [--seeds 1,2,3] [--trace philly|alibaba] [--max-pods N]

Per seed, batchsched on the scenario (the embedded default, or the trace)
with the simulator's config and ``topology.fragmentationAware`` off, then
on (``keepCliquesWhole`` off in both); then, on the embedded cluster with
its dgx1 and h100 nodes put in NVLink cliques of 4 nodes (label
``nvidia.com/gpu.clique``; ``clique_cluster``), ``keepCliquesWhole`` off,
then on (``fragmentationAware`` off) -- not with a trace.  Reported: useful
GPU allocation (allocation less the share held idle by incomplete gangs),
stranded GPUs, wait p50 / p90, the priority-2000 gangs' median start,
aligned multi-GPU pods, pods still queued when arrivals stop, pods
preempted (jobs), reservation idle GPU-hours.  On a terminal each run's
progress shows on stderr.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchsched.api.constants import GPU_CLIQUE_LABEL  # noqa: E402
from batchsched.config import SchedulerConfig  # noqa: E402
from batchsched.sim.cluster import NodeGroup, build_nodes  # noqa: E402
from batchsched.sim.engine import Simulation  # noqa: E402
from batchsched.sim.metrics import SimResult, percentile  # noqa: E402
from batchsched.sim.policies import BatchschedPolicy  # noqa: E402
from batchsched.sim.progress import TerminalProgress  # noqa: E402
from batchsched.sim.report import duration  # noqa: E402
from batchsched.sim.scenario import build_scenario  # noqa: E402

BIG_GANG_PRIORITY = 2000
CLIQUE_GROUPS = ("dgx1", "h100")  # the embedded cluster's groups put in cliques
CLIQUE_NODES = 4


def clique_cluster(groups: list[NodeGroup]) -> list[NodeGroup]:
    """``groups`` with those named in CLIQUE_GROUPS split into groups of
    CLIQUE_NODES nodes, each an NVLink clique of its own."""
    out = []
    for group in groups:
        if group.name not in CLIQUE_GROUPS:
            out.append(group)
            continue
        for start in range(0, group.count, CLIQUE_NODES):
            name = f"{group.name}-c{start // CLIQUE_NODES}"
            out.append(dataclasses.replace(group, name=name, count=min(CLIQUE_NODES, group.count - start),
                                           labels={**group.labels, GPU_CLIQUE_LABEL: name}))
    return out


def with_choice(config: SchedulerConfig, fragmentation: bool, cliques: bool) -> SchedulerConfig:
    topology = config.topology.model_copy(update={"fragmentation_aware": fragmentation,
                                                  "keep_cliques_whole": cliques})
    return config.model_copy(update={"topology": topology})


def run(groups: list[NodeGroup], scenario, config: SchedulerConfig, phase: str) -> SimResult:
    simulation = Simulation(build_nodes(groups), scenario.jobs, BatchschedPolicy(config),
                            scheduler_name=config.scheduler_name)
    return simulation.run(progress=TerminalProgress.if_terminal(sys.stderr), phase=phase)


def row(seed: int, cluster: str, variant: str, r: SimResult) -> str:
    big = r.waits_by_priority.get(BIG_GANG_PRIORITY, [])
    aligned = f"{100 * r.aligned_share:.1f}% of {r.multi_gpu_pods}" if r.multi_gpu_pods else "-"
    return (f"| {seed} | {cluster} | {variant} | {100 * r.share(r.allocated_mean - r.held_idle_mean):.1f}% | "
            f"{r.stranded_mean:.1f} | {duration(percentile(r.waits, 50))} / {duration(percentile(r.waits, 90))} | "
            f"{duration(percentile(big, 50)) if big else '-'} | {aligned} | {r.pods_unscheduled} | "
            f"{r.evicted_pods} ({r.preempted_jobs}) | {r.reserved_idle_gpu_hours:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--trace", choices=("philly", "alibaba"))
    parser.add_argument("--max-pods", type=int)
    args = parser.parse_args()
    print("| seed | cluster | variant | useful allocation | stranded GPUs | wait p50 / p90 | priority 2000 median "
          "start | aligned multi-GPU pods | unscheduled after arrivals | preempted pods (jobs) | "
          "reservation idle GPU-h |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed in (int(s) for s in args.seeds.split(",")):
        scenario = build_scenario(trace=args.trace, seed=seed, max_pods=args.max_pods)
        name = args.trace or "embedded"
        for on in (False, True):
            variant = "fragmentationAware " + ("on" if on else "off")
            r = run(scenario.cluster, scenario, with_choice(scenario.config, on, False), f"seed {seed}, {variant}")
            print(row(seed, name, variant, r), flush=True)
        if args.trace:
            continue
        for on in (False, True):
            variant = "keepCliquesWhole " + ("on" if on else "off")
            r = run(clique_cluster(scenario.cluster), scenario, with_choice(scenario.config, False, on),
                    f"seed {seed}, cliques, {variant}")
            print(row(seed, "cliques", variant, r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
