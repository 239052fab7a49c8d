"""The summary ``batchsched simulate`` prints, one column per policy, and
its optional charts (matplotlib, the ``plot`` extra)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

from batchsched.sim.metrics import SimResult, percentile


def duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _waits(waits: list[float]) -> str:
    return " / ".join(duration(percentile(waits, q)) for q in (50, 90, 99))


def _aligned(r: SimResult) -> str:
    return f"{100 * r.aligned_share:.1f}% of {r.multi_gpu_pods}" if r.multi_gpu_pods else "-"


def _rdma(r: SimResult) -> str:
    return f"{100 * r.rdma_share:.1f}% of {r.multi_node_gang_pods}" if r.multi_node_gang_pods else "-"


def _cycles(r: SimResult) -> str:
    if not r.cycle_seconds:
        return "0"
    return f"{len(r.cycle_seconds)}, {1000 * percentile(r.cycle_seconds, 99):.1f} ms"


ROWS: list[tuple[str, Callable[[SimResult], str]]] = [
    ("jobs placed", lambda r: f"{r.jobs_started}/{r.jobs}"),
    ("jobs finished", lambda r: f"{r.jobs_finished}/{r.jobs}"),
    ("wait p50 / p90 / p99", lambda r: _waits(r.waits)),
    ("GPU allocation", lambda r: f"{100 * r.share(r.allocated_mean):.1f}%"),
    ("  held idle by incomplete gangs", lambda r: f"{100 * r.share(r.held_idle_mean):.1f}%"),
    ("stranded GPUs (mean)", lambda r: f"{r.stranded_mean:.1f}"),
    ("GPU-hours idled by reservations", lambda r: f"{r.reserved_idle_gpu_hours:.1f}"),
    ("aligned multi-GPU pods", _aligned),
    ("multi-node gang pods with RDMA", _rdma),
    ("unscheduled pods after arrivals", lambda r: str(r.pods_unscheduled)),
    ("pods never placed", lambda r: str(r.pods_never_placed)),
    ("preempted pods (jobs)", lambda r: f"{r.evicted_pods} ({r.preempted_jobs})"),
    ("  GPU-hours they had run", lambda r: f"{r.evicted_gpu_hours:.1f}"),
    ("cycles, p99 cycle time", _cycles),
]
# shown only where some GPUs are served through DRA
DRA_ROW = ("pods bound with DRA claims", lambda r: str(r.pods_with_claims))


def _guaranteed_waits(r: SimResult) -> str:
    q = r.queues
    waits = " / ".join(duration(percentile(q.guaranteed_waits, p)) for p in (50, 90))
    unstarted = f", {q.guaranteed_unstarted} never" if q.guaranteed_unstarted else ""
    return f"{waits} ({len(q.guaranteed_waits)}{unstarted})"


# shown only where the workload has queues (docs/simulator.md, "Queues")
QUEUE_ROWS: list[tuple[str, Callable[[SimResult], str]]] = [
    ("queue share error (mean abs)",
     lambda r: "-" if math.isnan(r.queues.share_error) else f"{100 * r.queues.share_error:.1f}%"),
    ("Jain's index (time mean)", lambda r: "-" if math.isnan(r.queues.jain) else f"{r.queues.jain:.3f}"),
    ("guaranteed request to start p50 / p90", _guaranteed_waits),
    ("evictions: reclaim / priority", lambda r: f"{r.queues.reclaim_evictions} / {r.queues.priority_evictions}"),
]


def _queue_share(name: str) -> Callable[[SimResult], str]:
    return lambda r: (f"{100 * r.queues.share.get(name, 0):.1f}% / {100 * r.queues.fair_share.get(name, 0):.1f}%")


def summary(results: list[SimResult]) -> str:
    """A table: one row per figure, one column per policy; waits also per
    job priority when there are several."""
    header = [""] + [r.policy for r in results]
    shown = ROWS + [DRA_ROW] if any(r.dra_gpus for r in results) else ROWS
    if all(r.queues is not None for r in results):
        tenants = sorted({name for r in results for name in r.queues.share})
        shown = shown + QUEUE_ROWS + [(f"  {name}: share / fair share", _queue_share(name)) for name in tenants]
    rows = [header] + [[label] + [cell(r) for r in results] for label, cell in shown]
    priorities = sorted({p for r in results for p in r.waits_by_priority}, reverse=True)
    if len(priorities) > 1:
        at = next(k for k, row in enumerate(rows) if row[0].startswith("wait")) + 1
        rows[at:at] = [[f"  priority {p}"] + [_waits(r.waits_by_priority.get(p, [])) for r in results]
                       for p in priorities]
    first = max(len(row[0]) for row in rows)
    widths = [max(len(row[k]) for row in rows) for k in range(1, len(header))]
    lines = [row[0].ljust(first) + "".join("  " + cell.rjust(w) for cell, w in zip(row[1:], widths))
             for row in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"


class PlotUnavailable(RuntimeError):
    pass


def require_matplotlib():
    """matplotlib's pyplot, drawing to files; PlotUnavailable without it."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'batchsched[plot]' "
                              "(or pip install 'matplotlib>=3.8')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_plots(results: list[SimResult], directory: Path) -> list[Path]:
    """utilization.png (GPUs allocated over time, per policy), waits.png
    (wait-time distribution), occupancy-POLICY.png (GPUs held per node over
    time); needs matplotlib."""
    plt = require_matplotlib()
    directory.mkdir(parents=True, exist_ok=True)
    written = []

    figure, axes = plt.subplots(figsize=(10, 4))
    for r in results:
        times = [row[0] / 3600 for row in r.series]
        axes.step(times, [100 * r.share(row[1]) for row in r.series], where="post", label=r.policy, linewidth=1)
    axes.axvspan(r.window[0] / 3600, r.window[1] / 3600, color="0.9", zorder=0, label="arrivals")
    axes.set(xlabel="simulated hours", ylabel="GPUs allocated (%)", ylim=(0, 105),
             title="GPU allocation over time")
    axes.legend(loc="lower right")
    written.append(_save(plt, figure, directory / "utilization.png"))

    figure, axes = plt.subplots(figsize=(7, 4))
    for r in results:
        waits = sorted(r.waits)
        axes.step([w / 60 for w in waits], [100 * (k + 1) / r.jobs for k in range(len(waits))], where="post",
                  label=r.policy)
    axes.set(xlabel="wait from arrival to start (minutes, log scale)", ylabel="jobs started (% of all)",
             ylim=(0, 101), title="Wait-time distribution")
    axes.set_xscale("symlog", linthresh=1)
    axes.legend(loc="lower right")
    written.append(_save(plt, figure, directory / "waits.png"))

    for r in results:
        if not r.occupancy:
            continue
        figure, axes = plt.subplots(figsize=(10, max(3.0, min(12.0, len(r.node_names) / 8))))
        grid = [list(column) for column in zip(*(held for _, held in r.occupancy))]  # node x time
        start, end = r.occupancy[0][0] / 3600, r.occupancy[-1][0] / 3600
        image = axes.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis",
                            extent=(start, end, len(grid) - 0.5, -0.5))
        axes.set(xlabel="simulated hours", ylabel="node", title=f"GPUs held per node: {r.policy}")
        if len(r.node_names) <= 64:
            axes.set_yticks(range(len(r.node_names)), r.node_names, fontsize=6)
        figure.colorbar(image, ax=axes, label="GPUs held")
        written.append(_save(plt, figure, directory / f"occupancy-{r.policy}.png"))
    return written


def _save(plt, figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    figure.clf()
    import matplotlib.pyplot as plt
    plt.close(figure)
    return path
