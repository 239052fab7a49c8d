"""DeviceClasses, ResourceSlices and ResourceClaims as frozen model objects,
converted once on arrival (like ``core/model.py`` for pods and nodes).

Only what the inventory reads is kept.  Tenants write claims, admins write
classes and slices; either may be hostile or broken, so every list and name
is bounded by the API server's own limits (resource.k8s.io/v1 validation):
an object beyond them is refused with a ``DraError`` naming the field, and
the shell reports and skips it.  A claim is read allocation first: one
refused for anything else still holds its devices, as a partial claim
(``DraError.partial``) that nothing is allocated from.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from batchsched.core.text import clip

API_PATH = "/apis/resource.k8s.io/v1"
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"

# resource.k8s.io/v1 validation limits (k8s.io/api resource/v1 types.go)
MAX_DEVICES_PER_SLICE = 128  # ResourceSliceMaxDevices
MAX_ATTRIBUTES_PER_DEVICE = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_RESULTS = 32  # AllocationResultsMaxSize
MAX_RESERVED_FOR = 256  # ResourceClaimReservedForMaxSize
# The API bounds ownerReferences only by the object's size; a claim with
# more than this many is not read past its allocation.
MAX_OWNER_REFERENCES = 256
MAX_SELECTORS = 32  # DeviceSelectorsMaxSize
MAX_CONFIG = 32  # DeviceConfigMaxSize
MAX_OPAQUE_PARAMETERS = 10 * 1024  # OpaqueParametersMaxLength
MAX_NAME = 253  # DNS subdomain: driver, pool, class, claim names
MAX_DEVICE_NAME = 63  # DNS label
MAX_ATTRIBUTE_VALUE = 64  # string and version attribute values
MAX_EXPRESSION = 10 * 1024  # CELSelectorExpressionMaxLength

_DEVICE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class Version(str):
    """A ``version`` attribute (semver text): kept apart from a string so CEL
    selectors see a semver value."""


class SelectorError(ValueError):
    """A selector that cannot be used, or that failed on a device; the
    message says what and why, short enough for a condition.  (Here, not in
    ``selector.py``, so that ``cel.py`` raising it needs nothing of the
    module that imports it lazily.)"""


class DraError(ValueError):
    """An object the inventory cannot use; the message names the field.
    ``partial``: what of it is read all the same (a claim refused beyond its
    allocation), None when nothing is."""

    def __init__(self, message: str, partial: ResourceClaim | None = None):
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class DeviceClass:
    name: str
    extended_resource_name: str = ""
    selectors: tuple[str, ...] = ()  # CEL expressions, as written
    # spec.config[].opaque, each as JSON ({"driver": ..., "parameters": ...}):
    # copied into the allocations of its devices (source FromClass)
    config: tuple[str, ...] = ()


@dataclass(frozen=True)
class Device:
    name: str
    attributes: Mapping[str, str | int | bool]  # (a Version is a str) the driver's own under both its short and its qualified name
    capacity: Mapping[str, str]  # quantities, as written


@dataclass(frozen=True)
class ResourceSlice:
    name: str
    node: str  # spec.nodeName ("" for slices not tied to one node: not inventoried)
    driver: str
    pool: str
    generation: int
    slice_count: int
    devices: tuple[Device, ...]


@dataclass(frozen=True)
class AllocatedDevice:
    request: str
    driver: str
    pool: str
    device: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True)
class DeviceRequest:
    """One ``spec.devices.requests[]`` entry of a claim, as far as it is read:
    ``exactly`` with ExactCount or All.  ``unsupported`` says why any other
    form is not allocated (it is never guessed at)."""

    name: str
    device_class: str = ""
    count: int = 1  # ExactCount's count (0 with all_devices)
    selectors: tuple[str, ...] = ()  # CEL expressions, as written
    unsupported: str = ""
    all_devices: bool = False  # allocationMode All: every matching device of the node


@dataclass(frozen=True)
class MatchAttribute:
    """A ``spec.devices.constraints[]`` entry: the devices of ``requests``
    (all of the claim's when empty) share one value of ``attribute``."""

    attribute: str  # fully qualified (domain/name)
    requests: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResourceClaim:
    uid: str
    namespace: str
    name: str
    allocated: tuple[AllocatedDevice, ...] = ()  # status.allocation.devices.results
    reserved_for: tuple[str, ...] = ()  # uids of the pods in status.reservedFor
    owner_pod: str = ""  # uid of its controlling Pod, if any
    extended: bool = False  # made for a pod's extended resources (annotation)
    requests: tuple[DeviceRequest, ...] = ()  # spec.devices.requests
    constraints: tuple[MatchAttribute, ...] = ()  # spec.devices.constraints
    # spec.devices.config[].opaque, each as JSON with its requests
    # ({"requests": [...], "opaque": {...}}): copied into the allocation (source FromClaim)
    config: tuple[str, ...] = ()
    allocated_node: str = ""  # the node its allocation's nodeSelector names ("" when none is read)
    unsupported: str = ""  # why its spec cannot be allocated by this version ("" when it can)
    # Only its identity and allocation were read (``unsupported`` says why):
    # its devices are held, and no pod of ours uses it.
    partial: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _text(value: Any, where: str, limit: int = MAX_NAME) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DraError(f"{where} must be a string")
    if len(value) > limit:
        raise DraError(f"{where} is longer than {limit} characters")
    return value


def _list(value: Any, where: str, limit: int) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DraError(f"{where} must be a list")
    if len(value) > limit:
        raise DraError(f"{where} has {len(value)} entries, more than {limit}")
    return value


def _dict(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DraError(f"{where} must be an object")
    return value


def _int(value: Any, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise DraError(f"{where} must be a non-negative integer")
    return value


def _opaque(raw: Any, where: str) -> dict:
    """An opaque configuration, its parameters measured as the API server
    does: bytes of JSON, non-ASCII text as UTF-8 (its raw bytes are gone once
    decoded; the compact encoding is the fewest the API can have counted)."""
    raw = _dict(raw, where)
    driver = _text(raw.get("driver"), f"{where}.driver")
    size = len(json.dumps(raw.get("parameters"), ensure_ascii=False, separators=(",", ":")).encode())
    if size > MAX_OPAQUE_PARAMETERS:
        raise DraError(f"{where}.parameters is {size} bytes, more than {MAX_OPAQUE_PARAMETERS}")
    return {"driver": driver, "parameters": raw.get("parameters")}


def class_from_json(obj: Mapping[str, Any]) -> DeviceClass:
    meta, spec = _dict(obj.get("metadata"), "metadata"), _dict(obj.get("spec"), "spec")
    selectors = []
    for k, raw in enumerate(_list(spec.get("selectors"), "spec.selectors", MAX_SELECTORS)):
        cel = _dict(_dict(raw, f"spec.selectors[{k}]").get("cel"), f"spec.selectors[{k}].cel")
        selectors.append(_text(cel.get("expression"), f"spec.selectors[{k}].cel.expression", MAX_EXPRESSION))
    config = []
    for k, raw in enumerate(_list(spec.get("config"), "spec.config", MAX_CONFIG)):
        opaque = _opaque(_dict(raw, f"spec.config[{k}]").get("opaque"), f"spec.config[{k}].opaque")
        config.append(json.dumps(opaque, sort_keys=True))
    return DeviceClass(_text(meta.get("name"), "metadata.name"),
                       _text(spec.get("extendedResourceName"), "spec.extendedResourceName"), tuple(selectors),
                       tuple(config))


def _attribute(raw: Any, where: str) -> str | int | bool:
    """A DeviceAttribute: exactly one of int, bool, string, version."""
    raw = _dict(raw, where)
    if len(raw) != 1:
        raise DraError(f"{where} must hold exactly one of int, bool, string, version")
    kind, value = next(iter(raw.items()))
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind in ("string", "version") and isinstance(value, str):
        text = _text(value, where, MAX_ATTRIBUTE_VALUE)
        return Version(text) if kind == "version" else text
    raise DraError(f"{where} has an unknown or mistyped value {clip(str(kind), 40)!r}")


def _device(raw: Any, driver: str, where: str) -> Device:
    raw = _dict(raw, where)
    name = _text(raw.get("name"), f"{where}.name", MAX_DEVICE_NAME)
    if not _DEVICE_NAME.fullmatch(name):
        raise DraError(f"{where}.name {clip(name, 70)!r} is not a DNS label")
    raw_attributes = _dict(raw.get("attributes"), f"{where}.attributes")
    raw_capacity = _dict(raw.get("capacity"), f"{where}.capacity")
    if len(raw_attributes) + len(raw_capacity) > MAX_ATTRIBUTES_PER_DEVICE:
        raise DraError(f"{where} has more than {MAX_ATTRIBUTES_PER_DEVICE} attributes and capacities")
    attributes: dict[str, str | int | bool] = {}
    for key, value in raw_attributes.items():
        key = _text(key, f"{where}.attributes key")
        attributes[key] = _attribute(value, f"{where}.attributes[{key}]")
        # an unqualified name is the driver's own: readable both ways
        if "/" not in key:
            attributes.setdefault(f"{driver}/{key}", attributes[key])
        elif key.startswith(driver + "/"):
            attributes.setdefault(key[len(driver) + 1:], attributes[key])
    capacity = {_text(key, f"{where}.capacity key"): _text(_dict(value, f"{where}.capacity[{key}]").get("value"),
                                                          f"{where}.capacity[{key}].value", MAX_ATTRIBUTE_VALUE)
                for key, value in raw_capacity.items()}
    return Device(name, attributes, capacity)


def slice_from_json(obj: Mapping[str, Any]) -> ResourceSlice:
    meta, spec = _dict(obj.get("metadata"), "metadata"), _dict(obj.get("spec"), "spec")
    pool = _dict(spec.get("pool"), "spec.pool")
    driver = _text(spec.get("driver"), "spec.driver")
    raw_devices = _list(spec.get("devices"), "spec.devices", MAX_DEVICES_PER_SLICE)
    devices = tuple(_device(raw, driver, f"spec.devices[{k}]") for k, raw in enumerate(raw_devices))
    if len({d.name for d in devices}) != len(devices):
        raise DraError("spec.devices names a device twice")
    return ResourceSlice(_text(meta.get("name"), "metadata.name"), _text(spec.get("nodeName"), "spec.nodeName"),
                         driver, _text(pool.get("name"), "spec.pool.name"),
                         _int(pool.get("generation"), "spec.pool.generation"),
                         _int(pool.get("resourceSliceCount"), "spec.pool.resourceSliceCount"), devices)


MAX_REQUESTS = 32  # DeviceRequestsMaxSize
MAX_CONSTRAINTS = 32  # DeviceConstraintsMaxSize


def _request(raw: Any, where: str) -> DeviceRequest:
    raw = _dict(raw, where)
    name = _text(raw.get("name"), f"{where}.name", MAX_DEVICE_NAME)
    if raw.get("firstAvailable") is not None:
        return DeviceRequest(name, unsupported=f"request {clip(name, 63)!r} uses firstAvailable, which this "
                                               "version does not allocate")
    exactly = _dict(raw.get("exactly"), f"{where}.exactly")
    if not exactly:
        return DeviceRequest(name, unsupported=f"request {clip(name, 63)!r} has no exactly")
    device_class = _text(exactly.get("deviceClassName"), f"{where}.exactly.deviceClassName")
    selectors = []
    for k, selector in enumerate(_list(exactly.get("selectors"), f"{where}.exactly.selectors", MAX_SELECTORS)):
        cel = _dict(_dict(selector, f"{where}.exactly.selectors[{k}]").get("cel"),
                    f"{where}.exactly.selectors[{k}].cel")
        selectors.append(_text(cel.get("expression"), f"{where}.exactly.selectors[{k}].cel.expression",
                               MAX_EXPRESSION))
    mode = exactly.get("allocationMode") or "ExactCount"
    unsupported = ""
    if mode not in ("ExactCount", "All"):
        unsupported = (f"request {clip(name, 63)!r} asks allocationMode {clip(str(mode), 20)}; this version "
                       "allocates ExactCount and All")
    elif exactly.get("adminAccess"):
        unsupported = f"request {clip(name, 63)!r} asks adminAccess, which this version does not allocate"
    elif exactly.get("capacity") is not None:
        unsupported = f"request {clip(name, 63)!r} asks consumable capacity, which this version does not allocate"
    if mode == "All":  # the API refuses a count beside All; one set anyway is not read
        return DeviceRequest(name, device_class, 0, tuple(selectors), unsupported, all_devices=True)
    count = exactly.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RESULTS:
        raise DraError(f"{where}.exactly.count must be an integer from 1 to {MAX_RESULTS}")
    return DeviceRequest(name, device_class, count, tuple(selectors), unsupported)


def _constraint(raw: Any, where: str) -> MatchAttribute | str:
    raw = _dict(raw, where)
    requests = tuple(_text(r, f"{where}.requests[{k}]", MAX_DEVICE_NAME)
                     for k, r in enumerate(_list(raw.get("requests"), f"{where}.requests", MAX_REQUESTS)))
    attribute = _text(raw.get("matchAttribute"), f"{where}.matchAttribute")
    if not attribute or "/" not in attribute:
        return f"{where} is not a matchAttribute with a fully qualified name, which is all this version reads"
    return MatchAttribute(attribute, requests)


def _claim_spec(spec: dict) -> tuple[tuple[DeviceRequest, ...], tuple[MatchAttribute, ...], tuple[str, ...], str]:
    devices = _dict(spec.get("devices"), "spec.devices")
    requests = tuple(_request(raw, f"spec.devices.requests[{k}]")
                     for k, raw in enumerate(_list(devices.get("requests"), "spec.devices.requests", MAX_REQUESTS)))
    constraints, unsupported = [], ""
    for k, raw in enumerate(_list(devices.get("constraints"), "spec.devices.constraints", MAX_CONSTRAINTS)):
        read = _constraint(raw, f"spec.devices.constraints[{k}]")
        if isinstance(read, str):
            unsupported = unsupported or read
        else:
            constraints.append(read)
    config = []
    for k, raw in enumerate(_list(devices.get("config"), "spec.devices.config", MAX_CONFIG)):
        where = f"spec.devices.config[{k}]"
        raw = _dict(raw, where)
        if not _dict(raw.get("opaque"), f"{where}.opaque"):
            unsupported = unsupported or f"{where} has no opaque configuration"
            continue
        requests_named = [_text(name, f"{where}.requests[{n}]", MAX_DEVICE_NAME)
                          for n, name in enumerate(_list(raw.get("requests"), f"{where}.requests", MAX_REQUESTS))]
        config.append(json.dumps({"requests": requests_named, "opaque": _opaque(raw["opaque"], f"{where}.opaque")},
                                 sort_keys=True))
    unsupported = unsupported or next((r.unsupported for r in requests if r.unsupported), "")
    return requests, tuple(constraints), tuple(config), unsupported


def _allocated_node(allocation: dict) -> str:
    """The node an allocation's nodeSelector pins: ``matchFields
    metadata.name In [node]`` (as schedulers write it), else "" ."""
    terms = _dict(allocation.get("nodeSelector"), "status.allocation.nodeSelector").get("nodeSelectorTerms")
    if not isinstance(terms, list) or len(terms) != 1 or not isinstance(terms[0], dict):
        return ""
    fields = terms[0].get("matchFields")
    if terms[0].get("matchExpressions") or not isinstance(fields, list) or len(fields) != 1:
        return ""
    field = fields[0] if isinstance(fields[0], dict) else {}
    values = field.get("values")
    if (field.get("key") == "metadata.name" and field.get("operator") == "In" and isinstance(values, list)
            and len(values) == 1 and isinstance(values[0], str)):
        return _text(values[0], "status.allocation.nodeSelector node")
    return ""


def _allocation(status: dict) -> tuple[tuple[AllocatedDevice, ...], str]:
    """``status.allocation``: its devices and the node it names."""
    allocation = _dict(status.get("allocation"), "status.allocation")
    devices = _dict(allocation.get("devices"), "status.allocation.devices")
    allocated = []
    for k, raw in enumerate(_list(devices.get("results"), "status.allocation.devices.results", MAX_RESULTS)):
        where = f"status.allocation.devices.results[{k}]"
        raw = _dict(raw, where)
        allocated.append(AllocatedDevice(_text(raw.get("request"), f"{where}.request"),
                                         _text(raw.get("driver"), f"{where}.driver"),
                                         _text(raw.get("pool"), f"{where}.pool"),
                                         _text(raw.get("device"), f"{where}.device", MAX_DEVICE_NAME)))
    return tuple(allocated), _allocated_node(allocation) if allocation else ""


def _reserved_for(status: dict) -> tuple[str, ...]:
    """The uids of the pods in ``status.reservedFor``."""
    reserved = []
    for k, raw in enumerate(_list(status.get("reservedFor"), "status.reservedFor", MAX_RESERVED_FOR)):
        raw = _dict(raw, f"status.reservedFor[{k}]")
        if raw.get("resource") == "pods" and not raw.get("apiGroup"):
            reserved.append(_text(raw.get("uid"), f"status.reservedFor[{k}].uid"))
    return tuple(reserved)


def claim_from_json(obj: Mapping[str, Any]) -> ResourceClaim:
    """The claim; a ``DraError`` when any of it cannot be read, carrying the
    claim's identity and allocation as ``partial`` where those can: a claim
    refused for its spec (the API allows what this version does not read)
    must still hold the devices it was allocated."""
    meta, status = _dict(obj.get("metadata"), "metadata"), _dict(obj.get("status"), "status")
    uid, namespace = _text(meta.get("uid"), "metadata.uid"), _text(meta.get("namespace"), "metadata.namespace")
    name = _text(meta.get("name"), "metadata.name")
    allocated, allocated_node = _allocation(status)
    reserved: tuple[str, ...] = ()
    try:
        reserved = _reserved_for(status)
        owner = ""
        for k, raw in enumerate(_list(meta.get("ownerReferences"), "metadata.ownerReferences", MAX_OWNER_REFERENCES)):
            raw = _dict(raw, f"metadata.ownerReferences[{k}]")
            if raw.get("controller") is True and raw.get("kind") == "Pod" and raw.get("apiVersion") == "v1":
                owner = _text(raw.get("uid"), f"metadata.ownerReferences[{k}].uid")
        annotations = _dict(meta.get("annotations"), "metadata.annotations")
        requests, constraints, config, unsupported = _claim_spec(_dict(obj.get("spec"), "spec"))
    except DraError as error:
        raise DraError(str(error), ResourceClaim(uid, namespace, name, allocated, reserved,
                                                 allocated_node=allocated_node, unsupported=f"not read: {error}",
                                                 partial=True)) from error
    return ResourceClaim(uid, namespace, name, allocated, reserved, owner,
                         annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true", requests, constraints,
                         config, allocated_node, unsupported)
