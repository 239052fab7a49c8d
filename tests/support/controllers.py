"""Third-party controller managers (Kueue, JobSet: real ones, built from
source with the control plane, e2e/versions.env) running beside one test.

Each runs as a process on this machine, so its webhooks are registered by
URL (127.0.0.1, a certificate made for the test) rather than through a
Service: the webhooks of its own API group as they are, those on pods only
for the one test namespace carrying its label, so no other test's pods meet
them; every other webhook is left out.  Its CRDs come from the same module
it is built from."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

import yaml

from tests.support.kube import KubeError, TestKube, wait_for

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "e2e"))
import localcluster  # noqa: E402


def module_dir(module: str, version_key: str) -> Path:
    """Where the Go module cache holds ``module`` at the version e2e/versions.env pins."""
    version = localcluster.read_versions()[version_key]
    info = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], check=True,
                          capture_output=True, text=True, env=localcluster.go_env(), cwd="/").stdout
    return Path(json.loads(info)["Dir"])


def install_crds(kube: TestKube, module: Path) -> None:
    """The CRDs of a kubebuilder module (``config/components/crd/bases``), once established."""
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


def webhook_configurations(manifests: Path, own_group: str, url: str, ca: bytes, name: str,
                           namespace_label: dict) -> list[dict]:
    """The controller's webhooks for its API group and for pods, served at
    ``url``; the pod webhooks limited to namespaces with ``namespace_label``.
    Webhooks on other kinds (Jobs, Deployments, ...) are left out: they would
    see every test's objects."""
    configurations = []
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc:
            continue
        kept = []
        for hook in doc.get("webhooks") or ():
            groups = {g for rule in hook.get("rules") or () for g in rule.get("apiGroups") or ()}
            resources = {r for rule in hook.get("rules") or () for r in rule.get("resources") or ()}
            if groups == {own_group}:
                pass
            elif groups == {""} and resources == {"pods"}:
                hook["namespaceSelector"] = {"matchLabels": namespace_label}
            else:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": base64.b64encode(ca).decode()}
            kept.append(hook)
        doc["metadata"] = {"name": f"{name}-{doc['kind'].lower()}"}
        doc["webhooks"] = kept
        configurations.append(doc)
    return configurations


def webhook_path(doc: dict) -> str:
    plural = "mutatingwebhookconfigurations" if doc["kind"].startswith("Mutating") else "validatingwebhookconfigurations"
    return f"/apis/admissionregistration.k8s.io/v1/{plural}/{doc['metadata']['name']}"


def prepare(kube: TestKube, module: tuple[str, str], namespace: str, label: dict, system_namespace: str,
            certs: Path) -> tuple[Path, bytes]:
    """Before a manager starts: the CRDs of ``module`` (path, versions.env key)
    installed, the test ``namespace`` labelled ``label`` for its pod webhooks,
    its own ``system_namespace`` made, a serving certificate in ``certs``.
    Returns (the module's directory, the certificate's PEM)."""
    directory = module_dir(*module)
    install_crds(kube, directory)
    kube.merge_patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": label}})
    try:
        kube.create("/api/v1/namespaces", {"metadata": {"name": system_namespace}})
    except KubeError as exc:
        if exc.status != 409:
            raise
    return directory, certificate(certs)


@contextlib.contextmanager
def running_controller(kube: TestKube, kubeconfig: str, command: Sequence[str], log_path: Path, webhook_port: int,
                       hooks: list[dict], what: str) -> Iterator[subprocess.Popen]:
    """``command`` running until the block ends, from when its webhook server
    answers; ``hooks`` registered meanwhile and removed afterwards whatever happened."""
    log = open(log_path, "ab")
    proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "KUBECONFIG": kubeconfig}, preexec_fn=localcluster._die_with_parent)
    try:
        wait_for(f"{what}'s webhook server",
                 lambda: proc.poll() is None and _serving(webhook_port) or _died(proc, log_path, what), timeout=90)
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


def _died(proc: subprocess.Popen, log_path: Path, what: str) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"{what} exited ({proc.returncode}):\n" + log_path.read_text(errors="replace")[-4000:])
    return False
