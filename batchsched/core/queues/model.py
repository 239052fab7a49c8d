"""A Queue as the core needs it, converted once from its JSON (pure)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from batchsched.api.queue import ResourceQuota, parse_queue_spec
from batchsched.core import resources as res
from batchsched.core.resources import Resources


@dataclass(frozen=True)
class Quota:
    """One resource's quota in canonical units; None: not set."""

    guaranteed: int | None = None
    limit: int | None = None
    weight: float | None = None  # None: the queue's weight


@dataclass(frozen=True)
class QueueInfo:
    name: str
    parent: str = ""
    weight: float = 1.0
    reclaimable: bool = True
    quotas: Mapping[str, Quota] = field(default_factory=dict)  # by resource name
    gpu_types: Mapping[str, Quota] = field(default_factory=dict)  # nvidia.com/gpu by GPU type
    generation: int = 0

    def weight_of(self, resource: str) -> float:
        quota = self.quotas.get(resource)
        return quota.weight if quota is not None and quota.weight is not None else self.weight

    def guaranteed(self) -> Resources:
        return {name: q.guaranteed for name, q in self.quotas.items() if q.guaranteed is not None}

    def limits(self) -> Resources:
        return {name: q.limit for name, q in self.quotas.items() if q.limit is not None}


def queue_from_json(obj: Mapping[str, Any]) -> QueueInfo:
    """Convert a Queue; raises ValueError naming each field that makes no sense."""
    meta = obj.get("metadata") or {}
    spec = parse_queue_spec(obj.get("spec"))
    quotas = {name: _quota(f"spec.resources.{name}", name, q) for name, q in spec.resources.items()}
    gpu_types = {kind: _quota(f"spec.gpuTypes.{kind}", "nvidia.com/gpu", q) for kind, q in spec.gpu_types.items()}
    name = str(meta.get("name") or "")
    if spec.parent == name:
        raise ValueError(f"spec.parent: queue {name} cannot be its own parent")
    generation = meta.get("generation")
    return QueueInfo(name=name, parent=spec.parent or "", weight=spec.weight, reclaimable=spec.reclaimable,
                     quotas=quotas, gpu_types=gpu_types,
                     generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else 0)


def _quota(where: str, resource: str, raw: ResourceQuota) -> Quota:
    amounts = {}
    for key in ("guaranteed", "limit"):
        value = getattr(raw, key)
        if value is None:
            continue
        try:
            amount = res.canonical(resource, value)
        except res.QuantityError as exc:
            raise ValueError(f"{where}.{key}: {exc}") from None
        if amount < 0:
            raise ValueError(f"{where}.{key}: {value!r} is negative")
        amounts[key] = amount
    if amounts.get("guaranteed", 0) > amounts.get("limit", res.MAX_CANONICAL):
        raise ValueError(f"{where}: guaranteed {raw.guaranteed} is above limit {raw.limit}")
    return Quota(amounts.get("guaranteed"), amounts.get("limit"), raw.weight)
