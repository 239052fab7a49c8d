"""Writes PodGroup status and Kubernetes Events, coalesced.

A status is written only when it differs from the last one written (ignoring
timestamps), and at most once per ``min_interval`` per group, so an idle
cluster costs no writes.  Events are rate-limited per object and never stale
(:class:`EventRecorder`).
Both wait for a pause in the bindings (``wait_for_bindings``: the binder's
``wait_idle``; status writes at most ``YIELD_TO_BINDINGS_SECONDS``, Events
``EVENT_YIELD_SECONDS``): they share the API server with the bindings, and a
pod bound a moment sooner is worth more than its event.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
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


def podgroup_status_path(key: str) -> str:
    namespace, _, name = key.partition("/")
    return (f"/apis/{constants.GROUP}/{constants.VERSION}/namespaces/{quote(namespace)}"
            f"/podgroups/{quote(name)}/status")


def queue_status_path(name: str) -> str:
    return f"/apis/{constants.GROUP}/{constants.VERSION}/{constants.QUEUE_PLURAL}/{quote(name)}/status"


class StatusWriter:
    """The status of one kind of object (PodGroups by default), by key."""

    def __init__(self, kube: Kube, min_interval: float = 1.0,
                 wait_for_bindings: Callable[[float], Awaitable[None]] = _no_wait, kind: str = "PodGroup",
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


# An event equal to the last one posted for its object within this long is
# not posted again (kube's own event correlator dedups for 10 minutes).
EVENT_DEDUP_SECONDS = 600.0
# The least time between two events of one reason on one object: a gang whose
# verdict churns (members arriving one by one) reaches each of its pods at most
# this often, 256 pods about 26 events/s at worst.  kube-scheduler's own pace
# is alike: a pod it cannot place is retried, and gets its FailedScheduling
# Event, at most every 10 s (podMaxBackoffSeconds) once its backoff has grown.
EVENT_MIN_INTERVAL_SECONDS = 10.0
# Objects whose last event is remembered; beyond it the oldest are forgotten.
MAX_TRACKED_OBJECTS = 50_000
# How long an Event may wait for the bindings to pause: longer than a status
# write, as nothing reads Events to act.  A burst binds each of its pods with
# a Scheduled Event of its own to follow, one write per binding: were they let
# in 10 s after each binding, a burst longer than that would share the API
# server with its own Events (bench/history/RESULTS-until-2026-12-06.md,
# "Writes that can wait hold off for a quiet moment").  At 400 bindings/s,
# 30 s hold ~12,000 of them.
EVENT_YIELD_SECONDS = 30.0


@dataclass
class _Event:
    ref: dict[str, Any]
    event_type: str
    reason: str
    message: str


@dataclass
class _ObjectEvents:
    """One object's event history, as much as the rules need."""
    last: tuple[str, str] = ("", "")  # (reason, message) of the event posted last
    last_at: float = -math.inf
    posted_at: dict[str, float] = field(default_factory=dict)  # reason -> when last posted
    held: _Event | None = None  # the newest event, waiting for its reason's interval
    timer: asyncio.TimerHandle | None = None


class EventRecorder:
    """Kubernetes Events (core/v1), fire and forget, never stale.

    Per object: an event equal to the last one posted for it (within
    ``EVENT_DEDUP_SECONDS``) is dropped, so a steady state posts nothing; any
    other is posted, so A -> B -> A posts A again and the newest event always
    says what holds now.  Events of one reason on one object are at least
    ``min_interval`` apart: one that comes sooner is held, a newer one
    replaces it (latest wins) and it is posted when due, unless an event
    posted meanwhile superseded it.
    """

    def __init__(self, kube: Kube, component: str, max_in_flight: int = 16,
                 wait_for_bindings: Callable[[float], Awaitable[None]] = _no_wait,
                 min_interval: float = EVENT_MIN_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic,
                 max_objects: int = MAX_TRACKED_OBJECTS, yield_seconds: float = EVENT_YIELD_SECONDS):
        self.kube = kube
        self.component = component
        self.wait_for_bindings = wait_for_bindings
        self.yield_seconds = yield_seconds
        self.min_interval = min_interval
        self.clock = clock
        self.max_objects = max_objects
        self._objects: dict[str, _ObjectEvents] = {}  # least recently emitted first
        self._slots = asyncio.Semaphore(max_in_flight)
        self._tasks: set[asyncio.Task] = set()
        self.posted = 0

    def emit(self, ref: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        """ref: {kind, namespace, name, uid, apiVersion}."""
        key = ref.get("uid") or f"{ref['kind']}/{ref['namespace']}/{ref['name']}"
        state = self._objects.pop(key, None) or _ObjectEvents()
        self._objects[key] = state
        if len(self._objects) > self.max_objects:
            self._forget_oldest()
        now = self.clock()
        if state.last == (reason, message) and now - state.last_at < EVENT_DEDUP_SECONDS:
            self._drop_held(state)  # the object already shows what holds now
            return
        event = _Event(ref, event_type, reason, message)
        due = state.posted_at.get(reason, -math.inf) + self.min_interval
        if now >= due:
            self._post_now(state, event, now)
            return
        self._drop_held(state)
        state.held = event
        state.timer = asyncio.get_running_loop().call_later(due - now, self._release, key)

    def _release(self, key: str) -> None:
        state = self._objects.get(key)
        if state is not None and state.held is not None:
            state.timer = None
            self._post_now(state, state.held, self.clock())

    @staticmethod
    def _drop_held(state: _ObjectEvents) -> None:
        state.held = None
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None

    def _post_now(self, state: _ObjectEvents, event: _Event, now: float) -> None:
        self._drop_held(state)  # older than this one: posting it later would make it look newest
        state.last, state.last_at = (event.reason, event.message), now
        state.posted_at[event.reason] = now
        self.posted += 1
        task = asyncio.get_running_loop().create_task(self._post(event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _forget_oldest(self) -> None:
        """Keep memory bounded: forget the objects emitted to least recently
        (a held event of theirs is lost; with this many objects, old ones)."""
        for key in list(self._objects)[:len(self._objects) - self.max_objects // 2]:
            self._drop_held(self._objects.pop(key))

    async def _post(self, event: _Event) -> None:
        ref = event.ref
        stamp = now_rfc3339()
        namespace = ref.get("namespace") or "default"  # cluster-scoped objects' events (nodes) go there
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{ref['name']}.", "namespace": namespace},
            "involvedObject": ref, "reason": event.reason, "message": event.message[:1024],
            "type": event.event_type,
            "source": {"component": self.component}, "reportingComponent": self.component,
            "reportingInstance": self.component,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        yield_until = time.monotonic() + self.yield_seconds
        async with self._slots:
            # Waited for with a slot held: events let through by an idle moment
            # must not go on to post once bindings start again.
            await self.wait_for_bindings(max(0.0, yield_until - time.monotonic()))
            try:
                await self.kube.request("POST", f"/api/v1/namespaces/{quote(namespace)}/events", body=body)
            except (ApiError, OSError, asyncio.TimeoutError) as exc:
                log.debug("event %s on %s not recorded: %s", event.reason, ref.get("name"), exc)


def pod_ref(namespace: str, name: str, uid: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}


def node_ref(obj: dict) -> dict:
    meta = obj.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Node", "namespace": "", "name": meta.get("name", ""),
            "uid": meta.get("uid", "")}


def group_ref(obj: dict) -> dict:
    """A PodGroup of any gang source (the cache gives each its apiVersion)."""
    meta = obj.get("metadata") or {}
    return {"apiVersion": obj.get("apiVersion") or constants.API_VERSION, "kind": constants.PODGROUP_KIND,
            "namespace": meta.get("namespace", ""), "name": meta.get("name", ""), "uid": meta.get("uid", "")}
