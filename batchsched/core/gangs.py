"""Gangs as the scheduler sees them, built from a Snapshot.

A gang is every pod of ours (``schedulerName`` is this scheduler) that
shares a ``PodInfo.gang_key``: the pods of one PodGroup, or a lone pod with
no group label, which forms an implicit gang of one.  Pods that carry a
PodGroup's label but name another scheduler are not members: this
scheduler never places them and they never count toward minMember; they
are named in the gang's messages so the mistake shows (docs/podgroup.md).
"""
from __future__ import annotations

import difflib
import functools
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable, Iterator, Mapping, Sequence

from batchsched.api.constants import POD_GROUP_LABEL
from batchsched.api.podgroup import MAX_RECORDED_BINDINGS
from batchsched.core.cluster import ClusterState
from batchsched.core.gangsources import OWN, SOURCES, jobsets, stated_size
from batchsched.core.model import GroupSpec, PodInfo
from batchsched.core.snapshot import Snapshot
from batchsched.core.text import clip
from batchsched.core.tracked import TrackedDict

REASON_GROUP_NOT_FOUND = "PodGroupNotFound"
REASON_INVALID_GROUP = "InvalidPodGroup"
# Warning Event on a PodGroup and on each pod that carries its label but names another scheduler.
REASON_FOREIGN_MEMBERS = "ForeignSchedulerMembers"
MAX_NAMED_PODS = 5  # foreign pods named per scheduler; the rest are counted
MAX_NAMED_SCHEDULERS = 3
# Label values of a namespace compared with a PodGroup's name when it finds
# no pods (a tenant may label pods with any number of values).
MAX_LABEL_VALUES_COMPARED = 1000


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
    # unbound members whose ResourceClaims cannot be allocated now: (pod name, why)
    claims_waiting: tuple[tuple[str, str], ...] = ()
    foreign: tuple[PodInfo, ...] = ()  # see foreign_members
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
        return self.problem is None and self.active >= self.min_member and not self.tasks_short

    @property
    def tasks_short(self) -> tuple[tuple[str, int, int], ...]:
        """(task, live members, minTaskMember) of each task with too few live members."""
        if not self.spec.min_task_members:
            return ()
        live = Counter(p.task for p in (*self.bound_active, *self.pending))
        return tuple((task, live[task], need) for task, need in self.spec.min_task_members if live[task] < need)

    @property
    def task_need(self) -> dict[str, int]:
        """Task -> how many pending members of it must be placed at once, beyond those bound."""
        bound = Counter(p.task for p in self.bound_active)
        return {task: need - bound[task] for task, need in self.spec.min_task_members if need > bound[task]}

    @property
    def need(self) -> int:
        """How many pending members must be placed at once to reach quorum."""
        return max(0, self.min_member - len(self.bound_active))

    @property
    def partly_bound(self) -> bool:
        """Bound members hold room while the quorum is short: left so too
        long, the gang starts over, whoever bound them (a gang that cannot
        complete holds nothing; core/cycle/)."""
        return self.need > 0 and bool(self.bound_active)

    @functools.cached_property
    def first_in_line(self) -> bool:
        """Partly bound by this scheduler: the rest go before anyone else
        takes room (kept, as ``signature``).  Bound members nobody proves
        ours (a pod created with spec.nodeName, one found bound at a start
        that the PodGroup's status does not name) give no precedence."""
        return self.partly_bound and any(bound_by_us(p, self.spec) for p in self.bound_active)

    @functools.cached_property
    def signature(self) -> Hashable:
        """Changes when the gang's spec or membership does.  Kept on the
        object, which ``GangIndex`` keeps while the gang is unchanged: the
        queue asks every waiting gang's at each cycle."""
        return (self.spec.generation, frozenset(p.uid for p in self.members))


@dataclass
class GangChanges:
    """For a cache of per-gang facts kept across cycles: which gangs' pods
    or PodGroup changed since it last looked, from the cluster's change
    log and the PodGroups' (a TrackedDict, as the shell's cache and the
    simulator keep them)."""

    pods_mark: int | None = None  # the cluster's change clock at the last look (None: never looked)
    groups: Mapping | None = None  # the PodGroups looked at (None: not a TrackedDict)
    groups_mark: int = 0

    def since_last(self, snapshot: Snapshot) -> set[str] | None:
        """The gangs changed since the last ``looked``; None when the logs
        cannot tell (never looked, other PodGroups, logs trimmed): any may
        have."""
        groups = snapshot.groups
        if self.pods_mark is None or self.groups is not groups:
            return None
        pods = snapshot.cluster.gangs_changed_since(self.pods_mark)
        regrouped = groups.changed_since(self.groups_mark)  # (self.groups is a TrackedDict)
        if pods is None or regrouped is None:
            return None
        return set(pods).union(regrouped)

    def looked(self, snapshot: Snapshot) -> None:
        groups = snapshot.groups
        self.pods_mark = snapshot.cluster.mark
        self.groups, self.groups_mark = (groups, groups.mark) if isinstance(groups, TrackedDict) else (None, 0)


@dataclass
class _Built:
    """The gangs ``GangIndex`` built, kept across cycles: key -> (pods' stamp, PodGroup, validation message, gang)."""

    by_key: dict[str, tuple[int, GroupSpec | None, str | None, Gang]] = field(default_factory=dict)


class GangIndex(Mapping[str, Gang]):
    """Every gang with at least one pod of ours, by key, built on first use.

    Built gangs are kept across cycles in the cluster state (``_Built``) and
    reused while the gang's pods (``ClusterState.gang_stamp``), its PodGroup
    object and its validation message are unchanged: a gang is a function
    of exactly those.
    """

    def __init__(self, snapshot: Snapshot):
        self._snapshot = snapshot
        self._cluster = snapshot.cluster
        self._built = self._cluster.kept(_Built).by_key
        self._checked: dict[str, Gang] = {}  # gangs looked up in this snapshot: nothing changes within it

    def __getitem__(self, key: str) -> Gang:
        gang = self._checked.get(key)
        if gang is None:
            gang = self._checked[key] = self._current(key)
        return gang

    def _current(self, key: str) -> Gang:
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
        gang = _gang(key, members, snapshot, foreign_members(cluster, key))
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


def bound_by_us(pod: PodInfo, spec: GroupSpec) -> bool:
    """Whether batchsched bound the gang's member: this process made or saw
    the binding, or the PodGroup's status (which tenants cannot write) says
    so.  Only the status outlives a restart; where it is missing (a gang
    of another source, a binding made just before a crash) nothing is
    believed, and the gang gets no precedence (docs/binding.md)."""
    return pod.bound_by_scheduler or pod.uid in spec.recorded_bindings


def bindings_to_record(members: Sequence[PodInfo], recorded: frozenset[str]) -> list[str]:
    """What a PodGroup's status.boundByScheduler says next: the UIDs of the
    bound members batchsched bound (``recorded``: what it says now), at
    most MAX_RECORDED_BINDINGS of them, in a stable order.  One still bound
    is all ``Gang.first_in_line`` needs."""
    uids = sorted(p.uid for p in members if p.holds_resources and not p.terminating
                  and (p.bound_by_scheduler or p.uid in recorded))
    return uids[:MAX_RECORDED_BINDINGS]


def effective_priority(spec: GroupSpec, members: list[PodInfo]) -> int:
    """What the gang queues and preempts at: its most important member's
    priority, which the API server's Priority admission set on the pod, or
    the PodGroup's priorityClassName when that is lower.  A PodGroup is
    tenant-written: naming system-cluster-critical there never lifts a gang
    above what its pods were admitted with."""
    admitted = max(p.priority for p in members)
    return admitted if spec.priority is None else min(spec.priority, admitted)


def foreign_members(cluster: ClusterState, key: str) -> tuple[PodInfo, ...]:
    """The unfinished pods that carry the gang's PodGroup label but name another
    scheduler (a forgotten ``schedulerName``), in the order they came."""
    pods = (cluster.pods[uid] for uid in cluster.gang_uids(key))
    return tuple(p for p in pods if p.group and p.scheduler_name != cluster.scheduler_name and not p.terminal)


def members_selector(namespace: str, group: str, scheduler_name: str, source: str = "") -> str:
    """What makes a pod a member of the PodGroup (of gang source ``source``), in words."""
    membership = SOURCES[source or OWN].membership(group)
    return f"pods with {membership} and schedulerName {scheduler_name} in {namespace}"


def foreign_note(foreign: Sequence[PodInfo], scheduler_name: str) -> str:
    """Names ``foreign`` pods (foreign_members) by the scheduler they name,
    and where the bound ones are, and says what to change."""
    by_scheduler: dict[str, list[PodInfo]] = {}
    for pod in foreign:
        by_scheduler.setdefault(pod.scheduler_name, []).append(pod)
    parts = []
    for name, pods in sorted(by_scheduler.items())[:MAX_NAMED_SCHEDULERS]:
        named = ", ".join(f"{p.name} (bound to {p.node_name})" if p.node_name else p.name
                          for p in pods[:MAX_NAMED_PODS])
        more = f" and {len(pods) - MAX_NAMED_PODS} more" if len(pods) > MAX_NAMED_PODS else ""
        mark = "annotation" if SOURCES[pods[0].group_source or OWN].by_annotation else "label"
        parts.append(f"{len(pods)} pod(s) carry the gang {mark} but schedulerName {clip(name, 80)}: {named}{more}")
    if len(by_scheduler) > MAX_NAMED_SCHEDULERS:
        parts.append(f"pods naming {len(by_scheduler) - MAX_NAMED_SCHEDULERS} more scheduler(s)")
    return (f"{'; '.join(parts)}; they do not count toward minMember (set schedulerName: {scheduler_name})")


def foreign_pod_message(pod: PodInfo, scheduler_name: str) -> str:
    """The Event on a pod foreign_members names."""
    return (f"Pod carries {SOURCES[pod.group_source or OWN].membership(pod.group)}, a gang scheduled by "
            f"{scheduler_name}, but "
            f"schedulerName {clip(pod.scheduler_name, 80)}: it is not placed with its gang and does not count "
            f"toward its minMember; create it with schedulerName: {scheduler_name}.")


def no_members_message(cluster: ClusterState, namespace: str, group: str, min_member: int) -> str:
    """QuorumNotReached's message for a PodGroup with no pod of ours: the
    label and scheduler looked for, then the pods that name another
    scheduler, else label values close to the PodGroup's name (a typo)."""
    message = f"0/{min_member} members exist: no {members_selector(namespace, group, cluster.scheduler_name)}"
    foreign = foreign_members(cluster, f"{namespace}/{group}")
    if foreign:
        return f"{message}; {foreign_note(foreign, cluster.scheduler_name)}."
    others = itertools.islice((v for v in cluster.group_names(namespace) if v != group), MAX_LABEL_VALUES_COMPARED)
    similar = difflib.get_close_matches(group, others, n=3, cutoff=0.7)
    if similar:
        values = ", ".join(clip(v, 80) for v in sorted(similar))
        message += f"; pods in {namespace} carry {POD_GROUP_LABEL}={values} (a typo?)"
    return message + "."


def _not_found(key: str, pod: PodInfo) -> str:
    if not pod.group_source:
        return f"PodGroup {key} not found"
    source = SOURCES[pod.group_source]
    return (f"{source.kind} {pod.namespace}/{pod.group} ({source.api_version}, named by the pod's "
            f"{source.membership(pod.group)}) not found")


def _claims_waits(unbound: list[PodInfo]) -> dict[str, str]:
    """Unbound, ungated members whose claims cannot be allocated now: uid ->
    why.  A member joining a claim that a gang mate allocates in the same
    plan (``DeviceDemand.follows``) waits while that mate waits: the two go
    on one node or neither does."""
    live = {p.uid: p for p in unbound if not p.gated}
    waits = {uid: p.device_demand.problem for uid, p in live.items()
             if p.device_demand is not None and p.device_demand.problem}
    joiners: dict[str, list[tuple[str, PodInfo]]] = {}  # allocator uid -> (claim, a pod joining it)
    for pod in live.values():
        for key, allocator in pod.device_demand.follows if pod.device_demand is not None else ():
            if allocator in live:
                joiners.setdefault(allocator, []).append((key, pod))
            elif pod.uid not in waits:  # (joins keep up with their sharers: a guard, failing closed)
                waits[pod.uid] = (f"ResourceClaim {clip(key, 200)} is shared with the gang mate of uid "
                                  f"{clip(allocator, 63)}, which allocates it and is not pending")
    stack = list(waits)
    while stack:  # (the joiners of a joiner that waits wait too)
        allocator = stack.pop()
        for key, pod in joiners.get(allocator, ()):
            if pod.uid not in waits:
                waits[pod.uid] = (f"ResourceClaim {clip(key, 200)} is shared with gang mate {live[allocator].name}, "
                                  f"which allocates it and waits ({clip(waits[allocator], 300)})")
                stack.append(pod.uid)
    return waits


def _gang(key: str, members: list[PodInfo], snapshot: Snapshot, foreign: tuple[PodInfo, ...]) -> Gang:
    members.sort(key=lambda p: (p.created, p.name, p.uid))
    first = members[0]
    spec, problem = None, None
    if first.group and SOURCES[first.group_source or OWN].size_annotation:  # no PodGroup: its pods say what it is
        read = stated_size.group_spec(first.group_source, members)
        if isinstance(read, str):
            problem = GangProblem(REASON_INVALID_GROUP, read)
        else:
            spec = read
    elif first.group:
        if key in snapshot.invalid_groups:
            problem = GangProblem(REASON_INVALID_GROUP, snapshot.invalid_groups[key])
        elif key in snapshot.groups:
            spec = jobsets.started(snapshot.groups[key], members)
        else:
            problem = GangProblem(REASON_GROUP_NOT_FOUND, _not_found(key, first))
    implicit = spec is None
    if spec is None:
        spec = GroupSpec(namespace=first.namespace, name=first.group or key.split("/", 1)[1], min_member=1,
                         created=first.created, source=first.group_source)
    unbound = [p for p in members if not p.node_name and not p.terminal and not p.terminating]
    waits = _claims_waits(unbound)
    return Gang(
        key=key,
        spec=spec,
        priority=effective_priority(spec, members),
        members=tuple(members),
        pending=tuple(p for p in unbound if not p.gated and p.uid not in waits),
        bound_active=tuple(p for p in members if p.holds_resources and not p.terminating),
        gated=sum(1 for p in unbound if p.gated),
        claims_waiting=tuple((p.name, waits[p.uid]) for p in unbound if p.uid in waits),
        foreign=foreign,
        problem=problem,
        implicit=implicit,
    )
