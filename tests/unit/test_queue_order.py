"""Queue order as criteria in tables (core/queueing/order.py, issue 40): the
gang queue and the queues' turns follow what the tables say, and adding a
criterion is a line there."""
from __future__ import annotations

from batchsched.core.queueing import order
from batchsched.core.queueing.order import Criterion
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.queues.book import QueueBook
from tests.unit.helpers import node, snapshot
from tests.unit.test_queues import CONFIG, queue, with_queues


def filled() -> GangQueue:
    q = GangQueue()
    q.upsert("ns/old-low", priority=0, created=1, now=0)
    q.upsert("ns/new-high", priority=10, created=5, now=0)
    q.upsert("ns/half-bound", priority=0, created=9, now=0, partial=True, ahead=True)
    q.upsert("ns/b-new-high", priority=10, created=5, now=0)
    return q


def test_the_gang_queue_sorts_by_each_criterion_of_the_table_then_by_key():
    assert [c.name for c in order.GANG_ORDER] == ["partly-bound-first", "higher-priority-first", "older-first"]
    assert list(filled().ordered()) == ["ns/half-bound", "ns/b-new-high", "ns/new-high", "ns/old-low"]


def test_a_criterion_put_in_the_table_orders_the_gang_queue(monkeypatch):
    monkeypatch.setattr(order, "GANG_ORDER", (Criterion("lower-priority-first", lambda gang: gang.priority),))
    assert list(filled().ordered()) == ["ns/half-bound", "ns/old-low", "ns/b-new-high", "ns/new-high"]


def test_the_queues_turns_follow_their_table(monkeypatch):
    snap = with_queues(snapshot([node("n", gpu=8)]), queue("b", guaranteed=4), queue("a"))
    assert [c.name for c in order.QUEUE_ORDER] == ["below-guarantee-first", "lowest-weighted-dominant-share-first"]
    assert QueueBook(snap, CONFIG).order_key("b") < QueueBook(snap, CONFIG).order_key("a")  # b is below its guarantee
    monkeypatch.setattr(order, "QUEUE_ORDER", ())  # by name alone
    assert QueueBook(snap, CONFIG).order_key("a") < QueueBook(snap, CONFIG).order_key("b")
