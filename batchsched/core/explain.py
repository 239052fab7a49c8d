"""Why is this gang Pending? A node-by-node report, computed from a Snapshot.

Answers the classic GPU-Pending checklist as well: does any node advertise
the GPU resource at all, is any of it allocatable, did the pods ask for GPUs
(pods asking none usually misspell the resource name, e.g. nvidia.com/gpus).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from batchsched.api import constants
from batchsched.core import resources as res
from batchsched.core.gangs import GangIndex
from batchsched.core.model import NodeInfo, TopologyPolicy
from batchsched.core.placement.fit import fit_reasons
from batchsched.core.placement.gpus import pick_gpus, static_reason
from batchsched.core.snapshot import Snapshot
from batchsched.core.topology.accounting import GpuRoom, gpu_rooms


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)

    def add(self, text: str = "") -> None:
        self.lines.append(text)

    def __str__(self) -> str:
        return "\n".join(self.lines)


def explain_gang(snapshot: Snapshot, gang_key: str) -> Report:
    report = Report()
    gang = GangIndex(snapshot).get(gang_key)
    if gang is None:
        if gang_key in snapshot.groups or gang_key in snapshot.invalid_groups:
            report.add(f"PodGroup {gang_key} has no member pods with schedulerName "
                       f"{snapshot.scheduler_name!r} (label {constants.POD_GROUP_LABEL}={gang_key.split('/')[-1]}).")
        else:
            report.add(f"No PodGroup or pod gang {gang_key} is known.")
        return report

    report.add(f"Gang {gang.key}: minMember {gang.min_member}, priority {gang.priority}")
    report.add(f"  members: {len(gang.members)} ({len(gang.bound_active)} bound, {len(gang.pending)} pending"
               f", {gang.gated} gated)")
    if gang.problem is not None:
        report.add(f"  cannot be scheduled: {gang.problem.reason}: {gang.problem.message}")
        return report
    if not gang.eligible:
        report.add(f"  quorum not reached: {gang.active} active members, minMember {gang.min_member} "
                   "(members that Succeeded or Failed do not count)")
    if not gang.pending:
        report.add("  nothing to place: every active member is bound.")
        return report

    gpu_asked = [p for p in gang.pending if p.requests.get(constants.GPU_RESOURCE)]
    advertising = [n for n in snapshot.nodes.values() if constants.GPU_RESOURCE in n.allocatable]
    allocatable = sum(n.allocatable.get(constants.GPU_RESOURCE, 0) for n in advertising)
    free = snapshot.free_by_node()
    report.add("GPU checklist:")
    report.add(f"  pods asking {constants.GPU_RESOURCE} in limits: {len(gpu_asked)}/{len(gang.pending)}")
    report.add(f"  nodes advertising {constants.GPU_RESOURCE}: {len(advertising)}/{len(snapshot.nodes)}"
               f" ({allocatable} allocatable, "
               f"{sum(max(0, free[n.name].get(constants.GPU_RESOURCE, 0)) for n in advertising)} free)")
    if len(gpu_asked) < len(gang.pending):
        report.add(_no_gpu_asked(gang.pending))
    if gpu_asked and not advertising:
        report.add("  -> no node advertises GPUs: is the NVIDIA device plugin running on the GPU nodes?")

    rooms = gpu_rooms(snapshot)
    shapes: dict[tuple, list] = {}
    for pod in gang.pending:
        shapes.setdefault(tuple(sorted(pod.requests.items())), []).append(pod)
    for shape, pods in shapes.items():
        pod = pods[0]
        asks = ", ".join(f"{k}={res.format_amount(k, v)}" for k, v in shape)
        report.add(f"{len(pods)} pending pod(s) like {pod.name} asking {asks}:")
        fitting = 0
        for name in sorted(snapshot.nodes):
            node = snapshot.nodes[name]
            reasons = fit_reasons(pod, node, free[name]) or _topology_reasons(
                node, rooms.get(name), pod.requests, gang.spec.topology)
            if reasons:
                report.add(f"  {name}: " + "; ".join(reasons))
            else:
                slots = _how_many(pod.requests, free[name])
                fitting += slots
                gpus = pick_gpus(node, rooms.get(name), pod.requests, gang.spec.topology)
                ids = f", GPUs {','.join(map(str, gpus.gpus))} for the first" if gpus.gpus else ""
                report.add(f"  {name}: fits ({slots} such pod(s){ids})")
        report.add(f"  => room for {fitting} such pod(s) now; the gang needs {gang.need} placed at once")
    return report


def _topology_reasons(node: NodeInfo, room: GpuRoom | None, request: Mapping[str, int],
                      policy: TopologyPolicy) -> list[str]:
    """The gang's topology policy's verdict on a node whose counts fit."""
    why = static_reason(node, request, policy)
    if not why:
        pick = pick_gpus(node, room, request, policy)
        why = pick if isinstance(pick, str) else ""
    return [why] if why else []


def _no_gpu_asked(pending: list) -> str:
    """The hint for pods that ask no GPU: a look-alike resource name if they ask one."""
    without = [p for p in pending if not p.requests.get(constants.GPU_RESOURCE)]
    look_alikes = sorted({name for p in without for name in p.requests
                          if "gpu" in name.lower() and name != constants.GPU_RESOURCE})
    hint = (f"they ask {', '.join(look_alikes)}: a misspelt resource name?" if look_alikes
            else "intended? GPUs are asked in resources.limits")
    return f"  -> {len(without)} pod(s) ask no {constants.GPU_RESOURCE}; {hint}"


def _how_many(request: dict[str, int], free: dict[str, int]) -> int:
    counts = [free.get(k, 0) // v for k, v in request.items() if v > 0]
    return max(0, min(counts)) if counts else 0
