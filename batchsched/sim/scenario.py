"""What ``batchsched simulate`` runs: a cluster, a workload and batchsched's
configuration (the embedded defaults, files, or a trace), under each policy."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from batchsched.config import SchedulerConfig, load_config
from batchsched.core.queues.model import QueueInfo
from batchsched.sim import baselines, traces
from batchsched.sim.cluster import DEFAULTS, NodeGroup, build_dra, build_nodes, describe_cluster, load_cluster
from batchsched.sim.engine import Policy, SimOptions, simulate
from batchsched.sim.files import InputError
from batchsched.sim.metrics import SimResult
from batchsched.sim.progress import TerminalProgress
from batchsched.sim.policies import NAME as BATCHSCHED, BatchschedPolicy
from batchsched.sim.workload import Job, describe_workload, read_workload

POLICIES = (BATCHSCHED,) + baselines.NAMES
OCCUPANCY_SAMPLES = 240  # columns of the per-node occupancy chart
TRACES = ("alibaba", "philly")


@dataclass(frozen=True)
class Scenario:
    cluster: list[NodeGroup]
    jobs: list[Job]
    config: SchedulerConfig
    cluster_source: str  # where each came from, for the summary
    workload_source: str
    queues: Mapping[str, QueueInfo] = field(default_factory=dict)  # the workload file's (docs/queues.md)

    def describe(self) -> str:
        queues = f", {len(self.queues)} queues" if self.queues else ""
        return (f"cluster:  {self.cluster_source} ({describe_cluster(self.cluster)})\n"
                f"workload: {self.workload_source} ({describe_workload(self.jobs)}{queues})")


def default_config() -> SchedulerConfig:
    """The defaults of configs/scheduler.yaml, with preemption of inference
    pods for training gangs (defaults/scheduler.yaml)."""
    return load_config(DEFAULTS / "scheduler.yaml")


def build_scenario(cluster: Path | None = None, workload: Path | None = None, trace: str | None = None,
                   trace_dir: Path | None = None, config: Path | None = None,
                   seed: int = 1, max_pods: int | None = None) -> Scenario:
    """Files given win; what is not given comes from the trace or the embedded defaults."""
    trace_dir = trace_dir or traces.default_trace_dir()
    scheduler_config = load_config(config) if config else default_config()
    queues: dict[str, QueueInfo] = {}
    groups = load_cluster(cluster) if cluster else None
    cluster_source = str(cluster) if cluster else "embedded default"
    if trace == "alibaba":
        if workload:
            raise InputError("--trace alibaba brings its own workload; leave out --workload")
        trace_groups, jobs = traces.alibaba(trace_dir, max_pods, seed)
        if groups is None:
            groups, cluster_source = trace_groups, f"Alibaba v2023 GPU nodes{_sampled(max_pods)}"
        workload_source = f"Alibaba v2023 GPU pods{_sampled(max_pods)}"
    elif trace == "philly":
        if workload:
            raise InputError("--trace philly brings its own workload; leave out --workload")
        jobs = _first_pods(traces.philly(trace_dir, seed), max_pods)
        workload_source = f"Philly-derived job mix (Pollux workload-6){_sampled(max_pods)}"
    elif trace is not None:
        raise InputError(f"unknown trace {trace!r} (known: {', '.join(TRACES)})")
    else:
        loaded = read_workload(workload if workload else DEFAULTS / "workload.yaml", seed)
        jobs, queues = loaded.jobs, loaded.queues
        workload_source = str(workload) if workload else "embedded default"
    if groups is None:
        groups = load_cluster(DEFAULTS / "cluster.yaml")
    return Scenario(groups, jobs, scheduler_config, cluster_source, workload_source, queues)


def _sampled(max_pods: int | None) -> str:
    return f", sampled to {max_pods} pods" if max_pods else ""


def _first_pods(jobs: list[Job], max_pods: int | None) -> list[Job]:
    """The first jobs, by arrival, that hold at most ``max_pods`` pods together."""
    if max_pods is None:
        return jobs
    kept, pods = [], 0
    for job in jobs:
        if pods + job.pods > max_pods:
            break
        kept.append(job)
        pods += job.pods
    return kept


def policy_for(name: str, config: SchedulerConfig, seed: int) -> Policy:
    if name == BATCHSCHED:
        return BatchschedPolicy(config)
    return baselines.baseline(name, seed, config.core().default_queue, config.preemption.policy())


def run_scenario(scenario: Scenario, policies: list[str] = list(POLICIES), seed: int = 1,
                 plot: bool = False, progress: TerminalProgress | None = None) -> list[SimResult]:
    """One simulation per policy, on the same nodes and jobs; ``plot``
    also records per-node occupancy for the charts; ``progress`` shows each
    run's progress."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise InputError(f"unknown policy {unknown[0]!r} (known: {', '.join(POLICIES)})" if unknown
                         else f"no policy given (known: {', '.join(POLICIES)})")
    nodes, dra = build_nodes(scenario.cluster), build_dra(scenario.cluster)
    options = SimOptions(occupancy_samples=OCCUPANCY_SAMPLES if plot else 0)
    return [simulate(nodes, scenario.jobs, policy_for(name, scenario.config, seed), options,
                     scenario.config.scheduler_name, dra, progress, scenario.queues,
                     scenario.config.core().default_queue) for name in policies]
