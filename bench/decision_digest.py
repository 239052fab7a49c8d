"""A digest of every decision the core makes over fixed simulator runs.

    .venv/bin/python bench/decision_digest.py [--quick]

For refactors that must not change behaviour (the caches and indexes
behind bench/throughput_core.py): run it before and after, and the digests
must be equal.  Each scenario runs the real core through the simulator and
hashes, cycle by cycle, every binding (pod, node, GPU ids), nomination,
eviction and verdict reason.  Scenarios: the embedded default (preemption
on), the Philly-derived mix when ../shared is there, and the throughput
workload of bench/throughput_core.py at 200 and 1000 nodes, with arrivals
spread and in a burst, as they are (preemption off) and with lone pods as
low-priority inference that the gangs may preempt; and that workload at 200
nodes in the Queues of bench/queues_cycle.py (10 leaf queues under one
parent), preemption on, so queue limits, order and reclaims all decide.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batchsched.config import SchedulerConfig  # noqa: E402
from batchsched.sim.cluster import build_nodes  # noqa: E402
from batchsched.sim.engine import Simulation  # noqa: E402
from batchsched.sim.policies import BatchschedPolicy  # noqa: E402
from batchsched.sim.progress import TerminalProgress  # noqa: E402
from batchsched.sim.scenario import build_scenario  # noqa: E402
from batchsched.sim.workload import Job  # noqa: E402
from queues_cycle import queues  # noqa: E402
from throughput_core import cluster, workload  # noqa: E402


class DigestingPolicy(BatchschedPolicy):
    """The batchsched policy, hashing each cycle's plan."""

    def __init__(self, config: SchedulerConfig):
        super().__init__(config)
        self.digest = hashlib.sha256()
        self.decisions = 0

    def cycle(self, cluster, now):
        plan = super().cycle(cluster, now)
        update = self.digest.update
        update(f"@{now:.3f}".encode())
        for b in plan.bindings:
            update(f"B{b.pod_uid}>{b.node_name}{b.gpu_ids}".encode())
        for n in plan.nominations:
            update(f"N{n.pod.uid}>{n.node_name}".encode())
        for e in plan.evictions:
            update(f"E{e.pod.uid}<{e.preemptor}".encode())
        for key in sorted(plan.verdicts):
            update(f"V{key}:{plan.verdicts[key].reason}".encode())
        self.decisions += len(plan.bindings) + len(plan.nominations) + len(plan.evictions)
        return plan


def _with_inference(job: Job) -> Job:
    """Lone pods become preemptible inference (a Deployment's pods, never
    ending by themselves); gangs outrank them."""
    if job.pods == 1:
        return dataclasses.replace(job, labels={"workload": "inference"}, priority=100, controller="ReplicaSet")
    return dataclasses.replace(job, priority=1000, priority_class="training")


# Training gangs may evict inference pods however briefly they have run
# (the throughput jobs are short at these sizes).
PREEMPTING = SchedulerConfig.model_validate({"preemption": {
    "enabled": True, "victims": {"matchLabels": {"workload": "inference"}, "minRuntimeSeconds": 0},
    "preemptors": {"priorityClassNames": ["training"]}, "nodeCooldownSeconds": 5}})


# Any gang may be a reclaim's victim once it has run a minute.
RECLAIMING = SchedulerConfig.model_validate({"preemption": {
    "enabled": True, "victims": {"minRuntimeSeconds": 60}, "nodeCooldownSeconds": 5}})


def scenarios(quick: bool):
    """(name, nodes, jobs, config) or (name, nodes, jobs, config, queues)."""
    embedded = build_scenario(config=None)
    yield "embedded default", build_nodes(embedded.cluster), embedded.jobs, embedded.config
    if (ROOT.parent / "shared" / "data" / "traces").is_dir():
        philly = build_scenario(trace="philly", trace_dir=ROOT.parent / "shared" / "data" / "traces")
        yield "philly", build_nodes(philly.cluster), philly.jobs, philly.config
    sizes = (200,) if quick else (200, 1000)
    for nodes in sizes:
        for arrival in (500.0, 5.0):
            jobs = workload(2000 if quick else 4000, nodes, 1, arrival)
            yield (f"throughput {nodes} nodes, arrivals over {arrival:g} s",
                   build_nodes(cluster(nodes)), jobs, SchedulerConfig())
            yield (f"throughput {nodes} nodes, arrivals over {arrival:g} s, inference preempted",
                   build_nodes(cluster(nodes)), [_with_inference(job) for job in jobs], PREEMPTING)
    jobs = workload(2000, 200, 1, 500.0)
    yield ("throughput 200 nodes in 10 queues, reclaim on", build_nodes(cluster(200)),
           [dataclasses.replace(job, queue=f"team-{i % 10}") for i, job in enumerate(jobs)], RECLAIMING,
           queues(10, 8 * 200))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller throughput runs (about 1 min in all)")
    args = parser.parse_args()
    overall = hashlib.sha256()
    for name, nodes, jobs, config, *queue_objects in scenarios(args.quick):
        started = time.perf_counter()
        policy = DigestingPolicy(config)
        simulation = Simulation(nodes, jobs, policy, scheduler_name=config.scheduler_name)
        simulation.cluster.queues = queue_objects[0] if queue_objects else {}
        simulation.run(progress=TerminalProgress.if_terminal(sys.stderr), phase=name)
        digest = policy.digest.hexdigest()[:16]
        overall.update(digest.encode())
        print(f"{digest}  {policy.decisions:6d} decisions  {time.perf_counter() - started:6.1f} s  {name}",
              flush=True)
    print(f"{overall.hexdigest()[:16]}  all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
