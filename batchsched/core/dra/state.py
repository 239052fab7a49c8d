"""The DRA objects the scheduler knows, and which devices are in use.

``DraState`` is kept by ``ClusterState`` (the one place objects change).
Every change returns the nodes whose DRA picture it may have changed, so
the cluster state stamps them and what is derived per node is recomputed.

In use: every device named in any claim's ``status.allocation``, whoever
allocated it (kube-scheduler, another scheduler, us), plus the allocations
this scheduler has *in flight*: decided for a pod, being written into its
claims, not yet seen there.  As kube-scheduler's DRA plugin keeps its
in-flight allocations per claim, each is kept per claim and per binding
attempt (``InFlight``), so ending one attempt's (a late undo of a failed
attempt, say) never ends the next attempt's.  In-flight allocations live
beside the claims, so a relist of the claims never frees them; one ends
when its claim is seen reserved for the pod and holding its devices, when
the pod goes, or when its writer calls ``forget_allocation`` for the
attempt.  After a restart, nothing but the claims is needed: their
allocations are the truth.  While the claims cannot be listed at all
(``claims_unreadable``: RBAC, or not served), no device is known free, so
every one is in use.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

from batchsched.core.dra.inventory import GpuSelection, NodeDra, gpu_selection, node_dra
from batchsched.core.dra.model import AllocatedDevice, DeviceClass, ResourceClaim, ResourceSlice
from batchsched.core.topology.model import GpuTopology

DeviceKey = tuple[str, str, str]  # driver, pool, device

# The claim of an in-flight allocation that the writer creates (the pod's
# extended-resource claim): its uid is the API's to give, on create.
EXTENDED_CLAIM = ""


@dataclass(frozen=True)
class InFlight:
    """Which in-flight allocation: one claim's, of one binding attempt of a pod."""

    pod_uid: str
    attempt: int
    claim_uid: str  # EXTENDED_CLAIM for the pod's extended-resource claim


class DraState:
    def __init__(self) -> None:
        self.classes: dict[str, DeviceClass] = {}
        self.slices: dict[str, ResourceSlice] = {}
        self.claims: dict[str, ResourceClaim] = {}  # by uid
        self.claim_uids: dict[str, str] = {}  # namespace/name -> uid
        self.in_flight: dict[InFlight, tuple[AllocatedDevice, ...]] = {}
        self._in_flight_of: dict[str, dict[InFlight, None]] = {}  # pod uid -> its in-flight allocations
        self._attempts = 0  # binding attempts numbered so far
        self.selection: GpuSelection = gpu_selection(())
        self._node_slices: dict[str, dict[str, None]] = {}  # node -> slice names
        self._pool_nodes: dict[tuple[str, str], Counter] = {}  # (driver, pool) -> node -> slices
        self._in_use: Counter = Counter()  # device key -> claims (and assumptions) holding it
        self._reserved: dict[str, dict[str, None]] = {}  # pod uid -> claim uids reserved for it
        self.claims_unreadable = ""  # why the claims cannot be listed ("" while they can)

    # ---- classes and slices ----------------------------------------------------

    def put_class(self, device_class: DeviceClass) -> Iterable[str]:
        if self.classes.get(device_class.name) == device_class:
            return ()
        self.classes[device_class.name] = device_class
        return self._reselect()

    def remove_class(self, name: str) -> Iterable[str]:
        return self._reselect() if self.classes.pop(name, None) is not None else ()

    def _reselect(self) -> Iterable[str]:
        self.selection = gpu_selection(self.classes.values())
        return list(self._node_slices)

    def put_slice(self, resource_slice: ResourceSlice) -> Iterable[str]:
        old = self.slices.get(resource_slice.name)
        if old == resource_slice:
            return ()
        touched = self._unindex_slice(old) if old is not None else []
        self.slices[resource_slice.name] = resource_slice
        node, pool = resource_slice.node, (resource_slice.driver, resource_slice.pool)
        if node:
            self._node_slices.setdefault(node, {})[resource_slice.name] = None
            self._pool_nodes.setdefault(pool, Counter())[node] += 1
            touched.append(node)
        return touched

    def remove_slice(self, name: str) -> Iterable[str]:
        old = self.slices.pop(name, None)
        return self._unindex_slice(old) if old is not None else ()

    def _unindex_slice(self, old: ResourceSlice) -> list[str]:
        if not old.node:
            return []
        names = self._node_slices[old.node]
        names.pop(old.name, None)
        if not names:
            del self._node_slices[old.node]
        nodes = self._pool_nodes[(old.driver, old.pool)]
        nodes[old.node] -= 1
        if nodes[old.node] <= 0:
            del nodes[old.node]
        if not nodes:
            del self._pool_nodes[(old.driver, old.pool)]
        return [old.node]

    def has_slices(self, node: str) -> bool:
        return node in self._node_slices

    def node_dra(self, node: str, topology: GpuTopology | None) -> NodeDra | None:
        """The node's DRA GPUs mapped onto ``topology``; None when it has none."""
        names = self._node_slices.get(node)
        if not names:
            return None
        return node_dra((self.slices[n] for n in names), self.selection, topology)

    # ---- claims and in-flight allocations ---------------------------------------

    def put_claim(self, claim: ResourceClaim) -> set[str]:
        old = self.claims.get(claim.uid)
        if old == claim:
            return set()
        touched = self._unindex_claim(old) if old is not None else set()
        self.claims[claim.uid] = claim
        self.claim_uids[claim.key] = claim.uid
        touched |= self._hold(claim.allocated, 1)
        allocated = {d.key for d in claim.allocated}
        for pod_uid in claim.reserved_for:
            self._reserved.setdefault(pod_uid, {})[claim.uid] = None
            # confirmed only by a claim reserved for the pod holding every
            # device in flight (it holds them now): one that does not, a
            # tenant's forgery say, would free devices still being written
            for key in list(self._in_flight_of.get(pod_uid, ())):
                if key.claim_uid in (EXTENDED_CLAIM, claim.uid) and allocated >= {d.key for d in self.in_flight[key]}:
                    touched |= self._land(key)
        return touched

    def claim(self, key: str) -> ResourceClaim | None:
        """The claim namespace/name, if known."""
        uid = self.claim_uids.get(key)
        return self.claims.get(uid) if uid is not None else None

    def remove_claim(self, uid: str) -> set[str]:
        old = self.claims.pop(uid, None)
        return self._unindex_claim(old) if old is not None else set()

    def _unindex_claim(self, old: ResourceClaim) -> set[str]:
        if self.claim_uids.get(old.key) == old.uid:
            del self.claim_uids[old.key]
        for pod_uid in old.reserved_for:
            claims = self._reserved.get(pod_uid)
            if claims is not None:
                claims.pop(old.uid, None)
                if not claims:
                    del self._reserved[pod_uid]
        return self._hold(old.allocated, -1)

    def set_claims_unreadable(self, why: str) -> Iterable[str]:
        """The claims cannot be listed (``why``), or can again ("")."""
        if why == self.claims_unreadable:
            return ()
        self.claims_unreadable = why
        return list(self._node_slices)

    def assume_allocation(self, pod_uid: str,
                          by_claim: Mapping[str, tuple[AllocatedDevice, ...]]) -> tuple[int, set[str]]:
        """This scheduler is writing these allocations (claim uid, or
        EXTENDED_CLAIM, -> devices) for a new binding attempt of the pod: in
        use from now.  The attempt's number, and the nodes touched."""
        self._attempts += 1
        touched: set[str] = set()
        for claim_uid, devices in by_claim.items():
            if devices:
                key = InFlight(pod_uid, self._attempts, claim_uid)
                self.in_flight[key] = devices
                self._in_flight_of.setdefault(pod_uid, {})[key] = None
                touched |= self._hold(devices, 1)
        return self._attempts, touched

    def forget_allocation(self, pod_uid: str, attempt: int) -> set[str]:
        """The attempt's allocations are no longer in flight: known not
        written, or undone.  Another attempt's are left alone."""
        touched: set[str] = set()
        for key in [k for k in self._in_flight_of.get(pod_uid, ()) if k.attempt == attempt]:
            touched |= self._land(key)
        return touched

    def forget_pod(self, pod_uid: str) -> set[str]:
        """The pod is gone: what was in flight for it is moot."""
        touched: set[str] = set()
        for key in list(self._in_flight_of.get(pod_uid, ())):
            touched |= self._land(key)
        return touched

    def _land(self, key: InFlight) -> set[str]:
        """The in-flight allocation ``key`` ends (its claim holds it now, or nothing will)."""
        keys = self._in_flight_of[key.pod_uid]
        del keys[key]
        if not keys:
            del self._in_flight_of[key.pod_uid]
        return self._hold(self.in_flight.pop(key), -1)

    def _hold(self, devices: Iterable[AllocatedDevice], sign: int) -> set[str]:
        touched: set[str] = set()
        for device in devices:
            key = device.key
            self._in_use[key] += sign
            if self._in_use[key] <= 0:
                del self._in_use[key]
            touched.update(self._pool_nodes.get((device.driver, device.pool), ()))
        return touched

    # ---- reading ------------------------------------------------------------------

    def in_use(self, key: DeviceKey) -> bool:
        return bool(self.claims_unreadable) or key in self._in_use

    def claims_unreadable_note(self) -> str:
        """What the claims not being readable costs, where nodes have DRA
        devices ("" otherwise: nothing is held back)."""
        if self.claims_unreadable and self._node_slices:
            return f"{self.claims_unreadable}: no DRA GPU counts as free until they can be read"
        return ""

    def held_by_others(self, pod_uid: str, devices: Iterable[AllocatedDevice]) -> list[str]:
        """Those of ``devices`` in a claim's allocation, or in flight for
        another pod (a last check before writing them for ``pod_uid``)."""
        if self.claims_unreadable:
            return [d.device for d in devices]
        own = self._in_flight_devices(pod_uid)
        return [d.device for d in devices if self._in_use.get(d.key, 0) > (d.key in own)]

    def allocated(self, dra: NodeDra) -> int:
        """How many of the node's DRA GPUs are in use."""
        return sum(1 for gpu in dra.gpus if self.in_use(gpu.key))

    def _in_flight_devices(self, pod_uid: str) -> set[DeviceKey]:
        return {d.key for key in self._in_flight_of.get(pod_uid, ()) for d in self.in_flight[key]}

    def served_devices(self, pod_uid: str) -> set[DeviceKey]:
        """The devices allocated in claims reserved for the pod, or in flight for it."""
        served = {d.key for uid in self._reserved.get(pod_uid, ()) for d in self.claims[uid].allocated}
        return served | self._in_flight_devices(pod_uid)

    def served_gpus(self, pod_uid: str, dra: NodeDra | None) -> int:
        """The node's DRA GPUs allocated in claims reserved for the pod (or
        in flight for it): the part of its nvidia.com/gpu request that DRA,
        not the device plugin, serves (a tenant who forges a claim only
        makes DRA GPUs look used)."""
        if dra is None or (pod_uid not in self._reserved and pod_uid not in self._in_flight_of):
            return 0
        return len(self.served_devices(pod_uid) & {gpu.key for gpu in dra.gpus})
