"""The claim writers (shell/claims.py) against a scripted API: what they send
and how they read what comes back."""
from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace

import pytest

from batchsched.core.dra.claims import ClaimAllocation
from batchsched.core.dra.extended import ClaimRequest, ExtendedClaim
from batchsched.core.dra.model import AllocatedDevice
from batchsched.shell.claims import (DELETE_PROTECTION, ClaimError, ClaimWriter, ExplicitClaims, allocation_status,
                                     same_allocation)
from batchsched.kube.client import ApiError

DEVICE = AllocatedDevice("container-0-request-0", "gpu.nvidia.com", "node-a", "gpu-0")
EXTENDED = ExtendedClaim("node-a", "gpu.nvidia.com", (ClaimRequest("container-0-request-0", "main", 1),), (DEVICE,))


class ScriptedKube:
    """Answers each request from ``answer`` (method, path, body, content type)
    and records it; an exception returned is raised."""

    def __init__(self, answer):
        self.answer = answer
        self.sent: list[tuple[str, str, dict | None, str | None]] = []

    async def request(self, method, path, *, query=None, body=None, content_type=None, **_):
        self.sent.append((method, path, copy.deepcopy(body), content_type))
        result = self.answer(method, path, body, query)
        if isinstance(result, BaseException):
            raise result
        return result

    async def merge_patch(self, path, patch):
        return await self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    async def strategic_merge_patch(self, path, patch):
        return await self.request("PATCH", path, body=patch, content_type="application/strategic-merge-patch+json")


def no_state(claims=()):
    dra = SimpleNamespace(claims={c.uid: c for c in claims}, held_by_others=lambda uid, devices: [])
    return lambda: SimpleNamespace(dra=dra)


def test_a_lost_answer_is_recognised_by_meaning_when_the_server_added_fields():
    """The status update was committed, its answer lost; the claim read back
    carries fields the server added and another order: it is ours, done."""
    wanted = allocation_status("p", "uid-p", EXTENDED)["allocation"]
    stored = copy.deepcopy(wanted)
    stored["devices"]["results"][0]["adminAccess"] = False
    stored["allocationTimestamp"] = "2026-12-06T01:00:00Z"
    stored["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0] = {
        "values": ["node-a"], "operator": "In", "key": "metadata.name"}
    created = {"metadata": {"name": "p-extended-resources-x", "namespace": "ns", "uid": "c1"}}
    puts = []

    def answer(method, path, body, query):
        if method == "PUT":
            puts.append(path)
            return asyncio.TimeoutError()  # committed, the answer lost
        return {"items": [{**created, "status": {"allocation": stored}}]}
    writer = ClaimWriter(ScriptedKube(answer), no_state())
    asyncio.run(writer._allocate(created, "p", "uid-p", EXTENDED))
    assert len(puts) == 1


def test_an_allocation_of_other_devices_is_not_taken_for_ours():
    wanted = allocation_status("p", "uid-p", EXTENDED)["allocation"]
    other = copy.deepcopy(wanted)
    other["devices"]["results"][0]["device"] = "gpu-1"
    assert same_allocation(copy.deepcopy(wanted), wanted)
    assert not same_allocation(other, wanted)
    elsewhere = copy.deepcopy(wanted)
    elsewhere["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] = ["node-b"]
    assert not same_allocation(elsewhere, wanted)
    assert not same_allocation(None, wanted)


def test_no_second_claim_is_made_while_a_leftover_cannot_be_deleted():
    leftover = SimpleNamespace(uid="old", name="p-extended-resources-old", namespace="ns", extended=True,
                               owner_pod="uid-p")

    def answer(method, path, body, query):
        if method == "PATCH":
            return ApiError(500, "InternalError", "etcd timed out", {})
        return {"metadata": {"name": "new", "namespace": "ns", "uid": "c2"}}
    kube = ScriptedKube(answer)
    writer = ClaimWriter(kube, no_state([leftover]))
    with pytest.raises(ClaimError, match="leftover ResourceClaim p-extended-resources-old"):
        asyncio.run(writer.write("ns", "p", "uid-p", EXTENDED))
    assert not [s for s in kube.sent if s[0] == "POST"]


def unallocated_claim(resource_version: str, finalizers=()) -> dict:
    return {"metadata": {"name": "gpus", "namespace": "ns", "uid": "c1", "resourceVersion": resource_version,
                         **({"finalizers": list(finalizers)} if finalizers else {})},
            "spec": {}, "status": {}}


def test_a_pods_own_claim_gets_its_finalizer_by_a_patch_carrying_the_resource_version():
    """The shipped RBAC grants patch, not update, on claims: the finalizer
    goes by a merge patch whose resourceVersion makes a stale write conflict
    (409), after which the claim is read again."""
    versions = iter(["11", "12"])
    state = {"claim": unallocated_claim("10", ["someone.else/keep"])}

    def answer(method, path, body, query):
        claim = state["claim"]
        if method == "GET":
            return {"items": [claim]}
        if method == "PATCH":
            if body["metadata"]["resourceVersion"] == "10":  # changed meanwhile by someone else
                state["claim"] = {**claim, "metadata": {**claim["metadata"], "resourceVersion": next(versions)}}
                return ApiError(409, "Conflict", "the object has been modified", {})
            state["claim"] = {**claim, "metadata": {**claim["metadata"], "finalizers": body["metadata"]["finalizers"],
                                                    "resourceVersion": "13"}}
            return state["claim"]
        return {**body}  # the status PUT
    kube = ScriptedKube(answer)
    allocation = ClaimAllocation("ns", "gpus", "c1", "node-a", allocate=True, devices=(DEVICE,))
    reserved = asyncio.run(ExplicitClaims(kube, no_state()).write("p", "uid-p", (allocation,)))
    assert reserved[0].added_finalizer
    patches = [(body, kind) for method, path, body, kind in kube.sent if method == "PATCH"]
    assert [b["metadata"]["resourceVersion"] for b, _ in patches] == ["10", "11"]
    assert patches[-1] == ({"metadata": {"uid": "c1", "resourceVersion": "11",
                                         "finalizers": ["someone.else/keep", DELETE_PROTECTION]}},
                           "application/merge-patch+json")
    assert not [path for method, path, *_ in kube.sent if method == "PUT" and not path.endswith("/status")]
