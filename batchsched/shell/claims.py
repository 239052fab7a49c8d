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
3. patch the pod's ``status.extendedResourceClaimStatus``.

Only then does the scheduler bind.  A failure at any step undoes what was
written (``delete``: the finalizer removed, then the claim deleted), and a
create is never retried: its answer lost, a retry could make a second
claim.  Claims of ours left by a crash are found by their owner (a pod of
ours, unbound, not being bound) and deleted (``Scheduler`` sweeps them), so
a pod never has two.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Callable
from urllib.parse import quote

import aiohttp

from batchsched.api.constants import GPU_RESOURCE
from batchsched.core.cluster import ClusterState
from batchsched.core.dra.extended import ExtendedClaim
from batchsched.core.dra.model import API_PATH, EXTENDED_RESOURCE_CLAIM_ANNOTATION, ResourceClaim
from batchsched.core.text import clip
from batchsched.shell.kube import ApiError, Kube

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
    devices: dict = {"results": [{"request": d.request, "driver": d.driver, "pool": d.pool, "device": d.device}
                                 for d in claim.devices]}
    if claim.class_config:  # the class's config, for every request (they all ask that class)
        devices["config"] = [{"source": "FromClass", "requests": [r.name for r in claim.requests],
                              "opaque": json.loads(c)} for c in claim.class_config]
    return {
        "allocation": {
            "devices": devices,
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [claim.node]}]}]}},
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
            await self.delete(WrittenClaim(old.namespace, old.name, old.uid))
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
        try:
            await self._allocate(created, pod, pod_uid, claim)
            await self._point_pod_at(namespace, pod, pod_uid, written.name, claim)
        except ClaimError:
            await self.delete(written)
            raise
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
                if allocated == status["allocation"]:
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


def _why(exc: BaseException) -> str:
    return clip(str(exc) if isinstance(exc, ApiError) else repr(exc), 300)
