"""Writes fenced by the leader lease (Kube.write_validity, LeaderElector.validity).

The Kube here talks to a tiny local HTTP server that answers late or never:
a fault to provoke, not a stand-in for the API server (the same properties
against the real one are in tests/integration/test_lease_fence.py).  The
elector's validity runs on a fake clock.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web
from kubernetes.aio import client

from batchsched.kube.client import ApiError, Kube
from batchsched.shell.leader import LeaderElector
from tests.support.lease import HeldLease
from tests.unit.test_leader_election import LEASE, RENEW, RETRY, FakeLeaseApi


class FaultyServer:
    """Records every request that reaches it; reads wait for ``reads_go``,
    writes are answered after ``write_delay`` seconds (None: never)."""

    def __init__(self):
        self.received: list[str] = []
        self.reads_go = asyncio.Event()
        self.write_delay: float | None = None
        self.closing = asyncio.Event()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _handle(self, request: web.Request) -> web.Response:
        self.received.append(f"{request.method} {request.path}")
        if request.method == "GET":
            await self.reads_go.wait()
        elif self.write_delay is None:
            await self.closing.wait()
        else:
            await asyncio.sleep(self.write_delay)
        return web.json_response({"kind": "Status", "code": 200})

    async def __aenter__(self) -> "FaultyServer":
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.reads_go.set()
        self.closing.set()
        await self.runner.cleanup()


def kube_at(url: str, connections: int = 4) -> Kube:
    return Kube.over(client.Configuration(host=url), qps_connections=connections)


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 20))


def test_a_write_in_flight_when_the_lease_lapses_is_cancelled_at_once():
    async def scenario():
        async with FaultyServer() as server:  # never answers a write
            kube, lease = kube_at(server.url), HeldLease(0.3)
            kube.write_validity = lease.validity
            started = time.monotonic()
            with pytest.raises(ApiError) as refused:
                await kube.request("POST", "/api/v1/namespaces/a/pods", body={}, timeout=30)
            assert refused.value.reason == "NotLeader" and "in flight" in refused.value.message
            assert 0.25 <= time.monotonic() - started < 5  # the lease's deadline, not the 30 s timeout
            assert server.received == ["POST /api/v1/namespaces/a/pods"]
            await kube.close()

    run(scenario)


def test_a_write_outlasting_the_first_deadline_completes_while_the_lease_is_renewed():
    async def scenario():
        async with FaultyServer() as server:
            server.write_delay = 1.5  # three times the validity of any one renewal
            kube, lease = kube_at(server.url), HeldLease(0.5)
            kube.write_validity = lease.validity

            async def renewing():
                while True:
                    await asyncio.sleep(0.1)
                    lease.renew(0.5)

            renewals = asyncio.create_task(renewing())
            assert (await kube.request("POST", "/x", body={}))["code"] == 200
            renewals.cancel()
            await kube.close()

    run(scenario)


@pytest.mark.parametrize("lapse", ["lost to another holder", "renew deadline passed"])
def test_a_write_queued_for_a_connection_is_not_sent_once_the_lease_lapsed(lapse):
    async def scenario():
        async with FaultyServer() as server:
            kube, lease = kube_at(server.url, connections=1), HeldLease(60)
            kube.write_validity = lease.validity
            slow_read = asyncio.create_task(kube.request("GET", "/slow"))
            while not server.received:  # the read holds the only connection
                await asyncio.sleep(0.01)
            if lapse == "renew deadline passed":
                lease.renew(0.3)  # the last renewal: nothing renews it again
            write = asyncio.create_task(kube.request("POST", "/api/v1/namespaces/a/pods", body={}))
            await asyncio.sleep(0.1)
            assert not write.done() and lease.validity() > 0  # queued while the lease is valid
            if lapse.startswith("lost"):
                lease.lost = True
            else:
                await asyncio.sleep(lease.validity() + 0.05)
            server.reads_go.set()  # the connection frees up after the lease lapsed
            await slow_read
            with pytest.raises(ApiError) as refused:
                await write
            assert refused.value.reason == "NotLeader"
            assert server.received == ["GET /slow"]  # the write never reached the server
            # the pool is whole: the next request gets the connection
            assert (await kube.request("GET", "/after"))["code"] == 200
            await kube.close()

    run(scenario)


def test_a_write_whose_lease_lapses_after_its_headers_hook_is_not_sent():
    """The lease lapses between the headers hook and the body write (a
    process paused there, which on Python 3.11 is a loop turn wide: aiohttp
    writes the body from a task of its own).  The body hook refuses it."""
    async def scenario():
        async with FaultyServer() as server:  # a write that got through would never be answered
            kube, lease = kube_at(server.url), HeldLease(60)
            kube.write_validity = lease.validity

            async def lapse(session, context, params) -> None:
                lease.lost = True

            pause = aiohttp.TraceConfig()
            pause.on_request_headers_sent.append(lapse)  # runs after the fence's own headers hook
            kube.api.configuration.trace_configs.append(pause)
            with pytest.raises(ApiError) as refused:
                await kube.request("POST", "/api/v1/namespaces/a/events", body={"kind": "Event"})
            assert refused.value.reason == "NotLeader" and "before its bytes went out" in refused.value.message
            assert server.received == []
            lease.lost = False  # the pool is whole: the next write gets a connection and is sent
            kube.api.configuration.trace_configs.remove(pause)
            server.write_delay = 0
            assert (await kube.request("POST", "/api/v1/namespaces/a/events", body={}))["code"] == 200
            await kube.close()

    run(scenario)


def test_reads_are_not_fenced():
    async def scenario():
        async with FaultyServer() as server:
            server.reads_go.set()
            kube = kube_at(server.url)
            kube.write_validity = lambda: 0.0
            assert (await kube.request("GET", "/api/v1/pods"))["code"] == 200
            with pytest.raises(ApiError, match="before sending"):
                await kube.request("POST", "/api/v1/pods", body={})
            assert server.received == ["GET /api/v1/pods"]
            await kube.close()

    run(scenario)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_validity_is_what_is_left_of_the_renew_deadline_and_nothing_once_lost():
    async def scenario():
        api, clock = FakeLeaseApi(), FakeClock()
        holder = LeaderElector(api, "ns", "lease", "a", lease_duration=LEASE, renew_deadline=RENEW,
                               retry_period=RETRY, clock=clock)
        assert holder.validity() == 0  # a standby may not write at all
        task = asyncio.create_task(holder.run())
        await asyncio.wait_for(holder.leading.wait(), 1)
        api.hang = True  # no renewal from now on
        assert holder.validity() == pytest.approx(RENEW)
        clock.now += RENEW / 2
        assert holder.validity() == pytest.approx(RENEW / 2) and holder.is_leading()
        clock.now += RENEW / 2
        assert holder.validity() == 0 and not holder.is_leading()
        clock.now -= RENEW / 2  # back within the deadline, but once lost nothing may be written
        holder.lost.set()
        assert holder.validity() == 0
        task.cancel()

    run(scenario)
