"""Metrics, logs and configuration files: what operators read."""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import yaml

from batchsched.config import SchedulerConfig, load_config, parse_bind_address
from batchsched.core.gpu_pools import PoolGpus
from batchsched.core.queueing.queue import GangQueue
from batchsched.shell.logs import JsonFormatter, TextFormatter, decision
from batchsched.shell.metrics import Metrics
from tests.support.metrics import documented_metrics, exposed_metrics, standard_metrics

ROOT = Path(__file__).resolve().parents[2]


def test_every_exported_metric_is_documented_and_every_documented_one_exported():
    assert exposed_metrics(Metrics().exposition().decode()) == documented_metrics() | standard_metrics()


def test_the_standard_process_and_python_metrics_are_exported():
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "python_info",
            "python_gc_collections_total"} <= standard_metrics() <= exposed_metrics(Metrics().exposition().decode())


def test_queue_depth_and_gpu_pools_are_read_at_scrape_time():
    metrics, queue = Metrics(), GangQueue()
    pools = {"h100": PoolGpus(allocated=12, free=4, stranded=4)}
    metrics.read_live(queue.depth_by_priority, lambda: pools)
    queue.upsert("ns/a", priority=100, created=0, now=0)
    queue.upsert("ns/b", priority=100, created=1, now=0)
    queue.upsert("ns/c", priority=0, created=2, now=0)
    text = metrics.exposition().decode()
    assert 'batchsched_queue_depth{priority="100"} 2.0' in text
    assert 'batchsched_queue_depth{priority="0"} 1.0' in text
    assert 'batchsched_gpus_allocated{pool="h100"} 12.0' in text
    assert 'batchsched_gpus_stranded{pool="h100"} 4.0' in text


def test_two_schedulers_in_one_process_have_separate_registries():
    a, b = Metrics(), Metrics()
    a.bind_errors.inc()
    assert "batchsched_bind_errors_total 1.0" in a.exposition().decode()
    assert "batchsched_bind_errors_total 0.0" in b.exposition().decode()


def record(msg: str, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("batchsched.shell.scheduler", logging.INFO, __file__, 1, msg, (), None)
    rec.__dict__.update(extra)
    return rec


def test_json_log_lines_carry_the_gang_and_every_pod():
    pods = [f"train-{i}" for i in range(20)]
    line = JsonFormatter().format(record("bound 20 of 20 pod(s)", **decision("team/train", pods)))
    entry = json.loads(line)
    assert entry["gang"] == "team/train" and entry["pods"] == sorted(pods)
    assert entry["msg"] == "bound 20 of 20 pod(s)" and entry["level"] == "INFO"


def test_text_log_lines_name_the_gang_and_shorten_long_pod_lists():
    pods = [f"p{i:02d}" for i in range(12)]
    line = TextFormatter().format(record("Unschedulable: no room", **decision("team/train", pods, node="n1")))
    assert line.endswith("gang=team/train pods=p00,p01,p02,p03,p04,p05,p06,p07,p08,p09,...(+2) node=n1")
    assert "gang=" not in TextFormatter().format(record("caches synced"))


@pytest.mark.parametrize("text, expected", [
    (":8080", ("0.0.0.0", 8080)), ("127.0.0.1:9090", ("127.0.0.1", 9090)), ("[::1]:80", ("::1", 80)),
    ("", None), ("0", None)])
def test_bind_addresses(text, expected):
    assert parse_bind_address(text) == expected


@pytest.mark.parametrize("text", ["8080", "host:", "host:http", ":70000"])
def test_bad_bind_addresses_are_refused(text):
    with pytest.raises(ValueError):
        parse_bind_address(text)


def test_the_documented_defaults_are_the_defaults():
    assert load_config(ROOT / "configs" / "scheduler.yaml") == SchedulerConfig()


def aliases(model: type, prefix: str = "") -> set[str]:
    """Every field of a config model as a dotted camelCase path."""
    paths = set()
    for name, field in model.model_fields.items():
        path = prefix + (field.alias or name)
        paths.add(path)
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            paths |= aliases(annotation, path + ".")
    return paths


def leaf_paths(data: dict, prefix: str = "") -> set[str]:
    paths = set()
    for key, value in data.items():
        paths.add(prefix + key)
        if isinstance(value, dict) and value and key != "nodeSelector" and key != "matchLabels":
            paths |= leaf_paths(value, prefix + key + ".")
    return paths


def test_every_config_field_is_in_the_documented_default_file():
    documented = leaf_paths(yaml.safe_load((ROOT / "configs" / "scheduler.yaml").read_text()))
    assert aliases(SchedulerConfig) - documented == set()


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "examples").glob("*.yaml")) +
                         [ROOT / "deploy" / "scheduler.yaml"], ids=lambda p: p.name)
def test_example_and_deployed_configs_are_valid(path):
    load_config(path)


def test_the_grafana_dashboard_charts_every_metric_and_only_those():
    dashboard = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|count|sum)$", "", name) for e in exprs for name in re.findall(r"batchsched_\w+", e)}
    assert used == documented_metrics()
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
