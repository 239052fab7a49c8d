"""The DRA objects in the watch cache: DeviceClasses, ResourceSlices and
ResourceClaims.  A claim that does not convert keeps what of it is read (its
allocation) or its last good version, so its devices stay in use; claims
that cannot be read at all fail closed (``ClusterState.set_claims_unreadable``)."""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from batchsched.core.cluster import ClusterState
from batchsched.core.dra import model as dra
from batchsched.core.text import clip
from batchsched.shell.handlers import MAX_PROBLEM_LENGTH

log = logging.getLogger(__name__)
CLAIMS_ABSENT_EFFECT = "no DRA GPU counts as free until they can be read"


class DraHandlers:
    """The cache's DRA objects (its ``state``; ``_dra_listed``: the kinds listed so far)."""

    def _dra_entry(self, kind: str) -> Callable[[dict], tuple[str, Any] | None]:
        """A listed or changed DRA object.  One that does not convert is
        reported; what of it is read all the same (a claim's allocation) is
        kept, else, if an earlier version of it converted, that version: a
        claim's devices stay in use rather than be handed out again on a bad
        write.  Anything else is skipped."""
        convert, key_of, _, _ = DRA[kind]

        def entry(obj: dict) -> tuple[str, Any] | None:
            try:
                converted = convert(obj)
            except Exception as exc:  # noqa: BLE001 - whatever it holds, this object alone is skipped
                partial = exc.partial if isinstance(exc, dra.DraError) else None
                held_anyway = "" if partial is None else " beyond its allocation (its devices stay in use)"
                why = clip(f"{_DRA_KIND_NAMES[kind]} not used{held_anyway}: {exc}", MAX_PROBLEM_LENGTH)
                log.warning("ignoring %s %s: %s", kind, _name_of(obj), why)
                self.on_bad_object(_DRA_KIND_NAMES[kind], obj, why)
                if partial is not None:
                    return key_of(partial), partial
                key = _dra_key(kind, obj)
                held = _dra_held(self.state, kind).get(key)
                return None if held is None else (key, held)
            return key_of(converted), converted
        return entry

    def _dra_replace(self, kind: str) -> Callable[[dict[str, Any]], None]:
        _, _, put, remove = DRA[kind]

        def replace(listed: dict[str, Any]) -> None:
            held = _dra_held(self.state, kind)
            gone = [key for key in held if key not in listed]
            # as the watch would have: a new claim frees nothing; a changed or gone one may give devices back
            self.capacity_freed |= bool(gone) or any(
                held.get(key) != value and (key in held or kind != "resourceclaims") for key, value in listed.items())
            for key in gone:
                remove(self.state, key)
            for value in listed.values():
                put(self.state, value)
            self._dra_synced(kind)
            self._recheck_topologies(kind)
            self._notify()
        return replace

    def _dra_apply(self, kind: str) -> Callable[[str, dict], None]:
        _, _, put, remove = DRA[kind]
        entry_of = self._dra_entry(kind)

        def apply(event_type: str, obj: dict) -> None:
            held = _dra_held(self.state, kind)
            if event_type == "DELETED":
                key, new = _dra_key(kind, obj), None
                old = held.get(key)
                remove(self.state, key)
            else:
                entry = entry_of(obj)
                if entry is None:
                    return
                new, old = entry[1], held.get(entry[0])
                put(self.state, new)
            self._recheck_topologies(kind)
            # a new claim frees nothing; a changed or gone one may give devices back
            self.capacity_freed |= kind != "resourceclaims" or (old is not None and old != new)
            self._notify()
        return apply

    def _claims_unreadable(self, why: str) -> None:
        """The claims cannot be listed (``why``), or can again (""): the
        state decides what that means (every DRA GPU taken meanwhile)."""
        if not why and self.state.dra.claims_unreadable:
            self.capacity_freed = True
        self.state.set_claims_unreadable(why)
        self._notify()

    def _dra_synced(self, kind: str) -> None:
        """A DRA collection is listed: nodes whose topology check waited for
        them are checked once all are."""
        self._dra_listed.add(kind)
        if len(self._dra_listed) == len(DRA):
            waiting, self._unchecked_topology = self._unchecked_topology, {}
            for name, obj in waiting.items():
                self._check_topology(name, obj)

    def _recheck_topologies(self, kind: str) -> None:
        """Slices or classes changed which GPUs nodes serve through DRA:
        report a topology problem that appeared (a node's own events
        report the rest)."""
        if kind == "resourceclaims" or len(self._dra_listed) < len(DRA):
            return
        for name, node in self.nodes.items():
            if node.topology_error and node.topology_error != self.topology_reported.get(name):
                self._check_topology(name, {"metadata": {"name": name}})


def _name_of(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return clip(f"{meta.get('namespace') + '/' if meta.get('namespace') else ''}{meta.get('name')}", 300)


# kind -> (convert, key of a converted object, put into and remove from the state)
DRA: dict[str, tuple[Callable, Callable, Callable, Callable]] = {
    "deviceclasses": (dra.class_from_json, lambda c: c.name,
                      ClusterState.put_device_class, ClusterState.remove_device_class),
    "resourceslices": (dra.slice_from_json, lambda s: s.name,
                       ClusterState.put_resource_slice, ClusterState.remove_resource_slice),
    "resourceclaims": (dra.claim_from_json, lambda c: c.uid, ClusterState.put_claim, ClusterState.remove_claim),
}
_DRA_KIND_NAMES = {"deviceclasses": "DeviceClass", "resourceslices": "ResourceSlice",
                   "resourceclaims": "ResourceClaim"}


def _dra_key(kind: str, obj: dict) -> str:
    """What a DRA object is held by, read from its JSON: claims by uid, the others by name."""
    return str((obj.get("metadata") or {}).get("uid" if kind == "resourceclaims" else "name", ""))


def _dra_held(state: ClusterState, kind: str) -> Mapping[str, Any]:
    return {"deviceclasses": state.dra.classes, "resourceslices": state.dra.slices,
            "resourceclaims": state.dra.claims}[kind]
