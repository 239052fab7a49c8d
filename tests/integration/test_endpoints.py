"""/healthz, /readyz and /metrics of a running scheduler, and its JSON logs."""
from __future__ import annotations

import json

import pytest

from tests.support.kube import wait_for
from tests.support.metrics import documented_metrics, exposed_metrics, sample, standard_metrics
from tests.support.objects import pod, pod_group

pytestmark = pytest.mark.e2e

POOL_LABEL = "node.kubernetes.io/instance-type"


def test_probes_metrics_and_json_logs_of_a_scheduling_replica(env, start_scheduler):
    env.add_node("gpu0", gpus=8, labels={POOL_LABEL: "sim-h100"})
    env.create(pod_group("train", env.namespace, 2))
    for i in range(2):
        env.create(pod(f"train-{i}", env.namespace, group="train", gpus=3, cpu="1"))
    proc = start_scheduler(logFormat="json", logLevel="INFO")

    wait_for("/readyz 200", lambda: proc.get("/readyz")[0] == 200)
    assert proc.get("/healthz") == (200, "ok\n")
    wait_for("the gang bound", lambda: len(env.bound()) == 2)

    def metrics() -> str:
        return proc.get("/metrics")[1]

    text = wait_for("the gang's e2e latency observed", lambda: (
        t := metrics()) and sample(t, "batchsched_gang_e2e_scheduling_duration_seconds_count") == 1 and t)
    assert documented_metrics() | standard_metrics() <= exposed_metrics(text)
    assert sample(text, "batchsched_leader") == 1
    assert sample(text, "process_resident_memory_bytes") > 0  # the scheduler process's own figures
    assert sample(text, "batchsched_scheduling_attempts_total", 'result="scheduled"') == 1
    assert sample(text, "batchsched_bind_duration_seconds_count") == 2
    assert sample(text, "batchsched_bind_errors_total") == 0
    # 6 of 8 GPUs bound on the pool's one node: 2 free, and no 8-GPU pod can use them
    assert sample(text, "batchsched_gpus_allocated", 'pool="sim-h100"') == 6
    assert sample(text, "batchsched_gpus_free", 'pool="sim-h100"') == 2
    assert sample(text, "batchsched_gpus_stranded", 'pool="sim-h100"') == 2

    lines = [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]
    assert lines and len(lines) == len([line for line in proc.log().splitlines() if line.strip()])
    gang = f"{env.namespace}/train"
    decisions = [e for e in lines if e.get("gang") == gang]
    assert any(e.get("reason") == "Scheduled" and e["pods"] == ["train-0", "train-1"] for e in decisions)
    assert any(e["msg"] == "bound 2 of 2 pod(s)" and e["pods"] == ["train-0", "train-1"] for e in decisions)
