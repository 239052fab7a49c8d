"""Writes the PodScheduled condition of pending pods, coalesced.

Every pending pod of ours whose gang cannot be placed carries what
kube-scheduler would give it: ``PodScheduled=False``, reason
``Unschedulable``, and a message naming its gang and the gang's verdict, so
``kubectl describe pod`` and ``kubectl get pods`` tell why it waits.

A condition is written only when its message differs from the last one
written (or found on the pod when the scheduler started), at most once per
``min_interval`` per pod (latest wins), after the bindings in flight, and at
most ``max_in_flight`` at a time; the cycle only records what it wants
written.  Each patch carries the pod's resourceVersion, so it is refused
(409) if the pod changed since: once bound, PodScheduled is the binding's
(True) and is never overwritten here.  Gated pods are left alone
(kube-scheduler gives them SchedulingGated).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Awaitable, Callable
from urllib.parse import quote

from batchsched.core.model import PodInfo
from batchsched.kube.client import ApiError, Kube
from batchsched.kube.events import now_rfc3339
from batchsched.shell.status import YIELD_TO_BINDINGS_SECONDS

log = logging.getLogger(__name__)

REASON_UNSCHEDULABLE = "Unschedulable"  # kube-scheduler's reason for a pod it cannot place
MAX_MESSAGE_LENGTH = 1024
# How long a refused or failed write waits before it is tried again.
RETRY_SECONDS = 1.0
# Bookkeeping of pods no longer pending is dropped once it grows past this.
PRUNE_AT_LEAST = 1024


async def _no_wait(at_most: float) -> None:
    return None


class PodConditionWriter:
    def __init__(self, kube: Kube, lookup: Callable[[str], PodInfo | None], min_interval: float = 1.0,
                 wait_for_bindings: Callable[[float], Awaitable[None]] = _no_wait, max_in_flight: int = 16,
                 clock: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.lookup = lookup  # uid -> the pod as the cache sees it now (None: gone)
        self.min_interval = min_interval
        self.wait_for_bindings = wait_for_bindings
        self.clock = clock
        self._written: dict[str, str] = {}  # uid -> message of the condition the pod has
        self._pending: dict[str, str] = {}  # uid -> message to write
        self._last_write: dict[str, float] = {}
        self._prune_at = PRUNE_AT_LEAST
        self._slots = asyncio.Semaphore(max_in_flight)
        self._wake = asyncio.Event()
        self.writes = 0
        self.on_write: Callable[[], None] = lambda: None  # metrics hook

    def update(self, pod: PodInfo, message: str) -> None:
        """Want ``pod`` (pending) to say it is unschedulable because of ``message``."""
        message = message[:MAX_MESSAGE_LENGTH]
        if pod.uid not in self._written and pod.scheduled_condition[:2] == ("False", REASON_UNSCHEDULABLE):
            self._written[pod.uid] = pod.scheduled_condition[2]  # already there (a restart): not rewritten
        if self._pending.get(pod.uid, self._written.get(pod.uid)) == message:
            return
        if self._written.get(pod.uid) == message:
            del self._pending[pod.uid]  # back to what the pod has: nothing to write
            return
        self._pending[pod.uid] = message
        if len(self._written) + len(self._pending) > self._prune_at:
            self._prune()
        self._wake.set()

    def forget(self, uid: str) -> None:
        self._written.pop(uid, None)
        self._pending.pop(uid, None)
        self._last_write.pop(uid, None)

    def _prune(self) -> None:
        """Forget pods bound or gone since (the cache has no hook for it)."""
        for uid in [*self._written, *self._pending]:
            pod = self.lookup(uid)
            if pod is None or not pod.awaits_placement:
                self.forget(uid)
        self._prune_at = max(PRUNE_AT_LEAST, 2 * (len(self._written) + len(self._pending)))

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            yield_until = time.monotonic() + YIELD_TO_BINDINGS_SECONDS
            await self.wait_for_bindings(YIELD_TO_BINDINGS_SECONDS)
            now = self.clock()
            due = [uid for uid in self._pending
                   if now - self._last_write.get(uid, -math.inf) >= self.min_interval]
            outcomes = await asyncio.gather(*(self._write(uid, self._pending.pop(uid), yield_until) for uid in due),
                                            return_exceptions=True)  # a bug in one write must not end the writer
            for outcome in outcomes:
                if isinstance(outcome, Exception):
                    log.error("writing a PodScheduled condition failed", exc_info=outcome)
            failed = [outcome for outcome in outcomes if isinstance(outcome, str)]
            if failed:  # one line a round, however many pods: an API server outage must not flood the log
                log.warning("%d PodScheduled condition write(s) failed, retried in %.0fs; first: %s",
                            len(failed), RETRY_SECONDS, failed[0])
            if self._pending:
                await asyncio.sleep(max(self.min_interval, RETRY_SECONDS) / 2)
                self._wake.set()

    async def _write(self, uid: str, message: str, yield_until: float) -> str | None:
        """Writes one pod's condition; returns why it failed, if it did and is retried.
        With a slot held, it yields again to bindings that started since the
        writer's wait (until ``yield_until``, ``time.monotonic``)."""
        async with self._slots:
            await self.wait_for_bindings(max(0.0, yield_until - time.monotonic()))
            pod = self.lookup(uid)  # read now, after the waits: its resourceVersion is the latest
            if pod is None or not pod.awaits_placement:
                self.forget(uid)  # bound (PodScheduled is the binding's now), gated, or gone
                return None
            try:
                await self.kube.strategic_merge_patch(
                    f"/api/v1/namespaces/{quote(pod.namespace)}/pods/{quote(pod.name)}/status",
                    self._patch(pod, message))
            except ApiError as exc:
                if exc.not_found:
                    self.forget(uid)
                    return None
                self._retry(uid, message)
                if exc.conflict:  # the pod changed since the cache saw it; the next try reads it afresh
                    log.debug("PodScheduled condition of %s/%s: %s", pod.namespace, pod.name, exc)
                    return None
                return f"{pod.namespace}/{pod.name}: {exc}"
            except (OSError, asyncio.TimeoutError) as exc:
                self._retry(uid, message)
                return f"{pod.namespace}/{pod.name}: {exc!r}"
        self._written[uid] = message
        self._last_write[uid] = self.clock()
        self.writes += 1
        self.on_write()
        return None

    def _patch(self, pod: PodInfo, message: str) -> dict:
        """Only this condition (conditions merge by type); refused if the pod changed since."""
        condition = {"type": "PodScheduled", "status": "False", "reason": REASON_UNSCHEDULABLE,
                     "message": message, "lastProbeTime": None}
        if pod.uid not in self._written:  # it turns False now; else the merge keeps the pod's own time
            condition["lastTransitionTime"] = now_rfc3339()
        return {"metadata": {"resourceVersion": pod.resource_version}, "status": {"conditions": [condition]}}

    def _retry(self, uid: str, message: str) -> None:
        self._pending.setdefault(uid, message)  # a newer message wins
        self._last_write[uid] = self.clock() - self.min_interval + RETRY_SECONDS
        self._wake.set()
