"""The cluster as the scheduler knows it, indexed so a cycle costs what changed.

``ClusterState`` holds nodes and pods (core model objects) and is the one
place they change: the shell's watch cache and the simulator call
``put_node``, ``remove_node``, ``put_pod`` and ``remove_pod``.  Beside the
plain maps it keeps what a cycle would otherwise recompute from every pod:

* per node: the pods bound there, and, derived lazily and kept until the
  node or one of those pods changes, its free resources and GPU room;
* per gang: its pods, and which gangs have pending members of ours;
* per namespace: the gang label values its pods carry (for naming a
  likely typo when a PodGroup finds no pods);
* the pods terminating while they hold room, and our pending pods
  nominated to a node (preemption's holds);
* the sum of every node's allocatable, and how many nodes are in an
  NVLink clique (``nvidia.com/gpu.clique``);
* the GPU shapes asked: how many of our pending pods, and of the bound
  pods holding room, ask each number of GPUs (``gpu_asks``; our pending
  ones alone: ``pending_gpu_asks``), for fragmentation-aware node choice;
* the DRA objects (``dra``: DeviceClasses, ResourceSlices, ResourceClaims
  and assumed allocations, ``core/dra/state.py``): each node is held joined
  with its DRA GPUs (``model.with_dra``), and a change to those, or to a
  claim allocating or reserved for them, stamps the node;
* a change clock: a change to a node, or to a pod bound there, stamps the
  node, so whoever keeps a ``mark`` learns which nodes changed since then
  (``changed_since``) in time proportional to the changes; a change to a
  gang's pods stamps the gang (``gang_stamp``).

Pure data, no I/O.  ``kept(kind)`` holds what core modules derive from the
state and keep across cycles (the placement index, built gangs): one object
per type, the type defined, filled and invalidated by the module that owns
it, which checks its entries against the stamps kept here.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Collection, Hashable, Iterable, Iterator, Mapping, TypeVar

from batchsched.api.constants import GPU_CLIQUE_LABEL, GPU_RESOURCE
from batchsched.core import resources as res
from batchsched.core.dra import claims
from batchsched.core.dra.model import MAX_RESERVED_FOR, AllocatedDevice, DeviceClass, ResourceClaim, ResourceSlice
from batchsched.core.dra.state import DraState
from batchsched.core.model import NodeInfo, PodInfo, annotated_topology, with_dra
from batchsched.core.resources import Resources
from batchsched.core.text import clip
from batchsched.core.topology.accounting import GpuRoom, dra_gpus_by_id, gpu_id_count, room_after, room_of
from batchsched.core.topology.choose import mask_of
from batchsched.core.tracked import ChangeLog, changed_after


Kept = TypeVar("Kept")


class ClusterState:
    def __init__(self, scheduler_name: str, nodes: Iterable[NodeInfo] = (), pods: Iterable[PodInfo] = ()):
        self.scheduler_name = scheduler_name
        self.nodes: dict[str, NodeInfo] = {}  # joined with their DRA GPUs; read-only outside this class
        self._given: dict[str, NodeInfo] = {}  # the nodes as put (before the join)
        self.dra = DraState()  # read-only outside this class
        self.pods: dict[str, PodInfo] = {}  # by uid; read-only outside this class
        self.total_allocatable: Resources = {}
        self.clique_node_gpus: dict[int, int] = {}  # nodes labelled with an NVLink clique, by GPUs allocatable
        # GPUs per pod -> pods asking that many: ours pending, and every bound pod holding room
        self.gpu_asks: dict[int, int] = {}
        self.pending_gpu_asks: dict[int, int] = {}  # ours pending only
        self._kept: dict[Callable[[], Any], Any] = {}  # kept(kind): a cross-cycle cache per type
        self._clock = 0
        self._seq: dict[str, int] = {}  # uid -> when it entered ``pods`` (their order)
        self._next_seq = 0
        self._bound: dict[str, dict[str, PodInfo]] = {}  # node name -> uid -> pod bound there
        self._node_stamp: dict[str, int] = {}  # node name -> last change; most recent last
        self._derived: dict[str, tuple[int, Resources, GpuRoom | None]] = {}  # stamp, free, room
        self._by_gang: dict[str, dict[str, None]] = {}  # gang key -> uids (every scheduler's)
        self._gang_stamp: dict[str, int] = {}
        self._gang_changes = ChangeLog()  # of the gangs' pods, the loss of a gang's last pod included
        self._group_names: dict[str, dict[str, int]] = {}  # namespace -> gang label value -> pods (every scheduler's)
        self._pending: dict[str, int] = {}  # gang key -> our pending pods in it
        self._holding: dict[str, int] = {}  # gang key -> our pods in it holding room on a node
        self._terminating: set[str] = set()  # uids: bound, holding room, terminating
        self._nominated: set[str] = set()  # uids: ours, pending, nominated to a node
        self._claiming: dict[str, PodInfo] = {}  # uid -> a pod with ResourceClaims, as put (before the join)
        self._claim_pods: dict[str, dict[str, None]] = {}  # claim namespace/name -> uids of pods naming it
        for node in nodes:
            self.put_node(node)
        for pod in pods:
            self.put_pod(pod)

    # ---- changes --------------------------------------------------------------

    def put_node(self, node: NodeInfo) -> None:
        """Add or replace a node; one equal to the node held keeps the held
        object, so nothing derived from it is recomputed (a relist, a status
        heartbeat that changed nothing we read)."""
        old = self._given.get(node.name)
        if old is node or old == node:
            return
        self._given[node.name] = node
        self._join(node.name)

    def given_pod(self, uid: str) -> PodInfo | None:
        """The pod as last put, before it was joined with its claims."""
        return self._claiming.get(uid) or self.pods.get(uid)

    def given_node(self, name: str) -> NodeInfo | None:
        """The node as last put, before its DRA GPUs were joined."""
        return self._given.get(name)

    def _join(self, name: str) -> None:
        """Hold the node joined with its DRA GPUs; a join equal to the node
        held keeps the held object."""
        given = self._given[name]
        dra = self.dra.node_dra(name, annotated_topology(given)) if self.dra.has_slices(name) else None
        node = with_dra(given, dra)
        old = self.nodes.get(name)
        if old == node:
            return
        if old is not None:
            self._add_node(old, -1)
        self.nodes[name] = node
        self._add_node(node, 1)
        self._stamp_node(name)

    def remove_node(self, name: str) -> None:
        self._given.pop(name, None)
        old = self.nodes.pop(name, None)
        if old is not None:
            self._add_node(old, -1)
            self._stamp_node(name)
            self._derived.pop(name, None)

    def put_pod(self, pod: PodInfo) -> None:
        if pod.claims or pod.uid in self._claiming:
            self._put_claiming(pod)
        else:
            self._store_pod(pod)

    def _store_pod(self, pod: PodInfo) -> None:
        old = self.pods.get(pod.uid)
        if old is pod:
            return
        if old is not None:
            self._unindex(old)
        else:
            self._seq[pod.uid] = self._next_seq
            self._next_seq += 1
        self.pods[pod.uid] = pod
        self._index(pod)

    def remove_pod(self, uid: str) -> PodInfo | None:
        given = self._claiming.pop(uid, None)
        if given is not None:
            self._index_claims(given, -1)
        old = self.pods.pop(uid, None)
        if old is not None:
            self._unindex(old)
            del self._seq[uid]
        self._dra_changed(self.dra.forget_pod(uid))  # what was in flight for it is moot
        if given is not None:
            self._rejoin(_claim_keys(given))
        return old

    # ---- pods with ResourceClaims of their own --------------------------------------

    def _put_claiming(self, pod: PodInfo) -> None:
        """Hold the pod joined with what its claims ask (core/dra/claims.py);
        the pods sharing a claim with it are joined again: which of them
        allocates it may have changed."""
        pod = claims.unjoined(pod)
        old = self._claiming.get(pod.uid)
        if old is pod:
            return
        if old is not None:
            self._index_claims(old, -1)
        if pod.claims:
            self._claiming[pod.uid] = pod
            self._index_claims(pod, 1)
        else:
            self._claiming.pop(pod.uid, None)
        self._store_pod(self._joined(pod))
        self._rejoin((_claim_keys(old) if old is not None else set()) | _claim_keys(pod), but=pod.uid)

    def _index_claims(self, pod: PodInfo, sign: int) -> None:
        for key in _claim_keys(pod):
            uids = self._claim_pods.setdefault(key, {})
            if sign > 0:
                uids[pod.uid] = None
            else:
                uids.pop(pod.uid, None)
                if not uids:
                    del self._claim_pods[key]

    def _joined(self, pod: PodInfo) -> PodInfo:
        if not pod.claims or not pod.awaits_placement:
            return pod
        return claims.joined(pod, claims.join_demand(pod, self.dra.claim, self.dra.classes, self._shared_turn))

    def _rejoin(self, keys: Iterable[str] | None = None, but: str = "") -> None:
        """Join again the pods naming one of ``keys`` (None: every pod with claims)."""
        uids = (dict.fromkeys(self._claiming) if keys is None else
                dict.fromkeys(uid for key in keys for uid in self._claim_pods.get(key, ())))
        for uid in uids:
            if uid != but:
                joined = self._joined(self._claiming[uid])
                if joined != self.pods.get(uid):
                    self._store_pod(joined)

    def _shared_turn(self, key: str, pod: PodInfo) -> tuple[str, str]:
        """Of the unallocated claim ``key``, shared with other pods: why
        ``pod`` may not allocate it now, and the pod it joins it with
        instead ("" each: it allocates it).  A pod sharing it is bound (the
        allocation made for it is still to be seen): it waits.  One came
        first and allocates it: a member of the same gang of ours is placed
        with it in the same plan, any other pod waits and then follows it."""
        mine = self._seq.get(pod.uid, self._next_seq)
        first, first_seq, mates_ahead = None, mine, 0
        for other in self._claim_pods.get(key, ()):
            sharer = self._claiming.get(other)
            if other == pod.uid or sharer is None or sharer.terminal:
                continue
            if sharer.node_name:
                return (f"waiting for ResourceClaim {clip(key, 200)} to show the allocation made for pod "
                        f"{sharer.name}, which shares it"), ""
            seq = self._seq.get(other, self._next_seq)
            if sharer.awaits_placement and seq < mine:
                if self._planned_together(sharer, pod):
                    mates_ahead += 1
                if seq < first_seq:
                    first, first_seq = sharer, seq
        if first is None:
            return "", ""
        if not self._planned_together(first, pod):
            return (f"ResourceClaim {clip(key, 200)} is shared with pod {first.name}, which allocates it; this "
                    "pod then joins it on that node"), ""
        if mates_ahead >= MAX_RESERVED_FOR:
            return (f"ResourceClaim {clip(key, 200)} is shared by more than {MAX_RESERVED_FOR} pods of its gang, "
                    "the most the API lets it be reserved for"), ""
        return "", first.uid

    def _planned_together(self, one: PodInfo, other: PodInfo) -> bool:
        """Whether the two pods are members of one gang of ours (planned at once)."""
        return (one.gang_key == other.gang_key and one.scheduler_name == self.scheduler_name
                and other.scheduler_name == self.scheduler_name)

    # ---- DRA --------------------------------------------------------------------

    def put_device_class(self, device_class: DeviceClass) -> None:
        self._dra_changed(self.dra.put_class(device_class), rejoin=True)
        self._rejoin()

    def remove_device_class(self, name: str) -> None:
        self._dra_changed(self.dra.remove_class(name), rejoin=True)
        self._rejoin()

    def put_resource_slice(self, resource_slice: ResourceSlice) -> None:
        self._dra_changed(self.dra.put_slice(resource_slice), rejoin=True)

    def remove_resource_slice(self, name: str) -> None:
        self._dra_changed(self.dra.remove_slice(name), rejoin=True)

    def put_claim(self, claim: ResourceClaim) -> None:
        old = self.dra.claims.get(claim.uid)
        touched = set(self.dra.put_claim(claim))
        self._dra_changed(touched | self._nodes_of(old) | self._nodes_of(claim))
        self._rejoin({claim.key})

    def remove_claim(self, uid: str) -> None:
        old = self.dra.claims.get(uid)
        self._dra_changed(set(self.dra.remove_claim(uid)) | self._nodes_of(old))
        if old is not None:
            self._rejoin({old.key})

    def set_claims_unreadable(self, why: str) -> None:
        """The claims cannot be listed (``why``): every DRA GPU counts in use
        until they can again ("")."""
        self._dra_changed(self.dra.set_claims_unreadable(why))

    def assume_allocation(self, pod_uid: str, by_claim: Mapping[str, tuple[AllocatedDevice, ...]]) -> int:
        """Devices this scheduler is allocating to the pod's claims (claim
        uid, or ``EXTENDED_CLAIM``, -> devices) in a new binding attempt:
        in use until the claim is seen reserved for the pod and holding
        them, the pod goes, or ``forget_allocation`` of the attempt; a
        relist keeps them.  The attempt's number."""
        attempt, touched = self.dra.assume_allocation(pod_uid, by_claim)
        self._dra_changed(touched)
        return attempt

    def forget_allocation(self, pod_uid: str, attempt: int) -> None:
        self._dra_changed(self.dra.forget_allocation(pod_uid, attempt))

    def dra_allocated(self, name: str) -> int:
        """How many of the node's DRA GPUs are in use (allocated or assumed)."""
        dra = self.nodes[name].dra
        return self.dra.allocated(dra) if dra is not None else 0

    def _nodes_of(self, claim: ResourceClaim | None) -> set[str]:
        """Where the pods the claim is reserved for are bound (what DRA
        serves them changes what they hold of the node's other GPUs)."""
        if claim is None:
            return set()
        return {pod.node_name for uid in claim.reserved_for if (pod := self.pods.get(uid)) and pod.node_name}

    def _dra_changed(self, nodes: Iterable[str], rejoin: bool = False) -> None:
        """Stamp the nodes (of ours) a DRA change touched; ``rejoin``: their
        DRA GPUs may have changed too."""
        for name in nodes:
            if name in self._given:
                if rejoin:
                    self._join(name)
                self._stamp_node(name)

    def kept(self, kind: Callable[[], Kept]) -> Kept:
        """The cross-cycle cache of type ``kind``, made (``kind()``) at the
        first call: the module defining ``kind`` owns it, fills it and
        invalidates it (against ``mark``, ``changed_since``, ``gang_stamp``)."""
        found = self._kept.get(kind)
        if found is None:
            found = self._kept[kind] = kind()
        return found

    # ---- per node ---------------------------------------------------------------

    @property
    def mark(self) -> int:
        """The change clock now, for ``changed_since``."""
        return self._clock

    def changed_since(self, mark: int) -> list[str]:
        """The nodes (present or removed) changed after ``mark``, latest first."""
        return changed_after(self._node_stamp, mark)

    def gangs_changed_since(self, mark: int) -> list[str] | None:
        """The gangs whose pods changed after ``mark`` (those with none left
        too), latest first; None when ``mark`` is older than the log keeps."""
        return self._gang_changes.since(mark)

    def bound_pods(self, node_name: str) -> list[PodInfo]:
        """The pods bound to ``node_name``, in ``pods`` order."""
        on_node = self._bound.get(node_name)
        if not on_node:
            return []
        return sorted(on_node.values(), key=lambda p: self._seq[p.uid])

    def free(self, node_name: str) -> Resources:
        """The node's allocatable less what its bound, non-terminal pods
        request (terminating pods still hold theirs), less what DRA serves
        them (docs/dra.md).  Shared: do not mutate."""
        return self._derive(node_name)[1]

    def room(self, node_name: str) -> GpuRoom | None:
        """The node's GPU room (accounting.room_of), None where it has none."""
        return self._derive(node_name)[2]

    def _derive(self, name: str) -> tuple[int, Resources, GpuRoom | None]:
        stamp = self._node_stamp[name]
        derived = self._derived.get(name)
        if derived is None or derived[0] != stamp:
            node = self.nodes[name]
            holding = [p for p in self.bound_pods(name) if p.holds_resources]
            if node.dra is not None:  # only DRA GPUs can serve a pod's nvidia.com/gpu instead
                holding = [self._device_plugin_share(p, node) for p in holding]
            free = dict(node.allocatable)
            for pod in holding:
                for resource, amount in pod.requests.items():
                    free[resource] = free.get(resource, 0) - amount
            in_use = self.dra_in_use_ids(name)
            if node.gpus_by_dra:  # allocatable counts the DRA GPUs: those in claims are taken
                free[GPU_RESOURCE] -= in_use.bit_count() + self._dra_in_use_without_id(node)
            derived = self._derived[name] = (stamp, free, room_of(node, holding, in_use))
        return derived

    def _derive_onto(self, name: str, pod: PodInfo, before: tuple[int, Resources, GpuRoom | None]) -> None:
        """The node's free resources and room once ``pod`` is bound there,
        from ``before`` (current until it came), where that is what
        ``_derive`` would give: on a node without DRA, for a pod naming no
        GPU id of the node that another pod holds (pods naming disjoint ids
        leave one room, in whatever order they take it).  Else derived anew
        when next asked.  A burst binds pods onto nodes one by one, and each
        derived anew costs a pass over every pod the node holds."""
        node = self.nodes.get(name)
        if node is None or node.dra is not None:
            return
        _, free, room = before
        if pod.holds_resources:
            if room is not None:
                if mask_of(g for g in pod.gpu_ids if g < gpu_id_count(node)) & ~room.free:
                    return
                room = room_after(node, room, pod)
            free = res.subtract(free, pod.requests)
        self._derived[name] = (self._node_stamp[name], free, room)

    def dra_in_use_ids(self, name: str, except_pods: Collection[str] = ()) -> int:
        """Where DRA serves nvidia.com/gpu: the GPU ids (accounting.dra_gpus_by_id)
        whose devices are in a claim's allocation or assumed, less those
        only the pods ``except_pods`` (uids) hold -- as if they were gone."""
        by_id = dra_gpus_by_id(self.nodes[name])
        if not by_id:
            return 0
        theirs = set().union(*(self.dra.served_devices(uid) for uid in except_pods))
        return mask_of(i for i, gpu in by_id.items() if self.dra.in_use(gpu.key) and gpu.key not in theirs)

    def _dra_in_use_without_id(self, node: NodeInfo) -> int:
        """The GPUs serving nvidia.com/gpu, in use, that have no GPU id (off the topology)."""
        with_id = {gpu.key for gpu in dra_gpus_by_id(node).values()}
        return sum(1 for g in node.dra.gpus if g.extended_class and g.key not in with_id and self.dra.in_use(g.key))

    def _device_plugin_share(self, pod: PodInfo, node: NodeInfo) -> PodInfo:
        """The pod as it weighs on the node's device-plugin GPUs: its
        nvidia.com/gpu less the node's DRA GPUs its claims hold (counted
        once, as DRA devices in use)."""
        served = self.dra.served_gpus(pod.uid, node.dra)
        asked = pod.requests.get(GPU_RESOURCE, 0)
        if not served or not asked:
            return pod
        return replace(pod, requests={**pod.requests, GPU_RESOURCE: max(0, asked - served)})

    # ---- per gang ---------------------------------------------------------------

    def gang_uids(self, gang_key: str) -> Iterable[str]:
        """Every pod of the gang, of any scheduler, in the order they came."""
        return self._by_gang.get(gang_key, {}).keys()

    def gang_stamp(self, gang_key: str) -> int:
        """Changes whenever a pod of the gang does; 0 for a gang with no pods."""
        return self._gang_stamp.get(gang_key, 0)

    @property
    def gang_stamps(self) -> Mapping[str, int]:
        """``gang_stamp`` of every gang with pods, for a pass over many gangs (read-only)."""
        return self._gang_stamp

    def group_names(self, namespace: str) -> Collection[str]:
        """The gang label values that pods of ``namespace`` carry (any scheduler's)."""
        return self._group_names.get(namespace, {}).keys()

    def pending_gang_keys(self) -> Collection[str]:
        """Gangs with pods of ours that are unbound, not terminal, not
        terminating and not gated."""
        return self._pending.keys()

    def holding_gang_keys(self) -> Collection[str]:
        """Gangs with pods of ours that hold room on a node (bound, not terminal)."""
        return self._holding.keys()

    def terminating_pods(self) -> Iterator[PodInfo]:
        """Bound pods holding room while they terminate, in ``pods`` order."""
        return self._in_order(self._terminating)

    def nominated_pods(self) -> Iterator[PodInfo]:
        """Our pending pods that have a nominated node, in ``pods`` order."""
        return self._in_order(self._nominated)

    def _in_order(self, uids: set[str]) -> Iterator[PodInfo]:
        seq = self._seq
        return (self.pods[uid] for uid in sorted(uids, key=seq.__getitem__))

    # ---- bookkeeping ------------------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _stamp_node(self, name: str) -> None:
        self._node_stamp.pop(name, None)  # re-inserted last: the dict stays in stamp order
        self._node_stamp[name] = self._tick()

    def _add_node(self, node: NodeInfo, sign: int) -> None:
        total = self.total_allocatable
        for name, amount in node.allocatable.items():
            total[name] = total.get(name, 0) + sign * amount
        if GPU_CLIQUE_LABEL in node.labels:
            _count(self.clique_node_gpus, node.allocatable.get(GPU_RESOURCE, 0), sign)

    def _index(self, pod: PodInfo) -> None:
        self._move(pod, 1)

    def _unindex(self, pod: PodInfo) -> None:
        self._move(pod, -1)

    def _move(self, pod: PodInfo, sign: int) -> None:
        """Add (sign 1) or remove (-1) ``pod`` from every index."""
        uid, key = pod.uid, pod.gang_key
        if pod.node_name:
            on_node = self._bound.setdefault(pod.node_name, {})
            if sign > 0:
                on_node[uid] = pod
            else:
                on_node.pop(uid, None)
                if not on_node:
                    del self._bound[pod.node_name]
            before = self._derived.get(pod.node_name) if sign > 0 else None
            current = before is not None and before[0] == self._node_stamp.get(pod.node_name)
            self._stamp_node(pod.node_name)
            if current:
                self._derive_onto(pod.node_name, pod, before)
        members = self._by_gang.setdefault(key, {})
        if sign > 0:
            members[uid] = None
            self._gang_stamp[key] = self._tick()
        else:
            members.pop(uid, None)
            if members:
                self._gang_stamp[key] = self._tick()
            else:
                del self._by_gang[key], self._gang_stamp[key]
        self._gang_changes.note(key, self._tick(), self._by_gang)  # (a gang losing its last pod has no stamp)
        if pod.group and not pod.group_source:  # our label's values, for typo hints
            names = self._group_names.setdefault(pod.namespace, {})
            _count(names, pod.group, sign)
            if not names:
                del self._group_names[pod.namespace]
        ours = pod.scheduler_name == self.scheduler_name
        unbound_live = not pod.node_name and not pod.terminal
        if ours and pod.awaits_placement:
            _count(self._pending, key, sign)
        if ours and pod.holds_resources:
            _count(self._holding, key, sign)
        gpus = pod.requests.get(GPU_RESOURCE, 0)
        if gpus > 0 and ((ours and pod.awaits_placement) or pod.holds_resources):
            _count(self.gpu_asks, gpus, sign)
            if not pod.holds_resources:
                _count(self.pending_gpu_asks, gpus, sign)
        if pod.node_name and pod.holds_resources and pod.terminating:
            (self._terminating.add if sign > 0 else self._terminating.discard)(uid)
        if ours and unbound_live and pod.nominated_node:
            (self._nominated.add if sign > 0 else self._nominated.discard)(uid)


def _count(counts: dict, key: Hashable, delta: int) -> None:
    count = counts.get(key, 0) + delta
    if count:
        counts[key] = count
    else:
        del counts[key]


def _claim_keys(pod: PodInfo) -> set[str]:
    return {f"{pod.namespace}/{c.claim}" for c in pod.claims if c.claim}
