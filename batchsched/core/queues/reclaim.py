"""Reclaim: a queue taking back room it lent (pure; docs/queues.md,
"Reclaim" and "Reclaim in progress").  Whether a gang's queue may reclaim
and from which queues (``reclaim_for``), and the reclaims in flight, seen
from the gang waiting (``awaited_reclaim``) and from each queue
(``reclaims_by_queue``), over one cycle's :class:`QueueBook`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from batchsched.core import resources as res
from batchsched.core.gangs import Gang
from batchsched.core.model import PodInfo
from batchsched.core.queues.book import QueueBook, summed
from batchsched.core.queues.model import QueueInfo
from batchsched.core.resources import Resources


@dataclass(frozen=True)
class Reclaim:
    """A queue taking back room it lent (docs/queues.md, "Reclaim"): from
    which queues, and how much each queue on their side of where they meet
    the reclaiming queue holds beyond its fair share."""

    queue: str
    excess: Mapping[str, Mapping[str, int]]  # queue on a victim's path -> resource -> beyond its fair share
    paths: Mapping[str, tuple[str, ...]]  # victim queue -> it, and its parent unless shared with ``queue``
    queue_of: Callable[[str], str]

    def __call__(self, gang_key: str) -> bool:
        """Whether a gang is one the reclaim may evict."""
        return self.queue_of(gang_key) in self.paths

    def beyond(self, victims: Iterable[PodInfo]) -> str:
        """Why evicting ``victims`` would take a queue (a victim's, or its
        parent with all its children's) below its fair share, or ""."""
        taken: dict[str, Resources] = {}
        for pod in victims:
            for name in self.paths[self.queue_of(pod.gang_key)]:
                taken[name] = res.add(taken.get(name, {}), pod.requests)
        for name, amounts in sorted(taken.items()):
            for resource, amount in sorted(amounts.items()):
                if resource in self.excess[name] and amount > self.excess[name][resource]:
                    return (f"reclaiming for queue {self.queue} would take {res.format_amount(resource, amount)} {resource} "
                            f"from queue {name}, which holds only {res.format_amount(resource, self.excess[name][resource])} "
                            "beyond its fair share; nothing was evicted")
        return ""


@dataclass(frozen=True)
class ReclaimFlow:
    """Room going from one queue to another in a reclaim in flight: pods of
    the queue reclaimed from, terminating on nodes that pods of the
    reclaiming queue are nominated to (docs/queues.md, "Reclaim in progress")."""

    queue: str  # the other queue: the one reclaimed from, or the one reclaiming
    gangs: int  # victim gangs with pods still terminating
    pods: int
    amounts: Resources  # what those pods hold
    since: float  # the earliest of their deletions (unix seconds; 0: not known)

    @classmethod
    def of(cls, queue: str, victims: Iterable[PodInfo]) -> ReclaimFlow:
        victims = list(victims)
        return cls(queue, len({p.gang_key for p in victims}), len(victims), summed(p.requests for p in victims),
                   min((p.deleted for p in victims if p.deleted), default=0.0))

    def said(self) -> str:
        return f"{self.queue} ({self.gangs} gang{'s' if self.gangs != 1 else ''})"

    def data(self) -> dict:
        """As Queue status and ``explain -o json`` show it."""
        return {"queue": self.queue, "gangs": self.gangs, "pods": self.pods,
                "resources": {r: res.format_amount(r, a) for r, a in sorted(self.amounts.items())}}


def flows_said(flows: Iterable[ReclaimFlow]) -> str:
    """``team-b (3 gangs), team-c (1 gang)``."""
    return ", ".join(flow.said() for flow in flows)


def reclaim_for(book: QueueBook, gang: Gang) -> Reclaim | None:
    """Whether the gang's queue may take back room lent to others, and
    from which queues.  Another queue is compared with the gang's where
    their chains meet (their lowest common ancestor: a shared parent, or
    the cluster): each queue on its side up to there (it, and its parent
    unless that is shared) must be reclaimable and hold more than its
    fair share of what the gang asks, not counting what it already has
    terminating (so reclaims in flight are not repeated while their
    victims go); each queue on the gang's side up to there must stay
    within its fair share with the gang's minimum placed.  Above where
    they meet nothing moves, so nothing there is compared, and room
    never goes back and forth between two subtrees (docs/queues.md,
    "Reclaim")."""
    if not book.active:
        return None
    name = book.queue_of(gang.key)
    chain = book.charged(name)
    over = book.beyond_share(gang)
    if name in over:
        return None
    minimum = book.minimum(gang)
    fair = book.fair_share_by_queue()
    going = book.in_flight()[0]

    def beyond_share(queue: str) -> dict[str, int]:
        # only what it holds beyond its share binds: below it in a resource
        # nobody contends for (its share is its demand) it would get it back at once
        held = book.allocated(queue)
        return {r: more for r in minimum if minimum[r] and
                (more := held.get(r, 0) - going.get(queue, {}).get(r, 0)
                 - math.ceil(fair.get(queue, {}).get(r, 0))) > 0}

    excess: dict[str, dict[str, int]] = {}
    paths: dict[str, tuple[str, ...]] = {}
    for other in book.holding_queues():
        if other in chain or other in book.parents:
            continue
        theirs = book.charged(other)
        if any(queue in over for queue in chain if queue not in theirs):
            continue  # the gang's parent would go beyond its share taking from another subtree
        path = tuple(queue for queue in theirs if queue not in chain)
        if not all(book.queues.get(queue, QueueInfo(queue)).reclaimable for queue in path):
            continue
        beyond = {queue: beyond_share(queue) for queue in path}
        if any(all(r in amounts for amounts in beyond.values()) for r in beyond[other]):
            paths[other] = path
            excess.update(beyond)
    return Reclaim(name, excess, paths, book.queue_of) if paths else None


def awaited_reclaim(book: QueueBook, gang_key: str) -> list[ReclaimFlow]:
    """The reclaims in flight the gang waits for, by the queue reclaimed
    from (none without Queue objects)."""
    return [ReclaimFlow.of(other, pods.values())
            for other, pods in sorted(_in_flight_by_gang(book).get(gang_key, {}).items())]


def reclaims_by_queue(book: QueueBook) -> tuple[dict[str, list[ReclaimFlow]], dict[str, list[ReclaimFlow]], dict[str, int]]:
    """The reclaims in flight seen from each side: per reclaiming queue,
    the queues it takes from; per queue reclaimed from, the queues taking
    from it; and per reclaiming queue, how many of its gangs wait."""
    victims: dict[tuple[str, str], dict[str, PodInfo]] = {}  # (reclaiming, reclaimed from) -> uid -> pod
    waiting: dict[str, int] = {}
    for gang_key, by_queue in _in_flight_by_gang(book).items():
        name = book.queue_of(gang_key)
        waiting[name] = waiting.get(name, 0) + 1
        for other, pods in by_queue.items():
            victims.setdefault((name, other), {}).update(pods)
    taking: dict[str, list[ReclaimFlow]] = {}
    giving: dict[str, list[ReclaimFlow]] = {}
    for (name, other), pods in sorted(victims.items()):
        taking.setdefault(name, []).append(ReclaimFlow.of(other, pods.values()))
        giving.setdefault(other, []).append(ReclaimFlow.of(name, pods.values()))
    return taking, giving, waiting


def _in_flight_by_gang(book: QueueBook) -> dict[str, dict[str, dict[str, PodInfo]]]:
    """Per gang with pods nominated to nodes, per other queue, that
    queue's pods terminating on those nodes (uid -> pod): the room the
    gang waits for, taken from another queue.  Once a cycle."""
    if book.reclaims_in_flight is None:
        book.reclaims_in_flight = {}
        cluster = book.snapshot.cluster
        terminating_on: dict[str, list[PodInfo]] = {}
        if book.active:
            for pod in cluster.terminating_pods():
                if pod.scheduler_name == cluster.scheduler_name:
                    terminating_on.setdefault(pod.node_name, []).append(pod)
        for pod in cluster.nominated_pods() if terminating_on else ():
            own = book.charged(book.queue_of(pod.gang_key))
            for victim in terminating_on.get(pod.nominated_node, ()):
                other = book.queue_of(victim.gang_key)
                if other not in own:
                    by_queue = book.reclaims_in_flight.setdefault(pod.gang_key, {})
                    by_queue.setdefault(other, {})[victim.uid] = victim
    return book.reclaims_in_flight
