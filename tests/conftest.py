"""Fixtures for tests that talk to a real kube-apiserver.

The control plane comes up once per run from e2e/localcluster.py, or the
cluster named by $KUBECONFIG is used (kind, or any cluster) so one e2e suite
runs against both.  Every test gets its own namespace and a label that its
nodes carry, and everything cluster-scoped it made is removed afterwards.
"""
from __future__ import annotations

import json
import os
from datetime import datetime
import shutil
import sys
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))

import localcluster  # noqa: E402

from tests.support.deployed import SA_USER, Deployed, rbac_of, render  # noqa: E402
from tests.support.kube import KubeError, TestKube, wait_for  # noqa: E402
from tests.support.objects import gpu_node  # noqa: E402

SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def kubeconfig(tmp_path_factory) -> str:
    if os.environ.get("KUBECONFIG"):
        yield os.environ["KUBECONFIG"]
        return
    workdir = tmp_path_factory.mktemp("localcluster")
    cluster = localcluster.up(workdir, die_with_parent=True)
    try:
        yield str(cluster.kubeconfig)
    finally:
        localcluster.down(workdir)


@pytest.fixture(scope="session")
def audit_log(kubeconfig) -> Path:
    """The local API server's audit log: every request a ServiceAccount made."""
    if os.environ.get("KUBECONFIG"):
        pytest.skip("the audit log is the local control plane's; $KUBECONFIG names another cluster")
    return Path(kubeconfig).parent / localcluster.AUDIT_LOG


def install_crd(api: TestKube, path: Path) -> TestKube:
    """Apply the CRD in ``path`` and wait until the API server serves it."""
    crd = yaml.safe_load(path.read_text())
    api.apply_yaml_objects([crd])
    wait_for(f"{crd['spec']['names']['kind']} CRD established", lambda: any(
        c["type"] == "Established" and c["status"] == "True"
        for c in api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}")
        .get("status", {}).get("conditions") or []))
    return api


def install_podgroup_crd(api: TestKube) -> TestKube:
    return install_crd(api, ROOT / "crds" / "podgroup.yaml")


@pytest.fixture(scope="session")
def foreign_podgroup_crds(kube) -> TestKube:
    """scheduler-plugins' and Volcano's PodGroup CRDs (tests/fixtures/crds), left installed."""
    for path in sorted((ROOT / "tests" / "fixtures" / "crds").glob("*-podgroup.yaml")):
        install_crd(kube, path)
    return kube


@pytest.fixture(scope="session")
def jobset_crd(kube) -> TestKube:
    """JobSet's CRD, from the sigs.k8s.io/jobset module e2e/versions.env pins, left installed."""
    from tests.support import controllers, jobset
    controllers.install_crds(kube, controllers.module_dir(*jobset.MODULE))
    return kube


@pytest.fixture(scope="session")
def kube(kubeconfig) -> TestKube:
    return install_podgroup_crd(TestKube(kubeconfig))


@pytest.fixture(scope="session")
def queue_crd(kube) -> TestKube:
    """The Queue CRD, for the tests that use queues (docs/queues.md)."""
    return install_crd(kube, ROOT / "crds" / "queue.yaml")


class Env:
    """One test's slice of the cluster: a namespace and the nodes it made."""

    def __init__(self, kube: TestKube, kubeconfig: str):
        self.kube = kube
        self.kubeconfig = kubeconfig
        self.id = uuid.uuid4().hex[:8]
        self.namespace = f"t-{self.id}"
        self.node_label = {"batchsched.io/e2e-run": self.id}
        self.nodes: list[str] = []
        self.cluster_objects: list[str] = []
        # (start, end) epoch seconds in which the API server itself refuses what RBAC grants
        # (its authorizer not yet synced after a restart the test made): refusals then are the fault
        self.authorizer_outages: list[tuple[float, float]] = []
        kube.create("/api/v1/namespaces", {"metadata": {"name": self.namespace}})

    def add_node(self, name: str, **kwargs) -> str:
        full = f"{self.id}-{name}"
        labels = {**self.node_label, **kwargs.pop("labels", {})}
        self.kube.create("/api/v1/nodes", gpu_node(full, labels=labels, **kwargs))
        self.nodes.append(full)
        return full

    def add_cluster_object(self, obj: dict) -> dict:
        from tests.support.kube import object_collection_path
        created = self.kube.create(object_collection_path(obj), obj)
        self.cluster_objects.append(f"{object_collection_path(obj)}/{obj['metadata']['name']}")
        return created

    def create(self, obj: dict) -> dict:
        from tests.support.kube import object_collection_path
        obj.setdefault("metadata", {})["namespace"] = self.namespace
        return self.kube.create(object_collection_path(obj), obj)

    def pods(self) -> dict[str, dict]:
        return {p["metadata"]["name"]: p for p in self.kube.pods(self.namespace)}

    def bound(self) -> dict[str, str]:
        """Pod name -> node name, for every bound pod of the namespace."""
        return {name: p["spec"]["nodeName"] for name, p in self.pods().items() if p["spec"].get("nodeName")}

    def podgroup(self, name: str) -> dict:
        return self.kube.get(f"/apis/scheduling.batchsched.io/v1alpha1/namespaces/{self.namespace}/podgroups/{name}")

    def cleanup(self) -> None:
        for p in self.kube.pods(self.namespace):
            self.kube.delete(f"/api/v1/namespaces/{self.namespace}/pods/{p['metadata']['name']}",
                             gracePeriodSeconds=0)
        for node in self.nodes:
            self.kube.delete(f"/api/v1/nodes/{node}")
        for path in self.cluster_objects:
            self.kube.delete(path)
        try:
            self.kube.delete(f"/api/v1/namespaces/{self.namespace}")
        except KubeError:
            pass


@pytest.fixture
def env(kube, kubeconfig) -> Env:
    e = Env(kube, kubeconfig)
    try:
        yield e
    finally:
        e.cleanup()


@pytest.fixture(scope="session")
def kubectl() -> str:
    """kubectl built with the control plane; kubectl from PATH against $KUBECONFIG."""
    if os.environ.get("KUBECONFIG"):
        found = shutil.which("kubectl")
        if found is None:
            pytest.fail("$KUBECONFIG is set but no kubectl is on PATH")
        return found
    return str(localcluster.build_all()["kubectl"])


@pytest.fixture(scope="session")
def helm() -> str:
    """helm built from helm.sh/helm/v3 with the control plane (charts/batchsched's tests)."""
    return str(localcluster.build_all()["helm"])


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared data not present at {SHARED} (tests reading ../shared skip without it)")
    return SHARED


@pytest.fixture(scope="session")
def deployed(kubectl) -> Deployed:
    """deploy/'s ServiceAccount and RBAC: what every test runs the scheduler as."""
    return Deployed(rbac_of(render(kubectl)))


@pytest.fixture
def scheduler_kubeconfig(env, deployed, tmp_path) -> str:
    """A kubeconfig of deploy/'s ServiceAccount under the shipped RBAC, whose
    leader election may use the test's own namespace."""
    return deployed.kubeconfig(env.kube, env.kubeconfig, env.namespace, tmp_path / "scheduler-kubeconfig")


class SchedulerProcess:
    """batchsched run as its own process, as a user would run it."""

    def __init__(self, env: Env, tmp_path: Path, name: str, kubeconfig: str, **config):
        self.env = env
        self.kubeconfig = kubeconfig
        self.config_path = tmp_path / f"{name}.yaml"
        self.log_path = tmp_path / f"{name}.log"
        config.setdefault("nodeSelector", env.node_label)
        config.setdefault("logLevel", "DEBUG")
        # A test's replicas contend for a Lease no other test's replicas use.
        config.setdefault("leaderElection", {"leaseNamespace": env.namespace})
        config.setdefault("metricsBindAddress", f"127.0.0.1:{localcluster.free_port()}")
        self.url = f"http://{config['metricsBindAddress']}"
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc = None

    def start(self) -> "SchedulerProcess":
        import subprocess
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "batchsched", "run", "--kubeconfig", self.kubeconfig,
             "--config", str(self.config_path)],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=localcluster._die_with_parent)
        return self

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, like a crashed node."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:  # noqa: BLE001 - escalate whatever went wrong
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str) -> tuple[int, str]:
        """GET one of its HTTP endpoints: (status, body), (0, "") while it does not answer."""
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""


@pytest.fixture
def start_scheduler(env, tmp_path, request, scheduler_kubeconfig):
    """Starts the scheduler as deploy/'s ServiceAccount (``kubeconfig``: as
    another identity, which the test's name says)."""
    started: list[SchedulerProcess] = []

    def start(kubeconfig: str | None = None, **config) -> SchedulerProcess:
        proc = SchedulerProcess(env, tmp_path, f"scheduler-{len(started)}", kubeconfig or scheduler_kubeconfig,
                                **config).start()
        started.append(proc)
        return proc

    audit = None if os.environ.get("KUBECONFIG") else Path(env.kubeconfig).parent / localcluster.AUDIT_LOG
    since = audit.stat().st_size if audit is not None and audit.exists() else 0
    yield start
    for proc in started:
        proc.stop()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for proc in started:
            print(f"--- scheduler log (tail) ---\n{proc.log()[-6000:]}")
    elif audit is not None and started:
        # as deployed, on every path a test takes: nothing the scheduler asked was refused by RBAC
        refused = refused_requests(audit, since, SA_USER, env.authorizer_outages)
        assert not refused, f"the shipped RBAC refused the scheduler: {refused[:10]}"


def refused_requests(audit: Path, since: int, user: str, outages: list[tuple[float, float]] = ()) -> list[str]:
    """Requests by ``user`` that authorization refused, from byte ``since`` of
    the audit log, but for those received within one of ``outages``."""
    with audit.open() as log:
        log.seek(since)
        events = [json.loads(line) for line in log if line.strip()]

    def in_outage(event: dict) -> bool:
        received = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
        return any(start <= received <= end for start, end in outages)
    return [f"{e['verb']} {e['requestURI']}" for e in events if e["user"]["username"] == user
            and e.get("annotations", {}).get("authorization.k8s.io/decision") == "forbid" and not in_outage(e)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
