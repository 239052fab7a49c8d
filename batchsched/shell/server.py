"""The one HTTP server: ``/healthz``, ``/readyz`` and ``/metrics``.

``/healthz`` answers while the event loop runs (a wedged loop fails the
liveness probe).  ``/readyz`` answers 200 once the watch caches are synced,
while none of them has failed since its last successful list, and once the
leader lease's state is known (held here, or held by another replica: a
standby is ready too); otherwise 503 and why.  A ready scheduler that runs
degraded (``degraded()``: the claims cannot be read) says how after its ok.
"""
from __future__ import annotations

import logging
from typing import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from batchsched.config import parse_bind_address
from batchsched.shell.metrics import Metrics

log = logging.getLogger(__name__)


async def serve(bind_address: str, metrics: Metrics, not_ready: Callable[[], str],
                degraded: Callable[[], str] = lambda: "") -> web.AppRunner | None:
    """Start serving; ``not_ready()`` returns "" when ready, else why not;
    ``degraded()`` "" or what a ready scheduler does without.
    Returns the runner to ``cleanup()``, or None when the address turns it off."""
    address = parse_bind_address(bind_address)
    if address is None:
        return None

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        why = not_ready()
        if why:
            return web.Response(text=f"not ready: {why}\n", status=503)
        degraded_by = degraded()
        return web.Response(text=f"ok, degraded: {degraded_by}\n" if degraded_by else "ok\n")

    async def metrics_page(_: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, *address)
    await site.start()
    log.info("serving /healthz, /readyz and /metrics on %s",
             ", ".join(f"{a[0]}:{a[1]}" for a in runner.addresses))
    return runner
