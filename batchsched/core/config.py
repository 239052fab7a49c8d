"""Tunables of the decision core."""
from __future__ import annotations

from dataclasses import dataclass

from batchsched.api.constants import DEFAULT_SCHEDULER_NAME, GPU_CLIQUE_LABEL, GPU_PRODUCT_LABEL


@dataclass(frozen=True)
class CoreConfig:
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    initial_backoff: float = 1.0  # seconds after a gang's first failed attempt
    max_backoff: float = 60.0  # the backoff doubles up to this
    reservation_after_seconds: float = 60.0  # see batchsched.core.queueing.queue
    max_reservation_seconds: float = 14400.0  # a reservation held longer is released
    lend_reserved: bool = True  # reserved room lent to the pods its holder may evict (queueing.lending)
    max_gangs_per_cycle: int = 1000  # attempts per cycle; the rest wait a cycle
    # Node label keys naming a placement domain, smallest kind first (docs/topology.md).
    domain_labels: tuple[str, ...] = (GPU_CLIQUE_LABEL,)
    # Node choice beside best fit (core/placement/fragmentation.py, docs/topology.md):
    # the least fragmentation of the GPU shapes asked, and NVLink cliques'
    # wholly free nodes kept from partial pods while a whole-node pod waits.
    fragmentation_aware: bool = False  # off: it did not raise useful allocation (bench/RESULTS.md)
    keep_cliques_whole: bool = True
    # A gang partly bound (some members bound by us, quorum incomplete) for
    # this long has its bound members evicted to start over (docs/binding.md).
    partial_gang_timeout: float = 300.0
    # The queue of a gang whose PodGroup names none (and of lone pods); with
    # no Queue object of that name it takes any room, as if unlimited (docs/queues.md).
    default_queue: str = "default"
    # The node label whose value is the GPU type a Queue's gpuTypes count by.
    gpu_type_label: str = GPU_PRODUCT_LABEL
    # While a queue within its fair share has a gang waiting for room, gangs
    # of other queues may not take them beyond their own fair share (what
    # they borrowed would be reclaimed); needs preemption (docs/queues.md).
    hold_borrowing: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.initial_backoff <= self.max_backoff:
            raise ValueError("need 0 < initial_backoff <= max_backoff")
        if self.reservation_after_seconds < 0:
            raise ValueError("reservation_after_seconds must be >= 0")
        if not self.partial_gang_timeout > 0:
            raise ValueError("partial_gang_timeout must be > 0")
        if self.max_reservation_seconds <= 0:
            raise ValueError("max_reservation_seconds must be > 0")
        if self.max_gangs_per_cycle < 1:
            raise ValueError("max_gangs_per_cycle must be >= 1")
