"""Claims fail closed: any device in any claim's ``status.allocation`` is
held, whatever else in the claim cannot be read; and where the claims
cannot be listed at all, no DRA GPU is free (docs/dra.md, "The inventory")."""
from __future__ import annotations

import asyncio
import json
import logging

import pytest

from batchsched.core.dra.model import DraError, claim_from_json
from batchsched.core.explain import explain_gang
from batchsched.shell import reflector as reflector_module
from batchsched.shell.cache import ClusterCache
from batchsched.shell.reflector import Reflector
from tests.support import dra
from tests.unit.cache_support import PagedList
from tests.unit.test_dra import (  # noqa: F401 - cache is a fixture
    NODE, TOPOLOGY, NotServed, cache, claim_json, device, listed, node_json, pod_json,
)
from tests.unit.test_dra_claims import claiming_pod, cycle

EVERY_GPU = [device(i) for i in range(len(TOPOLOGY))]


def configured_claim(name: str, devices: list[str], parameters) -> dict:
    """A claim allocated on ``devices`` whose config carries ``parameters``."""
    obj = claim_json(name, devices)
    obj["spec"]["devices"]["config"] = [{"requests": ["gpus"],
                                         "opaque": {"driver": dra.DRIVER, "parameters": parameters}}]
    return obj


def many_owners(name: str, devices: list[str]) -> dict:
    """A claim allocated on ``devices`` with 257 ownerReferences (the API bounds them only by the object's size)."""
    return claim_json(name, devices, ownerReferences=[
        {"apiVersion": "v1", "kind": "ConfigMap", "name": f"o{i}", "uid": f"o{i}"} for i in range(257)])


def test_opaque_parameters_are_measured_in_utf8_bytes_as_the_api_server_does():
    # {"a":"é…"}: 8 + 2 x 5116 = 10,240 bytes, the API's limit (30,700 characters once \u-escaped)
    at_limit = {"a": "é" * 5116}
    claim = claim_from_json(configured_claim("c", [device(0)], at_limit))
    assert not claim.partial and claim.unsupported == ""
    assert json.loads(claim.config[0])["opaque"] == {"driver": dra.DRIVER, "parameters": at_limit}
    with pytest.raises(DraError, match="parameters is 10242 bytes, more than 10240"):
        claim_from_json(configured_claim("c", [device(0)], {"a": "é" * 5117}))


def test_a_foreign_claim_with_8000_bytes_of_non_ascii_parameters_is_read_and_holds_its_gpus(cache):
    """The review's double allocation: such a claim (legal) held every GPU
    of the node, was refused, and a pod was bound onto two of them."""
    hostile = configured_claim("foreign", EVERY_GPU, {"note": "é" * 4000})
    listed(cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)], claims=[hostile],
           pods=[pod_json("w", 2)])
    assert cache.state.dra_allocated(NODE) == len(TOPOLOGY)
    assert not cache.state.dra.claim("ns/foreign").partial
    plan = cycle(cache)
    assert not plan.bindings
    assert "no 2 free devices" in plan.verdicts["ns/pod:w"].message


@pytest.mark.parametrize("hostile, reason", [
    (many_owners("foreign", EVERY_GPU), "metadata.ownerReferences has 257 entries, more than 256"),
    (configured_claim("foreign", EVERY_GPU, {"note": "é" * 5200}),
     "spec.devices.config[0].opaque.parameters is 10411 bytes, more than 10240"),
])
def test_a_claim_refused_beyond_its_allocation_still_holds_its_devices_and_is_reported(cache, hostile, reason):
    reports = []
    cache.on_bad_object = lambda kind, obj, why: reports.append((kind, why))
    listed(cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)], claims=[hostile],
           pods=[pod_json("w", 2), claiming_pod("mine", "foreign")])
    assert cache.state.dra_allocated(NODE) == len(TOPOLOGY)
    claim = cache.state.dra.claim("ns/foreign")
    assert claim.partial and claim.unsupported == f"not read: {reason}"
    assert len(claim.allocated) == len(TOPOLOGY) and claim.allocated_node == NODE
    assert reports == [("ResourceClaim", f"ResourceClaim not used beyond its allocation (its devices stay in use): "
                                         f"{reason}")]
    plan = cycle(cache)
    assert not plan.bindings  # neither onto its GPUs, nor by joining it
    assert "no 2 free devices" in plan.verdicts["ns/pod:w"].message
    assert f"ResourceClaim ns/foreign: not read: {reason}" in plan.verdicts["ns/pod:mine"].message
    # a watch event refusing it the same way keeps holding them
    cache._dra_apply("resourceclaims")("MODIFIED", hostile)
    assert cache.state.dra_allocated(NODE) == len(TOPOLOGY)


def claims_reflector(cache: ClusterCache, kube) -> Reflector:
    return next(r for r in cache.reflectors(kube) if r.kind == "resourceclaims")


def run_a_while(reflector: Reflector) -> Reflector:
    """Run the reflector a while (several looks)."""
    async def run() -> None:
        task = asyncio.create_task(reflector.run())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    asyncio.run(run())
    return reflector


@pytest.mark.parametrize("status, said", [(403, "resourceclaims may not be read (RBAC)"),
                                          (404, "resourceclaims are not served by the API server")])
def test_where_slices_are_read_but_claims_cannot_be_no_dra_gpu_is_free(cache, monkeypatch, caplog, status, said):
    monkeypatch.setattr(reflector_module, "ABSENT_RECHECK_SECONDS", 0.01)
    listed(cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)], claims=[],
           pods=[pod_json("w", 1)])
    assert cache.state.dra_allocated(NODE) == 0
    with caplog.at_level(logging.WARNING):
        reflector = run_a_while(claims_reflector(cache, NotServed(status)))
    assert reflector.synced.is_set() and reflector.absent
    assert cache.state.dra_allocated(NODE) == len(TOPOLOGY)
    assert not cycle(cache).bindings
    note = f"{said}: no DRA GPU counts as free until they can be read"
    logged = [r.getMessage() for r in caplog.records if "resourceclaims" in r.getMessage()]
    assert len(logged) == 1 and "no DRA GPU counts as free until they can be read;" in logged[0]  # once
    assert cache.state.dra.claims_unreadable_note() == note  # what /readyz says after its ok
    report = explain_gang(cache.snapshot(0), "ns/pod:w")
    assert report.data["gpuChecklist"]["dra"]["claimsUnreadable"] == note
    assert f"  -> {note}" in report.lines
    (node,) = report.data["shapes"][0]["nodes"]
    assert node["reasons"][-1] == note

    cache.drain_changes()
    reflector.kube = PagedList([])  # type: ignore[assignment]  # readable again: the GPUs are free, worth a look
    run_a_while(reflector)
    assert cache.state.dra_allocated(NODE) == 0 and cache.state.dra.claims_unreadable_note() == ""
    assert cache.drain_changes()[1]
    assert len(cycle(cache).bindings) == 1


def test_without_any_slice_unreadable_claims_hold_nothing_back(cache):
    """A cluster without DRA (all three collections 404): nothing to say."""
    listed(cache, nodes=[node_json(gpus=8)], slices=[], claims=[])
    run_a_while(claims_reflector(cache, NotServed(404)))
    assert cache.state.dra.claims_unreadable_note() == ""
    assert cache.state.free(NODE)["nvidia.com/gpu"] == 8


def test_readyz_stays_ok_and_says_what_a_ready_scheduler_does_without():
    import aiohttp

    from batchsched.shell import server
    from batchsched.shell.metrics import Metrics

    note = "resourceclaims may not be read (RBAC): no DRA GPU counts as free until they can be read"

    async def readyz(degraded: str) -> tuple[int, str]:
        runner = await server.serve("127.0.0.1:0", Metrics(), lambda: "", lambda: degraded)
        try:
            host, port = runner.addresses[0][:2]
            async with aiohttp.ClientSession() as session, session.get(f"http://{host}:{port}/readyz") as answer:
                return answer.status, await answer.text()
        finally:
            await runner.cleanup()
    assert asyncio.run(readyz(note)) == (200, f"ok, degraded: {note}\n")
    assert asyncio.run(readyz("")) == (200, "ok\n")
