"""The picture of the cluster that one scheduling cycle decides on."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from batchsched.core.cluster import ClusterState
from batchsched.core.model import GroupSpec, NodeInfo, PodInfo
from batchsched.core.queues.model import QueueInfo
from batchsched.core.resources import Resources


@dataclass(frozen=True)
class Snapshot:
    """``nodes`` and ``pods`` are those of ``cluster``; without a cluster
    (tests, one-off tools), or with other maps, one is built from them.  The shell and the
    simulator pass their long-lived ``ClusterState``, whose indexes and
    caches make a cycle cost what changed; nothing changes it while a
    cycle runs."""

    nodes: Mapping[str, NodeInfo]
    pods: Mapping[str, PodInfo]  # every pod the cache knows, by uid
    groups: Mapping[str, GroupSpec]  # PodGroups by "namespace/name"
    now: float
    scheduler_name: str = "batchsched"
    # PodGroups that exist but failed validation: key -> message
    invalid_groups: Mapping[str, str] = field(default_factory=dict)
    queues: Mapping[str, QueueInfo] = field(default_factory=dict)  # Queue objects by name
    invalid_queues: Mapping[str, str] = field(default_factory=dict)  # Queues that failed validation: name -> why
    cluster: ClusterState = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        cluster = self.cluster
        if cluster is None or cluster.nodes is not self.nodes or cluster.pods is not self.pods:
            # (dataclasses.replace with new nodes or pods lands here too)
            object.__setattr__(self, "cluster", ClusterState(self.scheduler_name, self.nodes.values(),
                                                             self.pods.values()))

    @classmethod
    def of(cls, cluster: ClusterState, groups: Mapping[str, GroupSpec], now: float,
           invalid_groups: Mapping[str, str] | None = None, queues: Mapping[str, QueueInfo] | None = None,
           invalid_queues: Mapping[str, str] | None = None) -> Snapshot:
        return cls(nodes=cluster.nodes, pods=cluster.pods, groups=groups, now=now,
                   scheduler_name=cluster.scheduler_name, invalid_groups=invalid_groups or {},
                   queues=queues or {}, invalid_queues=invalid_queues or {}, cluster=cluster)

    def free_by_node(self) -> dict[str, Resources]:
        return {name: dict(self.cluster.free(name)) for name in self.nodes}
