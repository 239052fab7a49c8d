from batchsched.core.config import CoreConfig
from batchsched.core.queueing.queue import GangQueue, Reservation


def make_queue(**kwargs) -> GangQueue:
    return GangQueue(**{"initial_backoff": 1.0, "max_backoff": 8.0, "reservation_after_seconds": 60.0, **kwargs})


def test_order_is_priority_then_creation_then_key():
    q = make_queue()
    q.upsert("ns/old-low", priority=0, created=1, now=0)
    q.upsert("ns/b-high", priority=10, created=5, now=0)
    q.upsert("ns/a-high", priority=10, created=5, now=0)
    q.upsert("ns/new-low", priority=0, created=2, now=0)
    assert list(q.ordered()) == ["ns/a-high", "ns/b-high", "ns/old-low", "ns/new-low"]


def test_a_gang_partially_bound_by_us_comes_before_every_other():
    q = make_queue()
    q.upsert("ns/high", priority=100, created=1, now=0)
    q.upsert("ns/half-bound", priority=0, created=9, now=0, partial=True, ahead=True)
    assert list(q.ordered()) == ["ns/half-bound", "ns/high"]
    # partly bound by nobody proven to be us: its start-over clock runs, no precedence
    q.upsert("ns/half-bound", priority=0, created=9, now=0, partial=True, ahead=False)
    assert list(q.ordered()) == ["ns/high", "ns/half-bound"]


def test_priority_change_reorders():
    q = make_queue()
    q.upsert("a", 0, 1, 0)
    q.upsert("b", 0, 2, 0)
    q.upsert("b", 5, 2, 0)
    assert list(q.ordered()) == ["b", "a"]


def test_backoff_doubles_up_to_the_maximum():
    q = make_queue()
    q.upsert("g", 0, 0, now=0)
    assert [q.record_failure("g", now=100) for _ in range(6)] == [1, 2, 4, 8, 8, 8]
    assert not q.ready("g", 107.9)
    assert q.ready("g", 108)
    assert q.next_retry_at() == 108


def test_success_touch_and_freed_capacity_reset_the_backoff():
    q = make_queue()
    def capacity_freed_that_helps():
        q.capacity_freed()
        q.retry_if_freed(lambda key: True, lambda key: True)

    for reset in (lambda: q.record_success("g"), lambda: q.touch("g"), capacity_freed_that_helps):
        q.upsert("g", 0, 0, now=0)
        q.record_failure("g", now=0)
        q.record_failure("g", now=0)
        assert not q.ready("g", 1)
        reset()
        assert q.ready("g", 1)
        assert q.record_failure("g", now=1) == 1  # starts over from the initial backoff
        q.remove("g")


def test_a_changed_signature_counts_as_a_touch():
    q = make_queue()
    q.upsert("g", 0, 0, now=0, signature=("gen1",))
    q.record_failure("g", now=0)
    q.upsert("g", 0, 0, now=0.5, signature=("gen1",))
    assert not q.ready("g", 0.5)
    q.upsert("g", 0, 0, now=0.5, signature=("gen2",))
    assert q.ready("g", 0.5)


def test_timed_out_gangs_wait_for_a_touch_which_restarts_their_clock():
    q = make_queue()
    q.upsert("g", 0, 0, now=10)
    assert q.waited("g", 40) == 30
    q.time_out("g")
    assert q.timed_out("g") and not q.ready("g", 1000)
    q.capacity_freed()
    assert q.timed_out("g")  # capacity alone does not revive it
    q.touch("g")
    assert q.ready("g", 1000)
    q.upsert("g", 0, 0, now=1000)
    assert q.waited("g", 1005) == 5


def test_waiting_since_can_come_from_the_shell():
    q = make_queue()
    q.set_waiting_since("g", 3)
    q.upsert("g", 0, 0, now=50)
    assert q.waited("g", 50) == 47
    q.set_waiting_since("g", 1)
    assert q.waited("g", 50) == 49


def test_reservation_candidates_are_long_waiting_gangs_in_order():
    q = make_queue(reservation_after_seconds=60)
    q.upsert("low", 0, 0, now=0)
    q.upsert("high", 5, 0, now=30)
    q.upsert("new", 9, 0, now=80)
    assert list(q.reservation_candidates(now=70)) == ["low"]
    assert list(q.reservation_candidates(now=100)) == ["high", "low"]
    q.mark_hopeless("high")
    assert list(q.reservation_candidates(now=100)) == ["low"]
    q.capacity_freed()
    q.retry_if_freed(lambda key: True, lambda key: False)  # freed room it could not use even drained
    assert list(q.reservation_candidates(now=100)) == ["low"]
    q.capacity_freed()
    q.retry_if_freed(lambda key: True, lambda key: key == "high")
    assert list(q.reservation_candidates(now=100)) == ["high", "low"]


def test_a_reservation_binds_only_gangs_ordered_after_its_holder():
    q = make_queue()
    q.upsert("first", 9, 0, now=0)
    q.upsert("holder", 5, 0, now=0)
    q.upsert("later", 5, 1, now=0)
    q.reserve("holder", {"n1", "n2"}, now=0)
    assert q.reservation == Reservation("holder", frozenset({"n1", "n2"}))
    assert q.reserved_against("first") == frozenset()
    assert q.reserved_against("holder") == frozenset()
    assert q.reserved_against("later") == {"n1", "n2"}
    assert q.reserved_against("unknown") == {"n1", "n2"}


def test_the_reservation_ends_when_its_holder_succeeds_leaves_or_gives_up():
    q = make_queue()
    for end in (lambda: q.record_success("h"), lambda: q.remove("h"),
                lambda: q.time_out("h"), lambda: q.mark_hopeless("h")):
        q.upsert("h", 0, 0, now=0)
        q.reserve("h", {"n"}, now=0)
        end()
        assert q.reservation is None
        q.remove("h")


def test_sync_drops_gangs_that_left():
    class G:
        def __init__(self, key):
            self.key, self.priority, self.created, self.signature = key, 0, 0.0, None
            self.partly_bound = self.first_in_line = False

    q = make_queue()
    q.sync([G("a"), G("b")], now=0)
    q.reserve("b", {"n"}, now=0)
    q.sync([G("a")], now=1)
    assert list(q.ordered()) == ["a"] and "b" not in q and len(q) == 1
    assert q.reservation is None


def test_from_config():
    q = GangQueue.from_config(CoreConfig(initial_backoff=2, max_backoff=30, reservation_after_seconds=5))
    assert (q.initial_backoff, q.max_backoff, q.reservation_after_seconds) == (2, 30, 5)


def test_attempts_go_on_where_the_budget_stopped_and_each_gang_gets_one_per_pass():
    q = make_queue()
    for i, key in enumerate("abcde"):
        q.upsert(key, 0, i, now=0)
    assert list(q.attempts(now=0, budget=2)) == ["a", "b"]
    assert q.next_retry_at() == 0  # the pass is unfinished: the next cycle comes at once
    q.upsert("new", 9, 0, now=1)  # ahead of where the pass goes on, and new to it: tried first
    assert list(q.attempts(now=1, budget=2)) == ["new", "c"]
    assert list(q.attempts(now=2, budget=2)) == ["d", "e"]
    # the pass is done, and the gangs it had tried are ready: the next pass comes at once
    assert q.next_retry_at() == 2
    assert list(q.attempts(now=3, budget=10)) == ["new", "a", "b", "c", "d", "e"]
    assert q.next_retry_at() is None  # a whole pass in one cycle: nothing skipped, nothing waits


def test_new_gangs_ahead_of_the_pass_never_make_it_try_a_gang_twice():
    q = make_queue()
    for i, key in enumerate("CDEF"):
        q.upsert(key, 0, i, now=0)
    assert list(q.attempts(now=0, budget=2)) == ["C", "D"]
    for i, key in enumerate("abc"):
        q.upsert(key, 9, i, now=1)  # higher priority: ahead of everything
    seen = list(q.attempts(now=1, budget=2)) + list(q.attempts(now=2, budget=2)) + list(q.attempts(now=3, budget=2))
    assert sorted(seen) == ["E", "F", "a", "b", "c"]  # each once in the pass, C and D not again


def test_a_wake_by_freed_capacity_can_be_undone_until_the_gang_is_tried():
    q = make_queue()
    for key in ("a", "b", "c"):
        q.upsert(key, 0, 0, now=0)
        for t in (0, 1, 3):
            q.record_failure(key, now=t)  # third failure at 3: ready again at 7
    q.capacity_freed()
    q.retry_if_freed(lambda key: True, lambda key: True)
    assert all(q.ready(key, 4) and q.woken_by_freed(key, 4) for key in "abc")
    assert not q.woken_by_freed("a", 7)  # its backoff would have ended by then anyway
    q.resume_backoff("a")
    assert not q.ready("a", 6.9) and q.ready("a", 7) and not q.woken_by_freed("a", 4)
    q.record_failure("a", now=7)
    assert q.ready("a", 15) and not q.ready("a", 14.9)  # the fourth failure: the count was kept
    q.record_failure("b", now=4)  # tried and failed: the wake is spent, its count starts over
    q.resume_backoff("b")
    assert q.ready("b", 5) and not q.ready("b", 4.9)
    q.touch("c")
    assert not q.woken_by_freed("c", 4)


def test_freed_capacity_ends_only_the_backoffs_it_may_help():
    q = make_queue()
    for key in ("helped", "not-helped"):
        q.upsert(key, 0, 0, now=0)
        q.record_failure(key, now=0)
    q.retry_if_freed(lambda key: True, lambda key: True)
    assert not q.ready("helped", 0.5)  # nothing was freed
    q.capacity_freed()
    q.retry_if_freed(lambda key: key == "helped", lambda key: True)
    assert q.ready("helped", 0.5) and not q.ready("not-helped", 0.5)
