"""Restart cost: from process start to the first binding, on a big cluster,
and the memory of a forced relist of every collection.

    .venv/bin/python bench/restart.py [--nodes 5000] [--pods 50000]

A fresh local control plane gets ``--nodes`` 8-GPU nodes and ``--pods``
existing pods already bound to them (1 GPU each, as a previous scheduler
left them; the nodes are not kwok-managed, to keep the setup fast), plus one
pending 8-pod gang that fits.  Then ``batchsched run`` starts, and we time
process start -> the gang's first pod bound (seen on a watch), and read the
scheduler's peak resident memory (VmHWM) at that moment.  Then SIGUSR1
makes every watch cache relist (what any watch error costs); once its log
says every collection is listed again, a second 8-pod gang is submitted and
must be bound, and the peak resident memory over the whole run is read.
"""
from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import controlplane as cp  # noqa: E402  (shares the cluster helpers)

from batchsched.api import constants  # noqa: E402
from batchsched.kube.client import Kube  # noqa: E402

POOL = "restart"
KINDS = ("priorityclasses", "nodes", "podgroups", "pods")
LISTED = re.compile(r"(\w+) listed: (\d+) in (\d+) page\(s\), ([\d.]+)s")


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


async def submit_gang(kube: Kube, name: str) -> None:
    await kube.request("POST", f"/apis/{constants.API_VERSION}/namespaces/bench-new/podgroups",
                       body={"apiVersion": constants.API_VERSION, "kind": "PodGroup",
                             "metadata": {"name": name, "namespace": "bench-new"}, "spec": {"minMember": 8}})
    await cp.create_many(kube, "/api/v1/namespaces/bench-new/pods",
                         [cp.pod_body(f"{name}-{i}", "bench-new", "batchsched", name) for i in range(8)])


def listed_in(log: str) -> dict[str, tuple[int, int, float]]:
    """kind -> (objects, pages, seconds) of the lists the log text tells of."""
    return {m[1]: (int(m[2]), int(m[3]), float(m[4])) for m in LISTED.finditer(log)}


async def relisted(log_path: Path, offset: int, timeout: float = 900) -> dict[str, tuple[int, int, float]]:
    """Once the log past ``offset`` says every collection was listed: kind ->
    (objects, pages, seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, "rb") as log:
            log.seek(offset)
            found = listed_in(log.read().decode(errors="replace"))
        if found.keys() >= set(KINDS):
            return found
        await asyncio.sleep(0.1)
    raise TimeoutError("the forced relist did not finish")


async def populate(kube: Kube, nodes: int, pods: int) -> None:
    """The namespaces, ``nodes`` unmanaged nodes and ``pods`` pods bound to them."""
    for ns in ("bench-old", "bench-new"):
        await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    names = [f"{POOL}-{i:05d}" for i in range(nodes)]
    await cp.create_many(kube, "/api/v1/nodes", [unmanaged_node(n) for n in names], parallel=128)
    await cp.create_many(kube, "/api/v1/namespaces/bench-old/pods",
                         [bound_pod(i, names[i % len(names)]) for i in range(pods)], parallel=128)


async def main_async(args) -> None:
    async with cp.bench_cluster("bench-restart-", qps_connections=128) as (cluster, kube, workdir):
        t0 = time.monotonic()
        await populate(kube, args.nodes, args.pods)
        print(f"setup: {args.nodes} nodes, {args.pods} bound pods in {time.monotonic() - t0:.0f}s")
        await submit_gang(kube, "g")
        start = time.monotonic()
        proc = cp.start_batchsched(cluster.kubeconfig, workdir, POOL, log_level="INFO")
        log_path = workdir / f"batchsched-{POOL}.log"
        try:
            first, _ = await cp.wait_all_bound(kube, "bench-new", 1, timeout=900)
            rss_first = peak_rss_mib(proc.pid)
            start_lists = listed_in(log_path.read_bytes().decode(errors="replace"))
            await cp.wait_all_bound(kube, "bench-new", 8, timeout=900)
            offset = log_path.stat().st_size
            asked = time.monotonic()
            proc.send_signal(signal.SIGUSR1)
            lists = await relisted(log_path, offset)
            relist_done = time.monotonic()
            await submit_gang(kube, "g2")
            await cp.wait_all_bound(kube, "bench-new", 16, timeout=900)
            rss = peak_rss_mib(proc.pid)
        finally:
            cp.stop(proc)
    objects, pages, seconds = lists["pods"]
    print(f"restart to first bind: {first - start:.1f} s; scheduler peak RSS then: {rss_first:.0f} MiB")
    print("  its lists at the start (objects, pages, seconds each took): " + ", ".join(
        f"{kind} {n} / {p} / {t:.1f} s" for kind, (n, p, t) in sorted(start_lists.items()) if kind in KINDS))
    print(f"forced relist of every collection: {relist_done - asked:.1f} s (pods: {objects} in {pages} pages, "
          f"{seconds:.1f} s); a new gang bound after it; peak RSS over the whole run: {rss:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
