"""deploy/ and the image against a real API server: it applies, and its RBAC
is all the scheduler needs and no more.

No Deployment controller runs in the local control plane, so the manifests
are checked with a server-side dry run (every admission step, nothing
stored), and the RBAC is exercised by running the scheduler here with a
token of deploy/'s ServiceAccount: the API server's audit log must show
every rule used and nothing refused.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.test_dra_inventory import DGX1, dra_node, gpu_class  # noqa: F401
from tests.integration.test_gang_sources import SCHEDULER_NAMES
from tests.integration.test_gang_scheduling import make_gang, members_bound
from tests.integration.test_partial_gangs import refuse_binding_of
from tests.integration.test_preemption import Classes, alive, fill_with_inference, preemption_config
from tests.integration.test_native_gangs import native_group, native_member
from tests.support.frameworks import kuberay_volcano_cluster, mpi_operator_job
from tests.integration.test_queues import add_queue
from tests.support.kube import wait_for
from tests.support.kubectl import rendered, run_kubectl, service_account_kubeconfig

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
sys.path.insert(0, str(ROOT / "tools"))
from lock_requirements import lock_text, tools_lock_text  # noqa: E402
from tests.support.deployed import NAMESPACE, RBAC_KINDS, SA_USER, SERVICE_ACCOUNT  # noqa: E402


def apply(binary: str, kubeconfig: str, objects: list[dict]) -> None:
    run_kubectl(binary, kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


def test_deploy_passes_a_server_side_dry_run(kube, kubeconfig, kubectl):
    objects = rendered(kubectl, kubeconfig, DEPLOY)
    # A dry run creates nothing, so the objects that go into the namespace
    # need the namespace to exist already.
    apply(kubectl, kubeconfig, [o for o in objects if o["kind"] == "Namespace"])
    result = run_kubectl(kubectl, kubeconfig, "apply", "--dry-run=server", "-k", str(DEPLOY))
    assert "would violate PodSecurity" not in result.stderr, result.stderr
    # unchanged: already applied for real (the README's Quickstart, tests/integration/test_docs_commands.py)
    accepted = r" (created|configured|unchanged) \(server dry run\)$"
    assert re.search(r"^deployment\.apps/batchsched" + accepted, result.stdout, re.M), result.stdout

    deployment = next(o for o in objects if o["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert deployment["spec"]["replicas"] == 2
    assert spec["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    budget = next(o for o in objects if o["kind"] == "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert re.search(r"^poddisruptionbudget\.policy/batchsched" + accepted, result.stdout, re.M), result.stdout
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["scheduler.yaml"])
    assert config["leaderElection"]["enabled"] is True
    kinds = {o["kind"] for o in objects}
    assert {"CustomResourceDefinition", "Service", "PriorityClass", "Deployment", "ConfigMap",
            "PodDisruptionBudget"} | RBAC_KINDS <= kinds


def test_the_service_account_may_do_nothing_beyond_scheduling_and_evicting(
        env, kube, kubeconfig, kubectl, foreign_podgroup_crds, jobset_crd):  # kubectl auth can-i resolves their names
    apply(kubectl, kubeconfig, [o for o in rendered(kubectl, kubeconfig, DEPLOY) if o["kind"] in RBAC_KINDS])

    def can(verb: str, resource: str, *extra: str) -> bool:
        result = run_kubectl(kubectl, kubeconfig, "auth", "can-i", verb, resource, f"--as={SA_USER}", *extra,
                             check=False)
        return result.stdout.strip() == "yes"

    assert can("create", "pods", "--subresource=binding", "-n", env.namespace)
    assert can("patch", "podgroups.scheduling.batchsched.io", "--subresource=status", "-n", env.namespace)
    assert can("patch", "podgroups.scheduling.x-k8s.io", "--subresource=status", "-n", env.namespace)
    assert can("patch", "podgroups.scheduling.volcano.sh", "-n", env.namespace)
    assert can("update", "leases.coordination.k8s.io/batchsched", "-n", NAMESPACE)
    assert can("create", "pods", "--subresource=eviction", "-n", env.namespace)
    assert can("patch", "pods", "--subresource=status", "-n", env.namespace)
    assert can("create", "resourceclaims.resource.k8s.io", "-n", env.namespace)
    assert can("update", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", env.namespace)
    assert can("update", "resourceclaims.resource.k8s.io", "--subresource=binding", "-n", env.namespace)
    for verb, resource, *extra in [("create", "pods"), ("delete", "pods"), ("update", "pods"), ("get", "pods"),
                                   ("list", "poddisruptionbudgets.policy"),
                                   ("get", "secrets"), ("update", "nodes"), ("patch", "nodes"),
                                   ("update", "podgroups.scheduling.batchsched.io"),
                                   ("patch", "podgroups.scheduling.x-k8s.io"),
                                   ("update", "podgroups.scheduling.volcano.sh"),
                                   ("update", "jobsets.jobset.x-k8s.io"), ("patch", "jobs.batch"),
                                   ("get", "resourceclaims.resource.k8s.io"),
                                   ("update", "resourceclaims.resource.k8s.io"),
                                   ("create", "resourceslices.resource.k8s.io"),
                                   ("update", "leases.coordination.k8s.io/another-lease", "-n", NAMESPACE),
                                   ("get", "leases.coordination.k8s.io/batchsched", "-n", "kube-system")]:
        assert not can(verb, resource, "-n", env.namespace, *extra), f"{SA_USER} may {verb} {resource} {extra}"


def granted(objects: list[dict], service_account: str = SERVICE_ACCOUNT,
            namespace: str = NAMESPACE) -> set[tuple[str, str, str, str, str]]:
    """(namespace or "", API group, resource[/subresource], verb, name or "") for
    every rule bound to batchsched's ServiceAccount (or another)."""
    bound = {(b["kind"], b["roleRef"]["name"], b["metadata"].get("namespace", "")) for b in objects
             if b["kind"] in {"ClusterRoleBinding", "RoleBinding"}
             and {"kind": "ServiceAccount", "name": service_account, "namespace": namespace} in b["subjects"]}
    rules = set()
    for role in objects:
        namespace = role["metadata"].get("namespace", "") if role["kind"] == "Role" else ""
        if (f"{role['kind']}Binding", role["metadata"]["name"], namespace) not in bound:
            continue
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            rules.add((namespace, group, resource, verb, name))
    return rules


def audited(audit_log: Path, since: int, user: str = SA_USER) -> list[dict]:
    """The audit events of batchsched's ServiceAccount (or ``user``) after byte ``since`` of the log."""
    with audit_log.open() as log:
        log.seek(since)
        events = [json.loads(line) for line in log if line.strip()]
    return [e for e in events if e["user"]["username"] == user and e.get("objectRef")]


def used_by(rule: tuple[str, str, str, str, str], event: dict) -> bool:
    namespace, group, resource, verb, name = rule
    ref = event["objectRef"]
    full = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    if resource == "resourceclaims/binding":
        # not a request of its own: the API server asks it of every write of
        # a claim's allocation or reservedFor (DRAResourceClaimGranularStatusAuthorization)
        full = "resourceclaims/binding" if full == "resourceclaims/status" else full
    return (event["verb"] == verb and ref.get("apiGroup", "") == group and full == resource
            and (not name or ref.get("name") == name) and (not namespace or ref.get("namespace") == namespace))


def unused(rules: set[tuple[str, str, str, str, str]], events: list[dict]) -> set[tuple[str, str, str, str, str]]:
    return {r for r in rules if not any(used_by(r, e) for e in events)}


@pytest.mark.parametrize("mode, component", [("Evict", None), ("Delete", "preemption-delete")])
def test_every_rule_granted_is_used_and_nothing_the_scheduler_does_is_refused(
        env, kube, kubeconfig, kubectl, audit_log, start_scheduler, tmp_path, mode, component, gpu_class,
        foreign_podgroup_crds, queue_crd, jobset_crd):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, overlay)],
        "components": [os.path.relpath(DEPLOY / component, overlay)] if component else []}))
    rbac = [o for o in rendered(kubectl, kubeconfig, overlay) if o["kind"] in RBAC_KINDS]
    apply(kubectl, kubeconfig, rbac)
    for o in rbac:  # the component's grants go with this test; the base's stay for the others
        if component and o["kind"] in {"ClusterRole", "ClusterRoleBinding"} and \
                o["metadata"]["name"].endswith(component):
            plural = "clusterroles" if o["kind"] == "ClusterRole" else "clusterrolebindings"
            env.cluster_objects.append(f"/apis/rbac.authorization.k8s.io/v1/{plural}/{o['metadata']['name']}")
    kube.delete(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/batchsched")  # so it is created
    since = audit_log.stat().st_size

    classes = Classes(env)
    node = env.add_node("gpu0", gpus=8)
    inference = fill_with_inference(env, [node], 8, classes.low)
    make_gang(env, "train", 1, group_spec={"priorityClassName": classes.high}, gpus=4, cpu="1",
              priority_class=classes.high)
    # and a gang one of whose bindings is refused, which starts over (an eviction in either mode);
    # its pods ask GPUs of a node serving them through DRA only: their claims are written, and
    # stuck-1's deleted when its binding is refused
    dra_node(env, "dra", DGX1.read_text(), indices=[0, 1])
    refuse_binding_of(env, "stuck-1")
    make_gang(env, "stuck", 2, cpu="1", gpus=1)
    # and the foreign PodGroups' status (scheduler-plugins' subresource, Volcano's object)
    for group, pods in (mpi_operator_job("mpi", env.namespace, 1, 0, "scheduler-plugins-scheduler"),
                        kuberay_volcano_cluster("ray", env.namespace, 1, 0)):
        for obj in (group, *pods):
            env.create(obj)
    native_group(env, "native", 1)  # and the native gang API's (scheduling.k8s.io/v1beta1)
    native_member(env, "native-0", "native", 0)
    add_queue(env, "team")  # watched, and its status written
    config = preemption_config()
    config["schedulerNames"] = SCHEDULER_NAMES
    config["preemption"]["mode"] = mode
    config["binding"] = {"partialGangTimeoutSeconds": 2}
    sa_kubeconfig = service_account_kubeconfig(kube, kubeconfig, NAMESPACE, SERVICE_ACCOUNT,
                                               tmp_path / "sa-kubeconfig")
    proc = start_scheduler(kubeconfig=sa_kubeconfig, leaderElection={"leaseNamespace": NAMESPACE}, **config)
    wait_for("the preempting gang bound", lambda: members_bound(env, "train-") == ["train-0"], timeout=60)
    assert len(alive(env, inference)) == 4
    wait_for("the stuck gang started over", lambda: "stuck-0" not in env.pods(), timeout=60)

    rules = granted(rbac)
    try:  # the Lease is renewed (updated) every 2 s; the audit log may lag a little
        wait_for("every granted rule used", lambda: not unused(rules, audited(audit_log, since)), timeout=30)
    except AssertionError:
        pytest.fail(f"granted but never used: {sorted(unused(rules, audited(audit_log, since)))}")
    events = audited(audit_log, since)
    refused = [f"{e['verb']} {e['requestURI']}" for e in events
               if e.get("annotations", {}).get("authorization.k8s.io/decision") != "allow"]
    assert not refused, refused
    # RBAC refusals ("forbidden: User ... cannot"); admission refuses stuck-1 with
    # "forbidden" too, and so does a namespace left terminating by an earlier test
    assert not [line for line in proc.log().splitlines() if "forbidden: User" in line]


DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_the_image_pins_its_base_and_installs_exactly_the_locked_dependencies():
    bases = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.M)
    assert len(bases) == 1 and re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", bases[0])
    assert re.findall(r"^FROM (\S+)", DOCKERFILE, re.M) == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert "pip install --no-deps --only-binary=:all: --requirement requirements.lock" in DOCKERFILE
    assert "pip install --no-deps --no-build-isolation ." in DOCKERFILE  # nothing resolved beyond the lock
    assert "pip check" in DOCKERFILE
    assert "!requirements.lock" in (ROOT / ".dockerignore").read_text().splitlines()


def test_the_lock_is_the_tested_environment_and_pins_every_runtime_dependency():
    lock = (ROOT / "requirements.lock").read_text()
    assert lock == lock_text(), "requirements.lock is stale: run tools/lock_requirements.py > requirements.lock"
    pins = [line for line in lock.splitlines() if line and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[a-z0-9-]+==\S+", pin) for pin in pins)
    assert {"kubernetes", "aiohttp", "pydantic", "prometheus-client", "pyyaml"} <= {p.split("==")[0] for p in pins}


def test_the_test_tools_are_locked_as_tested_and_apart_from_the_runtime_ones():
    """make install pins the test extra's closure too (requirements-test.lock),
    so a new release of a test tool upstream cannot change a CI run."""
    lock = (ROOT / "requirements-test.lock").read_text()
    assert lock == tools_lock_text(), \
        "requirements-test.lock is stale: run tools/lock_requirements.py --test > requirements-test.lock"
    pins = {line.split("==")[0] for line in lock.splitlines() if line and not line.startswith("#")}
    runtime = {line.split("==")[0] for line in (ROOT / "requirements.lock").read_text().splitlines()
               if line and not line.startswith("#")}
    assert {"pytest", "hypothesis", "matplotlib"} <= pins and not pins & runtime
    assert "--constraint requirements.lock --constraint requirements-test.lock" in (ROOT / "Makefile").read_text()
