"""The scheduling loop: cache -> snapshot -> decision core -> binder and status.

Only data moves here; every decision is made by batchsched.core.cycle.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable
from urllib.parse import quote

from batchsched.api import constants
from batchsched.config import SchedulerConfig
from batchsched.core.cluster import ClusterState
from batchsched.core.cycle import (
    REASON_EXCEEDS_CAPACITY, REASON_QUORUM_NOT_REACHED, REASON_SCHEDULE_TIMEOUT, REASON_UNSCHEDULABLE, CyclePlan,
    Verdict, schedule_cycle,
)
from batchsched.core.gangsources import OWN, SOURCES, jobsets, source_of_key
from batchsched.core.gangsources.plugin import StatusFacts
from batchsched.core.gangsources.registry import PLUGINS
from batchsched.core.gangs import (
    REASON_FOREIGN_MEMBERS, foreign_members, foreign_note, foreign_pod_message, no_members_message,
)
from batchsched.core.gpu_pools import GpuPoolTally
from batchsched.core.model import PodInfo
from batchsched.core.readers import parse_time
from batchsched.core.queueing.idle import idle_on
from batchsched.core.queueing.queue import GangQueue, Reservation
from batchsched.core.queues.report import QueueSummary, summarize
from batchsched.core.snapshot import Snapshot
from batchsched.core.status import count_members, phase_of
from batchsched.core.topology.accounting import topology_of
from batchsched.core.topology.alignment import is_aligned
from batchsched.kube.client import Kube
from batchsched.kube.events import EventRecorder, node_ref, now_rfc3339, pod_ref
from batchsched.shell.binder import Binder, BindRequest, BindResult
from batchsched.shell.cache import ClusterCache
from batchsched.shell.claim_pipeline import ClaimPipeline, ClaimsRefused, has_claims
from batchsched.shell.claims import PodClaims
from batchsched.shell.evictor import Evictor
from batchsched.shell.logs import decision
from batchsched.shell.metrics import RESULT_SCHEDULED, RESULT_UNSCHEDULABLE, Metrics
from batchsched.shell.pod_status import PodConditionWriter
from batchsched.shell.status import StatusWriter, group_ref, queue_status_path

log = logging.getLogger(__name__)

IDLE_WAKEUP_SECONDS = 5.0
CHANGE_BATCH_SECONDS = 0.005
# With no pod to place, a cycle only books what changed (status, queue): a
# burst of confirmations (a gang being bound) is taken in fewer cycles.
QUIET_BATCH_SECONDS = 0.05
# Queue status and metrics are recomputed at most this often (each is a pass over the gangs).
QUEUE_SUMMARY_SECONDS = 1.0
# After a cycle raised: wait this long, doubling while cycles keep failing.
CYCLE_RETRY_SECONDS = 0.5
MAX_CYCLE_RETRY_SECONDS = 10.0
# ``on_started`` waits at most this long for the first cycle's bindings.
FIRST_BINDINGS_WAIT_SECONDS = 10.0


class Scheduler:
    def __init__(self, kube: Kube, config: SchedulerConfig, leading: asyncio.Event | None = None,
                 metrics: Metrics | None = None):
        self.kube = kube
        self.config = config
        self.core_config = config.core()
        self.cache = ClusterCache(config.scheduler_name, config.node_selector, config.also_serves,
                                  config.gang_sources.enabled(),
                                  config.gang_sources.auto_always())
        self.reflectors = self.cache.reflectors(kube)
        self.queue = GangQueue.from_config(self.core_config)
        self.binder = Binder(kube, config.binding.parallelism, config.binding.retries)
        self.binder.settled_by_watch = self._settled_by_watch
        self.claim_pipeline = ClaimPipeline(kube, self.cache, config.scheduler_name, config.binding.parallelism,
                                            self._spawn)
        self.status = StatusWriter(kube, config.status_min_interval_seconds, self.binder.wait_idle, path=status_path)
        self.queue_status = StatusWriter(kube, config.status_min_interval_seconds, self.binder.wait_idle,
                                         kind="Queue", path=queue_status_path)
        self.queue_summaries: dict[str, QueueSummary] = {}
        self._queues_summarized = 0.0
        self.events = EventRecorder(kube, config.scheduler_name, wait_for_bindings=self.binder.wait_idle)
        self.pod_conditions = PodConditionWriter(kube, lambda uid: self.cache.pods.get(uid),
                                                 config.status_min_interval_seconds, self.binder.wait_idle)
        self.preemption_policy = config.preemption.policy()
        self.evictor = Evictor(kube, self.cache, self.events, config.preemption)
        self._nominations_checked = 0.0
        # GPUs the reservation idled as of the last cycle, and its (monotonic) time
        self._reserved_idle: tuple[int, float | None] = (0, None)
        self.verdicts: dict[str, Verdict] = {}
        self.start_times: dict[str, str] = {}  # gang key -> scheduleStartTime
        self.ready = asyncio.Event()
        # Called once the first cycle's bindings are answered, or at once when
        # the caches have synced on a standby: the replica settles the heap
        # there, a pause (a full collection over the whole cache) that
        # should neither come before the first bindings nor hit a burst.
        self.on_started: Callable[[], None] = lambda: None
        self.bound_total = 0
        self._tasks: set[asyncio.Task] = set()
        self.cache.on_bad_object = self._bad_object
        self.cache.on_fixed_object = self._fixed_object
        # Object problems (and their fixes) not reported yet: (kind, namespace, name) ->
        # (ref, event type, reason, message).  By object, so a standby (no cycles)
        # keeps one per object, the latest, however often it changes.
        self._object_reports: dict[tuple[str, str, str], tuple[dict, str, str, str]] = {}
        # With leader election, the loop waits for this: a standby keeps its
        # caches warm and acts only once it holds the lease.
        self.leading = leading
        self.metrics = metrics or Metrics()
        pools = GpuPoolTally(config.node_pool_label)  # a scrape re-derives only the nodes changed since the last
        self.metrics.read_live(self.queue.depth_by_priority, lambda: pools.read(self.cache.state),
                               lambda: self.queue_summaries)
        self.cache.on_watch_restart = lambda kind, why: self.metrics.watch_restarts.labels(kind, why).inc()
        self.evictor.on_victim = lambda pod, preemptor: self.metrics.preemption_victims.inc()
        self.status.on_write = self.metrics.status_writes.inc
        self.pod_conditions.on_write = self.metrics.pod_condition_writes.inc

    # ---- lifecycle --------------------------------------------------------------

    async def run(self) -> None:
        reflectors = self.reflectors
        background = [asyncio.create_task(r.run(), name=f"reflector-{r.kind}") for r in reflectors]
        background.append(asyncio.create_task(self.status.run(), name="status-writer"))
        background.append(asyncio.create_task(self.queue_status.run(), name="queue-status-writer"))
        background.append(asyncio.create_task(self.pod_conditions.run(), name="pod-condition-writer"))
        try:
            await asyncio.gather(*(r.synced.wait() for r in self.reflectors))
            self.ready.set()
            log.info("caches synced: %d nodes, %d pods, %d PodGroups; scheduling as %s",
                     len(self.cache.nodes), len(self.cache.pods), len(self.cache.groups_raw),
                     ", ".join(map(repr, self.config.scheduler_names)))
            started = False
            if self.leading is not None and not self.leading.is_set():
                self.on_started()
                started = True
                log.info("standing by until this replica holds the leader lease")
                await self.leading.wait()
            self._seed_from_cluster()  # now, so a standby sees what the old leader wrote last
            failures = 0
            while True:
                try:
                    self.cycle()
                except Exception:  # noqa: BLE001 - the loop outlives any one cycle
                    failures += 1
                    delay = min(CYCLE_RETRY_SECONDS * 2 ** min(failures - 1, 10), MAX_CYCLE_RETRY_SECONDS)
                    self.metrics.cycle_errors.inc()
                    log.exception("scheduling cycle failed (%d in a row); next cycle in %.1fs", failures, delay)
                    await asyncio.sleep(delay)
                    continue
                failures = 0
                if not started:
                    started = True
                    self._spawn(self._started_once_answered(set(self._tasks)))
                await self._wait_for_work()
        finally:
            for task in background + list(self._tasks):
                task.cancel()
            await asyncio.gather(*background, *self._tasks, return_exceptions=True)

    async def _started_once_answered(self, first_bindings: set[asyncio.Task]) -> None:
        if first_bindings:
            await asyncio.wait(first_bindings, timeout=FIRST_BINDINGS_WAIT_SECONDS)
        self.on_started()

    def relist(self) -> None:
        """Every collection is listed again (SIGUSR1; see docs/operations.md)."""
        log.info("relisting every collection on request")
        for reflector in self.reflectors:
            reflector.relist()

    def _seed_from_cluster(self) -> None:
        """After a restart: know what status is already written and since when
        each gang has been waiting, so nothing is rewritten or reset."""
        for key, obj in self.cache.groups_raw.items():
            status = obj.get("status") or {}
            self.status.seed(key, status)
            if status.get("scheduleStartTime"):
                self.start_times[key] = status["scheduleStartTime"]
        for name, obj in self.cache.queues_raw.items():
            self.queue_status.seed(name, obj.get("status"))

    async def _wait_for_work(self) -> None:
        timeout = IDLE_WAKEUP_SECONDS
        retry_at = self.queue.next_retry_at()
        if retry_at is not None:
            timeout = min(timeout, max(0.0, retry_at - time.time()))
        # asyncio.timeout, not wait_for: on 3.11 wait_for can lose a
        # cancellation that arrives as the event is set, and the loop would
        # then outlive SIGTERM (seen under load).
        try:
            async with asyncio.timeout(timeout):
                await self.cache.changed.wait()
        except TimeoutError:
            pass
        else:
            # Watch events come in bursts (a bound gang, a relist): take the
            # whole burst into one cycle rather than one cycle per event.
            await asyncio.sleep(CHANGE_BATCH_SECONDS if self.cache.state.pending_gang_keys() else QUIET_BATCH_SECONDS)
        self.cache.changed.clear()

    # ---- one cycle --------------------------------------------------------------

    def cycle(self) -> CyclePlan:
        self.metrics.cycles.inc()
        for ref, event_type, reason, message in self._object_reports.values():
            self.events.emit(ref, event_type, reason, message)
        self._object_reports.clear()
        touched, freed = self.cache.drain_changes()
        try:
            return self._cycle(touched, freed)
        except Exception:
            # What changed is not lost: the next cycle looks at it again.
            self.cache.touched_gangs |= touched
            self.cache.capacity_freed |= freed
            raise

    def _cycle(self, touched: set[str], freed: bool) -> CyclePlan:
        self.queue.note_changes(touched, freed)
        for key in touched:
            if key not in self.cache.groups_raw and not self.cache.members(key):
                self._forget_gang(key)  # gone: what we kept about it would only pile up
                continue
            verdict = self.verdicts.get(key)
            if verdict is not None and verdict.reason == REASON_SCHEDULE_TIMEOUT:
                self.start_times.pop(key, None)  # a changed gang gets a fresh clock
        now = time.time()
        snapshot = self.cache.snapshot(now)
        for key, since in self.start_times.items():
            if key in self.queue:
                self.queue.set_waiting_since(key, parse_time(since))
        plan = schedule_cycle(snapshot, self.queue, self.core_config, self.preemption_policy,
                              self.evictor.state())
        for reset in plan.resets:
            self._spawn(self.evictor.start_over(reset))
        if plan.evictions or plan.nominations:
            for task in self.evictor.carry_out(plan.evictions, plan.nominations):
                self._track(task)
        # Also with preemption off: nominations left from when it was on
        # (before a restart) would otherwise hold their room for good.
        if time.monotonic() - self._nominations_checked > 1.0:
            self._nominations_checked = time.monotonic()
            for task in self.evictor.expire_nominations():
                self._track(task)
        if plan.bindings:
            eligible_since = self._quorum_eligible_since(plan, snapshot)  # before assuming changes it
            by_gang: dict[str, list[BindRequest]] = {}
            for b in plan.bindings:
                self.cache.assume(b.pod_uid, b.node_name, b.gpu_ids)
                attempt = self.cache.state.assume_allocation(b.pod_uid, b.allocations)  # taken from now, like its room
                by_gang.setdefault(b.gang_key, []).append(BindRequest(
                    b.pod_uid, b.namespace, b.pod_name, b.node_name, b.gang_key, b.gpu_ids, b.claim, b.claims,
                    attempt))
            for key, requests in by_gang.items():
                self._spawn(self._bind_gang(key, requests, eligible_since.get(key)))
        self.claim_pipeline.sweep_leftovers()
        self._count_attempts(plan)
        self._count_reserved_idle(snapshot.cluster, plan.reservation, time.monotonic())
        self._report(plan, touched)
        if time.monotonic() - self._queues_summarized > QUEUE_SUMMARY_SECONDS:
            self._queues_summarized = time.monotonic()
            self._report_queues(snapshot)
        return plan

    def _report_queues(self, snapshot: Snapshot) -> None:
        """Each Queue's status (only what changed is written) and the queue metrics."""
        if not self.cache.queues_raw and not self.queue_summaries:
            return  # no queues, and no metrics left from when there were
        self.queue_summaries = summarize(snapshot, self.core_config) if self.cache.queues_raw else {}
        for name in self.cache.queues_raw:
            summary = self.queue_summaries.get(name)
            status = summary.status() if summary is not None else {}
            why = self.cache.invalid_queues.get(name)
            status["conditions"] = [{"type": "Valid", "status": "False" if why else "True",
                                     "reason": "InvalidQueue" if why else "Valid", "message": why or ""}]
            self.queue_status.update(name, _with_removals(status, self.queue_status.last_written(name)))

    def _forget_gang(self, key: str) -> None:
        self.queue.forget(key)
        self.verdicts.pop(key, None)
        self.start_times.pop(key, None)
        self.status.forget(key)

    def _quorum_eligible_since(self, plan: CyclePlan, snapshot: Snapshot) -> dict[str, float]:
        """Gangs whose quorum these bindings complete -> since when each has been eligible."""
        keys = {b.gang_key for b in plan.bindings if b.gang_key in self.queue}
        bound = {key: sum(1 for p in self.cache.members(key) if p.holds_resources and not p.terminating)
                 for key in keys}
        return {key: snapshot.now - self.queue.waited(key, snapshot.now) for key in keys
                if bound.get(key, 0) < (jobsets.started(snapshot.groups[key], self.cache.members(key)).min_member
                                        if key in snapshot.groups else 1)}

    def _count_reserved_idle(self, cluster: ClusterState, reservation: Reservation | None, at: float) -> None:
        """The reservation's cost (core.queueing.idle), as of this cycle,
        into the metrics: the GPUs idled since the last cycle were those it
        idled then.  ``at``: a monotonic time (a step of the wall clock is
        no time spent)."""
        idle, since = self._reserved_idle
        if since is not None:
            self.metrics.reservation_idle_gpu_seconds.inc(idle * max(0.0, at - since))
        idle = idle_on(cluster, reservation)
        self._reserved_idle = (idle, at)
        self.metrics.reservation_idle_gpus.set(idle)
        self.metrics.reserved_nodes.set(len(reservation.nodes) if reservation is not None else 0)

    def _count_attempts(self, plan: CyclePlan) -> None:
        for verdict in plan.verdicts.values():
            if verdict.scheduled:
                self.metrics.scheduling_attempts.labels(RESULT_SCHEDULED).inc()
            elif verdict.reason in (REASON_UNSCHEDULABLE, REASON_EXCEEDS_CAPACITY):
                self.metrics.scheduling_attempts.labels(RESULT_UNSCHEDULABLE).inc()

    def _spawn(self, coro) -> None:
        self._track(asyncio.get_running_loop().create_task(coro))

    def _track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _settled_by_watch(self, uid: str, node: str) -> bool | None:
        """For the binder reading back an unclear outcome: None while the pod
        is still assumed, else whether the watch shows it bound to ``node``."""
        if uid in self.cache.assumed:
            return None
        pod = self.cache.pods.get(uid)
        return pod is not None and pod.node_name == node

    async def _bind_gang(self, key: str, requests: list[BindRequest], eligible_since: float | None) -> None:
        """One gang's pipeline: its claims, then its bindings.  Each gang a
        cycle places has its own, so a gang whose claims are slow to write
        holds up no other gang's bindings, and each gang's outcome (its
        partial-gang clock, its time to bind) is its own."""
        written: dict[str, PodClaims] = {}  # pod uid -> its claims, written for this binding
        if any(has_claims(r) for r in requests):
            outcome = await self.claim_pipeline.write_gang(key, requests)
            if isinstance(outcome, ClaimsRefused):
                self._claims_refused(key, requests, outcome)
                return
            written = outcome
        outcomes: list[BindResult] = []
        refused = False
        async for result in self.binder.bind_each(requests):
            outcomes.append(result)
            req = result.request
            if not result.ok:
                if req.uid in written:  # kube-scheduler's Unreserve: the claims go too, then the pod is free
                    self._spawn(self.claim_pipeline.undo_then_unassume(req, written.pop(req.uid)))
                else:
                    self.claim_pipeline.unassume(req)  # at once: its room is free whatever follows
                if not refused:  # at once, so the next cycle does not retry it; once a batch
                    refused = True
                    self.queue.record_bind_refused(key, time.time())  # refused or gone: not for want of room
            try:
                self._bound(result)
            except Exception:  # noqa: BLE001 - an event or a metric must not lose the other outcomes
                log.exception("recording the binding of %s/%s failed", req.namespace, req.name)
        bound = [r.request.name for r in outcomes if r.ok]
        if not refused:
            self.queue.record_bound(key)
        log.info("bound %d of %d pod(s)", len(bound), len(outcomes), extra=decision(key, bound))
        if eligible_since is not None and len(bound) == len(outcomes):
            self.metrics.gang_e2e_duration.observe(time.time() - eligible_since)

    def _claims_refused(self, key: str, members: list[BindRequest], refused: ClaimsRefused) -> None:
        """A gang with one claim not written binds no member: the claims
        written for it were undone, its pods are unassumed, and it backs off
        like a refused binding."""
        first, why = refused.first, refused.why
        for r in members:
            self.claim_pipeline.unassume(r)
            message = (f"{why}" if r.uid in refused.failed else
                       f"not bound: a ResourceClaim of gang member {first.name} was not written ({why})")
            self.metrics.bind_errors.inc()
            log.warning("%s/%s: %s", r.namespace, r.name, message, extra=decision(key, [r.name], node=r.node))
            self.events.emit(pod_ref(r.namespace, r.name, r.uid), "Warning", "FailedBinding",
                             f"Binding to {r.node} failed: {message}")
        self.queue.record_bind_refused(key, time.time())

    def _bound(self, result: BindResult) -> None:
        req = result.request
        self.metrics.bind_duration.observe(result.seconds)
        if result.ok:
            self.bound_total += 1
            self._count_alignment(req)
            self.events.emit(pod_ref(req.namespace, req.name, req.uid), "Normal", "Scheduled",
                             f"Successfully assigned {req.namespace}/{req.name} to {req.node}"
                             + (f" (GPUs {','.join(map(str, req.gpu_ids))})" if req.gpu_ids else ""))
            return
        self.metrics.bind_errors.inc()
        log.warning("binding %s/%s to %s failed%s: %s", req.namespace, req.name, req.node,
                    " (read back)" if result.verified else "", result.error,
                    extra=decision(req.gang_key, [req.name], node=req.node))
        self.events.emit(pod_ref(req.namespace, req.name, req.uid), "Warning", "FailedBinding",
                         f"Binding to {req.node} failed: {result.error}")

    def _count_alignment(self, req: BindRequest) -> None:
        """Multi-GPU pods on nodes of known topology: aligned set or not (docs/simulator.md)."""
        node = self.cache.nodes.get(req.node)
        topology = topology_of(node) if node is not None and len(req.gpu_ids) > 1 else None
        if topology is not None:
            aligned = is_aligned(topology, req.gpu_ids)
            self.metrics.multi_gpu_pods_bound.labels("true" if aligned else "false").inc()

    # ---- status and events --------------------------------------------------------

    def _report(self, plan: CyclePlan, touched: set[str]) -> None:
        changed = {k for k, v in plan.verdicts.items() if self.verdicts.get(k) != v}
        pods = self._pods_decided(changed, plan) if changed else {}
        for key in changed:
            verdict = plan.verdicts[key]
            self.verdicts[key] = verdict
            log.info("%s: %s", verdict.reason, verdict.message,
                     extra=decision(key, pods.get(key, ()), reason=verdict.reason))
            obj = self.cache.groups_raw.get(key)
            # An automatic gang's verdict goes on its owner (Job, JobSet), as kubectl describe shows it there.
            ref = group_ref(obj) if obj is not None else self.cache.owner_refs.get(key)
            if ref is not None:
                self.events.emit(ref, "Normal" if verdict.scheduled else "Warning",
                                 "Scheduled" if verdict.scheduled else "FailedScheduling", verdict.message)
        for key in changed | touched:
            obj = self.cache.groups_raw.get(key)
            members = self.cache.members(key)
            # A foreign PodGroup is ours to write only while a pod of ours is in
            # it: without one it is its own scheduler's (or nobody's yet).
            if obj is not None and (members or source_of_key(key) == OWN):
                self._write_status(key, obj, members)
                self._report_foreign_members(key, obj)
            self._report_pending_pods(key)

    def _pods_decided(self, keys: set[str], plan: CyclePlan) -> dict[str, list[str]]:
        """The pods each gang's verdict is about: those placed now, else those pending."""
        names: dict[str, list[str]] = {}
        for b in plan.bindings:
            if b.gang_key in keys:
                names.setdefault(b.gang_key, []).append(b.pod_name)
        for key in keys - names.keys():
            names[key] = [pod.name for pod in self.cache.members(key) if not pod.node_name]
        return names

    def _report_pending_pods(self, key: str) -> None:
        """Each pending pod of a gang that cannot be placed says why, as
        kube-scheduler's would: its PodScheduled condition and a
        FailedScheduling Event (both written only when they change)."""
        verdict = self.verdicts.get(key)
        if verdict is None or verdict.scheduled:
            return
        pending = [pod for pod in self.cache.members(key) if pod.awaits_placement]
        if not pending:
            return
        message = f"{verdict.reason}: {verdict.message}"
        if pending[0].group:
            message = f"gang {key} ({verdict.reason}): {verdict.message}"
        for pod in pending:
            self.pod_conditions.update(pod, message)
            self.events.emit(pod_ref(pod.namespace, pod.name, pod.uid), "Warning", "FailedScheduling", message)

    def _report_foreign_members(self, key: str, obj: dict) -> None:
        """Pods with the gang's label that name another scheduler: a Warning
        on the PodGroup and on each of them (docs/podgroup.md)."""
        foreign = foreign_members(self.cache.state, key)
        if not foreign:
            return
        name = self.config.scheduler_name
        self.events.emit(group_ref(obj), "Warning", REASON_FOREIGN_MEMBERS, foreign_note(foreign, name) + ".")
        for pod in foreign:
            self.events.emit(pod_ref(pod.namespace, pod.name, pod.uid), "Warning", REASON_FOREIGN_MEMBERS,
                             foreign_pod_message(pod, name))

    def _write_status(self, key: str, obj: dict, members: list[PodInfo]) -> None:
        counters = count_members(members)
        spec = self.cache.groups.get(key)
        min_member = spec.min_member if spec is not None else _stated_min_member(obj)
        verdict = self.verdicts.get(key) if members else None  # one left from pods now gone says nothing
        timed_out = verdict is not None and verdict.reason == REASON_SCHEDULE_TIMEOUT
        phase = phase_of(counters, min_member, timed_out)
        if key in self.cache.invalid_groups:
            reason, message = "InvalidPodGroup", self.cache.invalid_groups[key]
        elif not members:
            namespace, _, name = key.partition("/")
            reason, message = REASON_QUORUM_NOT_REACHED, no_members_message(self.cache.state, namespace, name,
                                                                            min_member)
        elif verdict is not None:
            reason, message = verdict.reason, verdict.message
        else:
            reason, message = "", ""
        if phase != "Pending" or counters.bound:
            self.start_times.setdefault(key, now_rfc3339())
        status = PLUGINS[source_of_key(key)].status(StatusFacts(
            phase, counters, min_member, reason, message, self.start_times.get(key), self.status.last_written(key),
            now_rfc3339(), obj, spec, members))
        if status is not None:
            self.status.update(key, status)

    def _bad_object(self, kind: str, obj: dict, why: str) -> None:
        """Found while syncing, maybe as a standby that may not write yet:
        the next cycle (of the leader) reports it."""
        if kind == "PodGroup":
            ref, reason = group_ref(obj), "InvalidPodGroup"
        elif kind == "Node":
            ref, reason = node_ref(obj), "InvalidGpuTopology"
        elif kind == "Queue":
            meta = obj.get("metadata") or {}
            ref = {"apiVersion": constants.API_VERSION, "kind": kind, "namespace": "", "name": meta.get("name", ""),
                   "uid": meta.get("uid", "")}
            reason = "InvalidQueue"
        elif kind in ("DeviceClass", "ResourceSlice", "ResourceClaim"):
            meta = obj.get("metadata") or {}
            ref = {"apiVersion": "resource.k8s.io/v1", "kind": kind, "namespace": meta.get("namespace") or "",
                   "name": meta.get("name", ""), "uid": meta.get("uid", "")}
            reason = f"Invalid{kind}"
        else:
            meta = obj.get("metadata") or {}
            ref, reason = pod_ref(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")), "InvalidPod"
        self._object_reports[(ref["kind"], ref.get("namespace") or "", ref["name"])] = (ref, "Warning", reason, why)

    def _fixed_object(self, kind: str, obj: dict, reason: str, message: str) -> None:
        """A problem reported before is gone (a node's topology annotation)."""
        ref = node_ref(obj)
        self._object_reports[(ref["kind"], "", ref["name"])] = (ref, "Normal", reason, message)


def _stated_min_member(obj: dict) -> int:
    """The minMember a PodGroup that could not be read states, where it is a usable one."""
    spec = obj.get("spec")
    stated = spec.get("minMember") if isinstance(spec, dict) else None
    return stated if isinstance(stated, int) and not isinstance(stated, bool) and stated >= 1 else 1


def status_path(key: str) -> str:
    """Where the status of the PodGroup with gang key ``key`` is written, whatever its source."""
    namespace, _, name = key.partition("/")
    source = SOURCES[source_of_key(key)]
    return source.object_path(quote(namespace), quote(name.removeprefix(f"{source.name}:")))


def _with_removals(status: dict, written: dict | None) -> dict:
    """``status`` as a merge patch over ``written``: each field and amount
    written before and gone now is set to null (a merge patch removes only
    those), such as ``reclaim`` once the reclaim is over."""
    for field, amounts in (written or {}).items():
        if field not in status:
            status[field] = None
        elif isinstance(amounts, dict) and isinstance(status[field], dict):
            status[field].update({k: None for k in amounts if k not in status[field]})
    return status

