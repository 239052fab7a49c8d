"""The most GPU allocation any policy could reach on a workload: a bound to
read the policies' useful allocation against (bench/allocation_ceiling.py).

Over the arrival window [w0, w1] (the one ``useful`` is measured over), a
job can hold at most its width (pods x GPUs) from its arrival on, and at
most its whole work (width x duration) in all; the cluster, at most its
GPUs at each moment.  The most allocation that allows is a maximum flow
from jobs to moments, and its minimum cut has a simple form: since every
job may run from its arrival to the window's end, the cheapest set of
moments to cut from the jobs' side is a prefix [w0, tau).  So the bound is

    min over tau of  gpus * (w1 - tau) + sum_j min(work_j, width_j * max(0, tau - a_j))

It allows what no scheduler can: pods split across nodes, preemption at no
cost, perfect packing, no gang, cpu, memory or topology constraint.  So no
policy can exceed it, and the gap to it bounds what any policy change can
still gain.
"""
from __future__ import annotations

from typing import Sequence

from batchsched.sim.workload import Job


def allocation_ceiling(jobs: Sequence[Job], gpus: int) -> float:
    """The largest mean share of ``gpus`` the jobs could hold over their
    arrival window (0 when the window is empty)."""
    if not jobs or gpus <= 0:
        return 0.0
    start = min(j.arrival for j in jobs)
    end = max(j.arrival for j in jobs)
    if end <= start:
        return 0.0
    # The cut's cost is piecewise linear in tau: at the window's start it is
    # gpus * (w1 - w0), and its slope, -gpus, gains a job's width from its
    # arrival until it could have run its whole work.  Its minimum lies where
    # the slope changes, or at an end.
    slope_changes: list[tuple[float, int]] = []
    for job in jobs:
        width = job.pods * job.gpus
        if width > 0 and job.duration > 0:
            slope_changes.append((job.arrival, width))
            slope_changes.append((job.arrival + job.duration, -width))
    slope_changes.sort()
    cost = best = float(gpus) * (end - start)
    tau, slope = start, -gpus
    for at, change in slope_changes:
        if at >= end:
            break
        cost += slope * (at - tau)
        tau, slope = at, slope + change
        best = min(best, cost)
    best = min(best, cost + slope * (end - tau))
    return best / (gpus * (end - start))
