"""Watch caches: list then watch pods, nodes, PodGroups, Queues, PriorityClasses and
the DRA objects (DeviceClasses, ResourceSlices, ResourceClaims).

The cache is the scheduler's only state.  It holds core model objects (not
client objects), applies the scheduler's *assumed* bindings on top of what the
API server has confirmed, and records what changed since the last cycle so
the queue can reset backoffs.

Each collection is kept by a :class:`Reflector` (shell/reflector.py), which
hands this cache's handlers for its kind (shell/handlers/) each listed object,
each whole list and each watch event.  A whole list is swapped in at once:
objects missing from it are removed, objects equal to those held keep the
held instance, and assumptions still overlay the listed pods, so bindings in
flight are not forgotten.  An object that cannot be converted is reported
(``on_bad_object``) and skipped.

An *optional* collection (the DRA ones, Queues, foreign PodGroups) that the
API server does not serve or that the scheduler may not read counts as
synced and empty: the scheduler runs as it did without DRA rather than stall
every gang for an inventory it can do without (without the Queue CRD every
gang is in the default queue, and one naming another queue waits with
QueueNotFound).  Claims are the exception that fails closed: without them no
DRA GPU is known free, so the cache tells the state
(``ClusterState.set_claims_unreadable``) and every DRA GPU counts in use.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Callable, Iterable, Mapping

from batchsched.api import constants
from batchsched.core import gangsources
from batchsched.core.cluster import ClusterState
from batchsched.core.dra import model as dra
from batchsched.core.model import GroupSpec, NodeInfo, PodInfo, pod_with
from batchsched.core.queues.model import QueueInfo
from batchsched.core.snapshot import Snapshot
from batchsched.core.tracked import TrackedDict
from batchsched.kube.client import Kube
from batchsched.shell import wire
from batchsched.shell.handlers.dra import CLAIMS_ABSENT_EFFECT, DRA, DraHandlers
from batchsched.shell.handlers.groups import GroupHandlers, foreign_kind
from batchsched.shell.handlers.nodes import NodeHandlers
from batchsched.shell.handlers.pods import PodHandlers
from batchsched.shell.handlers.queues import QueueHandlers
from batchsched.shell.reflector import Reflector
from batchsched.shell.trust import GpuIdTrust

log = logging.getLogger(__name__)

PODGROUPS_PATH = gangsources.SOURCES[gangsources.OWN].path
QUEUES_PATH = f"/apis/{constants.GROUP}/{constants.VERSION}/{constants.QUEUE_PLURAL}"


class ClusterCache(PodHandlers, NodeHandlers, DraHandlers, GroupHandlers, QueueHandlers, GpuIdTrust):
    """The scheduler's state, kept by one reflector per collection; the
    handlers of each kind (shell/handlers/) and the GPU-id trust
    (shell/trust.py) are its parts."""

    def __init__(self, scheduler_name: str, node_selector: Mapping[str, str] | None = None,
                 also_serves: Iterable[str] = (), gang_sources: Iterable[str] = (),
                 auto_always: Iterable[str] = ()):
        self.scheduler_name = scheduler_name
        # Other schedulerNames whose pods are ours too (config schedulerNames):
        # such a pod is held under scheduler_name, so the core sees one name.
        self.also_serves = frozenset(also_serves) - {scheduler_name}
        # The gang sources read (core/gangsources), ours always among them.
        self.gang_sources = frozenset({gangsources.OWN, *gang_sources})
        self.auto_always = frozenset(auto_always)  # automatic gangs that need no opt-in on the pods
        self.node_selector = dict(node_selector or {})
        self.state = ClusterState(scheduler_name)
        self.groups_raw: dict[str, dict] = {}  # every source's PodGroups, by gang key
        # The Jobs and JobSets sizing automatic gangs, as references for Events, by gang key.
        self.owner_refs: dict[str, dict] = {}
        self.groups: dict[str, GroupSpec] = TrackedDict()  # changes logged for the queues' counts (core/queues)
        self.invalid_groups: dict[str, str] = {}
        self.priority_classes: dict[str, int] = {}
        self.queues_raw: dict[str, dict] = {}  # kept raw: few, and their status is written back
        self.queues: dict[str, QueueInfo] = {}
        self.invalid_queues: dict[str, str] = {}  # name -> why
        # uid -> (node, gpu ids): bound by us (or being bound), not yet seen
        # bound by the watch.  Never expires: only the watch, the pod's end
        # or a binder that learnt the binding failed ends an assumption.
        self.assumed: dict[str, tuple[str, tuple[int, ...]]] = {}
        # uid -> (GPU ids, gang key) of the bound pods whose GPU ids this
        # scheduler believes (see _trusted); the gang is the one the pod was
        # in when this process made or saw its binding, "" when it did not.
        self.witnessed: dict[str, tuple[tuple[int, ...], str]] = {}
        self.pods_listed = False  # the first pod list is in: later arrivals are judged by what was seen
        self.touched_gangs: set[str] = set()
        self.capacity_freed = False
        self.changed = asyncio.Event()
        # node -> the topology problem last reported (reported once per new problem)
        self.topology_reported: dict[str, str] = {}
        # Nodes whose topology problem waits until the DRA collections are
        # listed: their GPUs served through DRA count in the check.
        self._unchecked_topology: dict[str, dict] = {}
        self._dra_listed: set[str] = set()
        self._listed_node_refs: dict[str, dict] = {}  # a node list's nodes, to name them in reports
        self.on_bad_object: Callable[[str, dict, str], None] = lambda kind, obj, why: None
        self.on_fixed_object: Callable[[str, dict, str, str], None] = lambda kind, obj, reason, message: None
        self.on_watch_restart: Callable[[str, str], None] = lambda kind, why: None

    # ---- wiring -------------------------------------------------------------

    def reflectors(self, kube: Kube) -> list[Reflector]:
        restart = lambda kind, why: self.on_watch_restart(kind, why)  # noqa: E731 - late bound
        return [
            Reflector(kube, "/apis/scheduling.k8s.io/v1/priorityclasses", "priorityclasses",
                      self._priority_class_entry, self._replace_priority_classes, self._apply_priority_class,
                      restart),
            Reflector(kube, "/api/v1/nodes", "nodes", self._node_entry, self._replace_nodes, self._apply_node,
                      restart),
            Reflector(kube, PODGROUPS_PATH, "podgroups", self._group_entry, self._replace_groups,
                      self._apply_group, restart),
            # A foreign CRD may not be installed: optional, like the DRA collections.
            *(Reflector(kube, gangsources.SOURCES[name].path, foreign_kind(name),
                        functools.partial(self._group_entry, source=name),
                        functools.partial(self._replace_groups, source=name),
                        functools.partial(self._apply_group, source=name), restart, optional=True)
              for name in gangsources.PRECEDENCE
              if name != gangsources.OWN and name in self.gang_sources and gangsources.SOURCES[name].podgroups),
            # Indexed Jobs and JobSets size their automatic gangs; without RBAC
            # for them (or their CRD) their pods wait as members of an owner not found.
            *(Reflector(kube, gangsources.SOURCES[name].path, gangsources.SOURCES[name].plural,
                        functools.partial(self._owner_entry, source=name),
                        functools.partial(self._replace_owners, source=name),
                        functools.partial(self._apply_owner, source=name), restart, optional=True)
              for name in gangsources.OWNER_SIZED if name in self.gang_sources),
            Reflector(kube, QUEUES_PATH, "queues", self._queue_entry, self._replace_queues, self._apply_queue,
                      restart, optional=True),
            Reflector(kube, "/api/v1/pods", "pods", self._pod_entry, self._replace_pods, self._apply_pod, restart,
                      decode_page=wire.pod_list, decode_event=wire.pod_event),
            *(Reflector(kube, f"{dra.API_PATH}/{kind}", kind, self._dra_entry(kind), self._dra_replace(kind),
                        self._dra_apply(kind), restart, optional=True,
                        **({"on_absent": self._claims_unreadable, "absent_effect": CLAIMS_ABSENT_EFFECT}
                           if kind == "resourceclaims" else {})) for kind in DRA),
        ]

    def _notify(self) -> None:
        self.changed.set()

    # ---- assumptions ----------------------------------------------------------

    def assume(self, uid: str, node: str, gpu_ids: tuple[int, ...]) -> None:
        pod = self.pods.get(uid)
        if pod is None:
            return
        self.assumed[uid] = (node, gpu_ids)
        self.state.put_pod(pod_with(pod, node_name=node, gpu_ids=gpu_ids, bound_by_scheduler=True))

    def forget(self, uid: str) -> None:
        """The binding is known not to have happened: the pod is unbound again.

        Only the binder calls this, after a refusal or after reading the pod
        back (an ambiguous outcome is never guessed at).  Its room frees for
        others; its gang is touched (its status counted the pod bound), and
        keeps the refusal's backoff, which a touch does not clear.
        """
        if self.assumed.pop(uid, None) is None:
            return
        pod = self.pods.get(uid)
        if pod is not None and not pod.terminal:
            self.state.put_pod(pod_with(pod, node_name="", gpu_ids=(), bound_by_scheduler=False))
            self.touched_gangs.add(pod.gang_key)  # its status counted the pod bound
        self.capacity_freed = True
        self._notify()

    # ---- the cycle's view ------------------------------------------------------

    def snapshot(self, now: float) -> Snapshot:
        # The cycle is synchronous: nothing changes the state while it runs.
        return Snapshot.of(self.state, self.groups, now, self.invalid_groups, self.queues, self.invalid_queues)

    def drain_changes(self) -> tuple[set[str], bool]:
        touched, freed = self.touched_gangs, self.capacity_freed
        self.touched_gangs, self.capacity_freed = set(), False
        return touched, freed

    def members(self, gang_key: str) -> list[PodInfo]:
        """The gang's pods of our scheduler, from the index (no scan)."""
        pods = (self.pods[uid] for uid in self.state.gang_uids(gang_key))
        return [p for p in pods if p.scheduler_name == self.scheduler_name]

    def set_nomination(self, uid: str, node_name: str) -> None:
        """Record (or clear, with "") the node a pending pod is nominated to."""
        pod = self.pods.get(uid)
        if pod is not None and pod.nominated_node != node_name:
            self.state.put_pod(pod_with(pod, nominated_node=node_name))

    def nominated_pods(self) -> list[PodInfo]:
        return list(self.state.nominated_pods())

    @property
    def pods(self) -> Mapping[str, PodInfo]:
        return self.state.pods

    @property
    def nodes(self) -> Mapping[str, NodeInfo]:
        return self.state.nodes
