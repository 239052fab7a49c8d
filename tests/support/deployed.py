"""The scheduler's identity as deployed: deploy/'s ServiceAccount, bound by
deploy/rbac.yaml, which every test that starts the scheduler runs it as.

A test that needs more than the shipped RBAC says so in its name and asserts
the 403 the shipped RBAC gives (``refused_as_deployed``).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.support.kube import KubeError, TestKube
from tests.support.kubectl import service_account_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAMESPACE, SERVICE_ACCOUNT = "batchsched-system", "batchsched"
SA_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
LEADER_ELECTION_ROLE = "batchsched-leader-election"


def render(kubectl: str, directory: Path = DEPLOY) -> list[dict]:
    """The objects ``kubectl kustomize directory`` produces (no cluster is asked)."""
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def rbac_of(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in RBAC_KINDS]


class Deployed:
    """deploy/'s RBAC, applied once per cluster, and kubeconfigs of its ServiceAccount."""

    def __init__(self, rbac: list[dict]):
        self.rbac = rbac
        self._applied: set[str] = set()

    def apply(self, kube: TestKube) -> None:
        server = kube.api.configuration.host
        if server in self._applied:
            return
        kube.apply_yaml_objects(self.rbac)
        self._applied.add(server)

    def kubeconfig(self, kube: TestKube, admin_kubeconfig: str, lease_namespace: str, path: Path) -> str:
        """A kubeconfig of the scheduler's ServiceAccount.  Its leader election
        may also use the Lease in ``lease_namespace`` (each test contends in its
        own namespace): the shipped Role's rules, bound there alike."""
        self.apply(kube)
        if lease_namespace != NAMESPACE:
            self.grant_leader_election(kube, lease_namespace)
        return service_account_kubeconfig(kube, admin_kubeconfig, NAMESPACE, SERVICE_ACCOUNT, path)

    def grant_leader_election(self, kube: TestKube, namespace: str) -> None:
        role = next(o for o in self.rbac if o["kind"] == "Role" and o["metadata"]["name"] == LEADER_ELECTION_ROLE)
        binding = next(o for o in self.rbac
                       if o["kind"] == "RoleBinding" and o["metadata"]["name"] == LEADER_ELECTION_ROLE)
        for obj in (role, binding):
            copy = {**obj, "metadata": {"name": obj["metadata"]["name"], "namespace": namespace}}
            try:
                kube.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/"
                            f"{obj['kind'].lower()}s", copy)
            except KubeError as exc:
                if exc.status != 409:
                    raise


def token_of(kubeconfig: str) -> str:
    config = yaml.safe_load(Path(kubeconfig).read_text())
    return config["users"][0]["user"]["token"]


def refused_as_deployed(kube_as_scheduler: TestKube, method: str, path: str, body: dict | None = None) -> str:
    """The message of the 403 the shipped RBAC gives the scheduler for this
    request; fails when the request is allowed."""
    try:
        kube_as_scheduler.request(method, path, body=body)
    except KubeError as exc:
        assert exc.status == 403, exc
        return str(exc)
    raise AssertionError(f"{method} {path} is allowed to {SA_USER}")
