"""JobSet (sigs.k8s.io/jobset, the real controller manager, built from source
with the control plane: e2e/versions.env) running beside one test.

The JobSet controller makes one Indexed Job per replica of each replicated
Job, stamping the JobSet's labels on each Job and its pod template; the
real Job controller (kube-controller-manager) then makes the pods.  Its
webhooks default and validate JobSets (and look at pods of the test's
namespace only: tests/support/controllers.py)."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

import yaml

from tests.support import controllers
from tests.support.kube import TestKube

NAMESPACE_LABEL = "batchsched.io/jobset-e2e"


MODULE = ("sigs.k8s.io/jobset", "JOBSET_VERSION")


@contextlib.contextmanager
def running_jobset(kube: TestKube, kubeconfig: str, binary: str, workdir: Path, namespace: str,
                   run_id: str) -> Iterator[subprocess.Popen]:
    """The JobSet controller until the block ends; its webhook configurations
    are removed afterwards whatever happened."""
    label, certs = {NAMESPACE_LABEL: run_id}, workdir / "jobset-webhook-certs"
    module, ca = controllers.prepare(kube, MODULE, namespace, label, "jobset-system", certs)
    port, health = (controllers.localcluster.free_port() for _ in range(2))
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": "0"},  # (controller-runtime: "0" serves no metrics)
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 200, "burst": 400},
    }
    (workdir / "jobset.yaml").write_text(yaml.safe_dump(config))
    hooks = controllers.webhook_configurations(module / "config/components/webhook/manifests.yaml",
                                               "jobset.x-k8s.io", f"https://127.0.0.1:{port}", ca,
                                               f"jobset-e2e-{run_id}", label)
    with controllers.running_controller(kube, kubeconfig, [binary, f"--config={workdir / 'jobset.yaml'}"],
                                        workdir / "jobset.log", port, hooks, "JobSet") as proc:
        yield proc
