"""Each queue at a glance, for its status, the metrics and ``explain`` (pure)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping, Sequence

from batchsched.core import resources as res
from batchsched.core.config import CoreConfig
from batchsched.core.gangs import GangIndex
from batchsched.core.queues.book import QueueBook, summed
from batchsched.core.queues.reclaim import ReclaimFlow, flows_said, reclaims_by_queue
from batchsched.core.queues.share import fair_shares
from batchsched.core.resources import Resources
from batchsched.core.snapshot import Snapshot
from batchsched.core.text import clip

MESSAGE_LIMIT = 1024  # a reclaim's message in status (crds/queue.yaml allows 4096)


@dataclass(frozen=True)
class QueueSummary:
    name: str
    allocated: Resources  # what its gangs' bound pods hold (a parent: its children's)
    guaranteed: Resources
    fair_share: Resources  # weighted max-min over what it holds and its waiting gangs ask (rounded down)
    borrowed: Resources  # allocated beyond guaranteed, of the resources its spec names
    pending_gangs: int  # gangs with pods waiting to be placed
    running_gangs: int  # gangs with pods bound
    # Reclaims in flight (a queue without children): the queues it takes
    # from, and how many of its gangs wait for them; the queues taking from it.
    reclaiming: tuple[ReclaimFlow, ...] = ()
    waiting_for_reclaim: int = 0
    reclaimed_by: tuple[ReclaimFlow, ...] = ()

    def status(self) -> dict:
        """Its Queue's status (crds/queue.yaml), quantities as the API writes
        them; ``reclaim`` and ``reclaimedBy`` only while a reclaim is in flight."""
        status = {"allocated": _quantities(self.allocated), "guaranteed": _quantities(self.guaranteed),
                  "fairShare": _quantities(self.fair_share), "borrowed": _quantities(self.borrowed),
                  "pendingGangs": self.pending_gangs, "runningGangs": self.running_gangs}
        if self.reclaiming:
            status["reclaim"] = {"message": clip(f"from {flows_said(self.reclaiming)}", MESSAGE_LIMIT),
                                 "waitingGangs": self.waiting_for_reclaim, **_since(self.reclaiming),
                                 "from": [f.data() for f in self.reclaiming]}
        if self.reclaimed_by:
            status["reclaimedBy"] = {"message": clip(f"by {flows_said(self.reclaimed_by)}", MESSAGE_LIMIT), **_since(self.reclaimed_by),
                                     "to": [f.data() for f in self.reclaimed_by]}
        return status


def summarize(snapshot: Snapshot, config: CoreConfig) -> dict[str, QueueSummary]:
    """Every Queue object's summary, and the default queue's when gangs are
    in it without one; a parent counts its children's gangs."""
    book = QueueBook(snapshot, config)
    gangs = GangIndex(snapshot)
    cluster = snapshot.cluster
    pending: dict[str, int] = {}
    running: dict[str, int] = {}
    demand: dict[str, Resources] = {}
    for gang in gangs.pending():
        name = book.queue_of(gang.key)
        pending[name] = pending.get(name, 0) + 1
        demand[name] = res.add(demand.get(name, {}), summed(p.requests for p in gang.pending))
    for key in cluster.holding_gang_keys():
        name = book.queue_of(key)
        running[name] = running.get(name, 0) + 1
    names = set(snapshot.queues) | set(pending) | set(running)
    names = {n for n in names if n in snapshot.queues or n == config.default_queue}
    for name in names:
        demand[name] = res.add(demand.get(name, {}), book.allocated(name))
    shares = fair_shares(snapshot.queues, {n: d for n, d in demand.items() if n in names},
                         cluster.total_allocatable)
    taking, giving, waiting = reclaims_by_queue(book)
    children = {q.name: q.parent for q in snapshot.queues.values() if q.parent in snapshot.queues}
    for child, parent in children.items():  # a parent's gangs are its children's
        pending[parent] = pending.get(parent, 0) + pending.get(child, 0)
        running[parent] = running.get(parent, 0) + running.get(child, 0)
    summaries = {}
    for name in sorted(names):
        info = snapshot.queues.get(name)
        guaranteed = info.guaranteed() if info is not None else {}
        allocated = {r: a for r, a in book.allocated(name).items() if a}
        summaries[name] = QueueSummary(
            name, allocated, guaranteed,
            {r: math.floor(s) for r, s in shares.get(name, {}).items() if s},
            {r: a - guaranteed.get(r, 0) for r, a in allocated.items()
             if info is not None and r in info.quotas and a > guaranteed.get(r, 0)},
            pending.get(name, 0), running.get(name, 0),
            tuple(taking.get(name, ())), waiting.get(name, 0), tuple(giving.get(name, ())))
    return summaries


def _since(flows: Sequence[ReclaimFlow]) -> dict[str, str]:
    """``since``: the earliest deletion among the flows' pods, when known."""
    since = min((f.since for f in flows if f.since), default=0.0)
    return {"since": datetime.fromtimestamp(since, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")} if since else {}


def _quantities(amounts: Mapping[str, int]) -> dict[str, str]:
    return {name: res.format_amount(name, amount) for name, amount in sorted(amounts.items())}
