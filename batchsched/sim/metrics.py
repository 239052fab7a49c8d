"""What a simulation measured (docs/simulator.md defines every figure).

* **wait**: from a job's arrival to its first start (``minMember`` pods bound);
* **GPU allocation**: GPUs held by bound pods over all GPUs, averaged over
  time in the *arrival window* (first to last arrival: the drain at the end
  would dilute it, and policies drain at different speeds);
* **held idle**: the part of it held by jobs that do not run, because fewer
  than ``minMember`` of their pods are bound (a gang placed piecemeal);
* **stranded GPUs**: free GPUs no whole-node pod can use
  (``batchsched.core.gpu_pools.stranded_gpus``), averaged like allocation;
* **aligned**: multi-GPU pods bound on an aligned GPU set
  (``batchsched.core.topology.alignment.is_aligned``); on a node without a
  known topology a pod does not count as aligned;
* **GPUDirect RDMA**: GPU pod bindings of multi-pod jobs whose pods were
  bound on two or more nodes (over the run), and of those the ones whose
  every GPU has a NIC at PIX or PXB (``GpuTopology.rdma_gpus``); a node
  whose topology lists no NICs gives none;
* **GPU-hours run by evicted pods**: over every eviction, the victim's
  GPUs times its run since it started (or since its checkpoint-time, which
  the simulator never sets; ``batchsched.core.preemption.plan.lost_work``):
  the work a job without checkpoints loses.  The simulator itself lets a
  preempted job resume with the time it had left, as if it saved its state
  when evicted;
* **unscheduled**: pods pending just after the last arrival's cycle, and
  pods never placed by the end of the run;
* **DRA claims**: pods bound with an extended-resource claim, on nodes
  where DRA serves ``nvidia.com/gpu`` (a pod bound again counts again);
* **idled by reservations**: GPU-hours, over the whole run, of GPUs left
  free on the nodes of the anti-starvation reservation (docs/queueing.md)
  while another gang waited with a pod asking no more GPUs than one of
  those nodes had free: room the reservation kept from a gang that could
  have used it (by GPU count).

With queues (a workload file's ``queues``), per queue that jobs name, over
the whole run (docs/simulator.md, "Queues"):

* **share**: the GPUs its jobs' pods hold (terminating ones until gone),
  over all GPUs; its **fair share** is the core's
  (``batchsched.core.queues.share.fair_shares``) over GPUs, from what each
  queue holds plus what its waiting pods ask;
* **share error**: the time mean of |share - fair share|, over the queues
  that hold or ask for GPUs at the time;
* **Jain's index**: (sum x)^2 / (n sum x^2) with x = held / fair share over
  the queues with a fair share above 0, time mean (1: each at its share);
* **guaranteed request to start**: for a gang arriving while its queue
  holds at most its ``guaranteed`` GPUs less the gang's minimum, from its
  arrival to its start (with borrowed GPUs to take back: the reclaim latency);
* **evictions by reclaim, by priority**: pods evicted for a queue taking
  back room it lent, and by priority preemption.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

from batchsched.api import constants
from batchsched.core.model import NodeInfo, PodInfo
from batchsched.core.queueing.idle import idle_reserved_gpus
from batchsched.core.queueing.queue import Reservation
from batchsched.core.queues.model import QueueInfo
from batchsched.core.queues.share import fair_shares
from batchsched.core.resources import Resources
from batchsched.core.topology.accounting import topology_of
from batchsched.core.topology.alignment import is_aligned
from batchsched.core.topology.choose import mask_of

if TYPE_CHECKING:
    from batchsched.sim.workload import Job


class RecordedCluster(Protocol):
    """What the recorder reads of the simulated cluster (``engine.SimCluster``;
    named here so that this module needs nothing of the engine that imports it)."""
    queues: Mapping[str, QueueInfo]
    nodes: Mapping[str, NodeInfo]
    pods: Mapping[str, PodInfo]
    free: Mapping[str, Resources]
    pending: set[str]
    total_gpus: int
    dra_gpus: int
    allocated_gpus: int
    stranded: int
    pods_with_claims: int


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class SimResult:
    policy: str
    gpus: int
    jobs: int
    pods: int  # created on arrival (recreated ones not counted)
    window: tuple[float, float]  # the arrival window, simulated seconds
    end: float  # when the last event happened
    waits: list[float] = field(default_factory=list)  # per started job
    waits_by_priority: dict[int, list[float]] = field(default_factory=dict)
    jobs_finished: int = 0
    pods_unscheduled: int = 0  # pending right after the arrivals
    pods_never_placed: int = 0
    allocated_mean: float = 0.0  # GPUs, over the arrival window
    held_idle_mean: float = 0.0
    stranded_mean: float = 0.0
    allocated_peak: int = 0
    multi_gpu_pods: int = 0
    aligned_pods: int = 0
    multi_node_gang_pods: int = 0  # GPU pod bindings of jobs whose pods were on 2+ nodes
    rdma_pods: int = 0  # of those, on GPUs that each have a NIC at PIX/PXB
    evicted_pods: int = 0
    evicted_gpu_hours: float = 0.0  # the victims' runs since start or checkpoint: work lost without checkpoints
    preempted_jobs: int = 0
    reserved_idle_gpu_hours: float = 0.0
    dra_gpus: int = 0  # of ``gpus``, those DRA serves
    pods_with_claims: int = 0
    cycle_seconds: list[float] = field(default_factory=list)
    series: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, allocated, busy, stranded)
    node_names: list[str] = field(default_factory=list)
    occupancy: list[tuple[float, list[int]]] = field(default_factory=list)  # (t, GPUs held per node)
    queues: QueueFigures | None = None  # with queues only

    @property
    def jobs_started(self) -> int:
        return len(self.waits)

    def share(self, gpus: float) -> float:
        return gpus / self.gpus if self.gpus else 0.0

    @property
    def aligned_share(self) -> float:
        return self.aligned_pods / self.multi_gpu_pods if self.multi_gpu_pods else math.nan

    @property
    def rdma_share(self) -> float:
        return self.rdma_pods / self.multi_node_gang_pods if self.multi_node_gang_pods else math.nan


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one has all; NaN for none or all 0."""
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else math.nan


@dataclass
class QueueFigures:
    """The fairness figures of a run with queues (module docstring)."""

    share: dict[str, float] = field(default_factory=dict)  # time mean of held / all GPUs, by queue
    fair_share: dict[str, float] = field(default_factory=dict)  # time mean of fair share / all GPUs
    share_error: float = math.nan
    jain: float = math.nan
    guaranteed_waits: list[float] = field(default_factory=list)  # guaranteed request to start, per started gang
    guaranteed_unstarted: int = 0  # guaranteed requests never started
    reclaim_evictions: int = 0
    priority_evictions: int = 0
    # per job, the times it lost pods (several pods at once: once)
    evicted_at: dict[str, list[float]] = field(default_factory=dict)
    # (queue evicting, queue evicted) -> pods: reclaim both ways between two queues would be ping-pong
    reclaimed: dict[tuple[str, str], int] = field(default_factory=dict)


class QueueTracker:
    """What each queue holds and asks over a run, against its fair share."""

    def __init__(self, queues: Mapping[str, QueueInfo], jobs: Sequence[Job], default_queue: str, total_gpus: int):
        self.queues, self.total = queues, total_gpus
        self.queue_of = {job.key: job.queue or default_queue for job in jobs}
        self.tenants = sorted(set(self.queue_of.values()))
        self.held = {name: 0 for name in self.tenants}
        self.asked = {name: 0 for name in self.tenants}
        self.figures = QueueFigures()
        self._requested: dict[str, float] = {}  # job -> arrival, for guaranteed requests
        self._last: tuple[float, dict[str, float], dict[str, float]] | None = None  # t, held, fair
        self._area = {"error": 0.0, "error_time": 0.0, "jain": 0.0, "jain_time": 0.0, "time": 0.0}
        self._share_area = {name: 0.0 for name in self.tenants}
        self._fair_area = {name: 0.0 for name in self.tenants}

    def guaranteed(self, name: str) -> int:
        queue = self.queues.get(name)
        quota = queue.quotas.get(constants.GPU_RESOURCE) if queue is not None else None
        return (quota.guaranteed or 0) if quota is not None else 0

    def arrived(self, job: Job, t: float) -> None:
        name = self.queue_of[job.key]
        self.asked[name] += job.pods * job.gpus
        if job.gpus and self.held[name] + job.min_member * job.gpus <= self.guaranteed(name):
            self._requested[job.key] = t

    def holds(self, job: Job, gpus: int) -> None:
        self.held[self.queue_of[job.key]] += gpus

    def finished(self, job: Job) -> None:
        self.asked[self.queue_of[job.key]] -= job.pods * job.gpus

    def started(self, job: Job, t: float) -> None:
        if job.key in self._requested:
            self.figures.guaranteed_waits.append(t - self._requested.pop(job.key))

    def evicted(self, job: Job, t: float, preemptor: str, reclaim: bool) -> None:
        f = self.figures
        if reclaim:
            f.reclaim_evictions += 1
            pair = (self.queue_of.get(preemptor, ""), self.queue_of[job.key])
            f.reclaimed[pair] = f.reclaimed.get(pair, 0) + 1
        else:
            f.priority_evictions += 1
        times = f.evicted_at.setdefault(job.key, [])
        if not times or times[-1] != t:
            times.append(t)

    def observe(self, t: float) -> None:
        """Account the time since the last observation, then take this one."""
        self._account(t)
        if not self.total:
            return
        # What each queue asks: its pods' GPUs, bound or pending (an evicted
        # pod's replacement is created only once it is gone, so never twice).
        fair = fair_shares(self.queues, {n: {constants.GPU_RESOURCE: a} for n, a in self.asked.items()},
                           {constants.GPU_RESOURCE: self.total})
        self._last = (t, dict(self.held),
                      {n: float(fair[n].get(constants.GPU_RESOURCE, Fraction(0))) for n in self.tenants})

    def _account(self, t: float) -> None:
        if self._last is None or t <= self._last[0]:
            return
        since, held, fair = self._last
        span = t - since
        self._area["time"] += span
        for name in self.tenants:
            self._share_area[name] += span * held[name] / self.total
            self._fair_area[name] += span * fair[name] / self.total
        active = [n for n in self.tenants if held[n] or fair[n]]
        if active:
            error = sum(abs(held[n] - fair[n]) for n in active) / (len(active) * self.total)
            self._area["error"] += span * error
            self._area["error_time"] += span
        jain = jain_index([held[n] / fair[n] for n in self.tenants if fair[n] > 0])
        if not math.isnan(jain):
            self._area["jain"] += span * jain
            self._area["jain_time"] += span

    def result(self, end: float) -> QueueFigures:
        self._account(end)
        f, area = self.figures, self._area
        if area["time"]:
            f.share = {n: a / area["time"] for n, a in self._share_area.items()}
            f.fair_share = {n: a / area["time"] for n, a in self._fair_area.items()}
        f.share_error = area["error"] / area["error_time"] if area["error_time"] else math.nan
        f.jain = area["jain"] / area["jain_time"] if area["jain_time"] else math.nan
        f.guaranteed_unstarted = len(self._requested)
        return f


def window_mean(series: Sequence[tuple[float, ...]], column: int, start: float, end: float) -> float:
    """Time average over [start, end] of a piecewise-constant ``column`` of
    ``series`` (each row holds from its time to the next row's)."""
    if end <= start:
        return float(series[-1][column]) if series else 0.0
    area = 0.0
    for (t, *values), nxt in zip(series, [row[0] for row in series[1:]] + [math.inf]):
        low, high = max(t, start), min(nxt, end)
        if high > low:
            area += values[column - 1] * (high - low)
    return area / (end - start)


class Recorder:
    def __init__(self, cluster: RecordedCluster, jobs: Sequence[Job], policy: str, default_queue: str = "default"):
        self.cluster = cluster
        self.queues = (QueueTracker(cluster.queues, jobs, default_queue, cluster.total_gpus)
                       if cluster.queues else None)
        arrivals = [j.arrival for j in jobs]
        self.result_ = SimResult(policy=policy, gpus=cluster.total_gpus, dra_gpus=cluster.dra_gpus, jobs=len(jobs),
                                 pods=sum(j.pods for j in jobs),
                                 window=(min(arrivals, default=0.0), max(arrivals, default=0.0)), end=0.0,
                                 node_names=sorted(cluster.nodes))
        self.cycle_seconds = self.result_.cycle_seconds
        self._preempted: set[str] = set()
        self._multi_pod = {job.key for job in jobs if job.pods > 1}
        self._gang_bindings: dict[str, list[tuple[str, bool]]] = {}  # job -> (node, with RDMA) per GPU pod
        self._reservation: Reservation | None = None
        self._reserved_idle = 0  # GPUs idled by the reservation since...
        self._reserved_idle_since = 0.0  # ...this time

    def reserved(self, t: float, reservation: Reservation | None) -> None:
        """The reservation a cycle left at ``t`` (None: none)."""
        self._reservation = reservation
        self._count_reserved_idle(t)

    def observe(self, t: float, busy_gpus: int) -> None:
        self._count_reserved_idle(t)
        if self.queues is not None:
            self.queues.observe(t)
        row = (t, self.cluster.allocated_gpus, busy_gpus, self.cluster.stranded)
        series = self.result_.series
        if series and series[-1][0] == t:
            series[-1] = row
        else:
            series.append(row)
        self.result_.allocated_peak = max(self.result_.allocated_peak, row[1])

    def _count_reserved_idle(self, t: float) -> None:
        """Add the GPU-hours idled since the last count, and see how many now."""
        self.result_.reserved_idle_gpu_hours += self._reserved_idle * (t - self._reserved_idle_since) / 3600
        self._reserved_idle_since = t
        self._reserved_idle = 0
        held = self._reservation
        if held is None:
            return
        pods = self.cluster.pods
        self._reserved_idle = idle_reserved_gpus(
            (self.cluster.free[name].get(constants.GPU_RESOURCE, 0) for name in held.nodes
             if name in self.cluster.free),
            (pods[uid].requests.get(constants.GPU_RESOURCE, 0) for uid in self.cluster.pending
             if pods[uid].gang_key != held.gang_key))

    def bound(self, pod: PodInfo, node: NodeInfo) -> None:
        gpus = pod.requests.get(constants.GPU_RESOURCE, 0)
        if gpus and pod.gang_key in self._multi_pod:
            topology = topology_of(node)
            rdma = topology is not None and bool(pod.gpu_ids) and not mask_of(pod.gpu_ids) & ~topology.rdma_gpus
            self._gang_bindings.setdefault(pod.gang_key, []).append((node.name, rdma))
        if gpus < 2:
            return
        self.result_.multi_gpu_pods += 1
        topology = topology_of(node)
        if topology is not None and pod.gpu_ids and is_aligned(topology, pod.gpu_ids):
            self.result_.aligned_pods += 1

    def arrived(self, job: Job, t: float) -> None:
        if self.queues is not None:
            self.queues.arrived(job, t)

    def holds(self, job: Job, gpus: int) -> None:
        """The job's bound pods hold ``gpus`` more (or fewer) GPUs."""
        if self.queues is not None:
            self.queues.holds(job, gpus)

    def started(self, job: Job, t: float) -> None:
        if self.queues is not None:
            self.queues.started(job, t)
        self.result_.waits.append(t - job.arrival)
        self.result_.waits_by_priority.setdefault(job.priority, []).append(t - job.arrival)

    def finished(self, job: Job) -> None:
        if self.queues is not None:
            self.queues.finished(job)
        self.result_.jobs_finished += 1

    def evicted(self, job: Job, t: float, preemptor: str = "", reclaim: bool = False,
                lost_gpu_seconds: float = 0.0) -> None:
        """``preemptor``: the key of the job the eviction makes room for ("": a gang started over);
        ``lost_gpu_seconds``: the victim's run since its start or last checkpoint."""
        if self.queues is not None:
            self.queues.evicted(job, t, preemptor, reclaim)
        self.result_.evicted_pods += 1
        self.result_.evicted_gpu_hours += lost_gpu_seconds / 3600
        self._preempted.add(job.key)

    def mark_last_arrival(self) -> None:
        self.result_.pods_unscheduled = len(self.cluster.pending)

    def sample_occupancy(self, t: float) -> None:
        free = self.cluster.free
        held = [node.allocatable.get(constants.GPU_RESOURCE, 0) - free[name].get(constants.GPU_RESOURCE, 0)
                for name, node in sorted(self.cluster.nodes.items())]
        self.result_.occupancy.append((t, held))

    def result(self, end: float) -> SimResult:
        self._count_reserved_idle(end)
        r = self.result_
        r.end = end
        r.pods_never_placed = len(self.cluster.pending)
        r.pods_with_claims = self.cluster.pods_with_claims
        r.preempted_jobs = len(self._preempted)
        spanning = [b for b in self._gang_bindings.values() if len({node for node, _ in b}) > 1]
        r.multi_node_gang_pods = sum(len(b) for b in spanning)
        r.rdma_pods = sum(rdma for b in spanning for _, rdma in b)
        start, stop = r.window if r.window[1] > r.window[0] else (r.window[0], end)
        r.allocated_mean = window_mean(r.series, 1, start, stop)
        r.held_idle_mean = r.allocated_mean - window_mean(r.series, 2, start, stop)
        r.stranded_mean = window_mean(r.series, 3, start, stop)
        if self.queues is not None:
            r.queues = self.queues.result(end)
        return r
