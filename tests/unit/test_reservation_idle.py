"""What a reservation costs: the GPUs it keeps idle (batchsched.core.queueing.idle;
docs/queueing.md, "What a reservation costs")."""
import pytest

from batchsched.core.queueing.idle import idle_on, idle_reserved_gpus
from batchsched.core.queueing.queue import Reservation
from tests.unit.helpers import gang_pods, group, node, pod, snapshot


def cluster(*pending):
    """gpu-0 and gpu-1 with 4 GPUs free each, gpu-2 with 8; the reserving
    gang ``hold`` waits with two 4-GPU pods."""
    bound = [pod(f"busy-{i}", gpu=4, node_name=f"gpu-{i}", phase="Running") for i in range(2)]
    pods = bound + gang_pods("hold", 2, gpu=4) + list(pending)
    return snapshot([node(f"gpu-{i}", gpu=8) for i in range(3)], pods, [group("hold", min_member=2)]).cluster


HELD = Reservation("default/hold", frozenset({"gpu-0", "gpu-1"}))


@pytest.mark.parametrize("pending, idle", [
    ((), 0),  # only the holder waits: its own room is not a cost
    ((pod("small", gpu=4),), 8),  # it could use either node: both nodes' free GPUs count
    ((pod("big", gpu=5),), 0),  # more than is free on any one of them
    ((pod("cpu-only", cpu="1"),), 0),
    ((pod("other", gpu=2, scheduler="default-scheduler"),), 0),  # not ours to place
    ((pod("gone", gpu=2, node_name="gpu-2", phase="Running"),), 0),  # bound elsewhere
])
def test_the_free_gpus_on_reserved_nodes_count_while_another_gang_could_use_them(pending, idle):
    assert idle_on(cluster(*pending), HELD) == idle


def test_no_reservation_idles_nothing_and_a_node_gone_counts_nothing():
    assert idle_on(cluster(pod("small", gpu=4)), None) == 0
    moved = Reservation("default/hold", frozenset({"gpu-0", "gone"}))
    assert idle_on(cluster(pod("small", gpu=4)), moved) == 4


def test_the_holders_own_pending_pods_are_not_counted_as_waiting_for_the_room():
    """Its pods ask 4 GPUs, as does another gang's pod: one of the two
    counted for 4 is the other's."""
    c = cluster(pod("same-size", gpu=4))
    assert c.pending_gpu_asks[4] == 3
    assert idle_on(c, HELD) == 8
    assert idle_on(cluster(), HELD) == 0


def test_idle_reserved_gpus_reads_the_asks_only_while_there_is_room():
    def asks():
        raise AssertionError("read")
        yield  # pragma: no cover
    assert idle_reserved_gpus([0, 0], asks()) == 0
    assert idle_reserved_gpus([], asks()) == 0
    assert idle_reserved_gpus([1, 3], iter([4, 3])) == 4


def test_the_scheduler_adds_up_what_each_cycle_idled_over_monotonic_time():
    from batchsched.config import SchedulerConfig
    from batchsched.shell.scheduler import Scheduler
    from tests.support.metrics import sample
    scheduler = Scheduler(kube=None, config=SchedulerConfig())  # type: ignore[arg-type]  # nothing is sent

    def metrics():
        text = scheduler.metrics.exposition().decode()
        return tuple(sample(text, name) for name in ("batchsched_reserved_nodes", "batchsched_reservation_idle_gpus",
                                                     "batchsched_reservation_idle_gpu_seconds_total"))

    waiting = cluster(pod("small", gpu=4))
    scheduler._count_reserved_idle(waiting, HELD, at=100.0)
    assert metrics() == (2, 8, 0)  # nothing counted before the first cycle
    scheduler._count_reserved_idle(waiting, HELD, at=102.5)
    assert metrics() == (2, 8, 20)
    scheduler._count_reserved_idle(cluster(), HELD, at=103.0)  # the other gang's pod is gone
    assert metrics() == (2, 0, 24)
    scheduler._count_reserved_idle(waiting, None, at=110.0)
    assert metrics() == (0, 0, 24)
