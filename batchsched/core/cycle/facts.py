"""What the cycle derives of a gang object, kept while the object lives.

``GangIndex`` keeps a gang object across cycles while its pods and PodGroup
are unchanged; these facts depend on nothing else (``placement_policy`` on
the config too), so they are kept beside it in one typed cross-cycle cache
(``ClusterState.kept``), checked by object identity: a rebuilt gang is a
new object and gets them anew.  The woken gangs are asked them in every
cycle that frees room.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from batchsched.core.config import CoreConfig
from batchsched.core.gangs import Gang
from batchsched.core.model import PodInfo, TopologyPolicy
from batchsched.core.placement.capacity import shape_key
from batchsched.core.queueing.runtime import runtime_bound
from batchsched.core.snapshot import Snapshot

_UNSET = object()


@dataclass
class _Facts:
    gang: Gang  # the object they are of
    one_pod_per_shape: list[PodInfo] | None = None
    shortest_bound: object = _UNSET  # float | None once known
    policy: tuple[CoreConfig, TopologyPolicy] | None = None


@dataclass
class GangFacts:
    """The cache: gang key -> its facts.  Entries of gangs gone are dropped
    all at once when there are more than twice as many as pods (a gang has
    at least one), so it stays within a constant factor of what lives."""

    by_key: dict[str, _Facts] = field(default_factory=dict)

    def renew(self, gang: Gang, pods: int) -> _Facts:
        """New facts for ``gang`` (first seen, or a new object)."""
        if len(self.by_key) > 2 * pods + KEPT_BEYOND_PODS:
            self.by_key.clear()
        facts = self.by_key[gang.key] = _Facts(gang)
        return facts


KEPT_BEYOND_PODS = 1024


def _facts(snapshot: Snapshot, gang: Gang) -> _Facts:
    kept = snapshot.cluster.kept(GangFacts)
    facts = kept.by_key.get(gang.key)
    if facts is None or facts.gang is not gang:
        facts = kept.renew(gang, len(snapshot.pods))
    return facts


def one_pod_per_shape(snapshot: Snapshot, gang: Gang) -> list[PodInfo]:
    """A pending pod of each of the gang's shapes (as ``places_none`` asks them)."""
    facts = _facts(snapshot, gang)
    if facts.one_pod_per_shape is None:
        facts.one_pod_per_shape = list({shape_key(p): p for p in gang.pending}.values())
    return facts.one_pod_per_shape


def shortest_bound(snapshot: Snapshot, gang: Gang) -> float | None:
    """The shortest runtime bound among its pending pods that end by themselves."""
    facts = _facts(snapshot, gang)
    if facts.shortest_bound is _UNSET:
        bounds = [bound for pod in gang.pending
                  if pod.runs_to_completion and (bound := runtime_bound(pod, snapshot.groups)) is not None]
        facts.shortest_bound = min(bounds, default=None)
    return facts.shortest_bound  # type: ignore[return-value]


def placement_policy(snapshot: Snapshot, gang: Gang, config: CoreConfig) -> TopologyPolicy:
    """The gang's topology policy as placement applies it: its domain label
    keys resolved (the PodGroup's, else the configured ones), and GPUDirect
    RDMA preferred for a gang of several pods (docs/topology.md, "NICs")."""
    facts = _facts(snapshot, gang)
    if facts.policy is not None and facts.policy[0] is config:
        return facts.policy[1]
    policy = gang.spec.topology
    if policy.domain_mode and not policy.domain_labels:
        policy = dataclasses.replace(policy, domain_labels=config.domain_labels)
    if len(gang.members) > 1 or gang.spec.min_member > 1:
        policy = dataclasses.replace(policy, rdma=True)
    facts.policy = (config, policy)
    return policy
