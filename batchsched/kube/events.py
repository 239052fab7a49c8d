"""Kubernetes Events (core/v1), fire and forget, never stale.

Events are rate-limited per object (:class:`EventRecorder`) and may wait for
a pause in the bindings (``wait_for_bindings``, at most
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

from batchsched.kube.client import ApiError, Kube

log = logging.getLogger(__name__)


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


async def no_wait(at_most: float) -> None:
    """The default ``wait_for_bindings``: nothing to wait for."""
    return None


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
                 wait_for_bindings: Callable[[float], Awaitable[None]] = no_wait,
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
