"""Predicates of one pod on one node, with kube-scheduler's wording.

Static predicates (unschedulable, readiness, taints, node selector and
affinity, and whether a node where DRA serves nvidia.com/gpu can give the
pod its GPUs) depend only on the pod's placement constraints and the node,
never on what runs there, so ``NodeFilter`` evaluates them once per distinct
set of constraints and reuses the answer for every pod and gang that shares
it.  The resource check is separate because free capacity changes with every
placement.

Like kube-scheduler's filter chain, a node reports the first static predicate
it fails and is only checked for resources when every static predicate
passes; the resource check reports every resource that is short.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core import resources as res
from batchsched.core.dra.extended import reuses_init_gpus
from batchsched.core.model import NodeInfo, PodInfo, Taint

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_NOT_READY = "node(s) were not ready"
REASON_NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_TOO_MANY_PODS = "Too many pods"
# Not kube-scheduler's: a node held for a long-waiting gang (see queueing).
REASON_RESERVED = "node(s) were reserved for a waiting gang"
# Not kube-scheduler's: its extended-resource claim would ask more devices
# than the pod holds (core/dra/extended.py, reuses_init_gpus).
REASON_DRA_INIT_GPUS = (f"node(s) serve {GPU_RESOURCE} through DRA, where this version gives no pod the GPUs "
                        "of an init container that its other containers reuse")

# The taints the node lifecycle controller puts on such nodes; a pod that
# tolerates them (a DaemonSet, say) may land there, as with kube-scheduler.
UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
NOT_READY_TAINT = Taint("node.kubernetes.io/not-ready", "", "NoSchedule")

_FILTERED_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def untolerated_taint_reason(taint: Taint) -> str:
    return f"node(s) had untolerated taint {taint}"


def insufficient_reason(resource: str) -> str:
    return REASON_TOO_MANY_PODS if resource == res.PODS else f"Insufficient {resource}"


def tolerates(pod: PodInfo, taint: Taint) -> bool:
    return any(t.tolerates(taint) for t in pod.tolerations)


def matches_node_affinity(pod: PodInfo, node: NodeInfo) -> bool:
    """nodeSelector and required node affinity (its terms ORed) both hold."""
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return False
    return not pod.affinity_terms or any(t.matches(node.labels, node.name) for t in pod.affinity_terms)


def static_reasons(pod: PodInfo, node: NodeInfo) -> list[str]:
    """Why ``pod`` can never run on ``node`` as it is now, whatever is free.

    Empty when every static predicate passes, else the first failure.
    """
    if node.unschedulable and not tolerates(pod, UNSCHEDULABLE_TAINT):
        return [REASON_UNSCHEDULABLE]
    if not node.ready and not tolerates(pod, NOT_READY_TAINT):
        return [REASON_NOT_READY]
    for taint in node.taints:
        if taint.effect in _FILTERED_EFFECTS and not tolerates(pod, taint):
            return [untolerated_taint_reason(taint)]
    if not matches_node_affinity(pod, node):
        return [REASON_NODE_AFFINITY]
    if node.gpus_by_dra and out_where_dra_serves_gpus(pod):
        return [REASON_DRA_INIT_GPUS]
    return []


def serves_through_extended_claim(pod: PodInfo) -> bool:
    """Whether a node where DRA serves nvidia.com/gpu gives ``pod`` its GPUs
    through an extended-resource claim: it asks some, and its own claims
    ask no GPUs (those get them there)."""
    return bool(pod.requests.get(GPU_RESOURCE, 0)) and not (pod.device_demand and pod.device_demand.asks_devices)


def out_where_dra_serves_gpus(pod: PodInfo) -> bool:
    """Whether nodes where DRA serves nvidia.com/gpu are out for ``pod``: it
    would get its GPUs there through an extended-resource claim, and it
    reuses an init container's GPUs, for which this version writes none."""
    return serves_through_extended_claim(pod) and reuses_init_gpus(pod)


def resource_reasons(request: Mapping[str, int], free: Mapping[str, int]) -> list[str]:
    """One reason per requested resource that ``free`` cannot cover.

    A resource missing from ``free`` (the node does not advertise it) is 0.
    """
    return [insufficient_reason(name) for name in sorted(res.shortfall(request, free))]


def fit_reasons(pod: PodInfo, node: NodeInfo, free: Mapping[str, int]) -> list[str]:
    """Every reason ``pod`` does not fit ``node`` now; empty when it fits."""
    return static_reasons(pod, node) or resource_reasons(pod.requests, free)


def placement_key(pod: PodInfo) -> Hashable:
    """What static predicates look at: pods with equal keys pass on the same nodes."""
    return (tuple(sorted(pod.node_selector.items())), pod.affinity_terms, pod.tolerations, pod.device_demand,
            out_where_dra_serves_gpus(pod))


@dataclass(frozen=True)
class StaticVerdict:
    feasible: tuple[str, ...]  # node names passing every static predicate, sorted
    rejected: Mapping[str, str]  # node name -> the static reason it fails


class NodeFilter:
    """Static predicates over a set of nodes, cached per placement key.

    ``nodes`` may be a live map: call ``nodes_changed`` whenever nodes in it
    are added, removed or replaced, and the cached answers are dropped.
    """

    def __init__(self, nodes: Mapping[str, NodeInfo]):
        self.nodes = nodes
        self._cache: dict[Hashable, StaticVerdict] = {}

    def evaluate(self, pod: PodInfo) -> StaticVerdict:
        key = placement_key(pod)
        verdict = self._cache.get(key)
        if verdict is None:
            feasible: list[str] = []
            rejected: dict[str, str] = {}
            for name in sorted(self.nodes):
                reasons = static_reasons(pod, self.nodes[name])
                if reasons:
                    rejected[name] = reasons[0]
                else:
                    feasible.append(name)
            verdict = self._cache[key] = StaticVerdict(tuple(feasible), rejected)
        return verdict

    def nodes_changed(self) -> None:
        self._cache.clear()
