"""Gangs as the scheduler sees them, built from a Snapshot.

A gang is every pod of ours (``schedulerName`` is this scheduler) that
shares a ``PodInfo.gang_key``: the pods of one PodGroup, or a lone pod with
no group label, which forms an implicit gang of one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterator, Mapping

from batchsched.core.model import GroupSpec, PodInfo
from batchsched.core.snapshot import Snapshot

REASON_GROUP_NOT_FOUND = "PodGroupNotFound"
REASON_INVALID_GROUP = "InvalidPodGroup"


@dataclass(frozen=True)
class GangProblem:
    """Why a gang cannot be scheduled at all, whatever the cluster holds."""

    reason: str
    message: str


@dataclass(frozen=True)
class Gang:
    key: str
    # The PodGroup, or a stand-in with minMember 1 for a lone pod or for a
    # group that is missing or invalid (see ``problem``).
    spec: GroupSpec
    priority: int
    members: tuple[PodInfo, ...]  # every pod of ours in the gang, terminal ones too
    pending: tuple[PodInfo, ...]  # unbound, not terminal, not terminating, not gated
    bound_active: tuple[PodInfo, ...]  # bound, not terminal, not terminating
    gated: int = 0  # unbound members held back by scheduling gates
    problem: GangProblem | None = None
    implicit: bool = False  # spec is a stand-in, not a PodGroup

    @property
    def min_member(self) -> int:
        return self.spec.min_member

    @property
    def created(self) -> float:
        return self.spec.created

    @property
    def active(self) -> int:
        """Members that count toward minMember."""
        return len(self.bound_active) + len(self.pending)

    @property
    def eligible(self) -> bool:
        return self.problem is None and self.active >= self.min_member

    @property
    def need(self) -> int:
        """How many pending members must be placed at once to reach quorum."""
        return max(0, self.min_member - len(self.bound_active))

    @property
    def signature(self) -> Hashable:
        """Changes when the gang's spec or membership does."""
        return (self.spec.generation, frozenset(p.uid for p in self.members))


class GangIndex(Mapping[str, Gang]):
    """Every gang with at least one pod of ours, by key, built on first use.

    Built gangs are kept across cycles in the cluster state's caches and
    reused while the gang's pods (``ClusterState.gang_stamp``), its PodGroup
    object and its validation message are unchanged: a gang is a function
    of exactly those.
    """

    def __init__(self, snapshot: Snapshot):
        self._snapshot = snapshot
        self._cluster = snapshot.cluster
        self._built: dict[str, tuple[int, GroupSpec | None, str | None, Gang]] = \
            self._cluster.caches.setdefault("gangs", {})

    def __getitem__(self, key: str) -> Gang:
        snapshot, cluster = self._snapshot, self._cluster
        stamp, group, invalid = cluster.gang_stamp(key), snapshot.groups.get(key), snapshot.invalid_groups.get(key)
        hit = self._built.get(key)
        if hit is not None and hit[0] == stamp and hit[1] is group and hit[2] == invalid:
            return hit[3]
        members = [p for p in (cluster.pods[uid] for uid in cluster.gang_uids(key))
                   if p.scheduler_name == snapshot.scheduler_name]
        if not members:
            self._built.pop(key, None)
            raise KeyError(key)
        gang = _gang(key, members, snapshot)
        self._built[key] = (stamp, group, invalid, gang)
        return gang

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def _keys(self) -> list[str]:
        cluster = self._cluster
        return sorted({p.gang_key for p in cluster.pods.values() if p.scheduler_name == cluster.scheduler_name})

    def pending(self) -> list[Gang]:
        """The gangs with pending pods of ours (unbound, live, not gated), in key order."""
        built = self._built
        if len(built) > 2 * len(self._cluster.pods) + 64:  # drop gangs that are gone
            for key in [k for k in built if not self._cluster.gang_stamp(k)]:
                del built[key]
        return [self[key] for key in sorted(self._cluster.pending_gang_keys())]


def build_gangs(snapshot: Snapshot) -> dict[str, Gang]:
    """Every gang with at least one pod of ours, by key, in key order."""
    return dict(GangIndex(snapshot))


def effective_priority(spec: GroupSpec, members: list[PodInfo]) -> int:
    """What the gang queues and preempts at: its most important member's
    priority, which the API server's Priority admission set on the pod, or
    the PodGroup's priorityClassName when that is lower.  A PodGroup is
    tenant-written: naming system-cluster-critical there never lifts a gang
    above what its pods were admitted with."""
    admitted = max(p.priority for p in members)
    return admitted if spec.priority is None else min(spec.priority, admitted)


def _gang(key: str, members: list[PodInfo], snapshot: Snapshot) -> Gang:
    members.sort(key=lambda p: (p.created, p.name, p.uid))
    first = members[0]
    spec, problem = None, None
    if first.group:
        if key in snapshot.invalid_groups:
            problem = GangProblem(REASON_INVALID_GROUP, snapshot.invalid_groups[key])
        elif key in snapshot.groups:
            spec = snapshot.groups[key]
        else:
            problem = GangProblem(REASON_GROUP_NOT_FOUND, f"PodGroup {key} not found")
    implicit = spec is None
    if spec is None:
        spec = GroupSpec(namespace=first.namespace, name=key.split("/", 1)[1], min_member=1,
                         created=first.created)
    unbound = [p for p in members if not p.node_name and not p.terminal and not p.terminating]
    return Gang(
        key=key,
        spec=spec,
        priority=effective_priority(spec, members),
        members=tuple(members),
        pending=tuple(p for p in unbound if not p.gated),
        bound_active=tuple(p for p in members if p.holds_resources and not p.terminating),
        gated=sum(1 for p in unbound if p.gated),
        problem=problem,
        implicit=implicit,
    )
