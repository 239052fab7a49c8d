"""What one ``/metrics`` scrape costs the scheduler's event loop, in process.

    .venv/bin/python bench/metrics_scrape.py [--nodes 5000] [--scrapes 50] [--changed 50]

Builds a scheduler's cache as ``batchsched run`` holds it: NODES x 8 GPUs
(the four built-in boards in turn, so four node pools), a 4-GPU pod bound
on every other node and an 8-GPU pod on every fifth.  Then times
``Metrics.exposition()``, what the HTTP handler runs on the event loop:
with nothing changed since the last scrape, and after ``--changed`` nodes
each got one more pod bound (a busy scrape interval), once with those nodes
not yet looked at since (the scrape derives their free GPUs itself) and once
after a cycle derived them (as the scheduling cycle does for changed nodes
before a scrape sees them).  Prints the median and the worst CPU time over
``--scrapes`` scrapes of each kind.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchsched.api.constants import GPU_RESOURCE  # noqa: E402
from batchsched.config import SchedulerConfig  # noqa: E402
from batchsched.core.model import PodInfo  # noqa: E402
from batchsched.shell.scheduler import Scheduler  # noqa: E402
from batchsched.sim.cluster import build_nodes  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from throughput_core import cluster  # noqa: E402


def bound_pod(uid: str, node: str, gpus: int) -> PodInfo:
    return PodInfo(uid=uid, namespace="bench", name=uid, node_name=node, phase="Running",
                   requests={GPU_RESOURCE: gpus, "cpu": 2000 * gpus})


def scrape_ms(scheduler: Scheduler) -> float:
    """CPU milliseconds of one scrape: on an idle core, how long it holds the
    event loop (wall time on a shared machine adds other processes' turns)."""
    started = time.thread_time()
    scheduler.metrics.exposition()
    return 1000 * (time.thread_time() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--changed", type=int, default=50, help="nodes changed between busy scrapes")
    args = parser.parse_args()

    scheduler = Scheduler(None, SchedulerConfig())  # no API calls: only its cache and metrics are used
    state = scheduler.cache.state
    names = []
    for i, node in enumerate(build_nodes(cluster(args.nodes)).values()):
        state.put_node(node)
        names.append(node.name)
        if i % 2 == 0:
            state.put_pod(bound_pod(f"half-{i}", node.name, 4))
        if i % 5 == 0:
            state.put_pod(bound_pod(f"full-{i}", node.name, 8))
    scrape_ms(scheduler)  # the first scrape after the caches synced

    idle = [scrape_ms(scheduler) for _ in range(args.scrapes)]
    def busy_scrapes(derived_first: bool) -> list[float]:
        times = []
        for round_ in range(args.scrapes):
            changed = [names[(round_ * args.changed + k) % len(names)] for k in range(args.changed)]
            for k, node in enumerate(changed):
                state.put_pod(bound_pod(f"more-{derived_first}-{round_}-{k}", node, 1))
            if derived_first:
                for node in changed:
                    state.free(node)
            times.append(scrape_ms(scheduler))
        return times

    busy, after_cycle = busy_scrapes(False), busy_scrapes(True)

    print(f"# {platform.python_implementation()} {platform.python_version()}, {platform.machine()}, "
          f"{args.nodes} nodes, {args.scrapes} scrapes each")
    print("| scrape | median CPU ms | max CPU ms |")
    print("|---|---:|---:|")
    print(f"| nothing changed | {statistics.median(idle):.2f} | {max(idle):.2f} |")
    print(f"| {args.changed} nodes changed | {statistics.median(busy):.2f} | {max(busy):.2f} |")
    print(f"| {args.changed} nodes changed, derived by a cycle first | {statistics.median(after_cycle):.2f} | "
          f"{max(after_cycle):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
