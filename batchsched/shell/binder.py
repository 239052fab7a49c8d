"""Binds planned pods through pods/binding, many at once, and reports each outcome.

What happens when the API fails mid-gang (docs/binding.md has the long form):

* Before any request, the cycle has *assumed* the whole plan in the cache, so
  the next cycle never hands the same room to another gang.
* Each binding is sent with the pod's UID as precondition.  A server error,
  throttling (429) or a broken connection is retried with backoff
  (``binding.retries`` times).
* A binding that still fails is forgotten in the cache: its pod is unbound
  again and its room free.  ``409 Conflict`` (pod already bound, or replaced
  by a new pod of that name) and ``404`` (pod or node gone) are not retried.
* Pods of the gang that did bind stay bound (Kubernetes cannot unbind).  The
  gang is then *partially bound*: the queue puts it ahead of every other gang
  and the planner places only the remainder, so a gang is never left below
  minMember by our decisions for longer than it takes to re-plan it; if the
  remainder cannot be placed, the condition says so.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import aiohttp

from batchsched.api import constants
from batchsched.shell.kube import ApiError, Kube

log = logging.getLogger(__name__)


# Not worth retrying: the pod or node is gone, the pod is bound already or was
# replaced (UID), or the request itself is refused.
FINAL_STATUSES = frozenset({400, 403, 404, 409, 422})


@dataclass(frozen=True)
class BindRequest:
    uid: str
    namespace: str
    name: str
    node: str
    gang_key: str
    gpu_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class BindResult:
    request: BindRequest
    ok: bool
    error: str = ""
    seconds: float = 0.0


class Binder:
    def __init__(self, kube: Kube, parallelism: int = 32, retries: int = 3):
        self.kube = kube
        self.retries = retries
        self._slots = asyncio.Semaphore(parallelism)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def bind_all(self, requests: list[BindRequest]) -> list[BindResult]:
        self._in_flight += len(requests)
        self._idle.clear()
        try:
            return list(await asyncio.gather(*(self._bind_one(r) for r in requests)))
        finally:
            self._in_flight -= len(requests)
            if not self._in_flight:
                self._idle.set()

    async def wait_idle(self, at_most: float) -> None:
        """Until no binding is in flight, or ``at_most`` seconds: writes that
        can wait (events, PodGroup status) let a burst of bindings go first,
        as each takes a share of the same API server."""
        if not self._idle.is_set():
            try:
                async with asyncio.timeout(at_most):  # not wait_for: see Scheduler._wait_for_work
                    await self._idle.wait()
            except TimeoutError:
                pass

    async def _bind_one(self, req: BindRequest) -> BindResult:
        annotations = {constants.GPU_IDS_ANNOTATION: ",".join(map(str, req.gpu_ids))} if req.gpu_ids else None
        delay, error = 0.1, ""
        async with self._slots:
            started = time.monotonic()
            for attempt in range(self.retries + 1):
                if attempt:
                    log.info("binding %s/%s to %s failed (%s); retry %d", req.namespace, req.name, req.node,
                             error, attempt)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                try:
                    await self.kube.bind(req.namespace, req.name, req.uid, req.node, annotations)
                    return BindResult(req, True, seconds=time.monotonic() - started)
                except ApiError as exc:
                    error = str(exc)
                    if exc.status in FINAL_STATUSES:
                        break
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    error = repr(exc)
            return BindResult(req, False, error, time.monotonic() - started)
