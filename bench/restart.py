"""Restart cost: from process start to the first binding, on a big cluster.

    .venv/bin/python bench/restart.py [--nodes 5000] [--pods 50000]

A fresh local control plane gets ``--nodes`` 8-GPU nodes and ``--pods``
existing pods already bound to them (1 GPU each, as a previous scheduler
left them; the nodes are not kwok-managed, to keep the setup fast), plus one
pending 8-pod gang that fits.  Then ``batchsched run`` starts, and we time
process start -> the gang's first pod bound (seen on a watch), and read the
scheduler's peak resident memory (VmHWM) at that moment.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import controlplane as cp  # noqa: E402  (shares the cluster helpers)
import yaml  # noqa: E402

from batchsched.api import constants  # noqa: E402
from batchsched.shell.kube import Kube  # noqa: E402

POOL = "restart"


def unmanaged_node(name: str) -> dict:
    body = cp.node_body(name, POOL)
    del body["metadata"]["labels"]["batchsched.io/simulated"]  # kwok leaves it alone
    return body


def bound_pod(i: int, node: str) -> dict:
    """Already bound, cpu and memory only, so ten per node still leave every GPU free."""
    body = cp.pod_body(f"old-{i}", "bench-old", "default-scheduler")
    body["spec"]["nodeName"] = node
    body["spec"]["containers"][0]["resources"]["limits"] = {}
    return body


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def main_async(args) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        workdir = Path(tmp)
        cluster = cp.localcluster.up(workdir / "cluster", with_scheduler=False, die_with_parent=True)
        kube = await Kube.connect(str(cluster.kubeconfig), qps_connections=128)
        try:
            crd = yaml.safe_load((cp.ROOT / "crds" / "podgroup.yaml").read_text())
            await kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
            for ns in ("bench-old", "bench-new"):
                await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
            t0 = time.monotonic()
            nodes = [f"{POOL}-{i:05d}" for i in range(args.nodes)]
            await cp.create_many(kube, "/api/v1/nodes", [unmanaged_node(n) for n in nodes], parallel=128)
            await cp.create_many(kube, "/api/v1/namespaces/bench-old/pods",
                                 [bound_pod(i, nodes[i % len(nodes)]) for i in range(args.pods)], parallel=128)
            print(f"setup: {args.nodes} nodes, {args.pods} bound pods in {time.monotonic() - t0:.0f}s")
            await kube.request("POST", f"/apis/{constants.API_VERSION}/namespaces/bench-new/podgroups",
                               body={"apiVersion": constants.API_VERSION, "kind": "PodGroup",
                                     "metadata": {"name": "g", "namespace": "bench-new"}, "spec": {"minMember": 8}})
            await cp.create_many(kube, "/api/v1/namespaces/bench-new/pods",
                                 [cp.pod_body(f"g-{i}", "bench-new", "batchsched", "g") for i in range(8)])
            start = time.monotonic()
            proc = cp.start_batchsched(cluster.kubeconfig, workdir, POOL)
            try:
                first, _ = await cp.wait_all_bound(kube, "bench-new", 1, timeout=900)
                rss = peak_rss_mib(proc.pid)
            finally:
                proc.terminate()
                proc.wait()
        finally:
            await kube.close()
            cp.localcluster.down(workdir / "cluster")
    print(f"restart to first bind: {first - start:.1f} s; scheduler peak RSS then: {rss:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
