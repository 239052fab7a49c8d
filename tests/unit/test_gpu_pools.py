from batchsched.core.gpu_pools import NO_POOL, PoolGpus, gpu_pools
from tests.unit.helpers import node, pod, snapshot

POOL = "pool"


def test_free_gpus_not_a_whole_node_pod_are_stranded_per_pool():
    nodes = [node("a1", gpu=8, labels={POOL: "a"}), node("a2", gpu=8, labels={POOL: "a"}),
             node("b1", gpu=16, labels={POOL: "b"}), node("cpu", gpu=0, labels={POOL: "a"})]
    pods = [pod("x", gpu=3, node_name="a1"),            # a1: 5 free, none usable by an 8-GPU pod
            pod("y", gpu=6, node_name="b1"),            # b1: 10 free, 8 usable, 2 stranded
            pod("done", gpu=8, node_name="a2", phase="Succeeded"),  # terminal: holds nothing
            pod("waiting", gpu=8)]                      # unbound: holds nothing
    assert gpu_pools(snapshot(nodes, pods), POOL) == {
        "a": PoolGpus(allocated=3, free=13, stranded=5),
        "b": PoolGpus(allocated=6, free=10, stranded=2),
    }


def test_every_free_gpu_of_a_node_taking_no_pods_is_stranded():
    nodes = [node("cordoned", gpu=8, unschedulable=True), node("down", gpu=8, ready=False),
             node("ok", gpu=8)]
    assert gpu_pools(snapshot(nodes), POOL) == {NO_POOL: PoolGpus(allocated=0, free=24, stranded=16)}


def test_whole_pod_size_is_a_parameter():
    pools = gpu_pools(snapshot([node("n", gpu=8, labels={POOL: "p"})], [pod("x", gpu=2, node_name="n")]),
                      POOL, whole_pod_gpus=4)
    assert pools == {"p": PoolGpus(allocated=2, free=6, stranded=2)}


def test_on_a_node_smaller_than_a_whole_node_pod_its_whole_free_set_is_usable():
    nodes = [node("four", gpu=4, labels={POOL: "s"}), node("two", gpu=2, labels={POOL: "s"})]
    pods = [pod("x", gpu=1, node_name="four")]  # four: 3 free of 4, stranded; two: both free, usable
    assert gpu_pools(snapshot(nodes, pods), POOL) == {"s": PoolGpus(allocated=1, free=5, stranded=3)}
