"""Every shell command the README and docs quote runs against the local
control plane, or is marked in the doc as not runnable here, with the reason
(issue 17; the rule and the markers: docs/testing.md).

Each document's commands run in order in one bash, from a scratch copy of
the repository root (links to its files, plus ``.venv`` naming the venv
running the tests, and ``../shared`` when there is one), with ``kubectl``
the control plane's, ``batchsched`` this checkout's and $KUBECONFIG the test
cluster. The local control plane runs no kube-controller-manager, so the
test stands in for it as tests/integration/test_examples.py does: the Jobs
and Deployments a document creates get their pods, deleted after it. On a
real cluster ($KUBECONFIG) the namespaces a document creates are deleted
after it.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import SHARED
from tests.support.controllers import controller_pods
from tests.support.doc_commands import documents, parse_file, run_commands
from tests.support.kube import KubeError, TestKube

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PARSED = {str(path.relative_to(ROOT)): parse_file(path, ROOT) for path in documents(ROOT)}
WITH_COMMANDS = [name for name, doc in PARSED.items() if doc.commands]
COMMAND_TIMEOUT = 60  # batchsched simulate, the slowest, takes about 20 s here


def scratch_checkout(base: Path) -> Path:
    """The repository root as a reader has it after `make install`; what the
    commands write (topo.json, charts/) stays out of the real checkout."""
    checkout = base / "checkout"
    checkout.mkdir()
    for entry in ROOT.iterdir():
        if entry.name != ".git":
            (checkout / entry.name).symlink_to(entry)
    if not (checkout / ".venv").exists():
        (checkout / ".venv").symlink_to(sys.prefix)
    if SHARED.is_dir():
        (base / "shared").symlink_to(SHARED)
    return checkout


class StandInControllers(threading.Thread):
    """The pods of every Job and Deployment created while it runs, as the Job
    and ReplicaSet controllers would create them."""
    OWNERS = {"Job": "/apis/batch/v1/jobs", "Deployment": "/apis/apps/v1/deployments"}

    def __init__(self, kubeconfig: str):
        super().__init__(daemon=True)
        self.kube = TestKube(kubeconfig)  # its own client: the test's stays on the test's thread
        self.seen = {o["metadata"]["uid"] for o in self.owners()}
        self.pods: list[str] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def owners(self) -> list[dict]:
        return [{**o, "kind": kind} for kind, path in self.OWNERS.items() for o in self.kube.get(path)["items"]]

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            try:
                for owner in self.owners():
                    if owner["metadata"]["uid"] not in self.seen:
                        self.seen.add(owner["metadata"]["uid"])
                        for pod in controller_pods(owner):
                            pods = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods"
                            self.kube.create(pods, pod)
                            self.pods.append(f"{pods}/{pod['metadata']['name']}")
            except KubeError as exc:
                self.errors.append(f"standing in for the controllers: {exc}")

    def stop(self) -> None:
        self.stopping.set()
        self.join()
        for path in self.pods:
            self.kube.delete(path, gracePeriodSeconds=0)


def namespaces(kube) -> set[str]:
    return {n["metadata"]["name"] for n in kube.get("/api/v1/namespaces")["items"]}


@pytest.mark.parametrize("document", WITH_COMMANDS)
def test_every_command_of_the_document_runs(document, kube, kubeconfig, kubectl, tmp_path):
    doc = PARSED[document]
    assert doc.problems == [], "\n".join(doc.problems)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "kubectl").symlink_to(kubectl)
    checkout = scratch_checkout(tmp_path)
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PYTHONPATH": str(checkout),
           "PATH": os.pathsep.join([str(tools), str(Path(sys.executable).parent), os.environ["PATH"]])}
    workdir = tmp_path / "run"
    workdir.mkdir()

    # Without a namespace controller a deleted namespace stays Terminating, unusable by a later test
    # (batchsched-system: test_deploy.py), so on the local control plane, fresh each session, they stay.
    real_cluster = bool(os.environ.get("KUBECONFIG"))
    before = namespaces(kube)
    controllers = None if real_cluster else StandInControllers(kubeconfig)
    if controllers:
        controllers.start()
    try:
        outcomes = run_commands(doc.commands, checkout, env, workdir, timeout=COMMAND_TIMEOUT)
    finally:
        if controllers:
            controllers.stop()
        for name in namespaces(kube) - before:
            if real_cluster:
                try:
                    kube.delete(f"/api/v1/namespaces/{name}")
                except KubeError:
                    pass

    skipped = [c for c in doc.commands if c.skip is not None]
    print(f"{document}: {len(outcomes)} command(s) run, {len(skipped)} not run here:")
    for command in skipped:
        print(f"  {command.where}: {command.text.splitlines()[0]}  -- {command.skip}")
    failures = [o.report() for o in outcomes if o.status != "ok"] + (controllers.errors if controllers else [])
    assert not failures, "\n\n".join(failures)
