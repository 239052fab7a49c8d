"""What the foreign gang sources share: a PodGroup read into a GroupSpec, and
the member counts their statuses carry."""
from __future__ import annotations

from typing import Any, Mapping

from batchsched.core import resources as res
from batchsched.core.gangsources import SOURCES
from batchsched.core.model import GroupSpec
from batchsched.core.readers import parse_time

# As our own PodGroup's bound (batchsched.api.podgroup): beyond it is a typo or hostile.
MAX_MIN_MEMBER = 100_000


def group_spec(obj: Mapping[str, Any], source: str, min_member: int, min_resources: Mapping[str, Any] | None,
               priority: int | None = None, priority_class: str = "") -> GroupSpec:
    """A foreign PodGroup as the core sees it.  minMember 0 (allowed, or the
    Go zero value of a field left out) asks no gang: like our minMember 1,
    any member may go alone."""
    meta = obj.get("metadata") or {}
    try:
        resources = res.parse_resource_map(min_resources)
    except res.QuantityError as exc:
        raise ValueError(f"spec.minResources: {exc}") from exc
    return GroupSpec(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        min_member=max(1, min_member),
        priority=priority,
        source=source,
        created=parse_time(meta.get("creationTimestamp")),
        min_resources=resources,
        # Without a status subresource every status write bumps the generation: only a spec change counts.
        generation=int(meta.get("generation") or 0) if SOURCES[source].status_subresource else 0,
        priority_class=priority_class,
    )
