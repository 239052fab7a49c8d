"""Why is this gang Pending? A node-by-node report, computed from a Snapshot.

Answers the classic GPU-Pending checklist as well: does any node advertise
the GPU resource at all, is any of it allocatable, did the pods ask for GPUs
in their limits (pods asking none usually misspell the resource name, e.g.
nvidia.com/gpus).  Each report carries the same facts as data (``-o json``)
and a one-line verdict (the list view).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from batchsched.api import constants
from batchsched.core import gangsources
from batchsched.core import resources as res
from batchsched.core.config import CoreConfig
from batchsched.core.cycle import REASON_EXCEEDS_CAPACITY
from batchsched.core.cycle.facts import placement_policy
from batchsched.core.dra.demand import DeviceDemand
from batchsched.core.gangs import Gang, GangIndex
from batchsched.core.model import NodeInfo, PodInfo, TopologyPolicy, device_plugin_gpus
from batchsched.core.placement.capacity import CapacityIndex
from batchsched.core.placement.fit import out_where_dra_serves_gpus, resource_reasons, static_reasons
from batchsched.core.placement.gang import min_resources_beyond, never_fits
from batchsched.core.placement.gpus import in_dra_terms, pick_gpus, static_reason
from batchsched.core.queues.book import REASON_QUEUE_AT_LIMIT, QueueBook
from batchsched.core.queues.reclaim import awaited_reclaim, flows_said
from batchsched.core.snapshot import Snapshot
from batchsched.core.text import clip
from batchsched.core.topology.accounting import GpuRoom


@dataclass
class Report:
    """The text lines, the same facts as JSON-ready data, and a one-line verdict."""
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""

    def add(self, text: str = "") -> None:
        self.lines.append(text)

    def __str__(self) -> str:
        return "\n".join(self.lines)


def gang_key_for(snapshot: Snapshot, namespace: str, target: str) -> str:
    """The gang a command-line target names: ``NAME`` or ``podgroup/NAME``
    (a PodGroup, or the gang its pods' label names), ``pod/NAME`` (the gang
    of that pod: its PodGroup's, or the pod alone, a gang of one), or
    ``NAMESPACE/NAME`` (a PodGroup in another namespace)."""
    kind, _, name = target.rpartition("/")
    if kind in ("pod", "pods"):
        pod = next((p for p in snapshot.cluster.pods.values() if p.namespace == namespace and p.name == name), None)
        return pod.gang_key if pod is not None else f"{namespace}/pod:{name}"
    if kind in ("", "podgroup", "podgroups"):
        return f"{namespace}/{name}"
    return target


def explain_waiting(snapshot: Snapshot, namespace: str | None, config: CoreConfig = CoreConfig()) -> list[Report]:
    """A report for every gang with pending pods of ours, in one namespace or all."""
    gangs = GangIndex(snapshot).pending()
    return [explain_gang(snapshot, g.key, config) for g in gangs
            if namespace is None or g.spec.namespace == namespace]


def explain_gang(snapshot: Snapshot, gang_key: str, config: CoreConfig = CoreConfig()) -> Report:
    report = Report(data={"gang": gang_key})
    gang = GangIndex(snapshot).get(gang_key)
    if gang is None:
        return _unknown_gang(snapshot, gang_key, report)
    _members(gang, report)
    if gang.problem is not None:
        report.data["problem"] = {"reason": gang.problem.reason, "message": gang.problem.message}
        report.data["reason"] = gang.problem.reason
        return _concluded(report, f"cannot be scheduled: {gang.problem.reason}: {gang.problem.message}")
    if not gang.eligible:
        report.data["quorumReached"] = False
        report.data["reason"] = "QuorumNotReached"
        report.verdict = (f"quorum not reached: {gang.active} active members, minMember {gang.min_member} "
                          "(members that Succeeded or Failed do not count)"
                          + "".join(f"; task {task}: {live} active, minTaskMember {need}"
                                    for task, live, need in gang.tasks_short))
        report.add(f"  {report.verdict}")
    queue_problem = _queue_checklist(snapshot, gang, config, report)
    if queue_problem:
        return _concluded(report, queue_problem)
    if not gang.pending:
        return _concluded(report, "nothing to place: every active member is bound.")
    free = snapshot.free_by_node()
    unreadable = _gpu_checklist(snapshot, gang, free, report)
    rooms = gpu_rooms(snapshot)
    report.data["need"] = gang.need
    report.data["shapes"] = []
    shapes: dict[tuple, list] = {}
    for pod in gang.pending:
        shapes.setdefault((tuple(sorted(pod.requests.items())), pod.device_demand, out_where_dra_serves_gpus(pod)),
                          []).append(pod)
    check = _NodeCheck(snapshot, gang, placement_policy(snapshot, gang, config), free, rooms, unreadable)
    for (shape, demand, _), pods in shapes.items():
        check.shape_room(pods, shape, demand, report)
    rooms_text = ", ".join(f"{s['room']} like {s['like']}" for s in report.data["shapes"])
    if gang.need:
        need = f"needs {gang.need} of its {len(gang.pending)} pending pod(s) placed at once"
    else:  # the quorum is bound: nothing is needed at once
        need = f"has its quorum bound; {len(gang.pending)} more pod(s) are placed as room allows"
    if gang.eligible:
        report.add(f"The gang {need}.")
    never = _never_fits(snapshot, gang, free, rooms)
    if never:
        report.data["neverFits"] = {"reason": REASON_EXCEEDS_CAPACITY, "message": never}
        report.add(never)
        report.data.setdefault("reason", REASON_EXCEEDS_CAPACITY)
    report.verdict = report.verdict or never or f"{need}; room now for {rooms_text}"
    report.data["verdict"] = report.verdict
    return report


def _unknown_gang(snapshot: Snapshot, gang_key: str, report: Report) -> Report:
    if gang_key in snapshot.groups or gang_key in snapshot.invalid_groups:
        source = gangsources.SOURCES[gangsources.source_of_key(gang_key)]
        name = gang_key.split("/")[-1].removeprefix(f"{source.name}:")
        report.verdict = (f"{source.kind} {gang_key} has no member pods with schedulerName "
                          f"{snapshot.scheduler_name!r} ({source.membership(name)}).")
    else:
        report.verdict = f"No PodGroup or pod gang {gang_key} is known."
    report.add(report.verdict)
    report.data.update(found=False, verdict=report.verdict)
    return report


def _members(gang: Gang, report: Report) -> None:
    report.data.update(
        found=True, minMember=gang.min_member, priority=gang.priority,
        members={"total": len(gang.members), "bound": len(gang.bound_active), "pending": len(gang.pending),
                 "gated": gang.gated})
    report.add(f"Gang {gang.key}: minMember {gang.min_member}, priority {gang.priority}")
    report.add(f"  members: {len(gang.members)} ({len(gang.bound_active)} bound, {len(gang.pending)} pending"
               f", {gang.gated} gated)")
    elastic = gang.active - gang.min_member
    if elastic > 0:  # beyond minMember: placed as room allows, the first victims (docs/podgroup.md)
        bound = min(elastic, max(0, len(gang.bound_active) - gang.min_member))
        report.data["elastic"] = {"members": elastic, "bound": bound, "pending": elastic - bound}
        report.add(f"  elastic: {elastic} member(s) beyond minMember {gang.min_member} ({bound} bound, "
                   f"{elastic - bound} pending): placed as room allows, the first victims at their priority")


def _gpu_checklist(snapshot: Snapshot, gang: Gang, free: Mapping[str, Mapping[str, int]], report: Report) -> str:
    """The GPU checklist (asks, advertising nodes, node agents, DRA); why
    claims could not be read ("" when they could)."""
    gpu_asked = [p for p in gang.pending if p.requests.get(constants.GPU_RESOURCE)]
    advertising = [n for n in snapshot.nodes.values() if constants.GPU_RESOURCE in n.allocatable]
    allocatable = sum(n.allocatable.get(constants.GPU_RESOURCE, 0) for n in advertising)
    report.data["gpuChecklist"] = {
        "podsAskingGpu": len(gpu_asked), "pendingPods": len(gang.pending), "nodesAdvertisingGpu": len(advertising),
        "nodes": len(snapshot.nodes), "gpusAllocatable": allocatable,
        "gpusFree": sum(max(0, free[n.name].get(constants.GPU_RESOURCE, 0)) for n in advertising)}
    report.add("GPU checklist:")
    report.add(f"  pods asking {constants.GPU_RESOURCE} in limits: {len(gpu_asked)}/{len(gang.pending)}")
    report.add(f"  nodes advertising {constants.GPU_RESOURCE}: {len(advertising)}/{len(snapshot.nodes)}"
               f" ({allocatable} allocatable, "
               f"{sum(max(0, free[n.name].get(constants.GPU_RESOURCE, 0)) for n in advertising)} free)")
    if len(gpu_asked) < len(gang.pending):
        report.add(_no_gpu_asked(gang.pending))
    _node_agent_checklist(snapshot, report)
    dra = _dra_checklist(snapshot)
    report.data["gpuChecklist"]["dra"] = dra
    if dra["nodes"]:
        serving = sum(1 for n in dra["nodes"] if snapshot.nodes[n].gpus_by_dra)
        report.add(f"  nodes with DRA GPUs: {len(dra['nodes'])} ({dra['devices']} devices, {dra['allocated']} "
                   f"allocated; {constants.GPU_RESOURCE} served through them, by extended-resource claims, "
                   f"on {serving})")
    for name, why in sorted(dra["unsupportedClasses"].items()):
        report.add(f"  -> DeviceClass {name} ({constants.GPU_RESOURCE}) is not read: {why}")
    if dra["claimsUnreadable"]:
        report.add(f"  -> {dra['claimsUnreadable']}")
    if gpu_asked and not advertising and not dra["nodes"]:
        report.add("  -> no node advertises GPUs: is the NVIDIA device plugin running on the GPU nodes?")
    return dra["claimsUnreadable"]


@dataclass(frozen=True)
class _NodeCheck:
    """What checking a pod shape node by node reads."""

    snapshot: Snapshot
    gang: Gang
    policy: TopologyPolicy  # the gang's, as placement applies it
    free: Mapping[str, Mapping[str, int]]
    rooms: Mapping[str, GpuRoom]
    unreadable: str  # why claims could not be read ("" when they could)

    def shape_room(self, pods: list[PodInfo], shape: tuple, demand: DeviceDemand | None, report: Report) -> None:
        """Node by node, why pods like ``pods[0]`` do not fit, or how many do."""
        snapshot, gang, free, rooms = self.snapshot, self.gang, self.free, self.rooms
        pod = pods[0]
        asks = ", ".join(f"{k}={res.format_amount(k, v)}" for k, v in shape)
        report.add(f"{len(pods)} pending pod(s) like {pod.name} asking {asks}:")
        nodes: list[dict[str, Any]] = []
        fitting = 0
        for name in sorted(snapshot.nodes):
            node = snapshot.nodes[name]
            # the order the planner checks in: static predicates, the node's GPU kind, counts, GPU choice
            reasons = in_dra_terms(node, static_reasons(pod, node)
                                   or _static_gpu_reasons(node, pod.requests, gang.spec.topology, demand)
                                   or resource_reasons(pod.requests, free[name])
                                   or _topology_reasons(node, rooms.get(name), pod.requests, gang.spec.topology,
                                                        demand), pod.requests)
            if reasons and node.dra is not None and self.unreadable:
                reasons = [*reasons, self.unreadable]  # why its DRA GPUs all count as taken
            if reasons:
                report.add(f"  {name}: " + "; ".join(reasons))
                nodes.append({"node": name, "fits": 0, "reasons": reasons})
            else:
                slots = _how_many(pod.requests, free[name])
                fitting += slots
                gpus = pick_gpus(node, rooms.get(name), pod.requests, self.policy, demand)
                ids = f", GPUs {','.join(map(str, gpus.gpus))} for the first" if gpus.gpus else ""
                report.add(f"  {name}: fits ({slots} such pod(s){ids})")
                nodes.append({"node": name, "fits": slots, "reasons": [], "gpus": list(gpus.gpus)})
        report.add(f"  => room for {fitting} such pod(s) now")
        report.data["shapes"].append({"pods": len(pods), "like": pod.name,
                                      "requests": {k: res.format_amount(k, v) for k, v in shape},
                                      "room": fitting, "nodes": nodes})


def _never_fits(snapshot: Snapshot, gang: Gang, free: Mapping[str, Mapping[str, int]],
                rooms: Mapping[str, GpuRoom]) -> str:
    """The cycle's ExceedsClusterCapacity message for the gang, "" if it might fit."""
    total = snapshot.cluster.total_allocatable
    beyond = min_resources_beyond(gang, total)
    if beyond or not gang.need or gang.need > len(gang.pending):
        return beyond
    index = CapacityIndex(snapshot.nodes, dict(free), rooms=dict(rooms))  # rooms: the GPU sets count too
    return never_fits(gang.pending, gang.need, index, gang.spec.topology, total)


def _queue_checklist(snapshot: Snapshot, gang: Gang, config: CoreConfig, report: Report) -> str:
    """The gang's queue: what it holds against its quota; the verdict when
    the queue admits nothing (the cycle's reason and message), or "".  A
    queue at its limit makes the verdict too, and the report goes on."""
    book = QueueBook(snapshot, config)
    name = book.queue_of(gang.key)
    data: dict[str, Any] = {"name": name}
    report.data["queue"] = data
    problem = book.problem(gang)
    if problem is not None:
        data.update(reason=problem.reason, message=problem.message)
        report.data["reason"] = problem.reason
        return f"cannot be scheduled: {problem.reason}: {problem.message}"
    info = snapshot.queues.get(name)
    if info is None:
        report.add(f"  queue: {name} (no Queue object: no quota)")
        return ""
    held = book.allocated(name)
    limits, guaranteed = info.limits(), info.guaranteed()
    data.update(parent=info.parent or None, weight=info.weight, share=float(book.share(name)),
                allocated={r: res.format_amount(r, a) for r, a in sorted(held.items()) if a},
                guaranteed={r: res.format_amount(r, a) for r, a in sorted(guaranteed.items())},
                limit={r: res.format_amount(r, a) for r, a in sorted(limits.items())})
    quota = ", ".join(f"{r} {res.format_amount(r, held.get(r, 0))} held, {res.format_amount(r, guaranteed[r])} "
                      f"guaranteed" if r in guaranteed else f"{r} {res.format_amount(r, held.get(r, 0))} held"
                      for r in sorted(set(limits) | set(guaranteed)))
    limited = ", ".join(f"limit {res.format_amount(r, a)} {r}" for r, a in sorted(limits.items()))
    report.add(f"  queue: {name}" + (f" (parent {info.parent})" if info.parent else "") + f", weight {info.weight:g}"
               + (f": {quota}" if quota else "") + (f"; {limited}" if limited else ""))
    admission = book.admission(gang) if gang.eligible and gang.need else None
    if isinstance(admission, str):
        data["atLimit"] = admission
        report.data["reason"] = REASON_QUEUE_AT_LIMIT
        report.verdict = report.verdict or f"{REASON_QUEUE_AT_LIMIT}: waits for its queue: {admission}"
        report.add(f"  -> {admission}")
    awaited = awaited_reclaim(book, gang.key)
    if awaited:
        waiting = f"waiting for reclaim from {flows_said(awaited)}"
        data["reclaim"] = [f.data() for f in awaited]
        report.verdict = report.verdict or waiting
        report.add(f"  -> {waiting}: " + "; ".join(
            f"{f.pods} pod(s) of queue {f.queue} terminating on the nodes its pods are nominated to" for f in awaited))
    return ""


def _concluded(report: Report, verdict: str) -> Report:
    report.verdict = report.verdict or verdict  # a quorum not reached says more than "nothing to place"
    report.data["verdict"] = report.verdict
    report.add(f"  {verdict}")
    return report


def _dra_checklist(snapshot: Snapshot) -> dict[str, Any]:
    """Each node's DRA GPUs: how many, how many allocated, where each sits on
    the topology, and its GPUs from both sources (docs/dra.md)."""
    state, nodes = snapshot.cluster, {}
    for name in sorted(snapshot.nodes):
        node = snapshot.nodes[name]
        if node.dra is None:
            continue
        device_plugin = device_plugin_gpus(node)
        nodes[name] = {
            "devices": len(node.dra.gpus), "allocated": state.dra_allocated(name),
            "devicePluginGpus": device_plugin, "gpus": device_plugin + len(node.dra.gpus),
            "extendedResource": node.dra.extended,
            "mapping": [{"device": g.device, "pool": g.pool, "driver": g.driver, "index": g.index,
                         "by": g.mapped_by, "allocated": state.dra.in_use(g.key)} for g in node.dra.gpus],
            "problems": list(node.dra.problems)}
    return {"nodes": nodes, "devices": sum(n["devices"] for n in nodes.values()),
            "allocated": sum(n["allocated"] for n in nodes.values()),
            "unsupportedClasses": dict(state.dra.selection.unsupported),
            "claimsUnreadable": state.dra.claims_unreadable_note()}


def _node_agent_checklist(snapshot: Snapshot, report: Report) -> None:
    """The nodes' side, where the node agent runs: its condition on each node
    (driver, advertised and allocatable GPUs, topology, last verification)."""
    checked = [n for n in snapshot.nodes.values() if n.gpu_agent]
    failing = sorted((n for n in checked if n.gpu_agent[0] != "True"), key=lambda n: n.name)
    report.data["gpuChecklist"]["nodeAgent"] = {
        "nodes": len(checked),
        "notReady": [{"node": n.name, "reason": n.gpu_agent[1], "message": n.gpu_agent[2]} for n in failing]}
    if checked:
        report.add(f"  nodes checked by the node agent ({constants.GPU_READY_CONDITION}): {len(checked)}, "
                   f"{len(failing)} not ready")
    for n in failing:
        report.add(f"  -> node {n.name}: {n.gpu_agent[1]}: {clip(n.gpu_agent[2], 300)}")


def _static_gpu_reasons(node: NodeInfo, request: Mapping[str, int], policy: TopologyPolicy,
                        demand: DeviceDemand | None) -> list[str]:
    why = static_reason(node, request, policy, demand)
    return [why] if why else []


def _topology_reasons(node: NodeInfo, room: GpuRoom | None, request: Mapping[str, int],
                      policy: TopologyPolicy, demand: DeviceDemand | None) -> list[str]:
    """The gang's topology policy's verdict on a node whose counts fit."""
    why = static_reason(node, request, policy, demand)
    if not why:
        pick = pick_gpus(node, room, request, policy, demand)
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


def gpu_rooms(snapshot: Snapshot) -> dict[str, GpuRoom]:
    """The room of every node that has one.  (Here, beside its one user, so
    that ``topology/accounting.py`` needs nothing of the snapshot.)"""
    state = snapshot.cluster
    return {name: room for name in snapshot.nodes if (room := state.room(name)) is not None}
