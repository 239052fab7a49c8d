"""GPU figures per node pool (batchsched_gpus_* metrics), kept across scrapes."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from batchsched.config import SchedulerConfig
from batchsched.core.cluster import ClusterState
from batchsched.core.gpu_pools import NO_POOL, GpuPoolTally, PoolGpus
from batchsched.shell.scheduler import Scheduler
from tests.unit.helpers import node, pod

POOL = "pool"


def gpu_pools(nodes, pods=(), pool_label=POOL, whole_pod_gpus=8) -> dict[str, PoolGpus]:
    """The figures of a cluster read once, from scratch."""
    return GpuPoolTally(pool_label, whole_pod_gpus).read(ClusterState("batchsched", nodes, pods))


def test_free_gpus_not_a_whole_node_pod_are_stranded_per_pool():
    nodes = [node("a1", gpu=8, labels={POOL: "a"}), node("a2", gpu=8, labels={POOL: "a"}),
             node("b1", gpu=16, labels={POOL: "b"}), node("cpu", gpu=0, labels={POOL: "a"})]
    pods = [pod("x", gpu=3, node_name="a1"),            # a1: 5 free, none usable by an 8-GPU pod
            pod("y", gpu=6, node_name="b1"),            # b1: 10 free, 8 usable, 2 stranded
            pod("done", gpu=8, node_name="a2", phase="Succeeded"),  # terminal: holds nothing
            pod("waiting", gpu=8)]                      # unbound: holds nothing
    assert gpu_pools(nodes, pods) == {
        "a": PoolGpus(allocated=3, free=13, stranded=5),
        "b": PoolGpus(allocated=6, free=10, stranded=2),
    }


def test_every_free_gpu_of_a_node_taking_no_pods_is_stranded():
    nodes = [node("cordoned", gpu=8, unschedulable=True), node("down", gpu=8, ready=False),
             node("ok", gpu=8)]
    assert gpu_pools(nodes) == {NO_POOL: PoolGpus(allocated=0, free=24, stranded=16)}


def test_whole_pod_size_is_a_parameter():
    pools = gpu_pools([node("n", gpu=8, labels={POOL: "p"})], [pod("x", gpu=2, node_name="n")],
                      whole_pod_gpus=4)
    assert pools == {"p": PoolGpus(allocated=2, free=6, stranded=2)}


def test_on_a_node_smaller_than_a_whole_node_pod_its_whole_free_set_is_usable():
    nodes = [node("four", gpu=4, labels={POOL: "s"}), node("two", gpu=2, labels={POOL: "s"})]
    pods = [pod("x", gpu=1, node_name="four")]  # four: 3 free of 4, stranded; two: both free, usable
    assert gpu_pools(nodes, pods) == {"s": PoolGpus(allocated=1, free=5, stranded=3)}


NODE_NAMES = ("n0", "n1", "n2", "n3")
changes = st.lists(st.one_of(
    st.tuples(st.just("put_node"), st.sampled_from(NODE_NAMES), st.sampled_from((0, 2, 4, 8, 16)),
              st.sampled_from(("a", "b", None)), st.booleans()),
    st.tuples(st.just("remove_node"), st.sampled_from(NODE_NAMES)),
    st.tuples(st.just("put_pod"), st.integers(0, 5), st.sampled_from(NODE_NAMES + ("",)),
              st.integers(1, 8), st.sampled_from(("Running", "Succeeded"))),
    st.tuples(st.just("remove_pod"), st.integers(0, 5)),
    st.tuples(st.just("read"),),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(changes)
def test_a_tally_kept_across_changes_reads_what_a_fresh_count_reads(steps):
    cluster, kept = ClusterState("batchsched"), GpuPoolTally(POOL)
    for step in steps:
        kind, *args = step
        if kind == "put_node":
            name, gpus, pool, cordoned = args
            cluster.put_node(node(name, gpu=gpus, labels={POOL: pool} if pool else {}, unschedulable=cordoned))
        elif kind == "remove_node":
            cluster.remove_node(args[0])
        elif kind == "put_pod":
            number, on, gpus, phase = args
            cluster.put_pod(pod(f"p{number}", gpu=gpus, node_name=on or None, phase=phase))
        elif kind == "remove_pod":
            cluster.remove_pod(pod(f"p{args[0]}").uid)
        else:
            assert kept.read(cluster) == GpuPoolTally(POOL).read(cluster)
    assert kept.read(cluster) == GpuPoolTally(POOL).read(cluster)


def test_a_metrics_scrape_derives_only_the_nodes_changed_since_the_last_scrape():
    scheduler = Scheduler(None, SchedulerConfig(nodePoolLabel=POOL))  # no API call is made here
    cluster = scheduler.cache.state
    for i in range(100):
        cluster.put_node(node(f"n{i}", gpu=8, labels={POOL: "p"}))
    derived = []
    free = cluster.free
    cluster.free = lambda name: derived.append(name) or free(name)  # type: ignore[method-assign]
    assert 'batchsched_gpus_free{pool="p"} 800.0' in scheduler.metrics.exposition().decode()
    derived.clear()
    assert 'batchsched_gpus_free{pool="p"} 800.0' in scheduler.metrics.exposition().decode()
    assert derived == []
    cluster.put_pod(pod("x", gpu=3, node_name="n7"))
    text = scheduler.metrics.exposition().decode()
    assert 'batchsched_gpus_free{pool="p"} 797.0' in text and 'batchsched_gpus_stranded{pool="p"} 5.0' in text
    assert derived == ["n7"]
