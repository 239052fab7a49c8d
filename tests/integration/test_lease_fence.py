"""A deposed leader's write never reaches the real API server.

The scheduler's Kube gets one connection; a watch holds it, so a write
queues behind it while the lease is valid.  The lease then lapses (lost to
another holder, or its renew deadline passes) before the connection frees
up: the write must be refused and the object must not exist on the server.
"""
from __future__ import annotations

import asyncio

import pytest

from batchsched.kube.client import ApiError, Kube
from tests.support.lease import HeldLease

pytestmark = pytest.mark.e2e


def config_map(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"written": "yes"}}


async def _event_named(watch, name: str) -> dict:
    """The watch's first event about ``name`` (the namespace is new: the
    controller manager may publish its kube-root-ca.crt ConfigMap meanwhile)."""
    async for event in watch:
        if event["object"]["metadata"]["name"] == name:
            return event
    raise AssertionError(f"the watch ended before {name} was seen")


@pytest.mark.parametrize("lapse", ["lost to another holder", "renew deadline passed"])
def test_a_write_queued_while_the_lease_was_valid_is_not_sent_after_it_lapsed(env, lapse):
    config_maps = f"/api/v1/namespaces/{env.namespace}/configmaps"

    async def scenario():
        kube = await Kube.connect(env.kubeconfig, qps_connections=1)
        lease = HeldLease(60)
        kube.write_validity = lease.validity
        try:
            listed = await kube.request("GET", config_maps)
            watch = kube.watch(config_maps, listed["metadata"]["resourceVersion"], timeout_seconds=60)
            marker_seen = asyncio.create_task(_event_named(watch, "marker"))
            env.kube.create(config_maps, config_map("marker"))
            assert (await marker_seen)["type"] == "ADDED"  # the watch holds the connection

            if lapse == "renew deadline passed":
                lease.renew(1.0)  # the last renewal: nothing renews it again
            write = asyncio.create_task(kube.request("POST", config_maps, body=config_map("fenced")))
            await asyncio.sleep(0.2)
            assert not write.done() and lease.validity() > 0  # queued while the lease is valid
            if lapse.startswith("lost"):
                lease.lost = True
            else:
                await asyncio.sleep(lease.validity() + 0.1)
            await watch.aclose()  # the connection frees up only now
            with pytest.raises(ApiError) as refused:
                await write
            assert refused.value.reason == "NotLeader"

            # the connection is usable again, and a write under a valid lease lands
            lease.lost = False
            lease.renew(60)
            await kube.request("POST", config_maps, body=config_map("after"))
        finally:
            await kube.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    names = {c["metadata"]["name"] for c in env.kube.get(config_maps)["items"]}
    assert "fenced" not in names and {"marker", "after"} <= names
