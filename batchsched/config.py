"""Scheduler configuration: YAML validated by pydantic (configs/scheduler.yaml documents every field)."""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from batchsched.api import constants
from batchsched.core.config import CoreConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class QueueConfig(_Strict):
    initial_backoff_seconds: float = Field(1.0, alias="initialBackoffSeconds", gt=0)
    max_backoff_seconds: float = Field(60.0, alias="maxBackoffSeconds", gt=0)
    reservation_after_seconds: float = Field(60.0, alias="reservationAfterSeconds", ge=0)
    max_gangs_per_cycle: int = Field(1000, alias="maxGangsPerCycle", ge=1)


class BindingConfig(_Strict):
    parallelism: int = Field(32, ge=1, le=1024)
    retries: int = Field(3, ge=0, le=20)
    assume_timeout_seconds: float = Field(30.0, alias="assumeTimeoutSeconds", gt=0)


class SchedulerConfig(_Strict):
    scheduler_name: str = Field(constants.DEFAULT_SCHEDULER_NAME, alias="schedulerName", min_length=1)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    queue: QueueConfig = Field(default_factory=QueueConfig)
    binding: BindingConfig = Field(default_factory=BindingConfig)
    status_min_interval_seconds: float = Field(1.0, alias="statusMinIntervalSeconds", ge=0)
    log_level: str = Field("INFO", alias="logLevel", pattern="^(DEBUG|INFO|WARNING|ERROR)$")

    def core(self) -> CoreConfig:
        return CoreConfig(
            scheduler_name=self.scheduler_name,
            initial_backoff=self.queue.initial_backoff_seconds,
            max_backoff=self.queue.max_backoff_seconds,
            reservation_after_seconds=self.queue.reservation_after_seconds,
            max_gangs_per_cycle=self.queue.max_gangs_per_cycle,
        )


def load_config(path: str | Path | None) -> SchedulerConfig:
    if path is None:
        return SchedulerConfig()
    data = yaml.safe_load(Path(path).read_text()) or {}
    return SchedulerConfig.model_validate(data)
