"""deploy/ against a real API server: it applies, and its RBAC is all the
scheduler needs and no more.

No Deployment controller runs in the local control plane, so the manifests
are checked with a server-side dry run (every admission step, nothing
stored), and the RBAC is exercised by running the scheduler here with a
token of deploy/'s ServiceAccount.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.kube import wait_for
from tests.support.kubectl import rendered, run_kubectl, service_account_kubeconfig
from tests.support.objects import pod, pod_group

pytestmark = pytest.mark.e2e

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE, SERVICE_ACCOUNT = "batchsched-system", "batchsched"
SA_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def apply(binary: str, kubeconfig: str, objects: list[dict]) -> None:
    run_kubectl(binary, kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


def test_deploy_passes_a_server_side_dry_run(kube, kubeconfig, kubectl):
    objects = rendered(kubectl, kubeconfig, DEPLOY)
    # A dry run creates nothing, so the objects that go into the namespace
    # need the namespace to exist already.
    apply(kubectl, kubeconfig, [o for o in objects if o["kind"] == "Namespace"])
    result = run_kubectl(kubectl, kubeconfig, "apply", "--dry-run=server", "-k", str(DEPLOY))
    assert "would violate PodSecurity" not in result.stderr, result.stderr
    assert "deployment.apps/batchsched created (server dry run)" in result.stdout \
        or "deployment.apps/batchsched configured (server dry run)" in result.stdout, result.stdout

    deployment = next(o for o in objects if o["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert deployment["spec"]["replicas"] == 2
    assert spec["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["scheduler.yaml"])
    assert config["leaderElection"]["enabled"] is True
    kinds = {o["kind"] for o in objects}
    assert {"CustomResourceDefinition", "Service", "PriorityClass", "Deployment", "ConfigMap"} | RBAC_KINDS <= kinds


def test_scheduler_with_the_service_account_token_binds_and_reports_and_may_do_nothing_else(
        env, kube, kubeconfig, kubectl, start_scheduler, tmp_path):
    apply(kubectl, kubeconfig, [o for o in rendered(kubectl, kubeconfig, DEPLOY) if o["kind"] in RBAC_KINDS])

    def can(verb: str, resource: str, *extra: str) -> bool:
        result = run_kubectl(kubectl, kubeconfig, "auth", "can-i", verb, resource, f"--as={SA_USER}", *extra,
                         check=False)
        return result.stdout.strip() == "yes"

    assert can("create", "pods", "--subresource=binding", "-n", env.namespace)
    assert can("patch", "podgroups.scheduling.batchsched.io", "--subresource=status", "-n", env.namespace)
    assert can("update", "leases.coordination.k8s.io/batchsched", "-n", NAMESPACE)
    for verb, resource, *extra in [("create", "pods"), ("delete", "pods"), ("update", "pods"),
                                   ("get", "secrets"), ("update", "nodes"), ("patch", "nodes"),
                                   ("update", "podgroups.scheduling.batchsched.io"),
                                   ("update", "leases.coordination.k8s.io/another-lease", "-n", NAMESPACE),
                                   ("get", "leases.coordination.k8s.io/batchsched", "-n", "kube-system")]:
        assert not can(verb, resource, "-n", env.namespace, *extra), f"{SA_USER} may {verb} {resource} {extra}"

    for i in range(2):
        env.add_node(f"gpu{i}", gpus=8)
    env.create(pod_group("train", env.namespace, 2))
    for i in range(2):
        env.create(pod(f"train-{i}", env.namespace, group="train", gpus=8, cpu="1"))
    sa_kubeconfig = service_account_kubeconfig(kube, kubeconfig, NAMESPACE, SERVICE_ACCOUNT,
                                               tmp_path / "sa-kubeconfig")
    proc = start_scheduler(kubeconfig=sa_kubeconfig, leaderElection={"leaseNamespace": NAMESPACE})

    wait_for("the gang bound", lambda: len(env.bound()) == 2, timeout=40)
    wait_for("PodGroup status written", lambda: env.podgroup("train").get("status", {}).get("phase") == "Running")
    wait_for("Scheduled events", lambda: {e["involvedObject"]["name"] for e in env.kube.get(
        f"/api/v1/namespaces/{env.namespace}/events")["items"] if e["reason"] == "Scheduled"}
        >= {"train", "train-0", "train-1"})
    assert "forbidden" not in proc.log().lower()
