"""Kueue (sigs.k8s.io/kueue, the real controller manager, built from source
with the control plane: e2e/versions.env) running beside one test.

Kueue is the admission layer many clusters put in front of their scheduler:
its pod webhook gates plain pods of a queue (``kueue.x-k8s.io/admission``),
its controllers group them into Workloads, admit those within the
ClusterQueue's quota and then lift the gate.  It runs as tests/support/
controllers.py runs every such manager: webhooks by URL, pod webhooks for
the one test namespace carrying ``NAMESPACE_LABEL``.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path
from typing import Iterator

from tests.support import controllers
from tests.support.kube import TestKube

NAMESPACE_LABEL = "batchsched.io/kueue-e2e"
# Kueue reads the metrics server's certificate from here when it does not
# manage certificates itself (cmd/kueue/main.go); the test makes one.
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"


MODULE = ("sigs.k8s.io/kueue", "KUEUE_VERSION")


@contextlib.contextmanager
def running_kueue(kube: TestKube, kubeconfig: str, binary: str, workdir: Path, namespace: str,
                  run_id: str) -> Iterator[subprocess.Popen]:
    """Kueue managing the plain pods of ``namespace`` until the block ends;
    its webhook configurations are removed afterwards whatever happened."""
    label, certs = {NAMESPACE_LABEL: run_id}, workdir / "webhook-certs"
    module, ca = controllers.prepare(kube, MODULE, namespace, label, "kueue-system", certs)
    METRICS_CERTS.mkdir(parents=True, exist_ok=True)  # (see METRICS_CERTS)
    for name in ("tls.crt", "tls.key"):
        (METRICS_CERTS / name).write_bytes((certs / name).read_bytes())
    port, health, metrics = (controllers.localcluster.free_port() for _ in range(3))
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchLabels": label},
        "integrations": {"frameworks": ["pod"]},
        "clientConnection": {"qps": 200, "burst": 400},
    }
    # JSON, which is YAML with every string quoted: a run id such as "1234e567" left plain would be
    # read by Kueue's Go YAML as a number, which a label's value may not be
    (workdir / "kueue.yaml").write_text(json.dumps(config))
    hooks = controllers.webhook_configurations(module / "config/components/webhook/manifests.yaml",
                                               "kueue.x-k8s.io", f"https://127.0.0.1:{port}", ca,
                                               f"kueue-e2e-{run_id}", label)
    # (its visibility API server would want certificates in /visibility: not needed here)
    with controllers.running_controller(
            kube, kubeconfig, [binary, f"--config={workdir / 'kueue.yaml'}", "--feature-gates=VisibilityOnDemand=false",
                               "--zap-log-level=info"], workdir / "kueue.log", port, hooks, "Kueue") as proc:
        yield proc
