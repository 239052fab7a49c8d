"""Binding throughput with extended-resource claims against without, in one run.

    .venv/bin/python bench/dra_claims.py [--nodes 40] [--pods 256] [--gang 8] [--big 256]

One fresh local control plane, two pools of DGX-1-like kwok nodes: one
advertising ``nvidia.com/gpu`` (the device plugin: batchsched only binds),
one serving it through DRA only (NVIDIA's DeviceClass, a ResourceSlice per
node: batchsched creates, allocates and reserves each pod's claim and
patches its status before binding).  The same pending 1-GPU pods in gangs
of ``--gang`` go to each pool in turn, with ``bench/controlplane.py``'s
measure (process start, then first to last binding seen on a watch).
Then one ``--big``-pod gang with claims, from eligible to all bound, with
batchsched already running; and, for the API server's own pace, as many
claims created and allocated by a bare client.  Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from controlplane import (  # noqa: E402
    GPU, Rate, bench_cluster, create_many, node_body, pod_body, settle, start_batchsched, stop, wait_all_bound,
)

from batchsched.api import constants  # noqa: E402
from batchsched.core.topology.annotation import to_annotation  # noqa: E402
from batchsched.core.topology.parse import parse_topo  # noqa: E402
from batchsched.kube.client import Kube  # noqa: E402
from tests.support import dra  # noqa: E402

DGX1 = ROOT / "tests" / "fixtures" / "topologies" / "dgx1-hybrid-cube-mesh-8gpu.txt"


async def add_nodes(kube: Kube, pool: str, count: int, through_dra: bool) -> None:
    names = [f"{pool}-{i:04d}" for i in range(count)]
    bodies = []
    for name in names:
        topology = dra.identified(parse_topo(DGX1.read_text()), name)
        body = node_body(name, pool)
        body["metadata"]["annotations"] = {constants.GPU_TOPOLOGY_ANNOTATION: to_annotation(topology)}
        if through_dra:
            without_gpu = {k: v for k, v in body["status"]["allocatable"].items() if k != GPU}
            body["status"].update(capacity=without_gpu, allocatable=without_gpu)
            await kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices",
                               body=dra.resource_slice(name, topology))
        bodies.append(body)
    await create_many(kube, "/api/v1/nodes", bodies)


async def gangs(kube: Kube, ns: str, prefix: str, count: int, size: int) -> None:
    await create_many(kube, f"/apis/{constants.API_VERSION}/namespaces/{ns}/podgroups", [
        {"apiVersion": constants.API_VERSION, "kind": "PodGroup", "metadata": {"name": f"{prefix}{g}", "namespace": ns},
         "spec": {"minMember": size}} for g in range(count // size)])
    await create_many(kube, f"/api/v1/namespaces/{ns}/pods", [
        pod_body(f"{prefix}{i // size}-{i % size}", ns, "batchsched", f"{prefix}{i // size}") for i in range(count)])


async def throughput(kube: Kube, kubeconfig: Path, workdir: Path, pool: str, count: int, size: int) -> Rate:
    await gangs(kube, f"bench-{pool}", "g", count, size)
    start = time.monotonic()
    proc = start_batchsched(kubeconfig, workdir, pool)
    try:
        return Rate(count, start, *(await wait_all_bound(kube, f"bench-{pool}", count)))
    finally:
        stop(proc)


async def big_gang(kube: Kube, kubeconfig: Path, workdir: Path, pool: str, size: int) -> float:
    ns = f"bench-{pool}"
    proc = start_batchsched(kubeconfig, workdir, pool)
    try:
        await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod_body("probe", ns, "batchsched"))
        await wait_all_bound(kube, ns, 1)
        await gangs(kube, ns, "big", size, size)
        eligible = time.monotonic()
        return (await wait_all_bound(kube, ns, size + 1))[1] - eligible
    finally:
        stop(proc)


async def bare_claim_writes(kube: Kube, ns: str, count: int, in_flight: int) -> float:
    """The API server's own pace for what a claim costs it, with no scheduler:
    ``count`` claims created and allocated (2 writes each) by a bare client,
    ``in_flight`` at a time, as batchsched's claim writer does; seconds."""
    slots = asyncio.Semaphore(in_flight)
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"

    async def one(i: int) -> None:
        async with slots:
            claim = await kube.request("POST", path, body={
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"generateName": f"bare-{i}-", "namespace": ns},
                "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
                    "deviceClassName": dra.GPU_CLASS, "allocationMode": "ExactCount", "count": 1}}]}}})
            claim["status"] = {"allocation": {
                "devices": {"results": [{"request": "container-0-request-0", "driver": dra.DRIVER,
                                         "pool": "bare", "device": f"gpu-{i % 8}"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["bare"]}]}]}}}
            await kube.request("PUT", f"{path}/{claim['metadata']['name']}/status", body=claim)

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(count)))
    return time.monotonic() - started


async def claims_of(kube: Kube, ns: str) -> int:
    return len((await kube.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"))["items"])


async def main_async(args) -> None:
    async with bench_cluster("bench-dra-") as (cluster, kube, workdir):
        await kube.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body=dra.device_class())
        pools = {"plugin": False, "dra": True, "big": True}
        for pool, through_dra in pools.items():
            await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": f"bench-{pool}"}})
            nodes = args.nodes if pool != "big" else -(-(args.big + 1) // 8)
            await add_nodes(kube, pool, nodes, through_dra)
        await asyncio.sleep(2)
        results = {}
        for pool, label in (("plugin", "device plugin (binding only)"), ("dra", "DRA (claim, then binding)")):
            results[label] = await throughput(kube, cluster.kubeconfig, workdir, pool, args.pods, args.gang)
            await settle(kube, f"bench-{pool}", args.pods)
        claims = await claims_of(kube, "bench-dra")
        latency = await big_gang(kube, cluster.kubeconfig, workdir, "big", args.big)
        big_claims = await claims_of(kube, "bench-big")
        await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "bench-bare"}})
        bare = await bare_claim_writes(kube, "bench-bare", args.big, 32)
    print(f"\n{args.nodes} DGX-1-like nodes per pool, {args.pods} pending 1-GPU pods in gangs of {args.gang}\n")
    print("| pool | steady pods bound/s | start to first bind (s) | overall pods/s incl. start |\n|---|---|---|---|")
    for label, rate in results.items():
        print(f"| {label} | {rate.steady:.0f} | {rate.startup:.2f} | {rate.overall:.0f} |")
    plugin, claimed = results.values()
    print(f"\nwith claims / without: {claimed.steady / plugin.steady:.2f} (steady); "
          f"{claims} claims written for {args.pods} pods")
    print(f"\n{args.big}-pod gang with claims, eligible to all bound: {latency * 1000:.0f} ms "
          f"({big_claims} claims)")
    print(f"\nthe API server alone, a bare client: {args.big} claims created and allocated (2 writes each, "
          f"32 in flight) in {bare * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--pods", type=int, default=256)
    parser.add_argument("--gang", type=int, default=8)
    parser.add_argument("--big", type=int, default=256)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
