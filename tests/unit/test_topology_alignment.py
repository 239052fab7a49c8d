"""Aligned GPU sets (docs/simulator.md): the best worst link a set of that
size reaches on the node, in no more NUMA nodes than the best such set."""
import pytest

from batchsched.core.topology.alignment import is_aligned
from batchsched.sim.cluster import builtin_topologies
from tests.unit.topology_support import fixture

DGX1 = fixture("dgx1-hybrid-cube-mesh-8gpu.txt")
PCIE = fixture("pcie-switch-pairs-8gpu.txt")
NVSWITCH = builtin_topologies()["dgx-a100"]


@pytest.mark.parametrize("topology, gpus, aligned", [
    (NVSWITCH, (0, 1), True),             # NV12, one socket
    (NVSWITCH, (0, 5), False),            # NV12 but two sockets, where one would do
    (NVSWITCH, (0, 1, 2, 3), True),
    (NVSWITCH, (2, 3, 4, 5), False),
    (NVSWITCH, tuple(range(8)), True),    # the whole board spans both sockets, as it must
    (DGX1, (0, 3), True),                 # NV2 within socket 0
    (DGX1, (0, 1), False),                # NV1 where NV2 pairs exist
    (DGX1, (0, 4), False),                # NV2 but across sockets
    (DGX1, (0, 1, 2, 3), True),           # a cube face: all NVLink, one socket
    (DGX1, (0, 1, 2, 4), False),          # has a SYS pair
    (PCIE, (0, 1), True),                 # PIX: one switch
    (PCIE, (0, 2), False),                # PHB
    (PCIE, (4, 5, 6, 7), True),           # the best 4-GPU set is PHB inside one socket
    (PCIE, (3,), True),                   # one GPU is always aligned
])
def test_aligned_sets(topology, gpus, aligned):
    assert is_aligned(topology, gpus) is aligned
