"""Garbage-collector settings for the scheduler process.

Once the watch caches have synced, the heap holds a long-lived object per
node, pod and PodGroup (tens of thousands of containers at 5,000 nodes), and
every full collection of the cyclic garbage collector walks all of them,
which showed as slow cycles (bench/history/RESULTS-until-2026-12-06.md,
"Decision throughput in process"), and,
while the first lists build them, as a pods list twice as long.
``collect_rarely`` makes collections rarer from the start; ``settle_heap``,
once the first bindings are answered (``Scheduler.on_started``), collects
once, then moves every surviving object to the permanent generation
(``gc.freeze``) so later collections skip it.  Reference counting still
frees frozen objects that are dropped; only cyclic garbage among them is
never collected.
"""
from __future__ import annotations

import gc

# gen0 collections every 50,000 net allocations instead of 700; full ones a
# fifth as often (Python's own guard against full collections on a large
# heap stays on).
THRESHOLDS = (50_000, 20, 100)


def collect_rarely() -> None:
    """At the start: the first lists build a long-lived object per pod and
    node, and at Python's default thresholds every ~700 of them set off a
    young collection and every ~70,000 a full one over all built so far."""
    gc.set_threshold(*THRESHOLDS)


def settle_heap() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
