"""Binds planned pods through pods/binding, many at once, and reports each outcome.

What happens when the API fails mid-gang (docs/binding.md has the long form):

* Before any request, the cycle has *assumed* the whole plan in the cache, so
  the next cycle never hands the same room to another gang.  An assumption
  has no deadline: it ends when the watch shows the pod bound, when the pod
  is gone, or when this binder *knows* the binding did not happen.
* Each binding is sent with the pod's UID as precondition.  A server error,
  throttling (429) or a broken connection is retried with backoff
  (``binding.retries`` times).
* A refusal the API states (400, 403, 404, 422) with no earlier try in
  doubt means not bound.  Any outcome that leaves doubt -- a timeout, a
  reset, a 5xx or 429 (the write may have been committed before the error),
  a 409 (already bound: perhaps by a try of ours whose answer was lost) --
  is settled by reading the pod back, as often as it takes.  Nothing is
  forgotten on a guess.
* Pods of the gang that did bind stay bound (Kubernetes cannot unbind).  The
  gang is then *partially bound*: the queue puts it ahead of every other
  gang and the planner places only the remainder; a refusal backs the gang
  off, and a gang partly bound for ``binding.partialGangTimeoutSeconds`` is
  started over (docs/binding.md).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable
from urllib.parse import quote

import aiohttp

from batchsched.api import constants
from batchsched.core.dra.claims import ClaimAllocation
from batchsched.core.dra.extended import ExtendedClaim
from batchsched.kube.client import ApiError, Kube

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
    claim: ExtendedClaim | None = None  # written (shell/claims.py) before the binding is sent
    claims: tuple[ClaimAllocation, ...] = ()  # its own claims: allocated or reserved before the binding is sent
    attempt: int = 0  # what its claims' devices are in flight under (ClusterState.assume_allocation)


@dataclass(frozen=True)
class BindResult:
    request: BindRequest
    ok: bool  # the pod is bound to request.node (known, not guessed)
    error: str = ""
    seconds: float = 0.0
    verified: bool = False  # the outcome was learnt by reading the pod back


VERIFY_BACKOFF_MAX_SECONDS = 5.0

# Bindings less than this apart are one burst.  The bindings of a burst's
# successive cycles leave the binder idle only for the few milliseconds
# between them; writes that can wait (events, statuses) let in then took
# the API server from the next cycle's bindings
# (bench/history/RESULTS-until-2026-12-06.md, "Writes that can wait hold
# off for a quiet moment").
QUIET_SECONDS = 0.5


class Binder:
    def __init__(self, kube: Kube, parallelism: int = 32, retries: int = 3, quiet: float = QUIET_SECONDS):
        self.kube = kube
        self.retries = retries
        self.quiet = quiet
        # Asked while an outcome is being read back, with the pod's uid and
        # node: None while the watch has not settled the pod, else whether it
        # shows the pod bound to that node (then reading stops).
        self.settled_by_watch: Callable[[str, str], bool | None] = lambda uid, node: None
        self._slots = asyncio.Semaphore(parallelism)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._idle_since = -math.inf  # when the last binding in flight ended

    async def bind_each(self, requests: list[BindRequest]) -> AsyncIterator[BindResult]:
        """Bind all of ``requests``, yielding each outcome as soon as it is
        known (one pod read back for long does not hold up the others')."""
        self._in_flight += len(requests)
        self._idle.clear()
        tasks = [asyncio.ensure_future(self._bind_one(r)) for r in requests]
        try:
            for done in asyncio.as_completed(tasks):
                yield await done
        finally:
            for task in tasks:
                task.cancel()
            self._in_flight -= len(requests)
            if not self._in_flight:
                self._idle.set()
                self._idle_since = time.monotonic()

    async def bind_all(self, requests: list[BindRequest]) -> list[BindResult]:
        """Every outcome, in the order of ``requests``."""
        outcomes = {id(result.request): result async for result in self.bind_each(requests)}
        return [outcomes[id(request)] for request in requests]

    async def wait_idle(self, at_most: float) -> None:
        """Until no binding has been in flight for ``quiet`` seconds, or
        ``at_most`` seconds: writes that can wait (events, PodGroup status)
        let a burst of bindings go first, as each takes a share of the same
        API server."""
        deadline = time.monotonic() + at_most
        while True:
            if not self._idle.is_set():
                try:  # (asyncio.timeout, not wait_for: see Scheduler._wait_for_work)
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        await self._idle.wait()
                except TimeoutError:
                    return
            until = min(self._idle_since + self.quiet, deadline)
            if time.monotonic() >= until:
                return
            await asyncio.sleep(until - time.monotonic())  # then look again: a binding may have started

    async def _bind_one(self, req: BindRequest) -> BindResult:
        annotations = {constants.GPU_IDS_ANNOTATION: ",".join(map(str, req.gpu_ids))} if req.gpu_ids else None
        delay, error = 0.1, ""
        doubt = False  # an earlier try may have been committed without our hearing of it
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
                        if exc.conflict:  # "already bound": by a try of ours that timed out?
                            doubt = True
                        break
                    doubt = True  # a 5xx or 429 may come after the write was committed
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    error = repr(exc)
                    doubt = True
            if not doubt:
                return BindResult(req, False, error, time.monotonic() - started)
        # Outside the slot: reading back must not hold up other bindings.
        bound, why = await self._read_back(req)
        return BindResult(req, bound, "" if bound else f"{error}; {why}", time.monotonic() - started, verified=True)

    async def _read_back(self, req: BindRequest) -> tuple[bool, str]:
        """Whether the pod is bound to req.node, from the API server itself,
        asked until it answers (or the watch has settled it meanwhile)."""
        # A list with a field selector, not a get: the scheduler's RBAC grants
        # list and watch on pods only (deploy/rbac.yaml).
        path = f"/api/v1/namespaces/{quote(req.namespace)}/pods"
        query = {"fieldSelector": f"metadata.name={req.name}"}
        delay = 0.2
        while True:
            by_watch = self.settled_by_watch(req.uid, req.node)
            if by_watch is not None:
                return by_watch, "" if by_watch else "the watch shows it not bound there"
            try:
                found = (await self.kube.request("GET", path, query=query, timeout=10)).get("items") or []
            except ApiError as exc:
                why = str(exc)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                why = repr(exc)
            else:
                if not found:
                    return False, "the pod is gone"
                meta, spec = found[0].get("metadata") or {}, found[0].get("spec") or {}
                if meta.get("uid") != req.uid:
                    return False, "the pod was replaced"
                node = spec.get("nodeName") or ""
                if node == req.node:
                    return True, ""
                return False, f"the pod is bound to {node}" if node else "the pod is not bound"
            log.warning("reading back pod %s/%s after an unclear binding failed (%s); again in %.1fs",
                        req.namespace, req.name, why, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, VERIFY_BACKOFF_MAX_SECONDS)
