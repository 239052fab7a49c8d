"""charts/batchsched against deploy/ and a real API server: `helm lint`
passes, the default values render exactly deploy/'s objects (the chart's
files/ link to deploy/; only Helm's labels, the CRDs' labels (Helm
installs crds/ untemplated), the config's ConfigMap name and its checksum
annotation differ), values change what they say and nothing
else, and the rendered chart passes a server-side dry-run apply."""
from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.kubectl import rendered, run_kubectl

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART, DEPLOY = ROOT / "charts" / "batchsched", ROOT / "deploy"
HELM_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart")


def helm_run(helm: str, *args: str) -> str:
    result = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def template(helm: str, *values: str, namespace: str = "batchsched-system") -> list[dict]:
    out = helm_run(helm, "template", "batchsched", str(CHART), "--namespace", namespace, "--include-crds",
                   *(a for v in values for a in ("--set-json", v)))
    return [o for o in yaml.safe_load_all(out) if o]


def comparable(obj: dict) -> dict:
    """What deploy/ and the chart must agree on: all but Helm's own marks
    and kustomize's ConfigMap hash (its data compared parsed)."""
    obj = copy.deepcopy(obj)
    labels = obj["metadata"].get("labels") or {}
    for key in HELM_LABELS:
        labels.pop(key, None)
    if obj["kind"] == "CustomResourceDefinition":  # Helm installs crds/ as they are, without labels
        obj["metadata"].pop("labels", None)
    if obj["kind"] == "ConfigMap":
        obj["metadata"]["name"] = re.sub(r"-[a-z0-9]{10}$", "", obj["metadata"]["name"])
        obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
    if obj["kind"] == "Deployment":
        pod = obj["spec"]["template"]
        (pod["metadata"].get("annotations") or {}).pop("checksum/config", None)
        if not pod["metadata"].get("annotations"):
            pod["metadata"].pop("annotations", None)
        for volume in pod["spec"].get("volumes", ()):
            if "configMap" in volume:
                volume["configMap"]["name"] = re.sub(r"-[a-z0-9]{10}$", "", volume["configMap"]["name"])
    return obj


def by_key(objects: list[dict]) -> dict[tuple[str, str], dict]:
    kept = [comparable(o) for o in objects]
    return {(o["kind"], o["metadata"]["name"]): o for o in kept}


def test_helm_lint_passes(helm):
    out = helm_run(helm, "lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_the_default_values_render_what_deploy_applies(helm, kubectl, kubeconfig):
    chart = by_key(template(helm))
    deploy = by_key(rendered(kubectl, kubeconfig, DEPLOY))
    namespace = deploy.pop(("Namespace", "batchsched-system"))  # the release's: helm --create-namespace
    assert chart.keys() == deploy.keys()
    for key, obj in deploy.items():
        assert chart[key] == obj, f"{key} differs from deploy/'s"
    with_namespace = by_key(template(helm, "namespace={\"create\":true}"))
    assert with_namespace[("Namespace", "batchsched-system")] == namespace  # restricted Pod Security, as deploy/'s


def test_values_change_what_they_name(helm, kubectl, kubeconfig):
    objects = template(helm, 'replicas=3', 'image={"repository":"registry.example/batchsched","tag":"1.2.3"}',
                       'config={"logLevel":"DEBUG","preemption":{"mode":"Delete"}}', 'preemptionDelete=true',
                       'nodeAgent={"enabled":true}', 'priorityClasses={"create":false}', namespace="ml-sched")
    kinds = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    deployment = kinds[("Deployment", "batchsched")]
    assert deployment["spec"]["replicas"] == 3 and deployment["metadata"]["namespace"] == "ml-sched"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/batchsched:1.2.3"
    config = yaml.safe_load(kinds[("ConfigMap", "batchsched-config")]["data"]["scheduler.yaml"])
    base = yaml.safe_load((DEPLOY / "scheduler.yaml").read_text())
    assert config == {**base, "logLevel": "DEBUG", "preemption": {**base.get("preemption", {}), "mode": "Delete"}}
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for binding in (o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith("batchsched")
                        and "node-agent" not in o["metadata"]["name"]):
            assert {s["namespace"] for s in binding["subjects"]} == {"ml-sched"}, binding["metadata"]["name"]
    assert ("ClusterRole", "batchsched-preemption-delete") in kinds
    assert not [o for o in objects if o["kind"] == "PriorityClass"]
    agent = kinds[("DaemonSet", "batchsched-node-agent")]
    assert agent["metadata"]["namespace"] == "batchsched-node-agent"  # its admission policies name it
    assert agent["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/batchsched:1.2.3"
    checksum = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    default = next(o for o in template(helm) if o["kind"] == "Deployment")
    assert default["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != checksum  # a new config rolls


def test_the_rendered_chart_passes_a_server_side_dry_run(helm, kubectl, kubeconfig, kube):
    namespace = "helm-dry-run"
    objects = template(helm, 'nodeAgent={"enabled":true}', 'namespace={"create":true}', namespace=namespace)
    # A dry run stores nothing: the namespaces and CRD it depends on are applied first, for real.
    first = [o for o in objects if o["kind"] in ("Namespace", "CustomResourceDefinition")]
    run_kubectl(kubectl, kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(first))
    try:
        result = run_kubectl(kubectl, kubeconfig, "apply", "--dry-run=server", "-f", "-",
                             stdin=yaml.safe_dump_all(objects))
        assert "would violate PodSecurity" not in result.stderr, result.stderr
        for kind, name in (("deployment.apps", "batchsched"), ("daemonset.apps", "batchsched-node-agent"),
                           ("clusterrole.rbac.authorization.k8s.io", "batchsched")):
            assert re.search(rf"^{re.escape(kind)}/{name} (created|configured|unchanged) \(server dry run\)$",
                             result.stdout, re.M), result.stdout
    finally:
        run_kubectl(kubectl, kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)
