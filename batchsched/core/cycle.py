"""One scheduling cycle: from a Snapshot to bindings and per-gang verdicts.

The cycle builds the gangs, reports those that cannot be tried (missing or
invalid PodGroup, quorum not reached, schedule timeout), refreshes the
queue's reservation, then tries every ready gang in queue order against one
running copy of free resources, so gangs placed in the same cycle never
share capacity.  A gang is bound whole (at least its quorum) or not at all.

Verdicts cover the gangs decided in this cycle; a gang still backing off,
or beyond ``max_gangs_per_cycle`` (``GangQueue.attempts``), gets none and
keeps its previous one.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Collection, Mapping

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core import resources as res
from batchsched.core.cluster import ClusterState
from batchsched.core.config import CoreConfig
from batchsched.core.dra import claims
from batchsched.core.dra.claims import ClaimAllocation
from batchsched.core.dra.extended import ExtendedClaim, extended_claim
from batchsched.core.dra.model import AllocatedDevice
from batchsched.core.dra.state import EXTENDED_CLAIM
from batchsched.core.gangs import Gang, GangChanges, GangIndex, foreign_note, members_selector
from batchsched.core.model import GroupSpec, PodInfo, TopologyPolicy
from batchsched.core.placement.capacity import CapacityIndex, NodeEntry, cluster_capacity, kept_index, shape_key
from batchsched.core.placement.fragmentation import node_choice
from batchsched.core.placement.gang import (Assignment, GangPlan, PlanFailure, min_resources_beyond, places_none,
                                            plan_gang)
from batchsched.core.preemption.plan import NominationHolds, NoPreemption, plan_preemption
from batchsched.core.preemption.policy import PreemptionPolicy, PreemptionState
from batchsched.core.placement.fit import REASON_RESERVED, serves_through_extended_claim
from batchsched.core.queueing.lending import lent_pods, may_borrow
from batchsched.core.queueing.queue import GangQueue, Reservation
from batchsched.core.queueing.runtime import KILL_GRACE_SECONDS, expected_end, overran_hint, runtime_bound
from batchsched.core.queues.book import REASON_QUEUE_AT_LIMIT, REASON_QUEUE_BEYOND_FAIR_SHARE, Admission, QueueBook
from batchsched.core.queues.reclaim import Reclaim, awaited_reclaim, flows_said, reclaim_for
from batchsched.core.resources import Resources
from batchsched.core.snapshot import Snapshot
from batchsched.core.text import clip
from batchsched.core.topology.accounting import room_of

REASON_SCHEDULED = "Scheduled"
REASON_UNSCHEDULABLE = "Unschedulable"
REASON_EXCEEDS_CAPACITY = "ExceedsClusterCapacity"  # could not fit even on empty nodes
REASON_QUORUM_NOT_REACHED = "QuorumNotReached"
# Enough members exist, but some wait for their ResourceClaims (made, allocatable).
REASON_CLAIMS_NOT_READY = "ResourceClaimsNotReady"
REASON_SCHEDULE_TIMEOUT = "ScheduleTimeout"
REASON_PARTIAL_TIMEOUT = "PartialGangTimeout"
REASON_INTERNAL_ERROR = "InternalError"  # trying the gang raised; see its message
# PodGroupNotFound and InvalidPodGroup come from batchsched.core.gangs.


@dataclass(frozen=True)
class Binding:
    pod_uid: str
    namespace: str
    pod_name: str
    node_name: str
    gang_key: str
    gpu_ids: tuple[int, ...] = ()  # travel on the Binding as the gpu-ids annotation
    # Where DRA serves nvidia.com/gpu: the claim to write (allocated and
    # reserved) before binding (shell/claims.py)
    claim: ExtendedClaim | None = None
    # The pod's own ResourceClaims, allocated or reserved before binding
    claims: tuple[ClaimAllocation, ...] = ()

    @property
    def allocations(self) -> dict[str, tuple[AllocatedDevice, ...]]:
        """The devices each claim is given (by claim uid; the extended-resource
        claim, not made yet, as ``EXTENDED_CLAIM``): in flight from the decision on."""
        given = {EXTENDED_CLAIM: self.claim.devices} if self.claim is not None else {}
        given.update((c.uid, c.devices) for c in self.claims if c.devices)
        return given


@dataclass(frozen=True)
class Verdict:
    scheduled: bool  # the gang's quorum is placed (now or before)
    reason: str
    message: str


@dataclass(frozen=True)
class Eviction:
    pod: PodInfo
    preemptor: str  # gang key
    reclaim: bool = False  # for the preemptor's queue taking back room it lent, not by priority


@dataclass(frozen=True)
class Nomination:
    pod: PodInfo
    node_name: str


@dataclass(frozen=True)
class GangReset:
    """A gang left partly bound too long: evict its bound members so it starts over."""

    gang_key: str
    pods: tuple[PodInfo, ...]
    message: str


@dataclass(frozen=True)
class CyclePlan:
    bindings: list[Binding] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    evictions: list[Eviction] = field(default_factory=list)
    nominations: list[Nomination] = field(default_factory=list)
    resets: list[GangReset] = field(default_factory=list)
    reservation: Reservation | None = None  # the queue's once the cycle is done


def schedule_cycle(snapshot: Snapshot, queue: GangQueue, config: CoreConfig = CoreConfig(),
                   preemption: PreemptionPolicy = PreemptionPolicy(enabled=False),
                   preemption_state: PreemptionState = PreemptionState()) -> CyclePlan:
    now = snapshot.now
    gangs = GangIndex(snapshot)
    book = QueueBook(snapshot, config)
    plan = CyclePlan()
    waiting = []
    for gang in gangs.pending():  # gangs with nothing to place (or only gated pods) wait
        queue_problem = book.problem(gang) if gang.problem is None else None
        if gang.problem is not None:
            plan.verdicts[gang.key] = Verdict(False, gang.problem.reason, gang.problem.message)
        elif queue_problem is not None:
            plan.verdicts[gang.key] = Verdict(False, queue_problem.reason, queue_problem.message)
        elif not gang.eligible and gang.key in queue.started_over:
            plan.verdicts[gang.key] = Verdict(False, REASON_PARTIAL_TIMEOUT, (f"{queue.started_over[gang.key]} "
                f"Waiting for its pods: {_quorum_message(gang, snapshot.scheduler_name)}."))
        elif not gang.eligible:
            waits_for_claims = (bool(gang.claims_waiting) and not gang.tasks_short
                                and gang.active + len(gang.claims_waiting) >= gang.min_member)
            plan.verdicts[gang.key] = Verdict(False, REASON_CLAIMS_NOT_READY if waits_for_claims
                                              else REASON_QUORUM_NOT_REACHED,
                                              _quorum_message(gang, snapshot.scheduler_name))
        else:
            waiting.append(gang)
    queue.sync(waiting, now)
    for gang in waiting:
        timeout = gang.spec.schedule_timeout_seconds
        if timeout and gang.need and not queue.timed_out(gang.key) and queue.waited(gang.key, now) > timeout:
            queue.time_out(gang.key)
        if queue.timed_out(gang.key):
            plan.verdicts[gang.key] = Verdict(False, REASON_SCHEDULE_TIMEOUT, (
                f"Gang {gang.key} was not scheduled within scheduleTimeoutSeconds={timeout}; "
                "it is retried when its pods or PodGroup change."))
    starting_over = _start_over_partial_gangs(gangs, queue, now, config.partial_gang_timeout, plan)

    # Room nominated to preemptors waiting for their victims is theirs alone.
    holds = NominationHolds.from_snapshot(snapshot)
    withheld = holds.withheld()
    choice = node_choice(snapshot.cluster, config)  # every cycle: its mix is kept with hysteresis
    # Built for the first gang tried: a cycle that tries none (bindings
    # being confirmed, pods ending) leaves the kept index to catch up on
    # every node changed meanwhile at once, later.
    capacity: CapacityIndex | None = None
    _retry_where_freed(snapshot, gangs, queue)
    # The holder's would-be victims on its reserved nodes, and those that
    # borrow its room in this cycle (queueing.lending).
    lent = _refresh_reservation(snapshot, gangs, queue, config, book, preemption)
    cluster_total = snapshot.cluster.total_allocatable
    evicting: set[str] = set()  # victims chosen earlier in this cycle
    for key in book.in_turn(queue.attempts(now, config.max_gangs_per_cycle), lambda key: gangs[key].first_in_line):
        if key in starting_over:
            continue
        if capacity is None:
            capacity = cluster_capacity(snapshot.cluster, withheld, choice)
        # One gang's unforeseen failure (a bug, a value no check foresaw) is
        # that gang's verdict: the gangs after it are still tried.
        before = (len(plan.bindings), len(plan.evictions), len(plan.nominations), frozenset(evicting))
        holds_given: dict[str, Resources] = {}
        try:
            if _room_taken_before_its_turn(snapshot, gangs, gangs[key], queue, config, preemption, preemption_state,
                                           book, holds, capacity, lent):
                queue.resume_backoff(key)
                continue
            _try_gang(snapshot, gangs, key, queue, config, preemption, preemption_state, capacity, cluster_total,
                      holds, withheld, evicting, plan, holds_given, book, lent)
        except Exception as exc:  # noqa: BLE001 - isolated per gang, reported in its verdict
            del plan.bindings[before[0]:], plan.evictions[before[1]:], plan.nominations[before[2]:]
            evicting.intersection_update(before[3])
            # Held room lent to it is taken back; room it may have taken stays
            # taken: the cycle may end with less room, never with more.
            _give(capacity, holds_given, res.subtract)
            queue.record_failure(key, now)
            plan.verdicts[key] = Verdict(False, REASON_INTERNAL_ERROR, (
                f"Gang {key} could not be tried: {type(exc).__name__}: {clip(str(exc), 300)}; "
                "it is retried after a backoff."))
    return dataclasses.replace(plan, reservation=queue.reservation)


def _retry_where_freed(snapshot: Snapshot, gangs: Mapping[str, Gang], queue: GangQueue) -> None:
    """After capacity was freed, the gangs it may help: a node changed since
    the last cycle (every node the first time) has room now for one of a
    backed-off gang's pending pods, or would have for a hopeless gang once
    every pod of ours that ends by itself had ended.  Resources only, so
    never a false no; churn on nodes that cannot take even one of its pods
    leaves a gang's backoff and hopeless mark alone."""
    cluster = snapshot.cluster
    mark = cluster.caches.get("cycle_mark")
    cluster.caches["cycle_mark"] = cluster.mark

    @functools.cache
    def changed() -> list[str]:
        names = cluster.nodes if mark is None else cluster.changed_since(mark)
        return [name for name in names if name in cluster.nodes]

    def drained(name: str) -> Resources:
        free = cluster.free(name)
        for pod in cluster.bound_pods(name):
            if pod.holds_resources and pod.scheduler_name == snapshot.scheduler_name and pod.runs_to_completion:
                free = res.add(free, pod.requests)
        return free

    queue.retry_if_freed(_fits_one_pod(gangs, lambda: [cluster.free(name) for name in changed()]),
                         _fits_one_pod(gangs, lambda: [drained(name) for name in changed()]))


def _fits_one_pod(gangs: Mapping[str, Gang], rooms: Callable[[], list[Resources]]) -> Callable[[str], bool]:
    """Whether one of a gang's pending pods fits one of ``rooms`` (computed
    at the first question, answers kept per pod shape, ``shape_key``)."""
    fits_by_shape: dict[tuple, bool] = {}

    def fits(pod: PodInfo) -> bool:
        shape = shape_key(pod)
        if shape not in fits_by_shape:
            fits_by_shape[shape] = any(not res.shortfall(pod.requests, room) for room in known())
        return fits_by_shape[shape]

    known = functools.cache(rooms)
    return lambda key: any(fits(p) for p in _one_pod_per_shape(gangs[key]))


def _room_taken_before_its_turn(snapshot: Snapshot, gangs: Mapping[str, Gang], gang: Gang, queue: GangQueue,
                                config: CoreConfig, preemption: PreemptionPolicy, state: PreemptionState,
                                book: QueueBook, holds: NominationHolds, capacity: CapacityIndex,
                                lent: Mapping[str, float]) -> bool:
    """A gang that freed room woke from its backoff (``_retry_where_freed``)
    finds, at its turn, no node with room for even one of its pods: gangs
    before it in this cycle took the room, or it is on nodes reserved
    against it.  Its attempt could only fail, with nothing else to do (it
    may not evict, holds no nominated room), so it is not made: when one
    node frees, the gangs woken by it do not all fail there in turn."""
    if not queue.woken_by_freed(gang.key, snapshot.now) or not gang.need or gang.key in holds.claims:
        return False
    if preemption.enabled and (book.active or not preemption.why_not_preempt(gang.spec, gang.priority, gang.members)):
        return False
    reserved = queue.reserved_against(gang.key)
    if reserved and (_one_pod_backfills(snapshot, gang, queue.reservation) or (
            config.lend_reserved and may_borrow(snapshot, gangs, gang, gang.pending, queue, preemption, state, lent))):
        reserved = frozenset()
    return places_none(_one_pod_per_shape(gang), capacity, reserved=reserved, policy=placement_policy(gang, config))


def _one_pod_backfills(snapshot: Snapshot, gang: Gang, reservation: Reservation | None) -> bool:
    """Whether one of the gang's pending pods alone backfills (``_backfills``):
    the one with the shortest runtime bound among those that end by
    themselves.  That bound is kept on the gang object, as
    ``_one_pod_per_shape`` is (it depends on the gang's pods and PodGroup)."""
    ready_at = reservation.ready_at if reservation is not None else None
    if ready_at is None:
        return False
    if "_shortest_bound" not in gang.__dict__:
        bounds = [bound for pod in gang.pending
                  if pod.runs_to_completion and (bound := runtime_bound(pod, snapshot.groups)) is not None]
        gang.__dict__["_shortest_bound"] = min(bounds, default=None)
    shortest = gang.__dict__["_shortest_bound"]
    return shortest is not None and snapshot.now + shortest <= ready_at


def _one_pod_per_shape(gang: Gang) -> list[PodInfo]:
    """A pending pod of each of the gang's shapes (as ``places_none`` asks
    them).  Kept on the gang object, which is kept across cycles while its
    pods and PodGroup are unchanged (``GangIndex``): the woken gangs are
    asked this in every cycle that frees room."""
    kept = gang.__dict__.get("_one_pod_per_shape")
    if kept is None:
        kept = gang.__dict__["_one_pod_per_shape"] = list({shape_key(p): p for p in gang.pending}.values())
    return kept


def _start_over_partial_gangs(gangs: Mapping[str, Gang], queue: GangQueue, now: float, timeout: float,
                              plan: CyclePlan) -> set[str]:
    """Gangs partly bound for longer than ``timeout`` (a binding refused over
    and over, say): their bound members are evicted so that the gang starts
    over whole, rather than holding GPUs it cannot use forever."""
    keys = set()
    for key in queue.partial_expired(now, timeout):
        gang = gangs[key]
        message = (f"Gang {key} stayed partly bound ({len(gang.bound_active)}/{gang.min_member}) for more than "
                   f"{timeout:g}s (binding.partialGangTimeoutSeconds); its {len(gang.bound_active)} bound "
                   "member(s) are evicted so that it starts over when its pods return.")
        plan.resets.append(GangReset(key, gang.bound_active, message))
        plan.verdicts[key] = Verdict(False, REASON_PARTIAL_TIMEOUT, message)
        queue.started_over[key] = message
        keys.add(key)
    return keys


def _try_gang(snapshot: Snapshot, gangs: GangIndex, key: str, queue: GangQueue, config: CoreConfig,
              preemption: PreemptionPolicy, preemption_state: PreemptionState, capacity: CapacityIndex,
              cluster_total: Mapping[str, int], holds: NominationHolds, withheld: Mapping[str, Resources],
              evicting: set[str], plan: CyclePlan, holds_given: dict[str, Resources], book: QueueBook,
              lent: dict[str, float]) -> None:
    """Plan one ready gang into ``plan``; ``holds_given`` is kept to the
    held room lent to it for the attempt (for a failure to take back);
    pods that borrow reserved room are added to ``lent``."""
    now = snapshot.now
    gang = gangs[key]
    too_big = min_resources_beyond(gang, cluster_total)
    if too_big:
        queue.record_failure(key, now)
        plan.verdicts[key] = Verdict(False, REASON_EXCEEDS_CAPACITY, too_big)
        return
    held_back = book.borrowing(gang)
    admission = held_back or book.admission(gang)
    if isinstance(admission, str):  # no eviction makes room in a queue: it is not offered preemption
        queue.record_failure(key, now)
        plan.verdicts[key] = Verdict(False, REASON_QUEUE_BEYOND_FAIR_SHARE if held_back else REASON_QUEUE_AT_LIMIT,
                                     f"Gang {key} waits for its queue: {admission}.")
        return
    reserved = queue.reserved_against(key)
    off_limits = _off_limits(reserved, admission)
    own_holds = _released_for(withheld, holds.withheld(key)) if key in holds.claims else {}
    _give(capacity, own_holds, res.add)
    holds_given.update(own_holds)
    result = plan_gang(admission.pods, gang.need, capacity, reserved=off_limits,
                       cluster_total=cluster_total, task_need=gang.task_need, **_topology_args(gang, config))
    borrowed = ""  # the gang whose reserved room it borrows (queueing.lending)
    if isinstance(result, PlanFailure) and reserved:
        backfills = _backfills(snapshot, admission.pods, queue.reservation)
        if not backfills and config.lend_reserved and may_borrow(snapshot, gangs, gang, admission.pods, queue,
                                                                 preemption, preemption_state, lent):
            borrowed = queue.reservation.gang_key
        if backfills or borrowed:
            # It ends before the reserved gang is expected to fit, or that
            # gang may evict it by then: the reserved nodes are its too
            # (other nodes were tried first).
            result = plan_gang(admission.pods, gang.need, capacity, reserved=_off_limits(frozenset(), admission),
                               cluster_total=cluster_total, task_need=gang.task_need,
                               **_topology_args(gang, config))
    if isinstance(result, PlanFailure):
        queue.record_failure(key, now)
        message = result.message
        awaited = awaited_reclaim(book, key)
        if awaited:  # the room it was nominated to is still held by the queues it reclaims from
            message = f"Gang {key} is waiting for reclaim from {flows_said(awaited)}. {message}"
        if queue.reservation_expired(key):
            message += (f" Its node reservation was released after it outlasted its bound (the pods it "
                        f"waited for, or maxReservationSeconds={config.max_reservation_seconds:g}); it "
                        "gets none until its pods or PodGroup change.")
        if queue.reservation is not None and queue.reservation.gang_key == key:
            message += " " + _held_reservation_note(queue.reservation, now)
        nominated_before = len(plan.nominations)
        if gang.need and preemption.enabled and not result.never_fits:  # no eviction could make it fit
            overran = _overran_hints(snapshot, gangs, gang, queue.reservation)
            said = (_preempt(snapshot, gangs, gang, preemption, preemption_state, capacity, holds.going_for(key),
                             off_limits, evicting, plan, overran=overran) + " ") if overran else ""
            if len(plan.nominations) == nominated_before:
                wait, priority_class = preemption.wait_before_evicting(gang.members)
                waited = queue.waited(key, now)
                if waited < wait:
                    said += (f"It may evict lower-priority pods once it has waited {wait:g}s for room to free "
                             f"by itself (preemption.preemptors.waitSeconds of PriorityClass {priority_class}); "
                             f"it has waited {waited:.0f}s.")
                else:
                    said += _preempt(snapshot, gangs, gang, preemption, preemption_state, capacity,
                                     holds.going_for(key), off_limits, evicting, plan)
            reclaim = reclaim_for(book, gang) if len(plan.nominations) == nominated_before else None
            if reclaim is not None:  # its queue takes back what it lent, whatever the victims' priority
                reclaimed = _preempt(snapshot, gangs, gang, preemption, preemption_state, capacity,
                                     holds.going_for(key), off_limits, evicting, plan, reclaim)
                said = reclaimed if len(plan.nominations) > nominated_before else f"{said} {reclaimed}"
            message += " " + said
        if len(plan.nominations) == nominated_before:
            _give(capacity, own_holds, res.subtract)  # its claims stand; new ones would replace them
            holds_given.clear()
            if config.hold_borrowing and preemption.enabled and not result.never_fits and gang.need \
                    and not own_holds and key not in preemption_state.in_flight:
                book.note_unplaced(gang)  # what others borrow now would be reclaimed for it
        reason = REASON_EXCEEDS_CAPACITY if result.never_fits else REASON_UNSCHEDULABLE
        plan.verdicts[key] = Verdict(False, reason, message)
        return
    over = book.over_limit(admission.queue, result.assignments)
    if over:  # its GPU types are known once placed; the room the plan took stays taken this cycle
        queue.record_failure(key, now)
        plan.verdicts[key] = Verdict(False, REASON_QUEUE_AT_LIMIT, f"Gang {key} waits for its queue: {over}.")
        return
    book.admit(admission.queue, result.assignments)
    queue.record_success(key)
    if result.unplaced or admission.left_out:
        queue.record_failure(key, now)  # back off retrying the members that did not fit
    plan.bindings.extend(
        Binding(a.pod.uid, a.pod.namespace, a.pod.name, a.node_name, key, a.gpu_ids, _claim_of(snapshot, a),
                claims.allocations(snapshot.nodes[a.node_name], a.pod, a.gpu_ids, snapshot.cluster.dra.claim,
                                   snapshot.cluster.dra.classes))
        for a in result.assignments)
    message = _scheduled_message(gang, result, admission)
    if borrowed and any(a.node_name in reserved for a in result.assignments):
        lent.update((a.pod.uid, queue.reservation.ready_at) for a in result.assignments if a.node_name in reserved)
        message += (f" It borrowed room on nodes reserved for gang {borrowed}, which may evict it once it can "
                    "use them (queue.lendReservedToVictims).")
    plan.verdicts[key] = Verdict(True, REASON_SCHEDULED, message)


def _held_reservation_note(reservation: Reservation, now: float) -> str:
    """What its holder's verdict says of the reservation: the nodes and when
    it is expected to fit there (a time, not a countdown: a verdict that
    changed every cycle would be written every cycle; so is one that is
    past, which stays at now while what it waits for is late)."""
    names = sorted(reservation.nodes)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if reservation.ready_at is None:
        when = "when they will have drained is unknown (a pod it waits for there has no runtime bound)"
    elif reservation.ready_at <= now:
        when = "it was expected to fit there by now"
    else:
        try:
            stamp = datetime.fromtimestamp(reservation.ready_at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        except (OverflowError, OSError, ValueError):  # a deadline of 2^62 s is valid in the API
            stamp = "a time past the year 9999"
        when = f"it is expected to fit there by {stamp}"
    return f"It holds a reservation of {len(names)} node(s) while they drain ({shown}); {when}."


def _backfills(snapshot: Snapshot, pods: Collection[PodInfo], reservation: Reservation | None) -> bool:
    """Whether ``pods`` may run on the reserved nodes meanwhile: each ends by
    itself within its runtime bound (runtime.runtime_bound), counted from
    now, by the time the reserved gang is expected to fit.  A pod without a
    bound never backfills, nor does any while that time is unknown."""
    ready_at = reservation.ready_at if reservation is not None else None
    if ready_at is None:
        return False
    for pod in pods:
        bound = runtime_bound(pod, snapshot.groups)
        if bound is None or not pod.runs_to_completion or snapshot.now + bound > ready_at:
            return False
    return True


def _overran_hints(snapshot: Snapshot, gangs: Mapping[str, Gang], gang: Gang,
                   reservation: Reservation | None) -> frozenset[str]:
    """The gangs the reservation ``gang`` holds waits for that run past
    their runtime hints on its nodes: its first victims, whatever their
    priority (docs/queueing.md, "Backfill")."""
    if reservation is None or reservation.gang_key != gang.key:
        return frozenset()
    cluster, now = snapshot.cluster, snapshot.now
    return frozenset(p.gang_key for name in reservation.nodes for p in cluster.bound_pods(name)
                     if p.holds_resources and p.gang_key != gang.key and p.scheduler_name == snapshot.scheduler_name
                     and p.gang_key in gangs and gangs[p.gang_key].priority <= gang.priority
                     and overran_hint(p, snapshot.groups, now))


def _off_limits(reserved: frozenset[str], admission: Admission) -> Collection[str]:
    """The nodes a gang may not use: those reserved for a gang ahead of it,
    and those of GPU types its queue is at the limit of (each with why)."""
    if not admission.excluded:
        return reserved
    return {**dict.fromkeys(reserved, REASON_RESERVED), **admission.excluded}


def _claim_of(snapshot: Snapshot, assignment: Assignment) -> ExtendedClaim | None:
    """The extended-resource claim of a pod given GPUs where DRA serves them
    (raises ExtendedClaimError, its gang's verdict, when it cannot have one)."""
    node = snapshot.nodes[assignment.node_name]
    if not node.gpus_by_dra or not serves_through_extended_claim(assignment.pod):
        return None
    return extended_claim(node, assignment.pod, assignment.gpu_ids, snapshot.cluster.dra.classes)


def _give(capacity: CapacityIndex, amounts: Mapping[str, Resources], op: Callable) -> None:
    """Add (op=res.add) or take back (res.subtract) room on nodes of the index."""
    if amounts:
        capacity.commit({node: op(capacity.free[node], amount) for node, amount in amounts.items()})


def _released_for(withheld_from_all: Mapping[str, Resources],
                  withheld_from_gang: Mapping[str, Resources]) -> dict[str, Resources]:
    """The room a claimant gets back on top of what every gang may use."""
    return {node: res.subtract(amount, withheld_from_gang.get(node, {}))
            for node, amount in withheld_from_all.items()}


def _preempt(snapshot: Snapshot, gangs: Mapping[str, Gang], gang: Gang, policy: PreemptionPolicy,
             state: PreemptionState, capacity: CapacityIndex, going: Mapping[str, Resources],
             off_limits: Collection[str], evicting: set[str], plan: CyclePlan, reclaim: Reclaim | None = None,
             overran: frozenset[str] = frozenset()) -> str:
    """Plan evictions for ``gang`` (by priority; with ``reclaim`` the room
    its queue lent; with ``overran`` only those gangs, past their runtime
    hints on its reserved nodes); returns the sentence its verdict gets."""
    victims_of = reclaim if reclaim is not None else (overran.__contains__ if overran else None)
    outcome = plan_preemption(snapshot, gangs, gang, policy, state, capacity.free, capacity.node_filter,
                              going, capacity.rooms, off_limits, evicting,
                              budget=policy.max_victims_per_cycle - len(evicting), reclaim=victims_of,
                              budgeted=bool(overran) and reclaim is None)
    said = "" if reclaim is None else f"Queue {reclaim.queue} is below its fair share and reclaims: "
    if overran:
        said = "Gangs past their expectedRuntimeSeconds on its reserved nodes go first: "
    if isinstance(outcome, NoPreemption):
        return said + outcome.message
    too_much = reclaim.beyond(outcome.victims) if reclaim is not None else ""
    if too_much:
        return f"Gang {gang.key}: {too_much}."
    evicting.update(p.uid for p in outcome.victims)
    plan.evictions.extend(Eviction(p, gang.key, reclaim is not None) for p in outcome.victims)
    plan.nominations.extend(Nomination(pod, node) for pod, node in outcome.nominations)
    # The nominated room is the preemptor's from now on, in this cycle too.
    nominated: dict[str, Resources] = {}
    for pod, node in outcome.nominations:
        nominated[node] = res.add(nominated.get(node, {}), pod.requests)
    _give(capacity, nominated, res.subtract)
    return said + outcome.message


def placement_policy(gang: Gang, config: CoreConfig) -> TopologyPolicy:
    """The gang's topology policy as placement applies it: its domain label
    keys resolved (the PodGroup's, else the configured ones), and GPUDirect
    RDMA preferred for a gang of several pods (docs/topology.md, "NICs").
    Kept on the gang object for its config (as ``_one_pod_per_shape``)."""
    kept = gang.__dict__.get("_placement_policy")
    if kept is not None and kept[0] is config:
        return kept[1]
    policy = gang.spec.topology
    if policy.domain_mode and not policy.domain_labels:
        policy = dataclasses.replace(policy, domain_labels=config.domain_labels)
    if len(gang.members) > 1 or gang.spec.min_member > 1:
        policy = dataclasses.replace(policy, rdma=True)
    gang.__dict__["_placement_policy"] = (config, policy)
    return policy


def _topology_args(gang: Gang, config: CoreConfig) -> dict:
    """plan_gang's topology arguments: the gang's placement policy and where
    its bound members are."""
    return {"policy": placement_policy(gang, config),
            "bound_on": frozenset(p.node_name for p in gang.bound_active)}


def _refresh_reservation(snapshot: Snapshot, gangs: Mapping[str, Gang], queue: GangQueue, config: CoreConfig,
                         book: QueueBook, preemption: PreemptionPolicy) -> dict[str, float]:
    """Give the reservation to the first long-waiting gang that is neither
    hopeless nor past its reservation's bound, nor waiting for its queue
    (see batchsched.core.queueing.queue); the pods lent its room
    (queueing.lending.lent_pods)."""
    cluster = snapshot.cluster
    for key in queue.reservation_candidates(snapshot.now):
        gang = gangs[key]
        if not gang.need or _waits_for_queue(book, gang):
            continue  # its quorum is bound (extra members reserve nothing), or room reserved would sit idle
        try:
            lent = lent_pods(snapshot, gangs, gang, queue, preemption) if config.lend_reserved else {}
            drained, draining = drained_index(snapshot, gangs, gang, lent)
            result = plan_gang(gang.pending, gang.need, drained, **_topology_args(gang, config))
        except Exception:  # noqa: BLE001 - its own attempt reports it (InternalError); others go on
            cluster.caches.pop("drained", None)  # maybe half updated: rebuilt on next use
            result = None
        if result is None or isinstance(result, PlanFailure):
            queue.mark_hopeless(key)
            continue
        quorum = result.assignments[:gang.need]
        reserved = {a.node_name for a in quorum}
        if queue.reserve(key, reserved, snapshot.now, _awaited_end(cluster, reserved, draining.waited_out),
                         _ready_at(snapshot, quorum, draining)):
            return dict(lent)
    queue.release_reservation()
    return {}


def drained_index(snapshot: Snapshot, gangs: Mapping[str, Gang], gang: Gang,
                  lent: Mapping[str, float] | None = None) -> tuple[CapacityIndex, Drain]:
    """The cluster as if the bound pods ``gang`` may wait out had ended
    (``_drained_entry``), and which pods those are: ours, of other gangs,
    not of higher priority, and those ``lent`` its reserved room
    (queueing.lending).  (Counting equal-priority pods is what makes the
    reservation useful when every gang has the default priority.)

    One index, kept across cycles, serves every head: it depends on the
    head only through the gangs it may wait out, so gangs that turned
    drainable or not since the last call (another head, a priority
    changed, they bound or ended), or whose runtime hint changed, change
    it on the nodes of their pods only; so do pods lent room or no longer."""
    cluster = snapshot.cluster
    lent = lent or {}
    holding = _holding_gangs(snapshot, gangs)
    drainable = frozenset([k for k, (priority, _) in holding.items() if priority <= gang.priority and k != gang.key])
    hints = {k: hint for k in drainable if (hint := holding[k][1])}
    before = cluster.caches.get("drainable")
    cluster.caches["drainable"] = (drainable, hints, lent)
    turned = ((drainable ^ before[0]) | {k for k in hints.keys() | before[1].keys()
                                         if hints.get(k) != before[1].get(k)}
              if before else frozenset())
    nodes = {p.node_name for k in turned for p in (cluster.pods[u] for u in cluster.gang_uids(k)) if p.node_name}
    if before:
        nodes.update(pod.node_name for uid in lent.keys() | before[2].keys() if lent.get(uid) != before[2].get(uid)
                     and (pod := cluster.pods.get(uid)) is not None and pod.node_name)
    draining = Drain(snapshot.scheduler_name, drainable, snapshot.groups, lent)
    return kept_index(cluster, "drained", None, _drained_entry(snapshot, draining), also_changed=nodes,
                      kept_rebuilds=DRAINED_VIEWS_KEPT_REBUILDS), draining


# The "as if drained" index keeps an unused view while keeping it current
# has cost less than this many rebuilds (capacity.drop_idle_views): head
# gangs of a few shapes take turns, and a rebuild is one cycle's cost.
DRAINED_VIEWS_KEPT_REBUILDS = 4


def _holding_gangs(snapshot: Snapshot, gangs: Mapping[str, Gang]) -> dict[str, tuple[int, float | None]]:
    """Each gang of ours holding room now: its priority and its PodGroup's
    runtime hint (expectedRuntimeSeconds, None without).  Kept across
    cycles: only the gangs whose pods or PodGroup changed are looked up
    again (with thousands of gangs running, looking each up at every
    reservation refresh was most of its cost)."""
    cluster, groups = snapshot.cluster, snapshot.groups
    changes, facts = cluster.caches.setdefault("holding_gangs", (GangChanges(), {}))
    holding = cluster.holding_gang_keys()
    changed = changes.since_last(snapshot)
    if changed is None:
        facts.clear()
        changed = holding
    for key in changed:
        if key in holding:
            group = groups.get(key)
            facts[key] = (gangs[key].priority, group.expected_runtime_seconds if group is not None else None)
        else:
            facts.pop(key, None)
    changes.looked(snapshot)
    return facts


def _waits_for_queue(book: QueueBook, gang: Gang) -> bool:
    """Its queue cannot take its quorum now, or would go beyond its fair
    share with it: room reserved for a borrower would be taken back by
    reclaim, over and over (or asking raised: its own attempt reports that
    as InternalError)."""
    try:
        return isinstance(book.admission(gang), str) or not book.within_fair_share(gang)
    except Exception:  # noqa: BLE001 - the gang's attempt reports it; the reservation goes on
        return True


@dataclass(frozen=True)
class Drain:
    """The bound pods a reservation counts as gone (called on a pod), and
    from when (``end``): ours, of a ``drainable`` gang and ending by
    themselves (PodInfo.runs_to_completion), at their expected end; and
    those ``lent`` its room (pod uid -> when its holder may evict them)."""

    ours: str
    drainable: frozenset[str]
    groups: Mapping[str, GroupSpec]
    lent: Mapping[str, float]

    def __call__(self, pod: PodInfo) -> bool:
        return pod.uid in self.lent or self.waited_out(pod)

    def waited_out(self, pod: PodInfo) -> bool:
        """One it waits to end by itself."""
        return pod.scheduler_name == self.ours and pod.gang_key in self.drainable and pod.runs_to_completion

    def end(self, pod: PodInfo, now: float | None = None) -> float | None:
        """When it is expected to be gone (runtime.expected_end), or evictable if lent sooner."""
        evictable = self.lent.get(pod.uid)
        if evictable is None:
            return expected_end(pod, self.groups, now)
        end = expected_end(pod, self.groups, now) if self.waited_out(pod) else None
        evictable = evictable if now is None else max(now, evictable)
        return evictable if end is None else min(end, evictable)


def _awaited_end(cluster: ClusterState, nodes: Collection[str], draining: Callable[[PodInfo], bool]) -> float | None:
    """When the last pod the reservation waits for on ``nodes`` is killed at
    its deadline (plus the kill's grace); None when one has no known end."""
    ends = [p.ends_by for name in nodes for p in cluster.bound_pods(name) if p.holds_resources and draining(p)]
    if not ends or None in ends:
        return None
    return max(ends) + KILL_GRACE_SECONDS


def _ready_at(snapshot: Snapshot, quorum: Collection[Assignment], draining: Drain) -> float | None:
    """When the reserved quorum is expected to fit (by resource counts): on
    each of its nodes, once the pods it waits for there have ended, soonest
    expected end first, until its pods there fit; None when one it needs
    has no expected end (runtime.expected_end)."""
    cluster = snapshot.cluster
    asked: dict[str, Resources] = {}
    for assignment in quorum:
        asked[assignment.node_name] = res.add(asked.get(assignment.node_name, {}), assignment.pod.requests)
    ready = snapshot.now
    for name, request in asked.items():
        free = cluster.free(name)
        ends = [(draining.end(p, snapshot.now), p) for p in cluster.bound_pods(name)
                if p.holds_resources and draining(p)]
        for end, pod in sorted(ends, key=lambda e: (math.inf if e[0] is None else e[0], e[1].uid)):
            if not res.shortfall(request, free):
                break
            if end is None:
                return None
            free, ready = res.add(free, pod.requests), max(ready, end)
    return ready


def _drained_entry(snapshot: Snapshot, draining: Drain) -> Callable[[str], NodeEntry]:
    """A node as if its ``draining`` pods had finished; among nodes equally
    good once drained, the one expected to be drained soonest goes first
    (by its pods' runtime bounds and how long they have run; a pod without
    a bound last), then the freest now."""
    cluster = snapshot.cluster

    def entry(name: str) -> NodeEntry:
        now = cluster.free(name)
        freest = (-now.get(GPU_RESOURCE, 0), -now.get(res.CPU, 0), -now.get(res.MEMORY, 0))
        holding = [p for p in cluster.bound_pods(name) if p.holds_resources]
        gone = [p for p in holding if draining(p)]
        if not gone:
            return now, cluster.room(name), (0.0, *freest)
        ends = [draining.end(p) for p in gone]
        drained_by = math.inf if None in ends else max(ends)
        free = dict(now)
        for pod in gone:
            free = res.add(free, pod.requests)
        room = cluster.room(name)
        if room is not None:
            gone_uids = {p.uid for p in gone}
            room = room_of(snapshot.nodes[name], [p for p in holding if p.uid not in gone_uids],
                           cluster.dra_in_use_ids(name, gone_uids))
        return free, room, (drained_by, *freest)
    return entry


def _quorum_message(gang: Gang, scheduler_name: str) -> str:
    """How many members exist against minMember, what makes a pod one, and
    the pods that carry the label but name another scheduler."""
    message = f"{gang.active}/{gang.min_member} members exist"
    if not gang.implicit:
        message += f" ({members_selector(gang.spec.namespace, gang.spec.name, scheduler_name, gang.spec.source)})"
    if gang.gated:
        message += f"; {gang.gated} more held by scheduling gates"
    if gang.claims_waiting:
        shown = "; ".join(f"pod {name}: {why}" for name, why in gang.claims_waiting[:3])
        more = len(gang.claims_waiting) - 3
        message += (f"; {len(gang.claims_waiting)} more wait for their ResourceClaims ({shown}"
                    + (f"; and {more} more" if more > 0 else "") + ")")
    if gang.tasks_short:
        message += "; " + ", ".join(f"task {clip(task, 80)} has {live}/{need} members"
                                    for task, live, need in gang.tasks_short[:5]) + " (minTaskMember)"
    if gang.foreign:
        message += f"; {foreign_note(gang.foreign, scheduler_name)}"
    return message


def _scheduled_message(gang: Gang, result: GangPlan, admission: Admission) -> str:
    placed = len(result.assignments)
    if gang.need:
        nodes = len({a.node_name for a in result.assignments})
        message = f"Gang {gang.key}: {placed} pod(s) placed on {nodes} node(s)"
    else:
        message = f"Gang {gang.key} has its quorum bound; {placed} more pod(s) placed"
    if admission.left_out:
        message += f"; {admission.left_out} more wait for their queue: {admission.left_out_why}"
    if result.unplaced:  # unplaced_message is a full sentence
        return f"{message}; {len(result.unplaced)} more do not fit: {result.unplaced_message}"
    return message + "."
