"""Fair share: what each queue is entitled to, and how far along it is (pure).

Two numbers, each over the resources in canonical units:

* ``dominant_share`` orders queues at admission (weighted DRF): a queue's
  allocation of each resource it holds, divided by the cluster's total of
  it and by the queue's weight for it; its share is the largest of those.
  Lowest share goes first.

* ``fair_shares`` says how much of each resource each queue deserves now
  (weighted max-min, for status and for reclaim): every queue first gets
  its demand up to ``guaranteed`` (all of them scaled down alike, should
  the guarantees add up to more than the cluster has), then what is left is
  split by weight among the queues that want more, none beyond its demand
  or its ``limit``, and what a queue cannot use goes to the others.  With
  two levels, the top-level queues divide the cluster and each parent's
  share is divided among its children the same way (a parent's demand is
  its children's, within its limit).

Fair shares are exact (Fractions): the tests compare them with hand-computed
cases.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Mapping

from batchsched.core.queues.model import QueueInfo
from batchsched.core.resources import Resources


def dominant_share(queue: QueueInfo, allocated: Mapping[str, int], total: Mapping[str, int]) -> float:
    """The queue's weighted dominant share: max over the resources it holds
    of allocated / (total * weight); 0 while it holds nothing.  (A float:
    it only orders queues, on every turn of a cycle.)"""
    return max((amount / (total[name] * queue.weight_of(name))
                for name, amount in allocated.items() if amount > 0 and total.get(name, 0) > 0), default=0.0)


@dataclass(frozen=True)
class Claimant:
    """One queue competing for one resource."""

    name: str
    demand: Fraction
    guaranteed: Fraction = Fraction(0)
    limit: Fraction | None = None
    weight: Fraction = Fraction(1)

    @property
    def cap(self) -> Fraction:
        return self.demand if self.limit is None else min(self.demand, self.limit)


def divide(capacity: Fraction, claimants: Iterable[Claimant]) -> dict[str, Fraction]:
    """Weighted max-min division of ``capacity`` (module docstring)."""
    claimants = list(claimants)
    given = {c.name: min(c.guaranteed, c.cap) for c in claimants}
    promised = sum(given.values(), Fraction(0))
    if promised > capacity:  # guarantees oversubscribed: all scaled down alike
        return {name: amount * capacity / promised for name, amount in given.items()}
    left = capacity - promised
    wanting = [c for c in claimants if c.cap > given[c.name]]
    while left > 0 and wanting:
        weights = sum((c.weight for c in wanting), Fraction(0))
        offer = {c.name: left * c.weight / weights for c in wanting}
        full = [c for c in wanting if c.cap - given[c.name] <= offer[c.name]]
        if not full:  # nobody is filled: the offer is the answer
            for c in wanting:
                given[c.name] += offer[c.name]
            return given
        for c in full:  # fill those it satisfies; the rest share what remains
            left -= c.cap - given[c.name]
            given[c.name] = c.cap
        wanting = [c for c in wanting if c not in full]
    return given


def fair_shares(queues: Mapping[str, QueueInfo], demand: Mapping[str, Resources],
                total: Mapping[str, int]) -> dict[str, dict[str, Fraction]]:
    """Each queue's fair share of each resource of ``total`` (queue name ->
    resource -> amount).  ``demand`` is what each queue holds plus what its
    waiting gangs ask; a queue named there but not in ``queues`` (the
    implicit default queue) counts as top-level with weight 1 and no quota.
    Children of a parent that is not in ``queues`` count as top-level."""
    names = set(queues) | set(demand)
    parent_of = {n: queues[n].parent for n in names if n in queues and queues[n].parent in queues}
    children: dict[str, list[str]] = {}
    for child, parent in parent_of.items():
        children.setdefault(parent, []).append(child)
    top = sorted(n for n in names if n not in parent_of)
    shares: dict[str, dict[str, Fraction]] = {n: {} for n in names}
    for resource, amount in total.items():
        def claimant(name: str) -> Claimant:
            info = queues.get(name, QueueInfo(name))
            quota = info.quotas.get(resource)
            wanted = (sum((claimant(c).cap for c in children[name]), Fraction(0)) if name in children
                      else Fraction(demand.get(name, {}).get(resource, 0)))
            return Claimant(name, wanted,
                            Fraction(quota.guaranteed) if quota and quota.guaranteed is not None else Fraction(0),
                            Fraction(quota.limit) if quota and quota.limit is not None else None,
                            Fraction(info.weight_of(resource)))

        for name, share in divide(Fraction(amount), [claimant(n) for n in top]).items():
            shares[name][resource] = share
            if name in children:
                for child, child_share in divide(share, [claimant(c) for c in sorted(children[name])]).items():
                    shares[child][resource] = child_share
    return shares
