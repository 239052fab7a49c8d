"""Baseline schedulers the simulator runs beside batchsched, each a simple,
count-only scheduler that stands for a common way of placing GPU jobs:

``spread``  kube-scheduler's default, roughly: every pod on its own, none
            of gangs (a gang's pods bind as they fit, and a job whose
            quorum is not all bound holds its GPUs idle); the node with the
            most free GPUs (then the most free cpu); GPU ids arbitrary, as
            the kubelet's device manager hands them out without topology
            hints (a seeded random choice).
``binpack`` first-fit bin packing of whole gangs: a gang binds at least its
            quorum at once or nothing; each pod on the first node, in name
            order, where it fits; the lowest free GPU ids.
``random``  a count-only gang scheduler (all or nothing, like the
            coscheduling plugin on kube-scheduler's default scoring): nodes
            as ``spread``, GPU ids at random.

``proportion`` quota admission with no reclaim, approximating Volcano's
            proportion plugin (its idea, not its code): ``binpack``'s
            placement, and a gang is admitted only within its queue's GPU
            quota.  Gangs whose queue stays within its ``guaranteed`` (Volcano's
            ``deserved``) with them go first, the queue furthest below it
            first; then the rest borrow idle GPUs up to the queue's (and its
            parent's) ``limit``.  Nothing is ever evicted: a queue gets its
            guaranteed back only as the borrowers' jobs end.  Counts
            ``nvidia.com/gpu`` only (no other resource, no GPU types), and
            takes weights into no account: Volcano divides ``deserved`` by
            weight, here it is the Queue's ``guaranteed``.

``volcano-like`` an approximation of Volcano's default session (actions
            allocate and preempt, plugins gang, priority and binpack; its
            ideas, not its code): whole gangs, each pod on the node that
            ends up fullest (most GPUs, then cpu, allocated: the binpack
            plugin with a GPU weight), the lowest free GPU ids (no topology),
            no reservation.  A gang that does not fit evicts lower-priority
            pods as Volcano's preempt action does: node by node, fullest
            first, victims of the lowest priority (then the youngest) first
            until the pod fits, and only if the whole quorum fits once they
            are gone; members of a victim gang go one by one (the legacy
            preempt action, whose gang check the shipped configs turn off),
            leaving it below its quorum.  While its victims terminate the
            gang does not preempt again, and nothing else takes the nodes it
            pipelined on in that cycle.
``kai-like`` an approximation of NVIDIA KAI Scheduler's defaults with fair
            share off (its ideas, not its code): placement as
            ``volcano-like``; preemption by victim *jobs*, as KAI's job
            solver: a victim gang goes whole (a gang left below its quorum
            would be evicted whole by KAI's stale-gang eviction), and jobs
            are added as victims cheapest first (lowest priority, then
            youngest), wherever they run, until the whole quorum fits; of
            those, the jobs with a pod on a node the quorum lands on are
            evicted.  Not modelled: KAI's consolidation (repacking running pods
            to make room), its queues and time-based fair share, and
            reservation pods for GPU sharing.

Both preempting baselines obey the scheduler config's ``preemption`` rules
of *who* (enabled, the preemptors' and victims' selectors, minimum run time,
opt-outs, ``gangs: never`` keeping gang members out); the rules of *how*
are theirs: no cooldown, no victim budget, no topology.

The others try pending pods by priority (highest first), then creation, and
skip what does not fit without blocking the rest, as kube-scheduler's queue
does; none backs off, reserves or preempts.  They honour the same static
predicates as batchsched (``batchsched.core.placement.fit``: taints, node
selectors, required node affinity) and count every resource a pod requests.
Where DRA serves a node's GPUs, a pod bound there gets the claim
kube-scheduler's DRA plugin would write, allocating the devices of its GPU
ids.
"""

from __future__ import annotations

from typing import Callable

from batchsched.core.preemption.policy import PreemptionPolicy
from batchsched.sim.baselines.count_only import CountOnlyScheduler, binpack, random_gangs, spread
from batchsched.sim.baselines.preempting import PreemptingScheduler
from batchsched.sim.baselines.proportion import ProportionScheduler

# name -> how to make it from (name, seed, default queue, preemption rules).
# A baseline is one module here and one line in this table.
BASELINES: dict[str, Callable[[str, int, str, PreemptionPolicy], CountOnlyScheduler]] = {
    "spread": lambda name, seed, queue, preemption: spread(name, seed),
    "binpack": lambda name, seed, queue, preemption: binpack(name, seed),
    "random": lambda name, seed, queue, preemption: random_gangs(name, seed),
    "volcano-like": lambda name, seed, queue, preemption: PreemptingScheduler(name, preemption, whole_gangs=False),
    "kai-like": lambda name, seed, queue, preemption: PreemptingScheduler(name, preemption, whole_gangs=True),
    "proportion": lambda name, seed, queue, preemption: ProportionScheduler(name, queue),
}
NAMES = tuple(BASELINES)


def baseline(name: str, seed: int = 1, default_queue: str = "default",
             preemption: PreemptionPolicy = PreemptionPolicy(enabled=False)) -> CountOnlyScheduler:
    """A baseline by name (NAMES); ``default_queue``: the queue of gangs
    naming none; ``preemption``: who may preempt whom, for the preempting ones."""
    make = BASELINES.get(name)
    if make is None:
        raise ValueError(f"unknown baseline {name!r} (known: {', '.join(NAMES)})")
    return make(name, seed, default_queue, preemption)
