"""Writes the extended-resource claim of each pod placed where DRA serves
nvidia.com/gpu, before the pod is bound -- as kube-scheduler v1.37 does
(docs/dra.md has the long form):

1. create the claim: ``generateName: <pod>-extended-resources-``, the
   annotation ``resource.kubernetes.io/extended-resource-claim: "true"``, a
   controller owner reference to the pod, one request per container asking
   nvidia.com/gpu, and the finalizer ``resource.kubernetes.io/delete-protection``
   (set on create: it is there before any allocation);
2. one status update (PUT with the claim's resourceVersion) writing
   ``allocation`` (the devices the topology chooser picked, a nodeSelector
   for the node) and ``reservedFor`` the pod; on a conflict the claim is
   read again and the update retried, unless someone else allocated it;
3. patch the pod's ``status.extendedResourceClaimStatus`` (sent beside step
   2: both precede the binding, neither depends on the other).

Only then does the scheduler bind.  A failure at any step undoes what was
written (``delete``: the finalizer removed, then the claim deleted), and a
create is never retried: its answer lost, a retry could make a second
claim.  Claims of ours left by a crash are found by their owner (a pod of
ours, unbound, not being bound) and deleted (``Scheduler`` sweeps them), so
a pod never has two.

A pod's own claims (``spec.resourceClaims``; ``core/dra/claims.py`` decides
their allocation) are written in place, as kube-scheduler's DRA plugin
writes them: the finalizer ``resource.kubernetes.io/delete-protection`` (by a
merge patch carrying the resourceVersion read, since the shipped RBAC grants
patch, not update, on claims), then one status update with ``allocation`` and the pod
appended to ``reservedFor`` (a claim allocated already only gets the
reservation); each read again and retried on a conflict.  Undone, the pod
leaves ``reservedFor``, and a claim we allocated that no one else reserved
loses its allocation, then our finalizer.  A crash between the claim and
the binding leaves the claim allocated and reserved for the pod: the pod's
next attempt binds it where the claim is, as kube-scheduler does.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import quote

import aiohttp

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core.cluster import ClusterState
from batchsched.core.dra.claims import ClaimAllocation
from batchsched.core.dra.extended import ExtendedClaim
from batchsched.core.dra.model import API_PATH, EXTENDED_RESOURCE_CLAIM_ANNOTATION, AllocatedDevice, ResourceClaim
from batchsched.core.text import clip
from batchsched.kube.client import ApiError, Kube

log = logging.getLogger(__name__)

DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
STATUS_TRIES = 5  # a conflict or a transient failure: read again, write again


class ClaimError(Exception):
    """The claim could not be written; the message says where and why."""


@dataclass(frozen=True)
class WrittenClaim:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class ReservedClaim:
    """A pod's own claim, reserved for it by us (and allocated, when ``allocated``)."""

    namespace: str
    name: str
    uid: str
    allocated: bool
    added_finalizer: bool


@dataclass
class PodClaims:
    """What was written for one pod: undone together."""

    extended: WrittenClaim | None = None
    reserved: list[ReservedClaim] = field(default_factory=list)


def claims_path(namespace: str) -> str:
    return f"{API_PATH}/namespaces/{quote(namespace)}/resourceclaims"


def new_claim(namespace: str, pod: str, pod_uid: str, claim: ExtendedClaim) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod}-extended-resources-", "namespace": namespace,
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid,
                                 "controller": True, "blockOwnerDeletion": True}],
            "finalizers": [DELETE_PROTECTION]},
        "spec": {"devices": {"requests": [
            {"name": r.name, "exactly": {"deviceClassName": claim.device_class, "allocationMode": "ExactCount",
                                         "count": r.count}} for r in claim.requests]}},
    }


def allocation_status(pod: str, pod_uid: str, claim: ExtendedClaim) -> dict:
    devices = _results(claim.devices)
    if claim.class_config:  # the class's config, for every request (they all ask that class)
        devices["config"] = [{"source": "FromClass", "requests": [r.name for r in claim.requests],
                              "opaque": json.loads(c)} for c in claim.class_config]
    return {
        "allocation": {
            "devices": devices,
            "nodeSelector": _on_node(claim.node)},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}],
    }


class ClaimWriter:
    def __init__(self, kube: Kube, state: Callable[[], ClusterState]):
        self.kube = kube
        self.state = state

    def leftovers(self, namespace: str, pod_uid: str) -> list[ResourceClaim]:
        """Extended-resource claims the pod already has (a crash's, or a lost create's)."""
        return [c for c in self.state().dra.claims.values()
                if c.extended and c.owner_pod == pod_uid and c.namespace == namespace]

    async def write(self, namespace: str, pod: str, pod_uid: str, claim: ExtendedClaim) -> WrittenClaim:
        """Create, allocate and reserve the pod's claim and point its status
        at it; on failure nothing of it is left (or the sweep removes it)."""
        for old in self.leftovers(namespace, pod_uid):
            if not await self.delete(WrittenClaim(old.namespace, old.name, old.uid)):
                # a second claim beside it would leave the pod two: wait for the sweep
                raise ClaimError(f"its leftover ResourceClaim {old.name} could not be deleted yet")
        taken = self.state().dra.held_by_others(pod_uid, claim.devices)
        if taken:
            raise ClaimError(f"device(s) {', '.join(taken)} of {claim.node} are allocated in another claim")
        try:
            created = await self.kube.request("POST", claims_path(namespace),
                                              body=new_claim(namespace, pod, pod_uid, claim))
        except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise ClaimError(f"creating its ResourceClaim failed: {_why(exc)}") from exc
        meta = created.get("metadata") or {}
        written = WrittenClaim(namespace, str(meta.get("name", "")), str(meta.get("uid", "")))
        # Both before the binding, neither needs the other: one round trip, not two.
        outcomes = await asyncio.gather(self._allocate(created, pod, pod_uid, claim),
                                        self._point_pod_at(namespace, pod, pod_uid, written.name, claim),
                                        return_exceptions=True)
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failure is not None:
            await self.delete(written)
            raise failure
        return written

    async def _allocate(self, current: dict, pod: str, pod_uid: str, claim: ExtendedClaim) -> None:
        """One status update writing allocation and reservedFor; a conflict
        or a transient failure reads the claim again and retries."""
        meta = current.get("metadata") or {}
        path = f"{claims_path(meta.get('namespace', ''))}/{quote(meta.get('name', ''))}"
        status = allocation_status(pod, pod_uid, claim)
        error = ""
        for attempt in range(STATUS_TRIES):
            if attempt:
                await asyncio.sleep(min(0.1 * 2 ** attempt, 1.0))
                # a list by name, not a get: the scheduler may list claims, not get them (deploy/rbac.yaml)
                try:
                    found = (await self.kube.request("GET", claims_path(meta.get("namespace", "")), query={
                        "fieldSelector": f"metadata.name={meta.get('name', '')}"})).get("items") or []
                except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    error = _why(exc)
                    continue
                current = found[0] if found else {}
                if (current.get("metadata") or {}).get("uid") != meta.get("uid"):
                    raise ClaimError("its ResourceClaim was replaced while being allocated")
                allocated = (current.get("status") or {}).get("allocation")
                if allocated and same_allocation(allocated, status["allocation"]):
                    return  # an earlier try was committed, its answer lost
                if allocated:
                    raise ClaimError("its ResourceClaim was allocated by someone else meanwhile")
            try:
                await self.kube.request("PUT", f"{path}/status", body={**current, "status": status})
                return
            except ApiError as exc:
                error = _why(exc)
                if not (exc.conflict or exc.status == 429 or exc.status >= 500):
                    break  # refused (403: resourceclaims/binding not granted, 422: invalid): final
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                error = _why(exc)
        if "resourceclaims/binding" in error:  # since 1.36 the API answers 422, naming the permission
            raise ClaimError(f"allocating its ResourceClaim {meta.get('name')} needs update on "
                             "resourceclaims/binding, which the scheduler's RBAC does not grant "
                             f"(deploy/rbac.yaml): {error}")
        raise ClaimError(f"allocating its ResourceClaim {meta.get('name')} failed: {error}")

    async def _point_pod_at(self, namespace: str, pod: str, pod_uid: str, claim_name: str,
                            claim: ExtendedClaim) -> None:
        mappings = [{"containerName": r.container, "requestName": r.name, "resourceName": GPU_RESOURCE}
                    for r in claim.requests]
        patch = {"metadata": {"uid": pod_uid},  # the uid is immutable: a replaced pod refuses the patch
                 "status": {"extendedResourceClaimStatus": {"resourceClaimName": claim_name,
                                                            "requestMappings": mappings}}}
        try:
            await self.kube.merge_patch(f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/status", patch)
        except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise ClaimError(f"patching its status.extendedResourceClaimStatus failed: {_why(exc)}") from exc

    async def delete(self, claim: WrittenClaim) -> bool:
        """Remove our finalizer, then delete the claim (gone already is fine);
        False, logged, when the API refused or failed: a later sweep retries."""
        path = f"{claims_path(claim.namespace)}/{quote(claim.name)}"
        try:
            try:
                await self.kube.strategic_merge_patch(path, {
                    "metadata": {"uid": claim.uid, "$deleteFromPrimitiveList/finalizers": [DELETE_PROTECTION]}})
                await self.kube.request("DELETE", path, body={"preconditions": {"uid": claim.uid}})
            except ApiError as exc:
                if not exc.not_found:
                    raise
        except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.warning("deleting ResourceClaim %s/%s failed (%s); retried later", claim.namespace, claim.name,
                        _why(exc))
            return False
        return True


class _Retry(Exception):
    """The update met a conflict or a transient failure: read again, write again."""


_TRANSIENT = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class ExplicitClaims:
    """Writes the allocation and reservation of pods' own claims (see the module's docstring)."""

    def __init__(self, kube: Kube, state: Callable[[], ClusterState]):
        self.kube = kube
        self.state = state

    async def write(self, pod: str, pod_uid: str, allocations: tuple[ClaimAllocation, ...]) -> list[ReservedClaim]:
        """Allocate and reserve each claim for the pod; on a failure the ones
        written are undone and ClaimError raised."""
        done: list[ReservedClaim] = []
        try:
            for allocation in allocations:
                done.append(await self._reserve(pod, pod_uid, allocation))
        except ClaimError:
            for reserved in reversed(done):
                await self.undo(pod_uid, reserved)
            raise
        return done

    async def _reserve(self, pod: str, pod_uid: str, allocation: ClaimAllocation) -> ReservedClaim:
        added = False
        if allocation.allocate:
            taken = self.state().dra.held_by_others(pod_uid, allocation.devices)
            if taken:
                raise ClaimError(f"device(s) {', '.join(taken)} of {allocation.node} for its ResourceClaim "
                                 f"{allocation.name} are allocated in another claim")

            def protect(claim: dict) -> dict | None:
                _live(claim, allocation)
                _ours_to_allocate(claim, allocation)
                finalizers = (claim.get("metadata") or {}).get("finalizers") or []
                if DELETE_PROTECTION in finalizers:
                    return None
                return {**claim, "metadata": {**claim["metadata"], "finalizers": [*finalizers, DELETE_PROTECTION]}}
            added = await self._update(allocation, protect, status=False)

        def reserve(claim: dict) -> dict | None:
            _live(claim, allocation)
            status = dict(claim.get("status") or {})
            reserved = list(status.get("reservedFor") or [])
            if allocation.allocate:
                if _ours_to_allocate(claim, allocation):
                    return None  # an earlier try was committed, its answer lost
                status["allocation"] = _allocation(allocation)
            elif not status.get("allocation"):
                raise ClaimError(f"its ResourceClaim {allocation.name} is no longer allocated")
            if any(r.get("uid") == pod_uid for r in reserved if isinstance(r, dict)):
                return None
            status["reservedFor"] = [*reserved, {"resource": "pods", "name": pod, "uid": pod_uid}]
            return {**claim, "status": status}
        try:
            await self._update(allocation, reserve, status=True)
        except ClaimError:
            if added:
                await self._unprotect(allocation)
            raise
        return ReservedClaim(allocation.namespace, allocation.name, allocation.uid, allocation.allocate, added)

    async def undo(self, pod_uid: str, reserved: ReservedClaim) -> bool:
        """The pod leaves the claim's reservedFor; an allocation of ours no one
        else holds goes, then our finalizer.  False, logged, when the API
        refused or failed (the claim stays reserved for an unbound pod, whose
        next attempt binds where it is)."""
        def unreserve(claim: dict) -> dict | None:
            status = dict(claim.get("status") or {})
            reserved_for = [r for r in status.get("reservedFor") or [] if not (isinstance(r, dict)
                                                                                and r.get("uid") == pod_uid)]
            drop = reserved.allocated and not reserved_for and status.get("allocation")
            if len(reserved_for) == len(status.get("reservedFor") or []) and not drop:
                return None
            status["reservedFor"] = reserved_for
            if drop:
                status.pop("allocation", None)
            return {**claim, "status": status}

        target = ClaimAllocation(reserved.namespace, reserved.name, reserved.uid, "")
        try:
            await self._update(target, unreserve, status=True)
        except ClaimError as exc:
            log.warning("undoing the reservation of ResourceClaim %s/%s failed (%s)", reserved.namespace,
                        reserved.name, exc)
            return False
        return not reserved.added_finalizer or await self._unprotect(target)

    async def _unprotect(self, target: ClaimAllocation) -> bool:
        """Our finalizer off a claim left unallocated; False, logged, on a failure."""
        def unprotect(claim: dict) -> dict | None:
            meta = claim.get("metadata") or {}
            if (claim.get("status") or {}).get("allocation") or DELETE_PROTECTION not in (meta.get("finalizers") or []):
                return None
            return {**claim, "metadata": {**meta, "finalizers": [f for f in meta["finalizers"]
                                                                 if f != DELETE_PROTECTION]}}
        try:
            await self._update(target, unprotect, status=False)
        except ClaimError as exc:
            log.warning("removing the finalizer of ResourceClaim %s/%s failed (%s)", target.namespace, target.name,
                        exc)
            return False
        return True

    async def _update(self, target: ClaimAllocation, change: Callable[[dict], dict | None], status: bool) -> bool:
        """Read the claim, ``change`` it (None: nothing to do), write it (a
        PUT of its status subresource when ``status``, else a patch of its
        finalizers); a conflict or a transient failure reads again and
        retries.  True when a write was made."""
        path = f"{claims_path(target.namespace)}/{quote(target.name)}" + ("/status" if status else "")
        error = ""
        for attempt in range(STATUS_TRIES):
            if attempt:
                await asyncio.sleep(min(0.1 * 2 ** attempt, 1.0))
            try:
                claim = await self._read(target)
                changed = change(claim)
                if changed is None:
                    return False
                if status:
                    await self.kube.request("PUT", path, body=changed)
                else:  # the finalizers alone, as a patch: the shipped RBAC grants patch, not update
                    await self.kube.merge_patch(path, _finalizers_patch(changed))
                return True
            except ApiError as exc:
                error = _why(exc)
                if not (exc.conflict or exc.status == 429 or exc.status >= 500):
                    break  # refused (403, 422: resourceclaims/binding not granted, invalid): final
            except _TRANSIENT as exc:
                error = _why(exc)
        if "resourceclaims/binding" in error:
            raise ClaimError(f"allocating its ResourceClaim {target.name} needs update on resourceclaims/binding, "
                             f"which the scheduler's RBAC does not grant (deploy/rbac.yaml): {error}")
        raise ClaimError(f"updating its ResourceClaim {target.name} failed: {error}")

    async def _read(self, target: ClaimAllocation) -> dict:
        # a list by name, not a get: the scheduler may list claims, not get them (deploy/rbac.yaml)
        found = (await self.kube.request("GET", claims_path(target.namespace), query={
            "fieldSelector": f"metadata.name={target.name}"})).get("items") or []
        claim = found[0] if found else {}
        if (claim.get("metadata") or {}).get("uid") != target.uid:
            raise ClaimError(f"its ResourceClaim {target.name} is gone or was replaced")
        return claim


def _finalizers_patch(claim: dict) -> dict:
    """A merge patch setting the claim's finalizers; its resourceVersion makes
    the server refuse it (409) if the claim changed since it was read, as an
    update would, and its uid if the claim was replaced."""
    meta = claim.get("metadata") or {}
    return {"metadata": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
                         "finalizers": list(meta.get("finalizers") or [])}}


def _allocation(allocation: ClaimAllocation) -> dict:
    devices = _results(allocation.devices)
    if allocation.config:
        devices["config"] = [json.loads(c) for c in allocation.config]
    return {"devices": devices, "nodeSelector": _on_node(allocation.node)}


def _results(devices: tuple[AllocatedDevice, ...]) -> dict:
    return {"results": [{"request": d.request, "driver": d.driver, "pool": d.pool, "device": d.device}
                        for d in devices]}


def _on_node(node: str) -> dict:
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def same_allocation(found: object, wanted: dict) -> bool:
    """Whether the allocation read back means ``wanted``: the same devices
    (request, driver, pool, device) on the same nodes.  Compared by meaning,
    not as dicts: the server may add fields (a result's ``adminAccess``,
    ``allocationTimestamp``) or order them otherwise."""
    return _meaning(found) == _meaning(wanted)


def _meaning(allocation: object) -> tuple[frozenset, frozenset] | None:
    if not isinstance(allocation, dict):
        return None
    results = ((allocation.get("devices") or {}).get("results") or []) \
        if isinstance(allocation.get("devices"), dict) else []
    devices = frozenset((r.get("request"), r.get("driver"), r.get("pool"), r.get("device"))
                        for r in results if isinstance(r, dict))
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") \
        if isinstance(allocation.get("nodeSelector"), dict) else None
    return devices, frozenset(_term_meaning(t) for t in terms or [] if isinstance(t, dict))


def _term_meaning(term: dict) -> tuple:
    def requirements(key: str) -> frozenset:
        return frozenset((r.get("key"), r.get("operator"), frozenset(map(str, r.get("values") or [])))
                         for r in term.get(key) or [] if isinstance(r, dict))
    return requirements("matchFields"), requirements("matchExpressions")


def _live(claim: dict, allocation: ClaimAllocation) -> None:
    if (claim.get("metadata") or {}).get("deletionTimestamp"):  # kube-scheduler allocates none such
        raise ClaimError(f"its ResourceClaim {allocation.name} is being deleted")


def _ours_to_allocate(claim: dict, allocation: ClaimAllocation) -> bool:
    """True when the claim holds our allocation already; raises when it holds another."""
    found = (claim.get("status") or {}).get("allocation")
    if not found:
        return False
    if same_allocation(found, _allocation(allocation)):
        return True
    raise ClaimError(f"its ResourceClaim {allocation.name} was allocated by someone else meanwhile")


def _why(exc: BaseException) -> str:
    return clip(str(exc) if isinstance(exc, ApiError) else repr(exc), 300)
