"""Structured logs: text for people, JSON (``logFormat: json``) for log pipelines.

A line about a decision carries the gang and its pods as fields::

    log.info("Unschedulable: %s", message, extra=decision(gang_key, pod_names))

JSON lines have them as ``gang`` and ``pods`` (every pod); text lines end
with ``gang=... pods=...`` (long pod lists shortened).
"""
from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any, Iterable

DECISION_FIELDS = ("gang", "pods", "node", "reason")
TEXT_MAX_PODS = 10


def decision(gang: str, pods: Iterable[str], **fields: Any) -> dict[str, Any]:
    """``extra`` for a log call about a decision on ``gang`` concerning ``pods``."""
    return {"gang": gang, "pods": sorted(pods), **fields}


def _decision_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: getattr(record, k) for k in DECISION_FIELDS if hasattr(record, k)}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **_decision_fields(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _decision_fields(record)
        if not fields:
            return line
        parts = []
        for key, value in fields.items():
            if key == "pods":
                shown = ",".join(value[:TEXT_MAX_PODS])
                value = shown + (f",...(+{len(value) - TEXT_MAX_PODS})" if len(value) > TEXT_MAX_PODS else "")
            parts.append(f"{key}={value}")
        # the traceback (if any) stays last
        head, sep, tail = line.partition("\n")
        return f"{head} {' '.join(parts)}{sep}{tail}"


def setup_logging(level: str, fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
