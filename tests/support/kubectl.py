"""Running kubectl in tests, and kubeconfigs for other identities."""
from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.support.kube import TestKube


def run_kubectl(binary: str, kubeconfig: str, *args: str, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([binary, "--kubeconfig", kubeconfig, *args], input=stdin, capture_output=True,
                            text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def rendered(binary: str, kubeconfig: str, directory: Path) -> list[dict]:
    """The objects ``kubectl kustomize directory`` produces."""
    return [o for o in yaml.safe_load_all(run_kubectl(binary, kubeconfig, "kustomize", str(directory)).stdout) if o]


def service_account_kubeconfig(kube: TestKube, admin_kubeconfig: str, namespace: str, name: str,
                               path: Path, bound_pod: dict | None = None) -> str:
    """A kubeconfig that authenticates as the ServiceAccount, with a token from
    the TokenRequest API (what kubelets use; no long-lived token Secret);
    ``bound_pod``: the token is bound to that pod, as a pod's projected token is
    (and then names the pod's node, Kubernetes >= 1.32)."""
    spec: dict = {"expirationSeconds": 3600}
    if bound_pod is not None:
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": bound_pod["metadata"]["name"],
                                  "uid": bound_pod["metadata"]["uid"]}
    token = kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": spec})["status"]["token"]
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    user = f"system:serviceaccount:{namespace}:{name}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user}}],
        "current-context": user,
    }))
    return str(path)
