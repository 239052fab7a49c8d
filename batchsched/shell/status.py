"""Writes PodGroup (and Queue) status, coalesced.

A status is written only when it differs from the last one written (ignoring
timestamps), and at most once per ``min_interval`` per group, so an idle
cluster costs no writes.  Writes wait for a pause in the bindings
(``wait_for_bindings``: the binder's ``wait_idle``; at most
``YIELD_TO_BINDINGS_SECONDS``): they share the API server with the bindings,
and a pod bound a moment sooner is worth more than its status.  Events are
:mod:`batchsched.kube.events`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable
from urllib.parse import quote

from batchsched.api import constants
from batchsched.kube.client import ApiError, Kube
from batchsched.kube.events import no_wait, now_rfc3339

log = logging.getLogger(__name__)


def _comparable(status: dict) -> dict:
    out = {k: v for k, v in status.items() if k != "conditions"}
    out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                         for c in status.get("conditions") or ()]
    return out


# How long events and status writes may wait for a burst of bindings to end.
YIELD_TO_BINDINGS_SECONDS = 10.0


def podgroup_status_path(key: str) -> str:
    namespace, _, name = key.partition("/")
    return (f"/apis/{constants.GROUP}/{constants.VERSION}/namespaces/{quote(namespace)}"
            f"/podgroups/{quote(name)}/status")


def queue_status_path(name: str) -> str:
    return f"/apis/{constants.GROUP}/{constants.VERSION}/{constants.QUEUE_PLURAL}/{quote(name)}/status"


class StatusWriter:
    """The status of one kind of object (PodGroups by default), by key."""

    def __init__(self, kube: Kube, min_interval: float = 1.0,
                 wait_for_bindings: Callable[[float], Awaitable[None]] = no_wait, kind: str = "PodGroup",
                 path: Callable[[str], str] = podgroup_status_path):
        self.kube = kube
        self.kind, self.path = kind, path
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
            yield_until = time.monotonic() + YIELD_TO_BINDINGS_SECONDS
            await self.wait_for_bindings(YIELD_TO_BINDINGS_SECONDS)
            now = time.monotonic()
            due = [k for k in self._pending if now - self._last_write.get(k, 0) >= self.min_interval]
            for key in due:
                # Bindings may start again while these are written: each write yields anew.
                await self.wait_for_bindings(max(0.0, yield_until - time.monotonic()))
                status = self._pending.pop(key, None)
                if status is not None:
                    await self._write(key, status)
            if self._pending:
                await asyncio.sleep(self.min_interval / 2)
                self._wake.set()

    async def _write(self, key: str, status: dict) -> None:
        try:
            await self.kube.merge_patch(self.path(key), {"status": status})
            log.debug("status of %s %s written: phase %s", self.kind, key, status.get("phase"))
            self._written[key] = status
            self._last_write[key] = time.monotonic()
            self.writes += 1
            self.on_write()
        except ApiError as exc:
            if exc.not_found:
                self.forget(key)
                return
            log.warning("status write for %s %s failed: %s", self.kind, key, exc)
            self._pending.setdefault(key, status)
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("status write for %s %s failed: %r", self.kind, key, exc)
            self._pending.setdefault(key, status)


def group_ref(obj: dict) -> dict:
    """A PodGroup of any gang source (the cache gives each its apiVersion)."""
    meta = obj.get("metadata") or {}
    return {"apiVersion": obj.get("apiVersion") or constants.API_VERSION, "kind": constants.PODGROUP_KIND,
            "namespace": meta.get("namespace", ""), "name": meta.get("name", ""), "uid": meta.get("uid", "")}
