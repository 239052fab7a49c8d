"""What a gang source plugs in (registry.py holds one of each): how its
objects are read into gang specs, how its PodGroup's status is written, and
what the scheduler's RBAC must grant for them (deploy/rbac.yaml; a test
checks each need is granted).  Naming (API group, member label, object path)
is its :class:`GangSource` in ``gangsources/__init__.py``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from batchsched.core.gangsources import GangSource
from batchsched.core.model import GroupSpec, PodInfo
from batchsched.core.status import Counters


@dataclass(frozen=True)
class Rule:
    """One RBAC permission: ``verbs`` on ``resource`` of ``api_group``."""
    api_group: str
    resource: str
    verbs: tuple[str, ...]


@dataclass(frozen=True)
class StatusFacts:
    """What a gang's PodGroup status is written from, whatever its source."""
    phase: str
    counters: Counters
    min_member: int
    reason: str  # the verdict's reason and message ("" when none)
    message: str
    start_time: str | None  # when the gang first left Pending (RFC 3339)
    written: Mapping[str, Any] | None  # the status last written
    now: str  # RFC 3339
    obj: Mapping[str, Any]  # the PodGroup as listed
    spec: GroupSpec | None  # None: it could not be read
    members: Sequence[PodInfo]


class GangSourcePlugin(Protocol):
    """A gang source: one module holds it, registry.py lists it."""

    @property
    def source(self) -> GangSource: ...

    @property
    def rbac(self) -> tuple[Rule, ...]: ...

    @property
    def names_priority_class(self) -> bool:
        """Its PodGroup names a PriorityClass, whose value the reader is given."""

    def read(self, obj: Mapping[str, Any], priority: int | None) -> GroupSpec | None:
        """The gang spec its object (PodGroup, or owner) makes, None for an
        owner that makes no gang; raises ValueError naming a field that makes
        no sense.  Never called for a source with no objects (Kueue)."""

    def status(self, facts: StatusFacts) -> dict | None:
        """Its PodGroup's status, as a merge patch; None: nothing to write."""


@dataclass(frozen=True)
class SourcePlugin:
    """A :class:`GangSourcePlugin` made of functions."""
    source: GangSource
    rbac: tuple[Rule, ...] = ()
    reader: Callable[[Mapping[str, Any], int | None], GroupSpec | None] | None = None
    writer: Callable[[StatusFacts], dict] | None = None
    names_priority_class: bool = True

    def read(self, obj: Mapping[str, Any], priority: int | None) -> GroupSpec | None:
        if self.reader is None:
            raise ValueError(f"gang source {self.source.name} has no objects to read")
        return self.reader(obj, priority)

    def status(self, facts: StatusFacts) -> dict | None:
        return None if self.writer is None else self.writer(facts)


def watches(source: GangSource) -> tuple[Rule, ...]:
    """RBAC to list and watch the objects that size its gangs."""
    return (Rule(source.api_group, source.plural, ("list", "watch")),)


def writes_status(source: GangSource) -> tuple[Rule, ...]:
    """RBAC to patch its PodGroup's status: the status subresource, else the object."""
    return (Rule(source.api_group, "podgroups/status" if source.status_subresource else "podgroups", ("patch",)),)
