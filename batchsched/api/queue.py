"""The Queue API as Python types (pydantic): a tenant's quota of the
cluster, cluster-scoped.  crds/queue.yaml is the same schema for the API
server; docs/queues.md explains the fields.

Queues are written by cluster admins, yet read like any other object: a
value no check foresaw makes that Queue invalid (its gangs wait with the
reason), never the scheduler fail.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from batchsched.api import constants
from batchsched.api.podgroup import Condition, ObjectMeta, Quantity, ResourceName, ApiModel, validate_spec

MAX_QUOTA_ENTRIES = 32
MAX_WEIGHT = 1_000_000.0
# A label value (the GPU type) is at most 63 characters.
GpuType = Annotated[str, Field(min_length=1, max_length=63)]


def _not_bool(value: object) -> object:
    # bool is an int to pydantic: `weight: true` is a mistake, not 1
    if isinstance(value, bool):
        raise ValueError("should be a number above 0, not a boolean")
    return value


Weight = Annotated[float, BeforeValidator(_not_bool), Field(gt=0, le=MAX_WEIGHT, allow_inf_nan=False)]


class ResourceQuota(ApiModel):
    """One resource's share: ``guaranteed`` is the queue's own (deserved),
    ``limit`` the most it may ever hold (borrowing up to it), ``weight``
    its part of what is left over (default: the queue's weight)."""

    guaranteed: Quantity | None = None
    limit: Quantity | None = None
    weight: Weight | None = None


class QueueSpec(ApiModel):
    parent: str | None = Field(None, min_length=1, max_length=253)
    weight: Weight = 1.0
    reclaimable: Annotated[bool, Field(strict=True)] = True
    resources: dict[ResourceName, ResourceQuota] = Field(default_factory=dict, max_length=MAX_QUOTA_ENTRIES)
    # nvidia.com/gpu quotas per GPU type: the value of the scheduler's
    # queues.gpuTypeLabel (nvidia.com/gpu.product) on the node a GPU is on
    gpu_types: dict[GpuType, ResourceQuota] = Field(default_factory=dict, alias="gpuTypes",
                                                    max_length=MAX_QUOTA_ENTRIES)


class ReclaimFlow(ApiModel):
    """The pods of one queue terminating for another's gangs."""

    queue: str
    gangs: int
    pods: int
    resources: dict[str, str] = Field(default_factory=dict)


class Reclaim(ApiModel):
    """A reclaim in flight, from the reclaiming queue (``from``) or the one
    reclaimed from (``to``)."""

    message: str
    waiting_gangs: int = Field(0, alias="waitingGangs")
    since: str | None = None
    from_: list[ReclaimFlow] = Field(default_factory=list, alias="from")
    to: list[ReclaimFlow] = Field(default_factory=list)


class QueueStatus(ApiModel):
    """What the scheduler writes back (docs/queues.md, "Status")."""

    allocated: dict[str, str] = Field(default_factory=dict)
    guaranteed: dict[str, str] = Field(default_factory=dict)
    fair_share: dict[str, str] = Field(default_factory=dict, alias="fairShare")
    borrowed: dict[str, str] = Field(default_factory=dict)
    pending_gangs: int = Field(0, alias="pendingGangs")
    running_gangs: int = Field(0, alias="runningGangs")
    reclaim: Reclaim | None = None
    reclaimed_by: Reclaim | None = Field(None, alias="reclaimedBy")
    conditions: list[Condition] = Field(default_factory=list)


class QueueMeta(ObjectMeta):
    namespace: str = ""  # cluster-scoped


class Queue(ApiModel):
    api_version: str = Field(constants.API_VERSION, alias="apiVersion")
    kind: str = constants.QUEUE_KIND
    metadata: QueueMeta
    spec: QueueSpec = Field(default_factory=QueueSpec)
    status: QueueStatus | None = None


def parse_queue_spec(raw: object) -> QueueSpec:
    """Validate a Queue's spec; ValueError names each bad field."""
    return validate_spec(QueueSpec, raw)
