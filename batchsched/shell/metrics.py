"""Every Prometheus metric batchsched exports (docs/metrics.md documents each).

The metrics live in their own registry, not prometheus_client's global one,
so several schedulers in one process (tests, the demo) never collide; the
standard process_* and python_* collectors are registered on it too.
Counters and histograms are updated by the shell as things happen; queue
depth, GPU pools and leadership are read from the scheduler's state when
``/metrics`` is scraped, so they cost nothing between scrapes (and the GPU
pools only what changed since the last scrape: core.gpu_pools.GpuPoolTally).
"""
from __future__ import annotations

from typing import Callable, Iterator, Mapping

from prometheus_client import (
    CollectorRegistry, Counter, Gauge, GCCollector, Histogram, PlatformCollector, ProcessCollector,
    disable_created_metrics, generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from batchsched.core.gpu_pools import PoolGpus
from batchsched.core.queues.report import QueueSummary

# The *_created series double the output and no dashboard reads them.
disable_created_metrics()

# Waiting for room can take hours; binding a gang takes well under a second.
GANG_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400)
BIND_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

RESULT_SCHEDULED = "scheduled"
RESULT_UNSCHEDULABLE = "unschedulable"


class _LiveState:
    """Gauges computed at scrape time from callables the scheduler provides."""

    def __init__(self) -> None:
        self.queue_depth: Callable[[], Mapping[int, int]] = dict
        self.gpu_pools: Callable[[], Mapping[str, PoolGpus]] = dict
        self.queues: Callable[[], Mapping[str, QueueSummary]] = dict

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("batchsched_queue_depth",
                                  "Gangs waiting in the scheduling queue, by priority.", labels=["priority"])
        for priority, count in sorted(self.queue_depth().items()):
            depth.add_metric([str(priority)], count)
        yield depth
        pools = self.gpu_pools()
        for field, help_text in (
                ("allocated", "GPUs held by bound, non-terminal pods, and DRA GPUs allocated to claims, per node "
                              "pool."),
                ("free", "GPUs not held by any pod or claim, per node pool (stranded ones included)."),
                ("stranded", "Free GPUs no whole-node pod (8 GPUs, or all of a smaller node) can use, per "
                             "node pool: the remainder on partly used nodes and all free GPUs of cordoned or "
                             "NotReady nodes.")):
            family = GaugeMetricFamily(f"batchsched_gpus_{field}", help_text, labels=["pool"])
            for pool, figures in sorted(pools.items()):
                family.add_metric([pool], getattr(figures, field))
            yield family
        yield from self._queues(self.queues())

    @staticmethod
    def _queues(queues: Mapping[str, QueueSummary]) -> Iterator[Metric]:
        for field, help_text in (
                ("allocated", "What the gangs of a queue hold (a parent: its children's), per resource in "
                              "canonical units (cpu in millicores, memory in bytes)."),
                ("guaranteed", "A queue's guaranteed (deserved) amount, per resource."),
                ("fair_share", "A queue's fair share now (weighted max-min over what it holds and its waiting "
                               "gangs ask), per resource."),
                ("borrowed", "What a queue holds beyond its guaranteed, per resource.")):
            family = GaugeMetricFamily(f"batchsched_queue_{field}", help_text, labels=["queue", "resource"])
            for name, summary in sorted(queues.items()):
                for resource, amount in sorted(getattr(summary, field).items()):
                    family.add_metric([name, resource], amount)
            yield family
        gangs = GaugeMetricFamily("batchsched_queue_gangs", "Gangs of a queue, by state (pending: with pods "
                                  "waiting to be placed; running: with pods bound).", labels=["queue", "state"])
        for name, summary in sorted(queues.items()):
            gangs.add_metric([name, "pending"], summary.pending_gangs)
            gangs.add_metric([name, "running"], summary.running_gangs)
        yield gangs
        reclaiming = GaugeMetricFamily(
            "batchsched_queue_reclaiming", "A reclaim in flight: what the pods of queue `from` still terminating "
            "for the gangs of `queue` hold, per resource (docs/queues.md, \"Reclaim in progress\").",
            labels=["queue", "from", "resource"])
        for name, summary in sorted(queues.items()):
            for flow in summary.reclaiming:
                for resource, amount in sorted(flow.amounts.items()):
                    reclaiming.add_metric([name, flow.queue, resource], amount)
        yield reclaiming


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.scheduling_attempts = Counter(
            "batchsched_scheduling_attempts", "Gangs tried against the cluster, by result "
            "(scheduled: quorum placed; unschedulable: it did not fit).", ["result"], registry=r)
        self.gang_e2e_duration = Histogram(
            "batchsched_gang_e2e_scheduling_duration_seconds",
            "From a gang becoming eligible (its quorum exists) to all of its quorum pods bound.",
            buckets=GANG_LATENCY_BUCKETS, registry=r)
        self.bind_duration = Histogram(
            "batchsched_bind_duration_seconds", "One pod's binding, retries included, whatever the outcome.",
            buckets=BIND_LATENCY_BUCKETS, registry=r)
        self.bind_errors = Counter(
            "batchsched_bind_errors", "Bindings that failed for good (after retries).", registry=r)
        self.watch_restarts = Counter(
            "batchsched_watch_restarts", "List/watch restarts, by resource and reason "
            "(gone: 410, relisted; error: reconnected after a failure; requested: relisted on SIGUSR1).",
            ["resource", "reason"], registry=r)
        self.preemption_victims = Counter(
            "batchsched_preemption_victims", "Pods evicted to make room for a higher-priority gang.",
            registry=r)
        self.multi_gpu_pods_bound = Counter(
            "batchsched_multi_gpu_pods_bound", "Pods with more than one GPU bound, by whether their "
            "GPUs form an aligned set (one NVLink domain / NUMA node).", ["aligned"], registry=r)
        self.cycles = Counter(
            "batchsched_scheduling_cycles", "Scheduling cycles run (one snapshot, one decision pass).",
            registry=r)
        self.cycle_errors = Counter(
            "batchsched_scheduling_cycle_errors", "Scheduling cycles that raised; the loop logs the error, "
            "backs off briefly and runs the next one.", registry=r)
        self.status_writes = Counter(
            "batchsched_podgroup_status_writes", "PodGroup status writes sent (only changed statuses "
            "are written, so an idle cluster adds none).", registry=r)
        self.pod_condition_writes = Counter(
            "batchsched_pod_condition_writes", "PodScheduled=False conditions written on pending pods (only "
            "changed ones, at most one per pod per statusMinIntervalSeconds).", registry=r)
        self.reserved_nodes = Gauge(
            "batchsched_reserved_nodes", "Nodes reserved for a long-waiting gang while they drain (0: none).",
            registry=r)
        self.reservation_idle_gpus = Gauge(
            "batchsched_reservation_idle_gpus", "GPUs free on the reserved nodes while a pod of another gang "
            "that could use them waits (the reservation's cost).", registry=r)
        self.reservation_idle_gpu_seconds = Counter(
            "batchsched_reservation_idle_gpu_seconds", "batchsched_reservation_idle_gpus over time, in "
            "GPU-seconds.", registry=r)
        self.leader = Gauge(
            "batchsched_leader", "1 while this replica holds the leader lease and acts, else 0.", registry=r)
        self.leader.set_function(lambda: 1)  # no election: the only replica acts
        for result in (RESULT_SCHEDULED, RESULT_UNSCHEDULABLE):
            self.scheduling_attempts.labels(result)
        for aligned in ("true", "false"):
            self.multi_gpu_pods_bound.labels(aligned)
        self._live = _LiveState()
        r.register(self._live)
        # What every Prometheus client exports: memory, CPU, file descriptors, Python version and GC.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)

    def read_live(self, queue_depth: Callable[[], Mapping[int, int]],
                  gpu_pools: Callable[[], Mapping[str, PoolGpus]],
                  queues: Callable[[], Mapping[str, QueueSummary]] = dict) -> None:
        """Where the scrape-time gauges come from."""
        self._live.queue_depth = queue_depth
        self._live.gpu_pools = gpu_pools
        self._live.queues = queues

    def read_leadership(self, is_leading: Callable[[], bool]) -> None:
        self.leader.set_function(lambda: 1 if is_leading() else 0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
