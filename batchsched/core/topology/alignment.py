"""Whether a pod's GPUs form an *aligned* set (docs/simulator.md, docs/metrics.md).

A set of two or more GPUs on a node is aligned when it is as good as the
node's topology allows for a set of its size, by the chooser's first and
third criteria (docs/topology.md, "Choosing GPUs on a node"):

* its worst link is the best worst link any set of that size reaches on the
  empty node (so all NVLink wherever an all-NVLink set of that size exists);
* it spans no more NUMA nodes than the chooser's best set of that size.

Aggregate bandwidth (the second criterion) is left out on purpose: it only
ranks sets that are already equally well linked, so two sets that both
avoid every weaker link count as aligned.  A set of one GPU is always aligned.
"""
from __future__ import annotations

from typing import Collection

from batchsched.core.topology.choose import choose_gpus, evaluate
from batchsched.core.topology.model import GpuTopology


def is_aligned(topology: GpuTopology, gpus: Collection[int]) -> bool:
    """``gpus`` (valid indices of ``topology``) form an aligned set."""
    k = len(gpus)
    if k < 2:
        return True
    every_gpu = (1 << len(topology)) - 1
    ideal = choose_gpus(topology, every_gpu, k)  # cached per (topology, k)
    if ideal is None:
        return False  # more GPUs than the topology has: nothing to compare with
    chosen = evaluate(topology, gpus, every_gpu)
    return chosen.worst >= ideal.worst and chosen.numa_nodes <= ideal.numa_nodes
