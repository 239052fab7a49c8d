"""PodGroups of every gang source, the PriorityClasses they name, and the
owners sizing automatic gangs (Jobs, JobSets) in the watch cache: each
converted by its source's reader; one that makes no sense is refused with
why, alone."""
from __future__ import annotations

import logging

from batchsched.api import constants
from batchsched.core import gangsources
from batchsched.core.gangsources.registry import PLUGINS
from batchsched.core.model import GroupSpec
from batchsched.core.readers import recorded_bindings
from batchsched.core.text import clip
from batchsched.shell.handlers import MAX_PROBLEM_LENGTH

log = logging.getLogger(__name__)


class GroupHandlers:
    """The cache's PodGroups, PriorityClasses and gang-sizing owners (``groups_raw``,
    ``groups``, ``invalid_groups``, ``priority_classes``, ``owner_refs``)."""

    def _convert_group(self, key: str, obj: dict) -> None:
        """(Re)convert one PodGroup of any source; its gang is touched, and a
        problem reported, only when what the core sees of it changed (a
        relist or a PriorityClass event converts every group again)."""
        old_spec, old_why = self.groups.pop(key, None), self.invalid_groups.pop(key, None)
        source = gangsources.source_of_key(key)
        try:
            spec = PLUGINS[source].read(obj, self._group_priority(source, obj))
        except Exception as exc:  # noqa: BLE001 - whatever it holds, only this PodGroup is refused
            why = str(exc) if isinstance(exc, (ValueError, TypeError)) else f"{type(exc).__name__}: {exc}"
            why = clip(why, MAX_PROBLEM_LENGTH)
            self.invalid_groups[key] = why
            if why != old_why:
                log.warning("PodGroup %s is invalid: %s", key, why)
                self.on_bad_object("PodGroup", obj, why)
                self.touched_gangs.add(key)
            return
        # an equal spec keeps the held object: the gangs built from it stay valid
        self.groups[key] = old_spec if spec == old_spec else spec
        if spec != old_spec:
            self.touched_gangs.add(key)

    def _group_priority(self, source: str, obj: dict) -> int | None:
        """The value of the PriorityClass the PodGroup names (None: it names
        none); ValueError when that class does not exist."""
        if not PLUGINS[source].names_priority_class:
            return None  # its PodGroup has no priorityClassName: the members' priority holds
        spec = obj.get("spec")
        class_name = spec.get("priorityClassName") if isinstance(spec, dict) else None
        if not class_name or not isinstance(class_name, str):
            return None
        if class_name not in self.priority_classes:
            raise ValueError(f"PriorityClass {clip(class_name, 253)!r} not found")
        return self.priority_classes[class_name]

    @staticmethod
    def _group_key(obj: dict, source: str = gangsources.OWN) -> str:
        meta = obj.get("metadata") or {}
        return gangsources.gang_key(str(meta.get("namespace", "")), source, str(meta.get("name", "")))

    def _group_entry(self, obj: dict, source: str = gangsources.OWN) -> tuple[str, dict]:
        # Kept raw: few, and their status is written back.  A list's items
        # may lack their kind: Events on the object need it.
        api = gangsources.SOURCES[source]
        obj.setdefault("apiVersion", api.api_version)
        obj.setdefault("kind", constants.PODGROUP_KIND)
        return self._group_key(obj, source), obj

    def _replace_groups(self, listed: dict[str, dict], source: str = gangsources.OWN) -> None:
        """A whole list of one source's PodGroups at once (the other sources' stay)."""
        held = {key for key in self.groups_raw if gangsources.source_of_key(key) == source}
        for key in held - listed.keys():  # gone while not watched
            del self.groups_raw[key]
            self.groups.pop(key, None)
            self.invalid_groups.pop(key, None)
            self.touched_gangs.add(key)
        self.groups_raw.update(listed)
        for key, obj in listed.items():
            self._convert_group(key, obj)
        self._notify()

    def _apply_group(self, event_type: str, obj: dict, source: str = gangsources.OWN) -> None:
        key, obj = self._group_entry(obj, source)
        if event_type == "DELETED":
            self.groups_raw.pop(key, None)
            self.groups.pop(key, None)
            self.invalid_groups.pop(key, None)
            self.touched_gangs.add(key)
        else:
            old = self.groups_raw.get(key)
            self.groups_raw[key] = obj
            if old is None or old.get("spec") != obj.get("spec") or \
                    old["metadata"].get("generation") != obj["metadata"].get("generation") or \
                    recorded_bindings(old) != recorded_bindings(obj):
                self._convert_group(key, obj)
        self._notify()

    @staticmethod
    def _priority_class_entry(obj: dict) -> tuple[str, int]:
        return obj["metadata"]["name"], int(obj.get("value") or 0)

    def _replace_priority_classes(self, listed: dict[str, int]) -> None:
        self.priority_classes = listed
        self._regroup()

    def _apply_priority_class(self, event_type: str, obj: dict) -> None:
        name, value = self._priority_class_entry(obj)
        if event_type == "DELETED":
            self.priority_classes.pop(name, None)
        else:
            self.priority_classes[name] = value
        self._regroup()

    def _regroup(self) -> None:
        for key, obj in self.groups_raw.items():
            self._convert_group(key, obj)
        self._notify()

    # ---- owners sizing automatic gangs: Jobs, JobSets ---------------------------------

    def _owner_entry(self, obj: dict, source: str) -> tuple[str, tuple[GroupSpec | str, dict]] | None:
        """An owner as its gang's spec, or why it makes none, with a reference
        to it for Events (held like a PodGroup's spec, never raw: nothing is
        written to it); None for an owner that is no gang (a Job that is not
        Indexed)."""
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        try:
            spec = PLUGINS[source].read(obj, None)
        except Exception as exc:  # noqa: BLE001 - whatever it holds, only this owner's gang is refused
            why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            spec = clip(why, MAX_PROBLEM_LENGTH)
        if spec is None:
            return None
        api = gangsources.SOURCES[source]
        ref = {"apiVersion": api.api_version, "kind": api.kind, "namespace": namespace, "name": name,
               "uid": str(meta.get("uid", ""))}
        return gangsources.gang_key(namespace, source, name), (spec, ref)

    def _replace_owners(self, listed: dict[str, tuple[GroupSpec | str, dict]], source: str) -> None:
        for key in [k for k in {*self.groups, *self.invalid_groups}
                    if gangsources.source_of_key(k) == source and k not in listed]:
            self._drop_owner(key)
        for key, (spec, ref) in listed.items():
            self._put_owner(key, spec, ref)
        self._notify()

    def _apply_owner(self, event_type: str, obj: dict, source: str) -> None:
        meta = obj.get("metadata") or {}
        key = gangsources.gang_key(str(meta.get("namespace", "")), source, str(meta.get("name", "")))
        entry = None if event_type == "DELETED" else self._owner_entry(obj, source)
        if entry is None:
            self._drop_owner(key)
        else:
            self._put_owner(key, *entry[1])
        self._notify()

    def _drop_owner(self, key: str) -> None:
        self.owner_refs.pop(key, None)
        if self.groups.pop(key, None) is not None or self.invalid_groups.pop(key, None) is not None:
            self.touched_gangs.add(key)

    def _put_owner(self, key: str, spec: GroupSpec | str, ref: dict) -> None:
        """Its gang is touched only when its size changed: a Job's status
        changes with every pod it starts, which mostly leaves the size be."""
        self.owner_refs[key] = ref
        if isinstance(spec, str):
            if self.invalid_groups.get(key) != spec:
                log.warning("%s is no gang: %s", key, spec)
                self.groups.pop(key, None)
                self.invalid_groups[key] = spec
                self.touched_gangs.add(key)
        elif self.groups.get(key) != spec or key in self.invalid_groups:
            self.invalid_groups.pop(key, None)
            self.groups[key] = spec
            self.touched_gangs.add(key)


def foreign_kind(source: str) -> str:
    """A foreign source's PodGroups as a collection is named (logs, metrics, /readyz)."""
    return f"podgroups.{gangsources.SOURCES[source].api_group}"
