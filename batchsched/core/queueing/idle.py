"""GPUs a reservation keeps idle while its nodes drain: what it costs the
gangs kept off them (docs/queueing.md, "What a reservation costs").  The
simulator adds it up as reservation idle GPU-hours, the scheduler exports
it as metrics; both count it here."""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterable

from batchsched.api.constants import GPU_RESOURCE

if TYPE_CHECKING:
    from batchsched.core.cluster import ClusterState
    from batchsched.core.queueing.queue import Reservation


def idle_reserved_gpus(free_gpus: Iterable[int], waiting_asks: Iterable[int]) -> int:
    """Every GPU free on the reserved nodes (``free_gpus``, one count per
    node), once a waiting pod of another gang asks for no more GPUs than
    the most free on one of them (``waiting_asks``: their GPU counts, read
    lazily): room it could have used.  Else none: room nobody waiting could
    use is not the reservation's cost."""
    free = list(free_gpus)
    largest = max(free, default=0)
    return sum(free) if largest and any(0 < ask <= largest for ask in waiting_asks) else 0


def idle_on(cluster: ClusterState, reservation: Reservation | None) -> int:
    """``idle_reserved_gpus`` of the cluster now: the reserved nodes' free
    GPUs, and what our pending pods of other gangs than the holder ask."""
    if reservation is None:
        return 0
    free = [cluster.free(name).get(GPU_RESOURCE, 0) for name in reservation.nodes if name in cluster.nodes]
    if not any(free):
        return 0
    holders = Counter(pod.requests.get(GPU_RESOURCE, 0) for uid in cluster.gang_uids(reservation.gang_key)
                      if (pod := cluster.pods[uid]).scheduler_name == cluster.scheduler_name
                      and pod.awaits_placement)
    return idle_reserved_gpus(free, (gpus for gpus, pods in cluster.pending_gpu_asks.items() if pods > holders[gpus]))
