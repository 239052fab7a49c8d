"""Writes PodGroup status and Kubernetes Events, coalesced.

A status is written only when it differs from the last one written (ignoring
timestamps), and at most once per ``min_interval`` per group, so an idle
cluster costs no writes.  Events are deduplicated by (object, reason, message).
Both wait while bindings are in flight (``wait_for_bindings``, at most
``YIELD_TO_BINDINGS_SECONDS``): they share the API server with the
bindings, and a pod bound a moment sooner is worth more than its event.
"""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable
from urllib.parse import quote

from batchsched.api import constants
from batchsched.shell.kube import ApiError, Kube

log = logging.getLogger(__name__)


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _comparable(status: dict) -> dict:
    out = {k: v for k, v in status.items() if k != "conditions"}
    out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                         for c in status.get("conditions") or ()]
    return out


# How long events and status writes may wait for a burst of bindings to end.
YIELD_TO_BINDINGS_SECONDS = 10.0


async def _no_wait(at_most: float) -> None:
    return None


class StatusWriter:
    def __init__(self, kube: Kube, min_interval: float = 1.0,
                 wait_for_bindings: Callable[[float], Awaitable[None]] = _no_wait):
        self.kube = kube
        self.min_interval = min_interval
        self.wait_for_bindings = wait_for_bindings
        self._written: dict[str, dict] = {}  # group key -> last status written
        self._pending: dict[str, dict] = {}
        self._last_write: dict[str, float] = {}
        self._wake = asyncio.Event()
        self.writes = 0
        self.on_write: Callable[[], None] = lambda: None  # metrics hook

    def seed(self, key: str, status: dict | None) -> None:
        """What the API server already has (from the watch), so a restart
        does not rewrite identical statuses."""
        if status and key not in self._written:
            self._written[key] = status

    def last_written(self, key: str) -> dict | None:
        return self._pending.get(key) or self._written.get(key)

    def update(self, key: str, status: dict) -> None:
        previous = self.last_written(key)
        if previous is not None and _comparable(previous) == _comparable(status):
            return
        # keep lastTransitionTime while a condition's status is unchanged
        old_conditions = {c["type"]: c for c in (previous or {}).get("conditions") or ()}
        stamp = now_rfc3339()
        for cond in status.get("conditions") or ():
            old = old_conditions.get(cond["type"])
            if old and old.get("status") == cond["status"] and old.get("lastTransitionTime"):
                cond["lastTransitionTime"] = old["lastTransitionTime"]
            else:
                cond.setdefault("lastTransitionTime", stamp)
        self._pending[key] = status
        self._wake.set()

    def forget(self, key: str) -> None:
        self._written.pop(key, None)
        self._pending.pop(key, None)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.wait_for_bindings(YIELD_TO_BINDINGS_SECONDS)
            now = time.monotonic()
            due = [k for k in self._pending if now - self._last_write.get(k, 0) >= self.min_interval]
            for key in due:
                status = self._pending.pop(key)
                await self._write(key, status)
            if self._pending:
                await asyncio.sleep(self.min_interval / 2)
                self._wake.set()

    async def _write(self, key: str, status: dict) -> None:
        namespace, _, name = key.partition("/")
        path = (f"/apis/{constants.GROUP}/{constants.VERSION}/namespaces/{quote(namespace)}"
                f"/podgroups/{quote(name)}/status")
        try:
            await self.kube.merge_patch(path, {"status": status})
            self._written[key] = status
            self._last_write[key] = time.monotonic()
            self.writes += 1
            self.on_write()
        except ApiError as exc:
            if exc.not_found:
                self.forget(key)
                return
            log.warning("status write for PodGroup %s failed: %s", key, exc)
            self._pending.setdefault(key, status)
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("status write for PodGroup %s failed: %r", key, exc)
            self._pending.setdefault(key, status)


class EventRecorder:
    """Kubernetes Events (core/v1), fire and forget, deduplicated."""

    def __init__(self, kube: Kube, component: str, max_in_flight: int = 16,
                 wait_for_bindings: Callable[[float], Awaitable[None]] = _no_wait):
        self.kube = kube
        self.component = component
        self.wait_for_bindings = wait_for_bindings
        self._seen: dict[tuple[str, str, str], float] = {}
        self._slots = asyncio.Semaphore(max_in_flight)
        self._tasks: set[asyncio.Task] = set()

    def emit(self, ref: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        """ref: {kind, namespace, name, uid, apiVersion}."""
        key = (ref.get("uid") or f"{ref['kind']}/{ref['namespace']}/{ref['name']}", reason, message)
        now = time.monotonic()
        if now - self._seen.get(key, -1e9) < 600:
            return
        self._seen[key] = now
        if len(self._seen) > 50_000:
            self._seen = {k: t for k, t in self._seen.items() if now - t < 600}
        task = asyncio.get_running_loop().create_task(self._post(ref, event_type, reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, ref: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        stamp = now_rfc3339()
        namespace = ref.get("namespace") or "default"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{ref['name']}.", "namespace": namespace},
            "involvedObject": ref, "reason": reason, "message": message[:1024], "type": event_type,
            "source": {"component": self.component}, "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        await self.wait_for_bindings(YIELD_TO_BINDINGS_SECONDS)
        async with self._slots:
            try:
                await self.kube.request("POST", f"/api/v1/namespaces/{quote(namespace)}/events", body=body)
            except (ApiError, OSError, asyncio.TimeoutError) as exc:
                log.debug("event %s on %s not recorded: %s", reason, ref.get("name"), exc)


def pod_ref(namespace: str, name: str, uid: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}


def node_ref(obj: dict) -> dict:
    meta = obj.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Node", "namespace": "", "name": meta.get("name", ""),
            "uid": meta.get("uid", "")}


def group_ref(obj: dict) -> dict:
    meta = obj.get("metadata") or {}
    return {"apiVersion": constants.API_VERSION, "kind": constants.PODGROUP_KIND,
            "namespace": meta.get("namespace", ""), "name": meta.get("name", ""), "uid": meta.get("uid", "")}
