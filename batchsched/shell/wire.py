"""Pods off the wire: only the fields the model reads are decoded.

A pod as the API server sends it is ~2 KB of JSON, most of it what the
scheduler never reads (managedFields, volumes, mounts, probes, images).
``json.loads`` builds all of it; a typed decoder (msgspec) skips the rest
without building it, which on a page of 500 pods costs a fifth of the time
(bench/history/RESULTS-until-2026-12-06.md, "Pods decoded by what the model
reads").  The start's pods list and every pod watch event pay this.

The types below name every field :func:`batchsched.core.model.pod_from_json`
reads (``tests/unit/test_wire.py`` records its reads and checks that each
is kept).  Leaves are ``Any``: what a tenant wrote is passed through
unchecked, as ``json.loads`` would, and the model judges it.  Anything the
types do not fit (never seen from a real API server) is decoded whole by
``json`` instead, so a page never fails on them.
"""
from __future__ import annotations

import json
from typing import Any, TypedDict

import msgspec


class _Meta(TypedDict, total=False):
    name: Any
    namespace: Any
    uid: Any
    resourceVersion: Any
    creationTimestamp: Any
    deletionTimestamp: Any
    labels: Any
    annotations: Any
    ownerReferences: Any


class _Container(TypedDict, total=False):
    name: Any
    resources: Any
    restartPolicy: Any


class _Spec(TypedDict, total=False):
    containers: list[_Container] | None
    initContainers: list[_Container] | None
    overhead: Any
    affinity: Any
    schedulingGroup: Any
    schedulingGates: Any
    tolerations: Any
    nodeSelector: Any
    nodeName: Any
    schedulerName: Any
    priority: Any
    priorityClassName: Any
    preemptionPolicy: Any
    restartPolicy: Any
    activeDeadlineSeconds: Any
    resourceClaims: Any


class _Status(TypedDict, total=False):
    phase: Any
    nominatedNodeName: Any
    startTime: Any
    conditions: Any
    resourceClaimStatuses: Any


class _Pod(TypedDict, total=False):
    apiVersion: Any
    kind: Any
    metadata: _Meta | None
    spec: _Spec | None
    status: _Status | None


class _PodList(TypedDict, total=False):
    metadata: Any
    items: list[_Pod] | None


class _PodEvent(TypedDict, total=False):
    type: Any
    object: _Pod | None


_LIST = msgspec.json.Decoder(_PodList)
_EVENT = msgspec.json.Decoder(_PodEvent)


def pod_list(data: bytes) -> dict:
    """A page of a pods list: its metadata whole, each pod as the model reads it."""
    try:
        return _LIST.decode(data)
    except msgspec.DecodeError:
        return json.loads(data)


def pod_event(line: bytes) -> dict:
    """One line of a pods watch; an ERROR event (its object a Status) whole."""
    try:
        event = _EVENT.decode(line)
    except msgspec.DecodeError:
        return json.loads(line)
    return json.loads(line) if event.get("type") == "ERROR" else event
