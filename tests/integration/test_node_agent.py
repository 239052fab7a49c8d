"""The node agent against the real API server: the reporter writes its node's
topology annotation and BatchschedGPUReady condition, and refuses a topology
whose GPU count the node does not advertise; the verifier reads a PodResources
endpoint (the real gRPC protocol) and records the GPUs pods really hold,
which the real scheduler then believes."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import localcluster
import pytest
import yaml

from batchsched.api import constants
from batchsched.core.topology.annotation import from_annotation, to_annotation
from batchsched.core.topology.parse import parse_topo
from batchsched.nodeagent.backends import with_identities
from batchsched.nodeagent.report import GPU_READY_CONDITION
from tests.integration.test_deploy import RBAC_KINDS, apply, audited, granted, unused
from tests.support.deployed import Deployed, rbac_of, render
from tests.support.kube import KubeError, TestKube, wait_for
from tests.support.kubectl import rendered, run_kubectl, service_account_kubeconfig
from tests.support.kubelet import PodResourcesServer
from tests.support.metrics import sample
from tests.support.nvml import fake_nvidia_smi, query_xml, uuid_of
from tests.support.objects import pod

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DGX1 = ROOT / "tests" / "fixtures" / "topologies" / "dgx1-hybrid-cube-mesh-8gpu.txt"


AGENT_NAMESPACE = AGENT_ACCOUNT = "batchsched-node-agent"


@pytest.fixture(scope="session")
def agent_rbac(kubectl, tmp_path_factory) -> Deployed:
    """deploy/ with the node-agent component: the agent's ServiceAccount and RBAC."""
    return Deployed(rbac_of(render(kubectl, deploy_with_the_agent(tmp_path_factory.mktemp("agent-overlay")))))


@pytest.fixture
def agent_kubeconfig(env, agent_rbac, tmp_path) -> str:
    """The agent as deployed: its ServiceAccount under the component's RBAC."""
    agent_rbac.apply(env.kube)
    return service_account_kubeconfig(env.kube, env.kubeconfig, AGENT_NAMESPACE, AGENT_ACCOUNT,
                                      tmp_path / "agent-kubeconfig")


def run_agent(env, node: str, tmp_path: Path, kubeconfig: str, *extra: str) -> subprocess.CompletedProcess:
    script = fake_nvidia_smi(tmp_path, DGX1, query_xml(parse_topo(DGX1.read_text())))
    return subprocess.run([sys.executable, "-m", "batchsched", "node-agent", "--once", "--node", node,
                           "--backend", "text", "--nvidia-smi", str(script), "--sys-root", str(tmp_path),
                           "--kubeconfig", kubeconfig, "--pod-resources-socket", "", "--metrics-bind-address", "0",
                           *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def condition(env, node: str) -> dict:
    conditions = env.kube.get(f"/api/v1/nodes/{node}")["status"]["conditions"]
    return next((c for c in conditions if c["type"] == GPU_READY_CONDITION), {})


def test_the_reporter_writes_the_topology_of_a_node_that_advertises_its_gpus(env, tmp_path, agent_kubeconfig):
    node = env.add_node("gpu", gpus=8)
    done = run_agent(env, node, tmp_path, agent_kubeconfig)
    assert done.returncode == 0, done.stderr
    annotations = env.kube.get(f"/api/v1/nodes/{node}")["metadata"]["annotations"]
    topology = from_annotation(annotations[constants.GPU_TOPOLOGY_ANNOTATION])
    assert [g.uuid for g in topology.gpus] == [uuid_of(i) for i in range(8)]
    assert str(topology.link(0, 3)) == "NV2"
    assert (condition(env, node)["status"], condition(env, node)["reason"]) == ("True", "TopologyReported")


def test_a_gpu_count_the_node_does_not_advertise_is_refused_with_an_event_and_a_condition(
        env, tmp_path, agent_kubeconfig):
    node = env.add_node("short", gpus=4)  # the driver shows 8
    done = run_agent(env, node, tmp_path, agent_kubeconfig)
    assert done.returncode == 1
    annotations = env.kube.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
    assert constants.GPU_TOPOLOGY_ANNOTATION not in annotations
    refused = condition(env, node)
    assert (refused["status"], refused["reason"]) == ("False", "GPUCountMismatch")
    assert refused["message"].startswith("driver: 8 GPUs visible; advertised: 4 (nvidia.com/gpu capacity); ")
    events = wait_for("the node's event", lambda: [
        e for e in env.kube.get("/api/v1/namespaces/default/events")["items"]
        if e["involvedObject"].get("name") == node and e["reason"] == "GPUCountMismatch"])
    assert events[0]["type"] == "Warning"


@pytest.fixture
def agent(env, tmp_path, agent_kubeconfig):
    """Starts `batchsched node-agent` (a process, looping every half second), as deployed."""
    started: list[subprocess.Popen] = []

    def start(node: str, socket: str, kubeconfig: str | None = None) -> str:
        script = fake_nvidia_smi(tmp_path, DGX1, query_xml(parse_topo(DGX1.read_text())))
        address = f"127.0.0.1:{localcluster.free_port()}"
        log = open(tmp_path / "agent.log", "ab")
        started.append(subprocess.Popen(
            [sys.executable, "-m", "batchsched", "node-agent", "--node", node, "--backend", "text",
             "--nvidia-smi", str(script), "--sys-root", str(tmp_path), "--kubeconfig", kubeconfig or agent_kubeconfig,
             "--interval", "0.5", "--pod-resources-socket", socket, "--metrics-bind-address", address],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        return f"http://{address}"

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)
    print((tmp_path / "agent.log").read_text(errors="replace")[-4000:] if (tmp_path / "agent.log").exists() else "")


def metrics_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            return response.read().decode()
    except OSError:
        return ""


def pod_gpu_ids(env, name: str, annotation: str = constants.GPU_IDS_ANNOTATION) -> set[int]:
    text = (env.pods()[name]["metadata"].get("annotations") or {}).get(annotation, "")
    return {int(i) for i in text.split(",") if i}


def test_a_planted_mismatch_is_recorded_and_the_scheduler_hands_out_the_freed_gpus(env, start_scheduler, agent):
    topology = with_identities(parse_topo(DGX1.read_text()), query_xml(parse_topo(DGX1.read_text())))
    node = env.add_node("gpu", gpus=8, annotations={constants.GPU_TOPOLOGY_ANNOTATION: to_annotation(topology)})
    start_scheduler()
    env.create(pod("first", env.namespace, gpus=2))
    wait_for("the first pod bound", lambda: env.bound().get("first"), timeout=60)
    planned = pod_gpu_ids(env, "first")
    taken = set(sorted(set(range(8)) - planned)[:2])  # the kubelet gave it two other GPUs
    with PodResourcesServer([g.uuid for g in topology.gpus]) as kubelet:
        kubelet.assignments[(env.namespace, "first")] = [topology.gpus[i].uuid for i in sorted(taken)]
        url = agent(node, kubelet.socket)
        wait_for("gpu-ids-actual", lambda: pod_gpu_ids(env, "first", constants.GPU_IDS_ACTUAL_ANNOTATION) == taken)
        assert {"List", "GetAllocatableResources"} <= set(kubelet.calls)
        events = wait_for("the mismatch event", lambda: [
            e for e in env.kube.get(f"/api/v1/namespaces/{env.namespace}/events")["items"]
            if e["involvedObject"].get("name") == "first" and e["reason"] == "GPUAssignmentMismatch"])
        assert events[0]["type"] == "Warning"
        assert f"but the kubelet gave {','.join(map(str, sorted(taken)))}" in events[0]["message"]
        assert wait_for("the metric", lambda: sample(metrics_text(url), "batchsched_gpu_assignment_mismatches_total",
                                                     f'node="{node}"')) == 1
        # the node's side of the checklist: the condition says what the last verification found
        ready = wait_for("the verification in the node condition", lambda: "last verification: 1 pods" in
                         condition(env, node).get("message", "") and condition(env, node))
        assert (ready["status"], ready["reason"]) == ("True", "TopologyReported")
        assert "kubelet allocatable: 8; " in ready["message"] and "1 holding other GPUs" in ready["message"]
        # six more GPUs: exactly the ones the first pod does not hold, its planned ones among them
        env.create(pod("second", env.namespace, gpus=6))
        wait_for("the second pod bound", lambda: env.bound().get("second"), timeout=60)
        assert pod_gpu_ids(env, "second") == set(range(8)) - taken
        assert sample(metrics_text(url), "batchsched_gpu_assignment_mismatches_total", f'node="{node}"') == 1


def deploy_with_the_agent(tmp_path: Path) -> Path:
    """An overlay: deploy/ plus the node-agent component."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy", overlay)],
        "components": [os.path.relpath(ROOT / "deploy" / "node-agent", overlay)]}))
    return overlay


def test_the_daemonset_passes_a_server_side_dry_run(kube, kubeconfig, kubectl, tmp_path):
    overlay = deploy_with_the_agent(tmp_path)
    objects = rendered(kubectl, kubeconfig, overlay)
    apply(kubectl, kubeconfig, [o for o in objects if o["kind"] == "Namespace"])
    result = run_kubectl(kubectl, kubeconfig, "apply", "--dry-run=server", "-k", str(overlay))
    assert re.search(r"^daemonset\.apps/batchsched-node-agent (created|configured|unchanged) \(server dry run\)$",
                     result.stdout, re.M), result.stdout
    assert "would violate PodSecurity" not in result.stderr, result.stderr
    spec = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert not any("nvidia.com/gpu" in (container.get("resources") or {}).get(k, {}) for k in ("requests", "limits"))
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    [mount] = container["volumeMounts"]
    assert mount["readOnly"] and mount["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_every_rule_granted_to_the_agent_is_used_and_nothing_it_does_is_refused(
        env, kube, kubeconfig, kubectl, audit_log, start_scheduler, agent, tmp_path):
    rbac = [o for o in rendered(kubectl, kubeconfig, deploy_with_the_agent(tmp_path)) if o["kind"] in RBAC_KINDS]
    apply(kubectl, kubeconfig, rbac)
    since = audit_log.stat().st_size
    topology = with_identities(parse_topo(DGX1.read_text()), query_xml(parse_topo(DGX1.read_text())))
    node = env.add_node("gpu", gpus=8)  # no annotation yet: the agent writes it
    start_scheduler()
    env.create(pod("first", env.namespace, gpus=1))
    planned = wait_for("the first pod bound with ids", lambda: pod_gpu_ids(env, "first"), timeout=60)
    other = min(set(range(8)) - planned)
    sa_kubeconfig = service_account_kubeconfig(kube, kubeconfig, AGENT_NAMESPACE, AGENT_ACCOUNT, tmp_path / "agent-kc")
    with PodResourcesServer([g.uuid for g in topology.gpus]) as kubelet:
        kubelet.assignments[(env.namespace, "first")] = [topology.gpus[other].uuid]
        agent(node, kubelet.socket, sa_kubeconfig)
        wait_for("gpu-ids-actual", lambda: pod_gpu_ids(env, "first", constants.GPU_IDS_ACTUAL_ANNOTATION) == {other})
        user = f"system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_ACCOUNT}"
        rules = granted(rbac, AGENT_ACCOUNT, AGENT_NAMESPACE)
        try:
            wait_for("every granted rule used", lambda: not unused(rules, audited(audit_log, since, user)), timeout=30)
        except AssertionError:
            pytest.fail(f"granted but never used: {sorted(unused(rules, audited(audit_log, since, user)))}")
    refused = [f"{e['verb']} {e['requestURI']}" for e in audited(audit_log, since, user)
               if e.get("annotations", {}).get("authorization.k8s.io/decision") != "allow"]
    assert not refused, refused


def test_with_the_policies_an_agent_changes_only_its_node_and_only_agents_set_gpu_ids_actual(
        env, kube, kubeconfig, kubectl, tmp_path):
    objects = rendered(kubectl, kubeconfig, deploy_with_the_agent(tmp_path))
    apply(kubectl, kubeconfig, [o for o in objects if o["kind"] in RBAC_KINDS])
    for policy in (o for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")):
        env.add_cluster_object(policy)
    node_a, node_b = env.add_node("a"), env.add_node("b")
    agent_pod = kube.create(f"/api/v1/namespaces/{AGENT_NAMESPACE}/pods", {
        "metadata": {"name": f"agent-{env.id}"},
        "spec": {"nodeName": node_a, "serviceAccountName": AGENT_ACCOUNT,
                 "containers": [{"name": "agent", "image": "batchsched:0.1.0"}]}})
    try:
        agent_kube = TestKube(service_account_kubeconfig(kube, kubeconfig, AGENT_NAMESPACE, AGENT_ACCOUNT,
                                                         tmp_path / "agent-a", bound_pod=agent_pod))
        for name, node in (("on-a", node_a), ("on-b", node_b)):
            env.create({**pod(name, env.namespace), "spec": {**pod(name, env.namespace)["spec"], "nodeName": node}})
        pods = f"/api/v1/namespaces/{env.namespace}/pods"

        def refused(do) -> str:
            try:
                do()
            except KubeError as exc:
                assert exc.status == 403, exc
                return str(exc)
            return ""

        actual = lambda value: {"metadata": {"annotations": {constants.GPU_IDS_ACTUAL_ANNOTATION: value}}}  # noqa: E731
        # the policies take effect a moment after they are created
        message = wait_for("node B refused to node A's agent", lambda: refused(
            lambda: agent_kube.merge_patch(f"/api/v1/nodes/{node_b}", {"metadata": {"annotations": {"x": "1"}}})))
        assert f'node agent of node "{node_a}" may change only that node and its pods (this is node "{node_b}")' \
            in message
        assert refused(lambda: agent_kube.merge_patch(f"{pods}/on-b", actual("0")))
        assert refused(lambda: agent_kube.request("PATCH", f"/api/v1/nodes/{node_b}/status", {"status": {}},
                                                  content_type="application/merge-patch+json"))
        assert not refused(lambda: agent_kube.merge_patch(f"/api/v1/nodes/{node_a}",
                                                          {"metadata": {"annotations": {"x": "1"}}}))
        assert not refused(lambda: agent_kube.merge_patch(f"{pods}/on-a", actual("3")))
        # everyone else (here the cluster admin, a fortiori a tenant): not gpu-ids-actual, other annotations yes
        wait_for("gpu-ids-actual refused to others",
                 lambda: refused(lambda: kube.merge_patch(f"{pods}/on-a", actual("4"))))
        forged = pod("forged", env.namespace)
        forged["metadata"]["annotations"] = {constants.GPU_IDS_ACTUAL_ANNOTATION: "0"}
        assert "only the batchsched node agent may set" in refused(lambda: env.create(forged))
        assert not refused(lambda: kube.merge_patch(f"{pods}/on-a", {"metadata": {"annotations": {"note": "ok"}}}))
        assert env.pods()["on-a"]["metadata"]["annotations"][constants.GPU_IDS_ACTUAL_ANNOTATION] == "3"
    finally:
        kube.delete(f"/api/v1/namespaces/{AGENT_NAMESPACE}/pods/{agent_pod['metadata']['name']}",
                    gracePeriodSeconds=0)
