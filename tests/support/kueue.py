"""Kueue (sigs.k8s.io/kueue, the real controller manager, built from source
with the control plane: e2e/versions.env) running beside one test.

Kueue is the admission layer many clusters put in front of their scheduler:
its pod webhook gates plain pods of a queue (``kueue.x-k8s.io/admission``),
its controllers group them into Workloads, admit those within the
ClusterQueue's quota and then lift the gate.  Here it runs as a process on
this machine, so its webhooks are registered by URL (127.0.0.1, a
certificate made for the test) rather than through a Service, and only for
the one test namespace carrying ``NAMESPACE_LABEL``, so no other test's pods
meet them.  Its CRDs come from the same module it is built from.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import urllib.request
import ssl
from pathlib import Path
from typing import Iterator

import yaml

from tests.support.kube import KubeError, TestKube, wait_for

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "e2e"))
import localcluster  # noqa: E402

NAMESPACE_LABEL = "batchsched.io/kueue-e2e"
# Kueue reads the metrics server's certificate from here when it does not
# manage certificates itself (cmd/kueue/main.go); the test makes one.
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"


def module_dir() -> Path:
    version = localcluster.read_versions()["KUEUE_VERSION"]
    info = subprocess.run(["go", "mod", "download", "-json", f"sigs.k8s.io/kueue@{version}"], check=True,
                          capture_output=True, text=True, env=localcluster.go_env(), cwd="/").stdout
    return Path(json.loads(info)["Dir"])


def install_crds(kube: TestKube, module: Path) -> None:
    crds = [yaml.safe_load(p.read_text()) for p in sorted((module / "config/components/crd/bases").glob("*.yaml"))]
    kube.apply_yaml_objects(crds)
    for crd in crds:
        wait_for(f"CRD {crd['metadata']['name']} established", lambda crd=crd: any(
            c["type"] == "Established" and c["status"] == "True"
            for c in kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}")
            .get("status", {}).get("conditions") or []), timeout=60)


def certificate(directory: Path) -> bytes:
    """A self-signed serving certificate for 127.0.0.1 in ``directory`` (tls.crt, tls.key); its PEM."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(directory / "tls.key"), "-out", str(directory / "tls.crt"),
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return (directory / "tls.crt").read_bytes()


def webhook_configurations(module: Path, url: str, ca: bytes, run_id: str, namespace_label: dict) -> list[dict]:
    """Kueue's own webhooks for its API and for pods, served at ``url``;
    the pod webhooks limited to namespaces with ``namespace_label``.  The
    webhooks of other frameworks (Jobs, Deployments, ...) are left out: they
    would see every test's objects."""
    configurations = []
    for doc in yaml.safe_load_all((module / "config/components/webhook/manifests.yaml").read_text()):
        if not doc:
            continue
        kept = []
        for hook in doc.get("webhooks") or ():
            groups = {g for rule in hook.get("rules") or () for g in rule.get("apiGroups") or ()}
            resources = {r for rule in hook.get("rules") or () for r in rule.get("resources") or ()}
            if groups == {"kueue.x-k8s.io"}:
                pass
            elif groups == {""} and resources == {"pods"}:
                hook["namespaceSelector"] = {"matchLabels": namespace_label}
            else:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": base64.b64encode(ca).decode()}
            kept.append(hook)
        doc["metadata"] = {"name": f"kueue-e2e-{run_id}-{doc['kind'].lower()}"}
        doc["webhooks"] = kept
        configurations.append(doc)
    return configurations


def webhook_path(doc: dict) -> str:
    plural = "mutatingwebhookconfigurations" if doc["kind"].startswith("Mutating") else "validatingwebhookconfigurations"
    return f"/apis/admissionregistration.k8s.io/v1/{plural}/{doc['metadata']['name']}"


@contextlib.contextmanager
def running_kueue(kube: TestKube, kubeconfig: str, binary: str, workdir: Path, namespace: str,
                  run_id: str) -> Iterator[subprocess.Popen]:
    """Kueue managing the plain pods of ``namespace`` until the block ends;
    its webhook configurations are removed afterwards whatever happened."""
    module = module_dir()
    install_crds(kube, module)
    label = {NAMESPACE_LABEL: run_id}
    kube.merge_patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": label}})
    try:
        kube.create("/api/v1/namespaces", {"metadata": {"name": "kueue-system"}})
    except KubeError as exc:
        if exc.status != 409:
            raise
    certs = workdir / "webhook-certs"
    ca = certificate(certs)
    METRICS_CERTS.mkdir(parents=True, exist_ok=True)  # (see METRICS_CERTS)
    for name in ("tls.crt", "tls.key"):
        (METRICS_CERTS / name).write_bytes((certs / name).read_bytes())
    port, health, metrics = (localcluster.free_port() for _ in range(3))
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
    (workdir / "kueue.yaml").write_text(yaml.safe_dump(config))
    hooks = webhook_configurations(module, f"https://127.0.0.1:{port}", ca, run_id, label)
    log = open(workdir / "kueue.log", "ab")
    # (its visibility API server would want certificates in /visibility: not needed here)
    proc = subprocess.Popen([binary, f"--config={workdir / 'kueue.yaml'}", "--feature-gates=VisibilityOnDemand=false",
                             "--zap-log-level=info"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "KUBECONFIG": kubeconfig}, preexec_fn=localcluster._die_with_parent)
    try:
        wait_for("Kueue's webhook server", lambda: proc.poll() is None and _serving(port) or _died(proc, workdir),
                 timeout=90)
        kube.apply_yaml_objects(hooks)
        yield proc
    finally:
        for doc in hooks:
            kube.delete(webhook_path(doc))
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serving(port: int) -> bool:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        urllib.request.urlopen(f"https://127.0.0.1:{port}/", timeout=1, context=context)
    except urllib.error.HTTPError:
        return True  # it answers (404 at /): the server is up
    except OSError:
        return False
    return True


def _died(proc: subprocess.Popen, workdir: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"Kueue exited ({proc.returncode}):\n"
                             + (workdir / "kueue.log").read_text(errors="replace")[-4000:])
    return False
