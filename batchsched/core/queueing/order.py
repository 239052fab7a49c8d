"""Queue order as criteria in tables: ``GANG_ORDER``, the gang queue's
order (queueing/queue.py), and ``QUEUE_ORDER``, which Queue's gang goes
next (queues/book.py ``in_turn``; docs/queues.md).  Each sorts by every
criterion of its table in turn, then by name (a gang's key, a queue's name),
so the order is total and the same in every process.  Adding a criterion is
one :class:`Criterion` and its line in a table, where it ranks against the
others."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Protocol, TypeVar


class Queued(Protocol):
    """What a criterion may read of a queued gang."""
    key: str
    priority: int
    created: float
    ahead: bool  # partly bound by us, quorum incomplete: its remainder goes first


class QueueShares(Protocol):
    """What a criterion may read of the queues (queues/book.py ``QueueBook``)."""

    def below_guarantee(self, name: str) -> bool: ...

    def share(self, name: str) -> float: ...


Item = TypeVar("Item", contravariant=True)


class Order(Protocol[Item]):
    """One criterion of an order: a lower rank goes first."""

    @property
    def name(self) -> str: ...

    def rank(self, item: Item) -> bool | int | float: ...


@dataclass(frozen=True)
class Criterion(Generic[Item]):
    """An :class:`Order` made of a function."""
    name: str
    ranked: Callable[[Item], bool | int | float]

    def rank(self, item: Item) -> bool | int | float:
        return self.ranked(item)


GANG_ORDER: tuple[Order[Queued], ...] = (
    Criterion("partly-bound-first", lambda gang: not gang.ahead),
    Criterion("higher-priority-first", lambda gang: -gang.priority),
    Criterion("older-first", lambda gang: gang.created),
)


# Ranked per queue as (QueueShares, queue name).
QUEUE_ORDER: tuple[Order[tuple[QueueShares, str]], ...] = (
    Criterion("below-guarantee-first", lambda of: not of[0].below_guarantee(of[1])),
    Criterion("lowest-weighted-dominant-share-first", lambda of: of[0].share(of[1])),
)


def order_key(gang: Queued) -> tuple:
    """Where ``gang`` sorts in the queue: its rank by each criterion, then its key (last)."""
    return (*(criterion.rank(gang) for criterion in GANG_ORDER), gang.key)


def queue_rank(queues: QueueShares, name: str) -> tuple:
    """Where queue ``name`` ranks: by each criterion, then its name (last)."""
    return (*(criterion.rank((queues, name)) for criterion in QUEUE_ORDER), name)
