"""Reading Prometheus text and the metric names docs/metrics.md documents."""
from __future__ import annotations

import re
from pathlib import Path

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented_metrics() -> set[str]:
    return set(re.findall(r"^\| `(batchsched_\w+)` \|", METRICS_DOC.read_text(), re.M))


def standard_metrics() -> set[str]:
    """The process and Python metrics of prometheus_client's standard collectors, as documented."""
    return set(re.findall(r"^\| `((?:process|python)_\w+)` \|", METRICS_DOC.read_text(), re.M))


def exposed_metrics(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def sample(text: str, name: str, labels: str = "") -> float | None:
    """The value of one sample, e.g. ``sample(text, "x_total", 'result="ok"')``; None if absent."""
    pattern = "^" + re.escape(name + (f"{{{labels}}}" if labels else "")) + r" (\S+)$"
    found = re.search(pattern, text, re.M)
    return float(found.group(1)) if found else None
