"""The queues as one cycle sees them: what each holds, what it may still
take, and whose turn it is (pure; docs/queues.md).

A gang's queue is its PodGroup's ``spec.queue``, else the configured
default queue (lone pods too).  The default queue needs no Queue object:
without one it has no quota, weight 1.  A queue with a parent is held to
the parent's limits too (what all its children hold together).

What a queue holds is what its gangs' bound pods ask (bound and assumed
alike, terminating ones until they are gone), plus what the cycle placed
so far: quota is charged by placement, never by a decision that did not
place (docs/queues.md, "Quota and physical fit").  GPU-type quotas count
each GPU by the node it is on (``CoreConfig.gpu_type_label``).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core import resources as res
from batchsched.core.config import CoreConfig
from batchsched.core.gangs import Gang, GangChanges, GangIndex, GangProblem
from batchsched.core.model import PodInfo
from batchsched.core.placement.gang import Assignment
from batchsched.core.queueing.order import queue_rank
from batchsched.core.queues.model import QueueInfo
from batchsched.core.queues.share import dominant_share, fair_shares
from batchsched.core.resources import Resources
from batchsched.core.snapshot import Snapshot

REASON_QUEUE_NOT_FOUND = "QueueNotFound"
REASON_INVALID_QUEUE = "InvalidQueue"
REASON_QUEUE_AT_LIMIT = "QueueAtLimit"
REASON_QUEUE_BEYOND_FAIR_SHARE = "QueueBeyondFairShare"  # held back from borrowing (CoreConfig.hold_borrowing)


@dataclass(frozen=True)
class Admission:
    """What a gang may try under its queue's limits."""

    queue: str
    pods: tuple[PodInfo, ...]  # its pending pods the queue has room for, together
    left_out: int = 0  # pending pods beyond that room
    left_out_why: str = ""
    # nodes of a GPU type the queue cannot take even one more pod's GPUs of: node -> why
    excluded: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Usage:
    amounts: Resources = field(default_factory=dict)
    gpu_types: dict[str, int] = field(default_factory=dict)

    def add(self, amounts: Mapping[str, int], gpu_types: Mapping[str, int], sign: int = 1) -> None:
        for name, amount in amounts.items():
            self.amounts[name] = self.amounts.get(name, 0) + sign * amount
        for kind, amount in gpu_types.items():
            self.gpu_types[kind] = self.gpu_types.get(kind, 0) + sign * amount

    def copy(self) -> _Usage:
        return _Usage(dict(self.amounts), dict(self.gpu_types))


@dataclass
class _Held:
    """What every queue holds, kept across cycles: per gang its part (by its
    pods' stamp and its PodGroup), and the totals they add up to, valid for
    one set of Queues and one config."""

    queues: Mapping[str, QueueInfo]
    config: tuple[str, str]  # default queue, GPU type label
    gangs: dict[str, tuple[int, object, list[str], Resources, dict[str, int]]] = field(default_factory=dict)
    totals: dict[str, _Usage] = field(default_factory=dict)
    changes: GangChanges = field(default_factory=GangChanges)  # since last counted

    def drop(self, key: str) -> None:
        _, _, charged, amounts, kinds = self.gangs.pop(key)
        for name in charged:
            self.totals[name].add(amounts, kinds, -1)


class QueueBook:
    def __init__(self, snapshot: Snapshot, config: CoreConfig):
        self.snapshot = snapshot
        self.queues: Mapping[str, QueueInfo] = snapshot.queues
        self.default = config.default_queue
        self.type_label = config.gpu_type_label
        # With no Queue object every gang is in the one unlimited default
        # queue: nothing to count, nothing to order (decisions as before queues).
        self.active = bool(self.queues)
        self.parents = {q.parent for q in self.queues.values() if q.parent}
        self._usage: dict[str, _Usage] = {}
        self._nodes_by_type: dict[str, list[str]] | None = None
        self._ranks: dict[str, tuple] = {}  # by queue (queueing/order.py), until it gains a gang
        self._charged_now: set[str] = set()  # queues this cycle placed gangs of
        self._fair: dict[str, dict[str, Fraction]] | None = None
        self._flight: tuple[dict[str, Resources], dict[str, dict[str, Resources]]] | None = None
        # per gang, per other queue, its pods terminating where the gang is nominated (queues/reclaim.py)
        self.reclaims_in_flight: dict[str, dict[str, dict[str, PodInfo]]] | None = None
        self._waiting_within_share: set[str] = set()  # queues with a gang unplaced this cycle within their share
        if self.active:
            self._count_bound()

    # -- which queue, and whether it can admit ------------------------------

    def queue_of(self, gang_key: str) -> str:
        group = self.snapshot.groups.get(gang_key)
        return group.queue if group is not None and group.queue else self.default

    def problem(self, gang: Gang) -> GangProblem | None:
        """Why the gang's queue admits nothing (missing, invalid, a parent), or None."""
        name = self.queue_of(gang.key)
        invalid = self.snapshot.invalid_queues
        if name in invalid:
            return GangProblem(REASON_INVALID_QUEUE, f"Queue {name} is invalid: {invalid[name]}")
        info = self.queues.get(name)
        if info is None:
            if name == self.default:
                return None
            return GangProblem(REASON_QUEUE_NOT_FOUND, (
                f"Queue {name} not found (spec.queue of PodGroup {gang.key}); create it, or name an existing "
                f"queue, or leave spec.queue unset for the default queue {self.default}."))
        if name in self.parents:
            return GangProblem(REASON_INVALID_QUEUE, (
                f"Queue {name} has child queues, and gangs go into queues without children; name one of "
                f"its children in spec.queue of PodGroup {gang.key}."))
        parent = info.parent
        if parent and parent in invalid:
            return GangProblem(REASON_INVALID_QUEUE, f"Queue {name}'s parent {parent} is invalid: {invalid[parent]}")
        if parent and parent not in self.queues:
            return GangProblem(REASON_QUEUE_NOT_FOUND, f"Queue {name} names parent queue {parent}, which does "
                                                        "not exist.")
        if parent and self.queues[parent].parent:
            return GangProblem(REASON_INVALID_QUEUE, (
                f"Queue {name}'s parent {parent} has a parent itself ({self.queues[parent].parent}); queues "
                "have two levels at most."))
        return None

    def admission(self, gang: Gang) -> Admission | str:
        """The pods of ``gang`` its queue can take (at least its quorum), or
        why not even the quorum fits (its verdict)."""
        name = self.queue_of(gang.key)
        pods = gang.pending
        if not self.active:
            return Admission(name, pods)
        chain = self._chain(name)
        headroom = self._headroom(chain)
        demand = self._demand(gang)
        if not headroom or not res.shortfall({r: demand.total.get(r, 0) for r in headroom}, headroom):
            return Admission(name, pods, excluded=self._excluded(chain, demand.smallest_gpus))
        limited = tuple(sorted(headroom))
        ordered, minimum = demand.smallest_first(limited), demand.minimum(limited)
        if res.shortfall({r: minimum.get(r, 0) for r in headroom}, headroom):
            return self.shortfall(name, minimum, {}, gang)
        taken, rest = _within(ordered, headroom)
        if len(taken) < gang.need:  # several resources limited: what fits alone may not fit together
            return self.shortfall(name, minimum, {}, gang) or \
                f"queue {name} cannot take gang {gang.key}'s {gang.need} pods at once within its limits"
        order = {p.uid: i for i, p in enumerate(pods)}
        taken.sort(key=lambda p: order[p.uid])
        why = self.shortfall(name, summed(p.requests for p in rest), {}, taking=summed(p.requests for p in taken))
        return Admission(name, tuple(taken), len(rest), why, self._excluded(chain, demand.smallest_gpus))

    def _demand(self, gang: Gang) -> _GangDemand:
        """What the gang's pending pods ask, kept across cycles with the gang
        (a gang at its queue's limit is asked every time room frees)."""
        kept = self.snapshot.cluster.kept(_Demands).by_gang
        demand = kept.get(gang.key)
        if demand is None or demand.gang is not gang:
            if len(kept) > 2 * len(self.snapshot.cluster.pending_gang_keys()) + 64:  # drop gangs that are gone
                kept.clear()
            demand = kept[gang.key] = _GangDemand(gang)
        return demand

    def shortfall(self, name: str, amounts: Mapping[str, int], gpu_types: Mapping[str, int],
                  gang: Gang | None = None, taking: Mapping[str, int] | None = None) -> str:
        """Why ``name`` (with its parent) cannot take ``amounts`` more (once
        it holds ``taking`` too), or ""."""
        taking = taking or {}
        for queue in self._chain(name):
            usage = self._usage.get(queue.name, _Usage())
            whose = f"queue {queue.name}" if queue.name == name else f"queue {name}'s parent {queue.name}"
            asked = [(r, limit, usage.amounts.get(r, 0) + taking.get(r, 0), amounts.get(r, 0)) for r, limit in
                     sorted(queue.limits().items())]
            asked += [(f"{GPU_RESOURCE} of {self.type_label}={kind}", quota.limit, usage.gpu_types.get(kind, 0),
                       gpu_types.get(kind, 0)) for kind, quota in sorted(queue.gpu_types.items())
                      if quota.limit is not None]
            for resource, limit, used, more in asked:
                if more <= 0 or used + more <= limit:
                    continue
                unit = resource if resource in amounts else GPU_RESOURCE
                needs = f"gang {gang.key} needs {_amount(unit, more)} at once" if gang else f"{_amount(unit, more)} more wanted"
                if more > limit:
                    return f"{whose} is too small: {needs}, beyond its limit of {_amount(unit, limit)} {resource}"
                return f"{whose} is at its limit: {_amount(unit, used)}/{_amount(unit, limit)} {resource} ({needs})"
        return ""

    def over_limit(self, name: str, assignments: Sequence[Assignment]) -> str:
        """Why a plan takes more than the queue may hold (its GPU types are
        known only once placed), or ""."""
        if not self.active:
            return ""
        amounts, kinds = self._placed(assignments)
        return self.shortfall(name, amounts, kinds)

    def admit(self, name: str, assignments: Sequence[Assignment]) -> None:
        """The cycle placed ``assignments`` for a gang of queue ``name``."""
        if self.active:
            amounts, kinds = self._placed(assignments)
            for charged in self.charged(name):
                if charged not in self._charged_now:  # the kept totals stay what is bound
                    self._usage[charged] = self._usage.get(charged, _Usage()).copy()
                    self._charged_now.add(charged)
                self._usage[charged].add(amounts, kinds)
                self._ranks.pop(charged, None)

    def within_fair_share(self, gang: Gang) -> bool:
        """Whether the gang's queue (and its parent) would stay within its
        fair share with the gang's minimum placed, counting the room
        nominated to its other gangs, whose victims are on their way out
        (always, without Queue objects)."""
        return not self.active or not self.beyond_share(gang)

    def beyond_share(self, gang: Gang) -> list[str]:
        """The queues of the gang's chain (its queue, its parent) that would
        go beyond their fair share with the gang's minimum placed, counting
        as ``within_fair_share`` does."""
        minimum = self.minimum(gang)
        fair = self.fair_share_by_queue()
        coming = self.in_flight()[1]
        beyond = []
        for charged in self.charged(self.queue_of(gang.key)):
            held = res.add(self._usage.get(charged, _Usage()).amounts, coming.get(charged, {}).get("", {}))
            own = coming.get(charged, {}).get(gang.key, {})  # this gang's own nomination is not extra
            if any(held.get(r, 0) - own.get(r, 0) + amount > fair.get(charged, {}).get(r, 0)
                   for r, amount in minimum.items() if amount):
                beyond.append(charged)
        return beyond

    def note_unplaced(self, gang: Gang) -> None:
        """``gang`` found no room this cycle, and holds none nominated: if
        its queue is within its fair share with it, other queues may not
        borrow beyond their own for the rest of the cycle (``borrowing``)."""
        if self.active and self.within_fair_share(gang):
            self._waiting_within_share.add(self.queue_of(gang.key))

    def borrowing(self, gang: Gang) -> str:
        """Why ``gang`` may not take room now: its queue would go beyond its
        fair share with it while a queue within its own waits for room, which
        would reclaim what was lent (docs/queues.md, "Borrowing"); or ""."""
        if not self._waiting_within_share:
            return ""
        name = self.queue_of(gang.key)
        waiting = sorted(self._waiting_within_share - set(self.charged(name)))
        if not waiting or self.within_fair_share(gang):
            return ""
        return (f"queue {name} would go beyond its fair share with gang {gang.key} while queue {waiting[0]}, "
                "within its own, waits for room (what it borrowed would be reclaimed)")

    def minimum(self, gang: Gang) -> Resources:
        demand = self._demand(gang)
        return demand.minimum(tuple(sorted(demand.total)))

    def in_flight(self) -> tuple[dict[str, Resources], dict[str, dict[str, Resources]]]:
        """Per queue (a parent too), what its terminating pods hold; and per
        queue and gang, the room nominated to the gang's pending pods (under
        the gang key "" too, for all its gangs together).  Once a cycle."""
        if self._flight is None:
            going: dict[str, Resources] = {}
            coming: dict[str, dict[str, Resources]] = {}
            cluster = self.snapshot.cluster
            for pod in cluster.terminating_pods():
                for charged in self.charged(self.queue_of(pod.gang_key)):
                    going[charged] = res.add(going.get(charged, {}), pod.requests)
            for pod in cluster.nominated_pods():
                for charged in self.charged(self.queue_of(pod.gang_key)):
                    by_gang = coming.setdefault(charged, {})
                    for key in ("", pod.gang_key):
                        by_gang[key] = res.add(by_gang.get(key, {}), pod.requests)
            self._flight = (going, coming)
        return self._flight

    def fair_share_by_queue(self) -> dict[str, dict[str, Fraction]]:
        """Every queue's fair share over what it holds and its waiting gangs
        ask (computed once a cycle: a placement moves a gang's pods from
        waiting to held, its demand stays)."""
        if self._fair is None:
            demand: dict[str, Resources] = {}
            for gang in GangIndex(self.snapshot).pending():
                if gang.eligible:
                    name = self.queue_of(gang.key)
                    demand[name] = res.add(demand.get(name, {}), self._demand(gang).total)
            for name, usage in self._usage.items():
                if name not in self.parents:
                    demand[name] = res.add(demand.get(name, {}), usage.amounts)
            self._fair = fair_shares(self.queues, demand, self.snapshot.cluster.total_allocatable)
        return self._fair

    # -- whose turn -------------------------------------------------------------

    def in_turn(self, keys: Iterable[str], ahead: Callable[[str], bool]) -> Iterator[str]:
        """``keys`` (in queue order) taken by queue: each next gang from the
        queue with the lowest share now (the share grows as the cycle places
        its gangs), each queue's gangs in their order; those ``ahead``
        (partly bound gangs, whose remainder comes before anyone takes the
        room) go first.  Without Queue objects, ``keys`` as they are."""
        if not self.active:
            yield from keys
            return
        by_queue: dict[str, list[str]] = {}
        for key in keys:
            if ahead(key):
                yield key
            else:
                by_queue.setdefault(self.queue_of(key), []).append(key)
        for waiting in by_queue.values():
            waiting.reverse()  # popped from the end
        # A queue's key only grows within a cycle (it only gains gangs), so
        # a key found unchanged when popped is the least of all.
        turns = [(self.order_key(name), name) for name in by_queue]
        heapq.heapify(turns)
        while turns:
            key, name = heapq.heappop(turns)
            now = self.order_key(name)
            if now != key:
                heapq.heappush(turns, (now, name))
                continue
            yield by_queue[name].pop()
            if by_queue[name]:
                heapq.heappush(turns, (self.order_key(name), name))

    def order_key(self, name: str) -> tuple:
        """Queues by ``QUEUE_ORDER`` (queueing/order.py: below their
        guarantee first, then by weighted dominant share), then by name; a
        child ranks first by its parent's key."""
        own = self._rank(name)
        info = self.queues.get(name)
        return (self._rank(info.parent), own) if info is not None and info.parent in self.queues else (own, own)

    def share(self, name: str) -> float:
        info = self.queues.get(name, QueueInfo(name))
        return dominant_share(info, self.allocated(name), self.snapshot.cluster.total_allocatable)

    def allocated(self, name: str) -> Resources:
        return dict(self._usage.get(name, _Usage()).amounts)

    def holding_queues(self) -> Iterable[str]:
        """The queues that hold something (or held, this cycle)."""
        return self._usage.keys()

    def below_guarantee(self, name: str) -> bool:
        """The queue holds less than it is guaranteed of some resource."""
        info = self.queues.get(name, QueueInfo(name))
        held = self._usage.get(name, _Usage()).amounts
        return any(held.get(r, 0) < amount for r, amount in info.guaranteed().items() if amount > 0)

    def _rank(self, name: str) -> tuple:
        if name not in self._ranks:
            self._ranks[name] = queue_rank(self, name)
        return self._ranks[name]

    # -- counting -------------------------------------------------------------

    def _count_bound(self) -> None:
        """What every queue holds now, from the bound pods of our gangs:
        kept across cycles, each gang recounted only when its pods or its
        PodGroup changed (all of them when the Queues or the config did)."""
        cluster, groups = self.snapshot.cluster, self.snapshot.groups
        usage = cluster.kept(_KeptUsage)
        held, config = usage.held, (self.default, self.type_label)
        if held is None or held.config != config or held.queues != self.queues:
            held = usage.held = _Held(dict(self.queues), config)
        holding, stamps, kept_gangs = cluster.holding_gang_keys(), cluster.gang_stamps, held.gangs
        changed = held.changes.since_last(self.snapshot)
        if changed is None:  # every holding gang is checked (the first count, or the logs cannot tell)
            changed = [key for key in holding if (kept := kept_gangs.get(key)) is None or kept[0] != stamps[key]
                       or kept[1] is not groups.get(key)]
            changed += [key for key in kept_gangs if key not in holding]
        for key in changed:
            if key in kept_gangs:
                held.drop(key)
            if key not in holding:
                continue
            stamp, group = stamps[key], groups.get(key)
            pods = [p for p in (cluster.pods[u] for u in cluster.gang_uids(key))
                    if p.holds_resources and p.scheduler_name == cluster.scheduler_name]
            charged = self.charged(self.queue_of(key))
            amounts, kinds = summed(p.requests for p in pods), self._by_type((p, p.node_name) for p in pods)
            held.gangs[key] = (stamp, group, charged, amounts, kinds)
            for name in charged:
                held.totals.setdefault(name, _Usage()).add(amounts, kinds)
        held.changes.looked(self.snapshot)
        self._usage = dict(held.totals)  # shared until this cycle charges a queue (admit)

    def _by_type(self, placed: Iterable[tuple[PodInfo, str]]) -> dict[str, int]:
        """The GPUs of pods on nodes (pod, node name), by the nodes' GPU type."""
        nodes = self.snapshot.nodes
        kinds: dict[str, int] = {}
        for pod, node_name in placed:
            gpus = pod.requests.get(GPU_RESOURCE, 0)
            node = nodes.get(node_name)
            kind = node.labels.get(self.type_label) if node is not None else None
            if gpus and kind:
                kinds[kind] = kinds.get(kind, 0) + gpus
        return kinds

    def _placed(self, assignments: Sequence[Assignment]) -> tuple[Resources, dict[str, int]]:
        return (summed(a.pod.requests for a in assignments), self._by_type((a.pod, a.node_name) for a in assignments))

    def charged(self, name: str) -> list[str]:
        """The queues a gang of ``name`` counts against: it and its parent;
        one without a Queue object (the default queue) alone, for its share."""
        return [q.name for q in self._chain(name)] or [name]

    def _chain(self, name: str) -> list[QueueInfo]:
        """The queue and its parent, those that exist."""
        info = self.queues.get(name)
        if info is None:
            return []
        parent = self.queues.get(info.parent) if info.parent else None
        return [info] + ([parent] if parent is not None else [])

    def _headroom(self, chain: Sequence[QueueInfo]) -> Resources:
        """What the chain may still take of each resource it limits."""
        room: Resources = {}
        for queue in chain:
            held = self._usage.get(queue.name, _Usage()).amounts
            for resource, limit in queue.limits().items():
                room[resource] = min(room.get(resource, limit - held.get(resource, 0)), limit - held.get(resource, 0))
        return room

    def _excluded(self, chain: Sequence[QueueInfo], smallest: int) -> dict[str, str]:
        """Nodes of the GPU types the chain cannot take a pod's ``smallest``
        GPU request more of, with the reason a plan's failure counts."""
        excluded: dict[str, str] = {}
        for queue in chain:
            held = self._usage.get(queue.name, _Usage()).gpu_types
            for kind, quota in queue.gpu_types.items():
                if smallest and quota.limit is not None and quota.limit - held.get(kind, 0) < smallest:
                    why = (f"node(s) had {self.type_label}={kind}, where queue {queue.name} is at its limit "
                           f"({held.get(kind, 0)}/{quota.limit} {GPU_RESOURCE})")
                    excluded.update(dict.fromkeys(self._typed_nodes().get(kind, ()), why))
        return excluded

    def _typed_nodes(self) -> dict[str, list[str]]:
        if self._nodes_by_type is None:
            self._nodes_by_type = {}
            for node in self.snapshot.nodes.values():
                kind = node.labels.get(self.type_label)
                if kind:
                    self._nodes_by_type.setdefault(kind, []).append(node.name)
        return self._nodes_by_type


def summed(requests: Iterable[Mapping[str, int]]) -> Resources:
    """What ``requests`` ask together."""
    total: Resources = {}
    for request in requests:
        for name, amount in request.items():
            total[name] = total.get(name, 0) + amount
    return total


@dataclass
class _KeptUsage:
    """The cross-cycle cache of ``_count_bound`` (ClusterState.kept)."""

    held: _Held | None = None


@dataclass
class _Demands:
    """The cross-cycle cache of ``_demand``: gang key -> its pending pods' demand."""

    by_gang: dict[str, _GangDemand] = field(default_factory=dict)


class _GangDemand:
    """A gang's pending pods: what they ask together, their smallest GPU
    request, and their order smallest first by each set of limited resources."""

    def __init__(self, gang: Gang):
        self.gang = gang
        self.total = summed(p.requests for p in gang.pending)
        self.smallest_gpus = min((g for p in gang.pending if (g := p.requests.get(GPU_RESOURCE, 0))), default=0)
        self._ordered: dict[tuple[str, ...], tuple[list[PodInfo], Resources]] = {}

    def smallest_first(self, limited: tuple[str, ...]) -> list[PodInfo]:
        return self._by(limited)[0]

    def minimum(self, limited: tuple[str, ...]) -> Resources:
        """What the quorum asks at least: its ``need`` smallest pods."""
        return self._by(limited)[1]

    def _by(self, limited: tuple[str, ...]) -> tuple[list[PodInfo], Resources]:
        if limited not in self._ordered:
            ordered = sorted(self.gang.pending, key=lambda p: tuple(p.requests.get(r, 0) for r in limited))
            self._ordered[limited] = ordered, summed(p.requests for p in ordered[:self.gang.need])
        return self._ordered[limited]


def _within(ordered: Sequence[PodInfo], room: Mapping[str, int]) -> tuple[list[PodInfo], list[PodInfo]]:
    """As many of ``ordered`` as fit in ``room`` together, taken in order
    (those that do not fit are skipped), and the rest."""
    taken, rest, left = [], [], dict(room)
    for pod in ordered:
        asked = {r: a for r, a in pod.requests.items() if r in left}
        if res.shortfall(asked, left):
            rest.append(pod)
        else:
            taken.append(pod)
            left = res.subtract(left, asked)
    return taken, rest


def _amount(resource: str, amount: int) -> str:
    return res.format_amount(resource, amount)
