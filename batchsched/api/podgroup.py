"""The PodGroup API as Python types (pydantic), shared by the scheduler, the
simulator and the tests.  crds/podgroup.yaml is the same schema for the API
server; docs/podgroup.md explains the fields and phases.

Unknown fields are ignored, so an older scheduler reads a newer PodGroup.
"""
from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batchsched.api import constants

Phase = Literal["Pending", "Queued", "Scheduled", "Running", "Succeeded", "Failed"]
# Bounded as crds/podgroup.yaml bounds them; batchsched.core.resources bounds the values.
Quantity = int | Annotated[str, Field(max_length=64)]
ResourceName = Annotated[str, Field(min_length=1, max_length=253)]
MAX_MIN_RESOURCES = 32
MAX_INT32 = 2**31 - 1
# Members status.boundByScheduler names: one still bound is all precedence
# needs (core/gangs.py), and the status stays small however large the gang.
MAX_RECORDED_BINDINGS = 16


class ApiModel(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    def to_json(self) -> dict:
        """The API server's JSON: camelCase names, unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True)


_M = TypeVar("_M", bound=ApiModel)


class Domain(ApiModel):
    mode: Literal["required", "preferred"]
    label_key: str = Field("", alias="labelKey", max_length=317)


class TopologyPolicySpec(ApiModel):
    numa: Literal["none", "best-effort", "single-numa-node"] = "none"
    gpu_link: Literal["any", "prefer-nvlink", "require-nvlink"] = Field("prefer-nvlink", alias="gpuLink")
    exclusive_gpus: Annotated[bool, Field(strict=True)] = Field(False, alias="exclusiveGpus")
    domain: Domain | None = None


class PodGroupSpec(ApiModel):
    min_member: Annotated[int, Field(ge=1, le=100_000, strict=True)] = Field(1, alias="minMember")
    min_resources: dict[ResourceName, Quantity] | None = Field(None, alias="minResources",
                                                                 max_length=MAX_MIN_RESOURCES)
    priority_class_name: str | None = Field(None, alias="priorityClassName", max_length=253)
    schedule_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_INT32, strict=True)] | None = Field(
        None, alias="scheduleTimeoutSeconds")
    preemption_policy: Literal["PreemptLowerPriority", "Never"] | None = Field(None, alias="preemptionPolicy")
    topology_policy: TopologyPolicySpec | None = Field(None, alias="topologyPolicy")
    # The Queue (cluster-scoped) the gang is admitted through; unset: the configured default (docs/queues.md)
    queue: str | None = Field(None, max_length=253)
    # A hint, not enforced: how long the gang's pods run once started; lets
    # it backfill nodes drained for a reservation (docs/queueing.md, "Backfill")
    expected_runtime_seconds: Annotated[int, Field(ge=1, le=MAX_INT32, strict=True)] | None = Field(
        None, alias="expectedRuntimeSeconds")


class Condition(ApiModel):
    """metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = Field(None, alias="lastTransitionTime")
    observed_generation: int | None = Field(None, alias="observedGeneration")


class PodGroupStatus(ApiModel):
    phase: Phase = "Pending"
    observed_generation: int | None = Field(None, alias="observedGeneration")
    bound: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    pending: int = 0  # members not bound yet (gated ones included)
    elastic: int = 0  # members bound beyond minMember (placed as room allows, the first victims)
    priority: int | None = None  # what the gang queues and preempts at; unset while it has no members
    schedule_start_time: str | None = Field(None, alias="scheduleStartTime")
    conditions: list[Condition] = Field(default_factory=list)
    # UIDs of members batchsched bound (docs/binding.md): status is the
    # scheduler's to write, not the tenants', so a restart believes it.
    bound_by_scheduler: list[str] | None = Field(None, alias="boundByScheduler",
                                                 max_length=MAX_RECORDED_BINDINGS)


class ObjectMeta(ApiModel):
    name: str
    namespace: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PodGroup(ApiModel):
    api_version: str = Field(constants.API_VERSION, alias="apiVersion")
    kind: str = constants.PODGROUP_KIND
    metadata: ObjectMeta
    spec: PodGroupSpec
    status: PodGroupStatus | None = None


def parse_spec(raw: object) -> PodGroupSpec:
    """Validate a PodGroup's spec; ValueError names each bad field."""
    return validate_spec(PodGroupSpec, raw)


def validate_spec(model: type[_M], raw: object) -> _M:
    """``raw`` (an object's spec, None when absent) as ``model``; ValueError
    names each bad field by its path under ``spec``."""
    try:
        return model.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        problems = "; ".join(
            "spec" + "".join(f".{part}" if isinstance(part, str) else f"[{part}]" for part in err["loc"])
            + f": {err['msg']}" for err in exc.errors())
        raise ValueError(problems) from None
