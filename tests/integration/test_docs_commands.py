"""Every shell command the README and docs quote runs against the local
control plane, or is marked in the doc as not runnable here, with the reason
(issue 17; the rule and the markers: docs/testing.md).

Each document's commands run in order in one bash, from a scratch copy of
the repository root (links to its files, plus ``.venv`` naming the venv
running the tests, and ``../shared`` when there is one), with ``kubectl``
the control plane's, ``batchsched`` this checkout's and $KUBECONFIG the test
cluster. What a document leaves behind goes after it: the namespaces it
created, and the Jobs and Deployments it created in namespaces that were
there before (their pods would otherwise take room on later tests' nodes).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED
from tests.support.doc_commands import documents, parse_file, run_commands
from tests.support.kube import KubeError, wait_for

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


WORKLOADS = (("/apis/batch/v1", "jobs"), ("/apis/apps/v1", "deployments"))
NAMESPACE_DELETION_TIMEOUT = 60  # the namespace controller deletes what is in it first


def namespaces(kube) -> set[str]:
    return {n["metadata"]["name"] for n in kube.get("/api/v1/namespaces")["items"]}


def workloads(kube) -> set[tuple[str, str]]:
    """(namespace, path) of every Job and Deployment of the cluster."""
    found = set()
    for api, plural in WORKLOADS:
        for o in kube.get(f"{api}/{plural}")["items"]:
            namespace = o["metadata"]["namespace"]
            found.add((namespace, f"{api}/namespaces/{namespace}/{plural}/{o['metadata']['name']}"))
    return found


def delete_what_the_document_left(kube, namespaces_before: set[str], workloads_before: set[tuple[str, str]]) -> None:
    """Its namespaces, gone before the next test (one may create the same
    namespace: batchsched-system, test_deploy.py), and its workloads in the
    others, with their pods."""
    created = namespaces(kube) - namespaces_before
    for namespace, path in workloads(kube) - workloads_before:
        if namespace not in created:
            kube.delete(path, propagationPolicy="Background")
    for name in created:
        try:
            kube.delete(f"/api/v1/namespaces/{name}")
        except KubeError:
            pass
    wait_for("the document's namespaces deleted", lambda: not created & namespaces(kube),
             timeout=NAMESPACE_DELETION_TIMEOUT)


@pytest.mark.parametrize("document", WITH_COMMANDS)
def test_every_command_of_the_document_runs(document, kube, kubeconfig, kubectl, helm, tmp_path):
    doc = PARSED[document]
    assert doc.problems == [], "\n".join(doc.problems)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "kubectl").symlink_to(kubectl)
    (tools / "helm").symlink_to(helm)
    checkout = scratch_checkout(tmp_path)
    env = {**os.environ, "KUBECONFIG": kubeconfig, "PYTHONPATH": str(checkout),
           "PATH": os.pathsep.join([str(tools), str(Path(sys.executable).parent), os.environ["PATH"]])}
    workdir = tmp_path / "run"
    workdir.mkdir()

    namespaces_before, workloads_before = namespaces(kube), workloads(kube)
    try:
        outcomes = run_commands(doc.commands, checkout, env, workdir, timeout=COMMAND_TIMEOUT)
    finally:
        delete_what_the_document_left(kube, namespaces_before, workloads_before)

    skipped = [c for c in doc.commands if c.skip is not None]
    print(f"{document}: {len(outcomes)} command(s) run, {len(skipped)} not run here:")
    for command in skipped:
        print(f"  {command.where}: {command.text.splitlines()[0]}  -- {command.skip}")
    failures = [o.report() for o in outcomes if o.status != "ok"]
    assert not failures, "\n\n".join(failures)
