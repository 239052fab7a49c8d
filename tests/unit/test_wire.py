"""Pods decoded by what the model reads (batchsched.shell.wire) read as the
model would read the whole JSON."""
from __future__ import annotations

import json
import types
import typing

from hypothesis import given, settings
from hypothesis import strategies as st

from batchsched.api import constants
from batchsched.core.model import PodInfo
from batchsched.core.readers import pod_from_json
from batchsched.shell import wire

# Every field pod_from_json reads, each with a value that makes it read on
# (a group label, a container asking GPUs, a template claim with its status...).
FULL_POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {
        "name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
        "creationTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": "2026-01-01T01:00:00Z",
        "labels": {constants.POD_GROUP_LABEL: "g"},
        "annotations": {constants.GPU_IDS_ANNOTATION: "0,1", constants.CHECKPOINT_TIME_ANNOTATION: "2026-01-01T00:30:00Z",
                        "volcano.sh/task-spec": "worker"},
        "ownerReferences": [{"kind": "Job", "name": "j", "controller": True}],
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
    },
    "spec": {
        "containers": [{"name": "c", "image": "x", "restartPolicy": "Always",
                        "resources": {"requests": {"cpu": "1"}, "limits": {constants.GPU_RESOURCE: "2"}},
                        "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
        "initContainers": [{"name": "i", "restartPolicy": "Always",
                            "resources": {"limits": {constants.GPU_RESOURCE: "1"}}}],
        "overhead": {"cpu": "100m"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}],
             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]}}},
        "schedulingGroup": {"podGroupName": "native"},
        "schedulingGates": [{"name": "wait"}],
        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"pool": "a"}, "nodeName": "n1", "schedulerName": "batchsched",
        "priority": 5, "priorityClassName": "high", "preemptionPolicy": "Never", "restartPolicy": "OnFailure",
        "activeDeadlineSeconds": 60,
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}, {"name": "x", "resourceClaimName": "c"}],
        "volumes": [{"name": "v", "emptyDir": {}}],
    },
    "status": {
        "phase": "Running", "nominatedNodeName": "n2", "startTime": "2026-01-01T00:10:00Z",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "m"}],
        "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu"}],
        "containerStatuses": [{"name": "c", "ready": True}],
    },
}


class Recording(dict):
    """A JSON object that notes, as paths, every key read from it."""

    def __init__(self, value: dict, path: tuple, reads: set):
        super().__init__({k: wrap(v, path + (k,), reads) for k, v in value.items()})
        self.path, self.reads = path, reads

    def get(self, key, default=None):
        self.reads.add(self.path + (key,))
        return super().get(key, default)

    def __getitem__(self, key):
        self.reads.add(self.path + (key,))
        return super().__getitem__(key)


def wrap(value, path: tuple, reads: set):
    if isinstance(value, dict):
        return Recording(value, path, reads)
    if isinstance(value, list):
        return [wrap(v, path + ("[]",), reads) for v in value]
    return value


def kept(path: tuple, hint=wire._Pod) -> bool:
    """Whether the typed pod keeps what is at ``path`` (all of it below an ``Any``)."""
    for key in path:
        while typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None: X
            hint = next(h for h in typing.get_args(hint) if h is not type(None))
        if hint is typing.Any:
            return True
        if typing.get_origin(hint) is list:
            if key != "[]":
                return False
            hint = typing.get_args(hint)[0]
            continue
        fields = typing.get_type_hints(hint)
        if key not in fields:
            return False
        hint = fields[key]
    return True


def test_every_field_the_model_reads_is_decoded():
    reads: set = set()
    pod_from_json(wrap(FULL_POD, (), reads), frozenset(["own", "volcano", "native"]))
    assert ("spec", "containers", "[]", "resources") in reads  # the recording sees nested reads
    missing = sorted(path for path in reads if not kept(path))
    assert not missing, f"pod_from_json reads fields shell/wire.py drops: {missing}"
    # and the check can fail: a dropped field is caught
    assert not kept(("spec", "volumes")) and not kept(("metadata", "managedFields"))


def test_a_pod_read_holds_podinfo_fields_only():
    """pod_from_json fills the instance without __init__: a misnamed field
    would be a stray attribute, not an error."""
    pod = pod_from_json(FULL_POD, frozenset(["own", "volcano", "native"]))
    assert set(pod.__dict__) == set(PodInfo.__dataclass_fields__)
    assert pod.tolerations and pod_from_json(FULL_POD).tolerations[0] is pod.tolerations[0]  # shared, not copied


def test_a_full_pod_reads_the_same_from_a_list_page_and_a_watch_event():
    page = json.dumps({"metadata": {"resourceVersion": "9", "continue": "abc"}, "items": [FULL_POD]}).encode()
    typed = wire.pod_list(page)
    assert typed["metadata"] == {"resourceVersion": "9", "continue": "abc"}
    assert "managedFields" not in typed["items"][0]["metadata"]  # what is never read is not built
    assert pod_from_json(typed["items"][0]) == pod_from_json(FULL_POD)
    event = wire.pod_event(json.dumps({"type": "MODIFIED", "object": FULL_POD}).encode())
    assert event["type"] == "MODIFIED" and pod_from_json(event["object"]) == pod_from_json(FULL_POD)


def test_an_error_event_and_a_page_the_types_do_not_fit_are_read_whole():
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    assert wire.pod_event(json.dumps({"type": "ERROR", "object": status}).encode())["object"] == status
    odd = {"metadata": {}, "items": [{"metadata": "not an object", "spec": {"containers": 3}}]}
    assert wire.pod_list(json.dumps(odd).encode()) == odd


json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


@st.composite
def hostile_pods(draw) -> dict:
    """The full pod with some fields, at any depth, replaced by any JSON value."""
    pod = json.loads(json.dumps(FULL_POD))
    for _ in range(draw(st.integers(0, 4))):
        target = pod
        while isinstance(target, (dict, list)) and target and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(target) if isinstance(target, dict) else range(len(target))))
            if not isinstance(target[key], (dict, list)):
                break
            target = target[key]
        if isinstance(target, dict) and target:
            target[draw(st.sampled_from(sorted(target)))] = draw(json_values)
        elif isinstance(target, list) and target:
            target[draw(st.integers(0, len(target) - 1))] = draw(json_values)
    return pod


def converted(obj):
    try:
        return pod_from_json(obj, frozenset(["own", "volcano", "native"]))
    except Exception as exc:  # noqa: BLE001 - the cache skips such a pod: the same error either way
        return type(exc)


@settings(max_examples=300, deadline=None)
@given(hostile_pods())
def test_any_pod_reads_the_same_typed_as_whole(pod):
    text = json.dumps(pod).encode()
    whole = json.loads(text)
    assert converted(wire.pod_list(b'{"items": [' + text + b"]}")["items"][0]) == converted(whole)
    assert converted(wire.pod_event(b'{"type": "ADDED", "object": ' + text + b"}")["object"]) == converted(whole)
