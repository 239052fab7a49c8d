"""Connections that fail midway reach callers as OSError (kube.TransportError).

aiohttp raises a server that hangs up before answering, or a body cut short,
as ClientErrors that are not OSErrors; every caller of the adapter handles
OSError for transport faults, so the adapter raises these as one.  Found
when an API server going away left Event posts failing with "Task exception
was never retrieved".  The server here is a raw socket that misbehaves: a
fault to provoke, not a stand-in for the API server."""
from __future__ import annotations

import asyncio

import pytest
from kubernetes.aio import client

from batchsched.kube.client import Kube, TransportError


async def misbehaving_server(answer: bytes):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("answer", [
    b"",  # hangs up: ServerDisconnectedError
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"kind\":",  # cut short
], ids=["disconnected", "body-cut-short"])
def test_a_connection_failing_midway_is_an_oserror(answer):
    async def scenario():
        server = await misbehaving_server(answer)
        host, port = server.sockets[0].getsockname()[:2]
        kube = Kube.over(client.Configuration(host=f"http://{host}:{port}"), qps_connections=2)
        try:
            for method in ("GET", "POST"):
                with pytest.raises(OSError) as raised:
                    await kube.request(method, "/api/v1/namespaces/a/events", body={}, timeout=5)
                assert isinstance(raised.value, TransportError), repr(raised.value)
        finally:
            await kube.close()
            server.close()

    asyncio.run(asyncio.wait_for(scenario(), 20))
