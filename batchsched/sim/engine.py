"""The event loop: simulated time, an in-memory cluster, and one policy
deciding every cycle.

``SimCluster`` holds what the shell's watch cache holds -- core model
objects for nodes, pods and PodGroups, plus the gangs touched and whether
capacity was freed since the last cycle -- but the simulator changes it
instead of an API server.  Bindings, evictions and nominations take effect
at once (the shell assumes them in its cache too).  On nodes where DRA serves
``nvidia.com/gpu``, a binding comes with its extended-resource claim, which
is put allocated and reserved for the pod, as the shell writes it before
binding; it goes with the pod, as kube-controller-manager deletes it.

``simulate`` runs a scenario under one policy:

* a job arrives: its PodGroup and pods are created;
* a cycle runs when the cluster changed (at most one every
  ``cycle_seconds``), or when the policy asks to be woken (the batchsched
  queue's backoff, a nomination's expiry), and only while pods are pending;
* a job starts once ``minMember`` of its pods are bound and finishes
  ``duration`` seconds later: its pods are deleted, its PodGroup too;
* an evicted pod terminates for ``grace_seconds`` (holding its resources),
  then is deleted and its controller recreates it, pending, under a new
  name; a job left below its quorum stops and later resumes its remaining
  time (docs/simulator.md, "Preemption").

Waking the policy only for its backoffs would never end while a gang that
cannot fit waits, and each retry of an unchanged cluster decides the same;
so once cycles have changed nothing for ``stall_seconds``, the simulator
skips to the next event.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol

from batchsched.api import constants
from batchsched.core import resources as res
from batchsched.core.cycle import CyclePlan
from batchsched.core.dra.extended import ExtendedClaim
from batchsched.core.dra.model import ResourceClaim
from batchsched.core.gpu_pools import stranded_gpus
from batchsched.core.model import GroupSpec, NodeInfo, PodInfo, pod_with
from batchsched.core.readers import group_from_json, pod_from_json
from batchsched.core.preemption.plan import lost_work
from batchsched.core.queues.model import QueueInfo
from batchsched.core.resources import Resources
from batchsched.core.tracked import TrackedDict
from batchsched.core.cluster import ClusterState
from batchsched.core.snapshot import Snapshot
from batchsched.core.topology.accounting import dra_gpus_by_id, gpu_id_count
from batchsched.core.topology.choose import mask_of
from batchsched.sim.cluster import DraObjects
from batchsched.sim.metrics import Recorder, SimResult
from batchsched.sim.progress import TerminalProgress
from batchsched.sim.workload import Job, pod_group_object, pod_object, to_unix


class SimulationError(RuntimeError):
    """A policy decided something the cluster cannot do (a bug)."""


class SimCluster:
    """Nodes, pods and PodGroups in memory, with per-node accounting."""

    def __init__(self, nodes: dict[str, NodeInfo], scheduler_name: str = constants.DEFAULT_SCHEDULER_NAME,
                 dra: DraObjects = DraObjects()):
        self.state = ClusterState(scheduler_name, nodes.values())
        self.queues: dict[str, QueueInfo] = {}  # Queue objects by name (docs/queues.md)
        for device_class in dra.classes:
            self.state.put_device_class(device_class)
        for resource_slice in dra.slices:
            self.state.put_resource_slice(resource_slice)
        self.nodes = self.state.nodes  # read-only views of the state (nodes joined with their DRA GPUs)
        self.pods = self.state.pods
        self.scheduler_name = scheduler_name
        self.groups: dict[str, GroupSpec] = TrackedDict()  # as the shell's cache
        self.pending: set[str] = set()  # uids of unbound pods
        self.touched: set[str] = set()  # gangs changed since the last cycle
        self.capacity_freed = False
        self.free: dict[str, Resources] = {name: dict(node.allocatable) for name, node in self.nodes.items()}
        # the GPU ids no pod holds, as a bit mask, for nodes whose GPUs have ids
        self.free_ids: dict[str, int] = {name: (1 << gpu_id_count(node)) - 1
                                         for name, node in self.nodes.items() if gpu_id_count(node)}
        self.total_gpus = sum(n.allocatable.get(constants.GPU_RESOURCE, 0) for n in self.nodes.values())
        self.dra_gpus = sum(n.allocatable.get(constants.GPU_RESOURCE, 0) for n in self.nodes.values()
                            if n.gpus_by_dra)
        self.allocated_gpus = 0
        self.stranded = sum(stranded_gpus(n, n.allocatable.get(constants.GPU_RESOURCE, 0))
                            for n in self.nodes.values())
        self.claims: dict[str, ResourceClaim] = {}  # pod uid -> its extended-resource claim
        self.pods_with_claims = 0  # bindings that came with a claim

    # ---- what the cache would see --------------------------------------------

    def snapshot(self, now: float) -> Snapshot:
        """The cycle's view (``now`` in unix seconds); like the shell's, it
        shares the dicts, which nothing changes while a cycle runs."""
        return Snapshot.of(self.state, self.groups, now, queues=self.queues)

    def drain_changes(self) -> tuple[set[str], bool]:
        touched, freed = self.touched, self.capacity_freed
        self.touched, self.capacity_freed = set(), False
        return touched, freed

    # ---- changes ---------------------------------------------------------------

    def add_group(self, obj: dict, priority: int | None) -> None:
        group = group_from_json(obj, priority)
        self.groups[group.key] = group
        self.touched.add(group.key)

    def remove_group(self, key: str) -> None:
        if self.groups.pop(key, None) is not None:
            self.touched.add(key)

    def add_pod(self, obj: dict) -> PodInfo:
        pod = pod_from_json(obj)
        if pod.uid in self.pods:
            raise SimulationError(f"pod {pod.key} exists already")
        self.state.put_pod(pod)
        self.pending.add(pod.uid)
        self.touched.add(pod.gang_key)
        return pod

    def bind(self, uid: str, node_name: str, gpu_ids: Iterable[int], now: float,
             claim: ExtendedClaim | None = None) -> PodInfo:
        """Bind a pending pod, with its extended-resource claim where DRA
        serves its GPUs; refuses what does not fit, so a policy that hands
        out room, GPU ids or devices twice is caught."""
        pod = self.pods.get(uid)
        if pod is None or pod.node_name or uid not in self.pending:
            raise SimulationError(f"pod {uid} is not pending and cannot be bound")
        short = res.shortfall(pod.requests, self.free[node_name])
        if short:
            raise SimulationError(f"pod {pod.key} does not fit on {node_name}: short of {', '.join(short)}")
        gpus, ids = pod.requests.get(constants.GPU_RESOURCE, 0), mask_of(gpu_ids)
        if node_name in self.free_ids and (ids & ~self.free_ids[node_name] or ids.bit_count() != gpus):
            raise SimulationError(f"pod {pod.key} asks {gpus} GPU(s) on {node_name} but got ids "
                                  f"{sorted(gpu_ids)}, not all of them free")
        self._check_claim(pod, node_name, gpu_ids, claim)
        self._take(node_name, pod.requests, ids, sign=1)
        pod = pod_with(pod, node_name=node_name, gpu_ids=tuple(sorted(gpu_ids)),
                       phase="Running", started=to_unix(now), bound_by_scheduler=True)
        self.state.put_pod(pod)
        if claim is not None:
            self._put_claim(pod, claim)
        self.pending.discard(uid)
        self.touched.add(pod.gang_key)
        return pod

    def _check_claim(self, pod: PodInfo, node_name: str, gpu_ids: Iterable[int], claim: ExtendedClaim | None) -> None:
        """Where DRA serves the pod's GPUs, its claim must allocate exactly
        the devices of its GPU ids, none of them in use."""
        node = self.nodes[node_name]
        if not (node.gpus_by_dra and pod.requests.get(constants.GPU_RESOURCE, 0)):
            if claim is not None:
                raise SimulationError(f"pod {pod.key} got a DRA claim on {node_name}, where DRA serves no GPU")
            return
        if claim is None or claim.node != node_name:
            raise SimulationError(f"pod {pod.key} is bound on {node_name}, where DRA serves its GPUs, "
                                  "without its claim")
        by_id = dra_gpus_by_id(node)
        expected = sorted(by_id[i].key for i in gpu_ids if i in by_id)
        got = sorted(d.key for d in claim.devices)
        if got != expected:
            raise SimulationError(f"pod {pod.key}'s claim allocates {[k[2] for k in got]}, not the devices of "
                                  f"its GPU ids {sorted(gpu_ids)}")
        held = [k[2] for k in got if self.state.dra.in_use(k)]
        if held:
            raise SimulationError(f"pod {pod.key}'s claim allocates {held}, already in another claim")

    def _put_claim(self, pod: PodInfo, claim: ExtendedClaim) -> None:
        """The claim as the shell writes it: allocated, reserved for the pod, owned by it."""
        written = ResourceClaim(uid=f"{pod.uid}-claim", namespace=pod.namespace,
                                name=f"{pod.name}-extended-resources", allocated=claim.devices,
                                reserved_for=(pod.uid,), owner_pod=pod.uid, extended=True)
        self.claims[pod.uid] = written
        self.state.put_claim(written)
        self.pods_with_claims += 1

    def terminate(self, uid: str, now: float) -> PodInfo:
        """The pod is being deleted (evicted) at ``now``: it holds its room until it is gone."""
        pod = dataclasses.replace(self.pods[uid], terminating=True, deleted=now)
        self.state.put_pod(pod)
        self.touched.add(pod.gang_key)
        self.capacity_freed = True  # a victim going away: worth another look (as the shell's cache)
        return pod

    def delete(self, uid: str) -> PodInfo:
        pod = self.state.remove_pod(uid)
        if pod is None:
            raise KeyError(uid)
        self.pending.discard(uid)
        claim = self.claims.pop(uid, None)
        if claim is not None:  # its owner gone, the garbage collector deletes it
            self.state.remove_claim(claim.uid)
        if pod.holds_resources:
            self._take(pod.node_name, pod.requests, mask_of(pod.gpu_ids), sign=-1)
            self.capacity_freed = True
        self.touched.add(pod.gang_key)
        return pod

    def nominate(self, uid: str, node_name: str) -> None:
        pod = self.pods.get(uid)
        if pod is not None:
            self.state.put_pod(dataclasses.replace(pod, nominated_node=node_name))

    def _take(self, node_name: str, requests: Resources, ids: int, sign: int) -> None:
        node = self.nodes[node_name]
        free = self.free[node_name]
        gpus_before = free.get(constants.GPU_RESOURCE, 0)
        for name, amount in requests.items():
            free[name] = free.get(name, 0) - sign * amount
        if node_name in self.free_ids:
            self.free_ids[node_name] ^= ids  # taken ids were free, released ones were taken
        gpus_after = free.get(constants.GPU_RESOURCE, 0)
        self.allocated_gpus += gpus_before - gpus_after
        self.stranded += stranded_gpus(node, gpus_after) - stranded_gpus(node, gpus_before)


class Policy(Protocol):
    """A scheduler under simulation (batchsched.sim.policies, .baselines)."""

    name: str

    def cycle(self, cluster: SimCluster, now: float) -> CyclePlan:
        """Decide at simulated time ``now``; the plan is applied at once."""

    def next_wakeup(self) -> float | None:
        """When to run a cycle even if nothing changes (simulated seconds)."""


@dataclass(frozen=True)
class SimOptions:
    cycle_seconds: float = 1.0  # at most one cycle per this many simulated seconds
    grace_seconds: float = 30.0  # an evicted pod's termination
    stall_seconds: float = 150.0  # see the module docstring
    occupancy_samples: int = 0  # per-node GPU occupancy snapshots over the run, for plots


@dataclass
class _JobRun:
    job: Job
    members: list[str]  # uid of each member's current pod
    incarnations: list[int]
    remaining: float
    started: float | None = None  # the first start
    running_since: float | None = None
    epoch: int = 0  # a finish event of an older epoch is stale
    held_gpus: int = 0  # GPUs its bound pods hold

    @property
    def running(self) -> bool:
        return self.running_since is not None


_ARRIVE, _FINISH, _GONE, _SAMPLE, _MARK = range(5)


@dataclass(order=True)
class _Event:
    time: float
    seq: int
    kind: int = field(compare=False)
    payload: object = field(compare=False, default=None)


class Simulation:
    def __init__(self, nodes: dict[str, NodeInfo], jobs: list[Job], policy: Policy,
                 options: SimOptions = SimOptions(), scheduler_name: str = constants.DEFAULT_SCHEDULER_NAME,
                 dra: DraObjects = DraObjects(), queues: Mapping[str, QueueInfo] | None = None,
                 default_queue: str = "default"):
        """``queues``: the Queue objects (docs/queues.md), which also turn on
        the fairness figures; ``default_queue``: the scheduler's, for jobs
        naming none."""
        self.cluster = SimCluster(nodes, scheduler_name, dra)
        self.cluster.queues = dict(queues or {})
        self.policy = policy
        self.options = options
        self.runs = {job.key: _JobRun(job, [], [], job.duration) for job in jobs}
        self.by_pod: dict[str, _JobRun] = {}
        self.busy_gpus = 0  # GPUs held by running jobs
        self.total_pods = sum(job.pods for job in jobs)
        self.placed: set[tuple[str, int]] = set()  # (job, pod index) bound at least once
        self._slot: dict[str, tuple[str, int]] = {}  # pod uid -> (job, pod index)
        self.now = min((j.arrival for j in jobs), default=0.0)
        self.recorder = Recorder(self.cluster, jobs, policy.name, default_queue)
        self._events: list[_Event] = []
        self._seq = 0
        for job in jobs:
            self._push(job.arrival, _ARRIVE, job.key)
        last_arrival = max((j.arrival for j in jobs), default=0.0)
        self._push(last_arrival + 2 * options.cycle_seconds, _MARK)
        if options.occupancy_samples:
            horizon = last_arrival - self.now
            for k in range(options.occupancy_samples):
                self._push(self.now + horizon * k / max(1, options.occupancy_samples - 1), _SAMPLE)

    def _push(self, when: float, kind: int, payload: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, _Event(when, self._seq, kind, payload))

    # ---- the loop ---------------------------------------------------------------

    def run(self, until: float = math.inf, progress: TerminalProgress | None = None,
            phase: str | None = None) -> SimResult:
        """Run until nothing more happens, or up to simulated time ``until``;
        ``progress`` shows how far it got while it works, named ``phase``
        (default: the policy's name)."""
        last_cycle, last_change, dirty = -math.inf, self.now, True
        start = self.now
        while True:
            next_event = self._events[0].time if self._events else math.inf
            if dirty:
                cycle_at = max(self.now, last_cycle + self.options.cycle_seconds)
            else:
                wake = self.policy.next_wakeup()
                stalled = self.now - last_change > self.options.stall_seconds
                cycle_at = (max(wake, self.now, last_cycle + self.options.cycle_seconds)
                            if wake is not None and not stalled and self.cluster.pending else math.inf)
            if min(next_event, cycle_at) > until or next_event == cycle_at == math.inf:
                break
            if next_event <= cycle_at:
                self.now = next_event
                while self._events and self._events[0].time == next_event:
                    dirty |= self._handle(heapq.heappop(self._events))
                self.recorder.observe(self.now, self.busy_gpus)
                if dirty:
                    last_change = self.now
                continue
            self.now, last_cycle, dirty = cycle_at, cycle_at, False
            if not self.cluster.pending:
                continue  # nothing to place: the cycle would decide nothing
            started = time.perf_counter()
            plan = self.policy.cycle(self.cluster, self.now)
            self.recorder.cycle_seconds.append(time.perf_counter() - started)
            if plan.bindings or plan.evictions or plan.nominations or plan.resets:
                self._apply(plan)
                dirty, last_change = True, self.now
                self.recorder.observe(self.now, self.busy_gpus)
            self.recorder.reserved(self.now, plan.reservation)
            if progress is not None:
                progress.update(phase or self.policy.name, self.now - start, len(self.placed), self.total_pods)
        if progress is not None:
            progress.done()
        return self.recorder.result(self.now)

    def _handle(self, event: _Event) -> bool:
        """Apply one event; whether the cluster changed."""
        if event.kind == _ARRIVE:
            self._arrive(self.runs[event.payload])
        elif event.kind == _FINISH:
            key, epoch = event.payload
            run = self.runs[key]
            if epoch != run.epoch:
                return False
            self._finish(run)
        elif event.kind == _GONE:
            self._gone(event.payload)
        elif event.kind == _SAMPLE:
            self.recorder.sample_occupancy(self.now)
            return False
        else:
            self.recorder.mark_last_arrival()
            return False
        return True

    # ---- jobs -------------------------------------------------------------------

    def _arrive(self, run: _JobRun) -> None:
        job = run.job
        if job.has_pod_group:
            # a PodGroup naming a PriorityClass gets its value, as the shell's cache resolves it
            self.cluster.add_group(pod_group_object(job), job.priority if job.priority_class else None)
        self.recorder.arrived(job, self.now)
        for index in range(job.pods):
            run.incarnations.append(0)
            run.members.append(self._create_pod(run, index))

    def _create_pod(self, run: _JobRun, index: int) -> str:
        pod = self.cluster.add_pod(pod_object(run.job, index, run.incarnations[index], self.now,
                                              self.cluster.scheduler_name))
        self.by_pod[pod.uid] = run
        self._slot[pod.uid] = (run.job.key, index)
        return pod.uid

    def _bound_members(self, run: _JobRun) -> int:
        pods = self.cluster.pods
        return sum(1 for uid in run.members if pods[uid].holds_resources and not pods[uid].terminating)

    def _hold(self, run: _JobRun, gpus: int) -> None:
        """The job's bound pods hold ``gpus`` more (or fewer) GPUs."""
        run.held_gpus += gpus
        self.recorder.holds(run.job, gpus)
        if run.running:
            self.busy_gpus += gpus

    def _run_from(self, run: _JobRun, since: float | None) -> None:
        """The job runs from ``since`` on, or stops (None)."""
        if run.running:
            self.busy_gpus -= run.held_gpus
        run.running_since = since
        if run.running:
            self.busy_gpus += run.held_gpus

    def _bound(self, pod: PodInfo) -> None:
        run = self.by_pod[pod.uid]
        self.placed.add(self._slot[pod.uid])
        self.recorder.bound(pod, self.cluster.nodes[pod.node_name])
        self._hold(run, pod.requests.get(constants.GPU_RESOURCE, 0))
        if not run.running and self._bound_members(run) >= run.job.min_member:
            if run.started is None:
                run.started = self.now
                self.recorder.started(run.job, self.now)
            self._run_from(run, self.now)
            run.epoch += 1
            self._push(self.now + run.remaining, _FINISH, (run.job.key, run.epoch))

    def _stop(self, run: _JobRun) -> None:
        """The job lost its quorum: it keeps the time it has left."""
        run.remaining = max(0.0, run.remaining - (self.now - run.running_since))
        run.epoch += 1
        self._run_from(run, None)

    def _finish(self, run: _JobRun) -> None:
        self._run_from(run, None)
        self.recorder.holds(run.job, -run.held_gpus)
        run.held_gpus = 0
        self.recorder.finished(run.job)
        for uid in run.members:
            if uid in self.cluster.pods:
                self.cluster.delete(uid)
            del self.by_pod[uid]
        run.members = []
        self.cluster.remove_group(run.job.key)

    def _gone(self, uid: str) -> None:
        """A victim's termination ended: it is deleted, and recreated unless its job has finished."""
        if uid not in self.cluster.pods:
            return  # its job finished while it terminated
        pod = self.cluster.delete(uid)
        run = self.by_pod.pop(uid)
        self._hold(run, -pod.requests.get(constants.GPU_RESOURCE, 0))
        index = run.members.index(uid)
        run.incarnations[index] += 1
        run.members[index] = self._create_pod(run, index)

    # ---- plans --------------------------------------------------------------------

    def _apply(self, plan: CyclePlan) -> None:
        for binding in plan.bindings:
            self._bound(self.cluster.bind(binding.pod_uid, binding.node_name, binding.gpu_ids, self.now,
                                          binding.claim))
        for nomination in plan.nominations:
            self.cluster.nominate(nomination.pod.uid, nomination.node_name)
        evicted = ([(e.pod, e.preemptor, e.reclaim) for e in plan.evictions]
                   + [(p, "", False) for reset in plan.resets for p in reset.pods])
        for victim, preemptor, reclaim in evicted:  # a gang started over loses its bound members as a victim does
            pod = self.cluster.terminate(victim.uid, self.now)
            run = self.by_pod[pod.uid]
            self.recorder.evicted(run.job, self.now, preemptor, reclaim, lost_work(pod, to_unix(self.now)))
            if run.running and self._bound_members(run) < run.job.min_member:
                self._stop(run)
            self._push(self.now + self.options.grace_seconds, _GONE, pod.uid)


def simulate(nodes: dict[str, NodeInfo], jobs: list[Job], policy: Policy, options: SimOptions = SimOptions(),
             scheduler_name: str = constants.DEFAULT_SCHEDULER_NAME, dra: DraObjects = DraObjects(),
             progress: TerminalProgress | None = None, queues: Mapping[str, QueueInfo] | None = None,
             default_queue: str = "default") -> SimResult:
    return Simulation(nodes, jobs, policy, options, scheduler_name, dra, queues, default_queue).run(progress=progress)
