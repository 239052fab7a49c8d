"""``batchsched demo-cluster``: batchsched on a local control plane.

Starts the local control plane from e2e/, adds four simulated 8-GPU nodes,
submits a training gang of 4 pods x 4 GPUs, an inference pod and a gang too
big for the cluster, runs the real scheduler, then prints where each pod went
and why the big gang is pending.  (``make demo`` runs ``batchsched
simulate``, which needs no control plane.)
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import yaml

from batchsched.api import constants
from batchsched.config import SchedulerConfig
from batchsched.core.explain import explain_gang

REPO = Path(__file__).resolve().parents[1]
DEMO_NS = "demo"
NODE_LABEL = {"batchsched.io/demo": "true"}


def _node(name: str, gpus: int) -> dict:
    resources = {"cpu": "96", "memory": "1Ti", "pods": "110", constants.GPU_RESOURCE: str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"batchsched.io/simulated": "true", **NODE_LABEL}},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}


def _pod(name: str, gpus: int, group: str | None = None, priority_class: str | None = None) -> dict:
    labels = {constants.POD_GROUP_LABEL: group} if group else {}
    spec = {"schedulerName": constants.DEFAULT_SCHEDULER_NAME, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "registry.example/train:1",
                            "resources": {"requests": {"cpu": "8", "memory": "64Gi"},
                                          "limits": {constants.GPU_RESOURCE: str(gpus)}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": DEMO_NS, "labels": labels}, "spec": spec}


def _group(name: str, min_member: int) -> dict:
    return {"apiVersion": constants.API_VERSION, "kind": constants.PODGROUP_KIND,
            "metadata": {"name": name, "namespace": DEMO_NS},
            "spec": {"minMember": min_member, "priorityClassName": "training"}}


async def _scenario(kubeconfig: str) -> int:
    from batchsched.kube.client import Kube
    from batchsched.shell.scheduler import Scheduler

    kube = await Kube.connect(kubeconfig)
    crd = yaml.safe_load((REPO / "crds" / "podgroup.yaml").read_text())
    await kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
    await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": DEMO_NS}})
    await kube.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                       body={"metadata": {"name": "training"}, "value": 1000})
    for i in range(4):
        await kube.request("POST", "/api/v1/nodes", body=_node(f"gpu-node-{i}", 8))
    while True:  # the CRD must be served before PodGroups can be created
        crd_now = await kube.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                            f"{crd['metadata']['name']}")
        if any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd_now.get("status") or {}).get("conditions") or ()):
            break
        await asyncio.sleep(0.1)
    groups = f"/apis/{constants.API_VERSION}/namespaces/{DEMO_NS}/podgroups"
    await kube.request("POST", groups, body=_group("llama-finetune", 4))
    await kube.request("POST", groups, body=_group("too-big", 5))
    pods = f"/api/v1/namespaces/{DEMO_NS}/pods"
    for i in range(4):
        await kube.request("POST", pods, body=_pod(f"llama-finetune-{i}", 4, "llama-finetune", "training"))
    for i in range(5):
        await kube.request("POST", pods, body=_pod(f"too-big-{i}", 8, "too-big"))
    await kube.request("POST", pods, body=_pod("inference-0", 1))

    scheduler = Scheduler(kube, SchedulerConfig(nodeSelector=NODE_LABEL))
    task = asyncio.create_task(scheduler.run())
    started = time.monotonic()
    expected = {f"llama-finetune-{i}" for i in range(4)} | {"inference-0"}
    while time.monotonic() - started < 30:
        listing = await kube.request("GET", pods)
        placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in listing["items"]}
        if all(placed.get(name) for name in expected):
            break
        await asyncio.sleep(0.2)
    elapsed = time.monotonic() - started
    print(f"\nbatchsched demo: 4 nodes x 8 GPUs, scheduled in {elapsed:.2f}s\n")
    print(f"{'POD':<20} {'GANG':<16} {'GPUS':>4}  NODE")
    for item in sorted(listing["items"], key=lambda p: p["metadata"]["name"]):
        gang = item["metadata"].get("labels", {}).get(constants.POD_GROUP_LABEL, "-")
        gpus = item["spec"]["containers"][0]["resources"]["limits"][constants.GPU_RESOURCE]
        print(f"{item['metadata']['name']:<20} {gang:<16} {gpus:>4}  {item['spec'].get('nodeName') or '(pending)'}")
    print("\n$ batchsched explain demo/too-big")
    print(explain_gang(scheduler.cache.snapshot(time.time()), f"{DEMO_NS}/too-big"))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await kube.close()
    return 0 if all(placed.get(name) for name in expected) and not any(
        placed.get(f"too-big-{i}") for i in range(5)) else 1


def run_demo() -> int:
    sys.path.insert(0, str(REPO / "e2e"))
    import localcluster

    with tempfile.TemporaryDirectory(prefix="batchsched-demo-") as workdir:
        cluster = localcluster.up(Path(workdir), with_scheduler=False, die_with_parent=True)
        try:
            return asyncio.run(_scenario(str(cluster.kubeconfig)))
        finally:
            localcluster.down(Path(workdir))
