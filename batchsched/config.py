"""Scheduler configuration: YAML validated by pydantic (configs/scheduler.yaml documents every field).

Every number must be finite (no .inf or .nan) and every duration between 0
and ``MAX_SECONDS``; a bad file is refused at start with one line naming
the file, each bad key's path and what it needs (``ConfigError``).
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from batchsched.api import constants
from batchsched.core import gangsources
from batchsched.core.config import CoreConfig
from batchsched.core.preemption.policy import PreemptionPolicy


MAX_SECONDS = 365 * 24 * 3600  # a year: longer durations are typos, and .inf would turn a feature off


class ConfigError(ValueError):
    """The configuration file is unreadable or invalid; the message is one line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class QueueConfig(_Strict):
    initial_backoff_seconds: float = Field(1.0, alias="initialBackoffSeconds", gt=0, le=MAX_SECONDS)
    max_backoff_seconds: float = Field(60.0, alias="maxBackoffSeconds", gt=0, le=MAX_SECONDS)
    reservation_after_seconds: float = Field(60.0, alias="reservationAfterSeconds", ge=0, le=MAX_SECONDS)
    max_reservation_seconds: float = Field(14400.0, alias="maxReservationSeconds", gt=0, le=MAX_SECONDS)
    lend_reserved_to_victims: bool = Field(True, alias="lendReservedToVictims", strict=True)
    max_gangs_per_cycle: int = Field(1000, alias="maxGangsPerCycle", ge=1)


class BindingConfig(_Strict):
    parallelism: int = Field(32, ge=1, le=1024)
    retries: int = Field(3, ge=0, le=20)
    partial_gang_timeout_seconds: float = Field(300.0, alias="partialGangTimeoutSeconds", gt=0, le=MAX_SECONDS)


class VictimSelector(_Strict):
    namespaces: list[str] = Field(default_factory=list)
    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    priority_class_names: list[str] = Field(default_factory=list, alias="priorityClassNames")
    min_runtime_seconds: float = Field(0.0, alias="minRuntimeSeconds", ge=0, le=MAX_SECONDS)
    gangs: Literal["whole", "never"] = "whole"
    opt_out_namespaces: list[str] = Field(default_factory=list, alias="optOutNamespaces")
    max_per_namespace_per_hour: int | None = Field(None, alias="maxPerNamespacePerHour", ge=0, le=1_000_000)


class PreemptorSelector(_Strict):
    min_priority: int | None = Field(None, alias="minPriority")
    priority_class_names: list[str] = Field(default_factory=list, alias="priorityClassNames")
    # PriorityClass name -> how long a gang of it waits for room to free by
    # itself before it may evict (classes not named: at once).
    wait_seconds: dict[str, float] = Field(default_factory=dict, alias="waitSeconds")

    @field_validator("wait_seconds")
    @classmethod
    def _waits(cls, waits: dict[str, float]) -> dict[str, float]:
        for name, seconds in waits.items():
            if not name:
                raise ValueError("waitSeconds: a PriorityClass name may not be empty")
            if not 0 <= seconds <= MAX_SECONDS:
                raise ValueError(f"waitSeconds[{name}]: {seconds} is not within 0..{MAX_SECONDS:g}")
        return waits


class PreemptionConfig(_Strict):
    enabled: bool = False
    victims: VictimSelector = Field(default_factory=VictimSelector)
    preemptors: PreemptorSelector = Field(default_factory=PreemptorSelector)
    max_victims_per_cycle: int = Field(64, alias="maxVictimsPerCycle", ge=1)
    node_cooldown_seconds: float = Field(30.0, alias="nodeCooldownSeconds", ge=0, le=MAX_SECONDS)
    nomination_timeout_seconds: float = Field(120.0, alias="nominationTimeoutSeconds", gt=0, le=MAX_SECONDS)
    refusal_backoff_seconds: float = Field(60.0, alias="refusalBackoffSeconds", gt=0, le=MAX_SECONDS)
    eviction_retry_seconds: float = Field(30.0, alias="evictionRetrySeconds", ge=0, le=MAX_SECONDS)
    # Evict (PodDisruptionBudgets hold) or Delete (they do not: only when explicitly chosen).
    mode: Literal["Evict", "Delete"] = "Evict"

    def policy(self) -> PreemptionPolicy:
        return PreemptionPolicy(
            enabled=self.enabled,
            victim_namespaces=frozenset(self.victims.namespaces),
            victim_labels=tuple(sorted(self.victims.match_labels.items())),
            victim_priority_classes=frozenset(self.victims.priority_class_names),
            min_runtime_seconds=self.victims.min_runtime_seconds,
            gang_victims=self.victims.gangs,
            opt_out_namespaces=frozenset(self.victims.opt_out_namespaces),
            preemptor_min_priority=self.preemptors.min_priority,
            preemptor_priority_classes=frozenset(self.preemptors.priority_class_names),
            preemptor_wait_seconds=tuple(sorted(self.preemptors.wait_seconds.items())),
            max_victims_per_cycle=self.max_victims_per_cycle,
            namespace_evictions_per_hour=self.victims.max_per_namespace_per_hour,
            node_cooldown_seconds=self.node_cooldown_seconds,
            nomination_timeout_seconds=self.nomination_timeout_seconds,
        )


class LeaderElectionConfig(_Strict):
    """Replicas share a coordination.k8s.io Lease; only its holder acts (docs/operations.md)."""

    enabled: bool = True
    lease_name: str = Field("batchsched", alias="leaseName", min_length=1)
    # "": the namespace batchsched runs in ($POD_NAMESPACE, else the service account's), else "default"
    lease_namespace: str = Field("", alias="leaseNamespace")
    lease_duration_seconds: float = Field(10.0, alias="leaseDurationSeconds", gt=0, le=MAX_SECONDS)
    renew_deadline_seconds: float = Field(7.0, alias="renewDeadlineSeconds", gt=0, le=MAX_SECONDS)
    retry_period_seconds: float = Field(2.0, alias="retryPeriodSeconds", gt=0, le=MAX_SECONDS)

    @model_validator(mode="after")
    def _ordered(self) -> "LeaderElectionConfig":
        # The holder must give up (renew deadline) before anyone may take over
        # (lease duration), and must get several renewal tries in before that.
        if not self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError("need retryPeriodSeconds < renewDeadlineSeconds < leaseDurationSeconds")
        return self


def parse_bind_address(text: str) -> tuple[str, int] | None:
    """"host:port", ":port" (every interface) or "[v6]:port"; "" or "0" means off (None)."""
    if text in ("", "0"):
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        hint = f'; for port {text} on every interface write ":{text}"' if text.isdigit() else ""
        raise ValueError(f'bind address {text!r} is not "host:port", ":port", "" or "0" (off){hint}')
    return host.strip("[]") or "0.0.0.0", int(port)


# spec.schedulerName is a DNS-1123 subdomain (the API server validates it so):
# a name that is not one can never match a pod, so it is a typo.
SCHEDULER_NAME_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_SCHEDULER_NAMES = 16


def _check_scheduler_name(name: str) -> str:
    if len(name) > 253 or not SCHEDULER_NAME_PATTERN.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid schedulerName (a DNS-1123 subdomain: lowercase letters, "
                         "digits, '-' and '.', at most 253 characters), so no pod could name it")
    return name


# never: not read (Jobs not watched); optIn: the owners whose pods carry
# scheduling.batchsched.io/auto-gang=true; always: every owner of the kind,
# but those whose pods say "false".
AutoGangMode = Literal["never", "optIn", "always"]


class AutoGangsConfig(_Strict):
    """Gangs formed from the pods' owner, with no PodGroup (docs/integrations.md)."""

    jobs: AutoGangMode = "optIn"  # indexed Jobs, minMember = parallelism
    # JobSets, minMember = the sum over replicated Jobs (those started, for one started in turn)
    job_sets: AutoGangMode = Field("optIn", alias="jobSets")
    # each group of a LeaderWorkerSet, minMember = its pods' size annotation
    leader_worker_sets: AutoGangMode = Field("optIn", alias="leaderWorkerSets")


class GangSourcesConfig(_Strict):
    """The foreign PodGroup conventions read beside our own (docs/integrations.md)."""

    native: bool = True  # scheduling.k8s.io/v1beta1 PodGroups, where the API is served
    scheduler_plugins: bool = Field(True, alias="schedulerPlugins")
    volcano: bool = True
    kueue: bool = True  # Kueue's plain-pod groups (no PodGroup object)
    auto_gangs: AutoGangsConfig = Field(default_factory=AutoGangsConfig, alias="autoGangs")

    def _auto(self) -> tuple[tuple[str, str], ...]:
        return ((gangsources.LEADER_WORKER_SET, self.auto_gangs.leader_worker_sets),
                (gangsources.JOBSET, self.auto_gangs.job_sets), (gangsources.JOB, self.auto_gangs.jobs))

    def enabled(self) -> tuple[str, ...]:
        return tuple(name for name, on in ((gangsources.NATIVE, self.native),
                                           (gangsources.SCHEDULER_PLUGINS, self.scheduler_plugins),
                                           (gangsources.VOLCANO, self.volcano), (gangsources.KUEUE, self.kueue),
                                           *((name, mode != "never") for name, mode in self._auto()))
                     if on)

    def auto_always(self) -> tuple[str, ...]:
        """The automatic sources that need no opt-in on the pods."""
        return tuple(name for name, mode in self._auto() if mode == "always")


class QueuesConfig(_Strict):
    default_queue: str = Field("default", alias="defaultQueue", min_length=1, max_length=253)
    gpu_type_label: str = Field(constants.GPU_PRODUCT_LABEL, alias="gpuTypeLabel", min_length=1, max_length=317)
    # While a queue within its fair share waits for room, other queues do not
    # borrow beyond theirs (docs/queues.md, "Borrowing"): fewer reclaim evictions.
    hold_borrowing: bool = Field(False, alias="holdBorrowing", strict=True)


class TopologyConfig(_Strict):
    domain_labels: list[str] = Field(default_factory=lambda: [constants.GPU_CLIQUE_LABEL], alias="domainLabels")
    fragmentation_aware: bool = Field(False, alias="fragmentationAware")
    keep_cliques_whole: bool = Field(True, alias="keepCliquesWhole")


class SchedulerConfig(_Strict):
    # The default name: Events come from it and messages tell pods to set it.
    scheduler_name: str = Field(constants.DEFAULT_SCHEDULER_NAME, alias="schedulerName", min_length=1)
    # Every name served, the default first (docs/integrations.md): filled from
    # schedulerName when not given, and schedulerName from its first entry.
    scheduler_names: list[str] = Field(default_factory=list, alias="schedulerNames",
                                       max_length=MAX_SCHEDULER_NAMES)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    queue: QueueConfig = Field(default_factory=QueueConfig)
    binding: BindingConfig = Field(default_factory=BindingConfig)
    preemption: PreemptionConfig = Field(default_factory=PreemptionConfig)
    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    gang_sources: GangSourcesConfig = Field(default_factory=GangSourcesConfig, alias="gangSources")
    queues: QueuesConfig = Field(default_factory=QueuesConfig)
    status_min_interval_seconds: float = Field(1.0, alias="statusMinIntervalSeconds", ge=0, le=MAX_SECONDS)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", alias="logLevel")
    log_format: Literal["text", "json"] = Field("text", alias="logFormat")
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig, alias="leaderElection")
    metrics_bind_address: str = Field(":8080", alias="metricsBindAddress")
    node_pool_label: str = Field("node.kubernetes.io/instance-type", alias="nodePoolLabel", min_length=1)

    @field_validator("scheduler_name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return _check_scheduler_name(value)

    @field_validator("scheduler_names")
    @classmethod
    def _valid_names(cls, value: list[str]) -> list[str]:
        for name in value:
            _check_scheduler_name(name)
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"names {', '.join(repeated)} more than once")
        return value

    @model_validator(mode="after")
    def _default_name_first(self) -> "SchedulerConfig":
        if not self.scheduler_names:
            self.scheduler_names = [self.scheduler_name]
        elif "scheduler_name" not in self.model_fields_set:
            self.scheduler_name = self.scheduler_names[0]
        elif self.scheduler_names[0] != self.scheduler_name:
            raise ValueError(f"schedulerNames must start with schedulerName {self.scheduler_name!r}, the default "
                             "name (or leave schedulerName out: the first of schedulerNames is then the default)")
        return self

    @property
    def also_serves(self) -> tuple[str, ...]:
        """The names served beside the default one."""
        return tuple(self.scheduler_names[1:])

    @field_validator("metrics_bind_address", mode="before")
    @classmethod
    def _port_alone(cls, value: object) -> object:
        # YAML reads `metricsBindAddress: 8080` as a number: the port, on every interface (0 stays off).
        if isinstance(value, int) and not isinstance(value, bool):
            return ":" + str(value) if value else "0"
        return value

    @field_validator("metrics_bind_address")
    @classmethod
    def _bind_address(cls, value: str) -> str:
        parse_bind_address(value)
        return value

    def core(self) -> CoreConfig:
        return CoreConfig(
            scheduler_name=self.scheduler_name,
            initial_backoff=self.queue.initial_backoff_seconds,
            max_backoff=self.queue.max_backoff_seconds,
            reservation_after_seconds=self.queue.reservation_after_seconds,
            max_reservation_seconds=self.queue.max_reservation_seconds,
            lend_reserved=self.queue.lend_reserved_to_victims,
            max_gangs_per_cycle=self.queue.max_gangs_per_cycle,
            domain_labels=tuple(self.topology.domain_labels),
            fragmentation_aware=self.topology.fragmentation_aware,
            keep_cliques_whole=self.topology.keep_cliques_whole,
            partial_gang_timeout=self.binding.partial_gang_timeout_seconds,
            default_queue=self.queues.default_queue,
            gpu_type_label=self.queues.gpu_type_label,
            hold_borrowing=self.queues.hold_borrowing,
        )


def load_config(path: str | Path | None) -> SchedulerConfig:
    """The configuration in ``path`` (None: the defaults); raises ConfigError."""
    if path is None:
        return SchedulerConfig()
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"config {path}: cannot read it: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config {path}: not valid YAML: " + " ".join(str(exc).split())) from None
    return validate_config(data, str(path))


def validate_config(data: object, source: str = "config") -> SchedulerConfig:
    """``data`` (parsed YAML) as a SchedulerConfig; raises ConfigError naming each bad key."""
    try:
        return SchedulerConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_problem(err) for err in exc.errors(include_url=False))
        raise ConfigError(f"config {source}: " + " ".join(problems.split())) from None


def _problem(err: dict) -> str:
    """One validation error as "key.path: what is wrong, and what would do"."""
    loc = err["loc"]
    where = ".".join(str(part) for part in loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        known = _keys_at(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        fix = f"did you mean {close[0]}?" if close else "the keys here are " + ", ".join(known)
        return f"{where}: unknown key; {fix} (configs/scheduler.yaml documents every key)"
    if err["type"] == "model_type":
        return f"{where}: should be a mapping of keys, not {_shown(err['input'])}"
    if err["type"] == "value_error":
        return f"{where}: {err['ctx']['error']}"
    return f"{where}: {err['msg']}, not {_shown(err['input'])}"


def _keys_at(loc: tuple) -> list[str]:
    """The keys the config model accepts at ``loc`` (list indices skipped)."""
    model: type[BaseModel] = SchedulerConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for name, f in model.model_fields.items() if part in (f.alias, name)), None)
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return []
        model = field.annotation
    return sorted(field.alias or name for name, field in model.model_fields.items())


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
