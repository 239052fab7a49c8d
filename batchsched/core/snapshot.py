"""An immutable picture of the cluster that one scheduling cycle decides on."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from batchsched.core import resources as res
from batchsched.core.model import GroupSpec, NodeInfo, PodInfo
from batchsched.core.resources import Resources


@dataclass(frozen=True)
class Snapshot:
    nodes: Mapping[str, NodeInfo]
    pods: Mapping[str, PodInfo]  # every pod the cache knows, by uid
    groups: Mapping[str, GroupSpec]  # PodGroups by "namespace/name"
    now: float
    scheduler_name: str = "batchsched"
    # PodGroups that exist but failed validation: key -> message
    invalid_groups: Mapping[str, str] = field(default_factory=dict)

    def used_by_node(self) -> dict[str, Resources]:
        """Resources held on each node by every non-terminal bound pod,
        whichever scheduler placed it (terminating pods still hold theirs)."""
        return self._used_by_node(lambda pod: False)

    def free_by_node(self) -> dict[str, Resources]:
        return self.free_by_node_without(lambda pod: False)

    def free_by_node_without(self, gone: Callable[[PodInfo], bool]) -> dict[str, Resources]:
        """Free resources per node as if the bound pods for which ``gone``
        is true had finished."""
        used = self._used_by_node(gone)
        return {name: res.subtract(node.allocatable, used[name]) for name, node in self.nodes.items()}

    def pods_by_node(self) -> Mapping[str, tuple[PodInfo, ...]]:
        """The pods bound to each node name, in ``pods`` order.  Built once
        per snapshot (kept in the instance's ``__dict__``, not a field)."""
        index = self.__dict__.get("_pods_by_node")
        if index is None:
            grouped: dict[str, list[PodInfo]] = {}
            for pod in self.pods.values():
                if pod.node_name:
                    grouped.setdefault(pod.node_name, []).append(pod)
            index = {name: tuple(pods) for name, pods in grouped.items()}
            object.__setattr__(self, "_pods_by_node", index)
        return index

    def _used_by_node(self, gone: Callable[[PodInfo], bool]) -> dict[str, Resources]:
        used: dict[str, Resources] = {name: {} for name in self.nodes}
        for pod in self.pods.values():
            held = used.get(pod.node_name)
            if held is not None and pod.holds_resources and not gone(pod):
                for name, amount in pod.requests.items():  # in place: this runs for every pod, every cycle
                    held[name] = held.get(name, 0) + amount
        return used
