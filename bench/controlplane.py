"""Binding throughput against the real control plane (local, kwok nodes).

    .venv/bin/python bench/controlplane.py [--nodes 500] [--pods 4000] [--gang 8] [--rounds 3] [--only-ab]

One run, one fresh control plane, three contenders on the same nodes and the
same number of pending pods (1 GPU each), each measured from "pods exist and
the binder is ready" to "the API server has every pod bound" (seen on a
watch, i.e. at binding, not at Running):

(a) null binder: binds pod i to node i mod N through batchsched's own client
    stack (kube.client.Kube.bind, same parallelism), no decisions: the ceiling;
(b) batchsched (`batchsched run` as its own process), pods in gangs;
(c) the harness's kube-scheduler on plain pods, once with client QPS/burst
    5000 (no client limit, like ours) and once with its defaults.

Each contender starts once kwok has started the previous one's pods, so
their status updates do not compete with it.  A pool's nodes exist only
while its contender runs: with every pool's nodes created at once (13
pools of 500 for ``--rounds 5``), the API server and etcd used 1.4 of this
machine's 2 cores over the 5 s after, with no contender running (kwok
taking up and leasing 6,500 nodes); with one pool's, 0.02.  (a) and (b) run ``--rounds``
times, alternating which goes first, each round on pools of its own; the
table gives the median round of each and every round's ratio.  Then one
256-pod gang, once batchsched has bound a probe pod: latency from the last
member's creation (the moment
the gang becomes eligible) to all 256 bound, with batchsched already running.

Prints a Markdown table of pods/s and ratios to (a), and batchsched's CPU
seconds from its first binding to its last (its own process, read from
/proc), per 1,000 pods and as a share of one core over that window: a
share well below 1 says its process waits on the API server rather than
on its own work.
"""
from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import AsyncIterator, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT))

import localcluster  # noqa: E402
import yaml  # noqa: E402

from batchsched.api import constants  # noqa: E402
from batchsched.kube.client import Kube  # noqa: E402

GPU = constants.GPU_RESOURCE
PROFILE_DIR: Path | None = None  # --profile: where batchsched's cProfile output goes


def node_body(name: str, pool: str) -> dict:
    res = {"cpu": "128", "memory": "2Ti", "pods": "110", GPU: "8"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"batchsched.io/simulated": "true", "bench-pool": pool}},
            "status": {"capacity": res, "allocatable": res,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}


def pod_body(name: str, ns: str, scheduler: str, group: str | None = None, pool: str = "") -> dict:
    labels = {constants.POD_GROUP_LABEL: group} if group else {}
    spec = {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "x", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {GPU: "1"}}}]}
    if pool:
        spec["nodeSelector"] = {"bench-pool": pool}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": spec}


async def create_many(kube: Kube, path: str, bodies: list[dict], parallel: int = 64) -> None:
    sem = asyncio.Semaphore(parallel)

    async def one(body):
        async with sem:
            await kube.request("POST", path, body=body)
    await asyncio.gather(*(one(b) for b in bodies))


async def wait_all_bound(kube: Kube, ns: str, count: int, timeout: float = 600,
                         on_first: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """Watch the namespace until ``count`` pods are bound; returns the
    monotonic times the first and the last binding were seen (``on_first``
    is called at the first)."""
    first = None
    listing = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods")
    bound = {p["metadata"]["uid"] for p in listing["items"] if p["spec"].get("nodeName")}
    rv = listing["metadata"]["resourceVersion"]
    deadline = time.monotonic() + timeout
    while len(bound) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(bound)}/{count} bound")
        async for ev in kube.watch(f"/api/v1/namespaces/{ns}/pods", rv, timeout_seconds=60):
            obj = ev["object"]
            rv = obj["metadata"].get("resourceVersion", rv)
            if ev["type"] in ("ADDED", "MODIFIED") and obj["spec"].get("nodeName"):
                if first is None:
                    first = time.monotonic()
                    on_first()
                bound.add(obj["metadata"]["uid"])
                if len(bound) >= count:
                    break
    return first or time.monotonic(), time.monotonic()


async def settle(kube: Kube, ns: str, count: int, timeout: float = 300) -> None:
    """Until kwok has started every pod of the last contender (their status
    updates would otherwise compete with the next contender), then 1 s more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods")
        if sum(1 for p in listing["items"] if (p.get("status") or {}).get("phase") == "Running") >= count:
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(1)


class Rate:
    """Pods/s from the start of work (process start, or first bind call for
    the null binder) and in steady state (first to last binding seen)."""

    def __init__(self, count: int, start: float, first: float, last: float, cpu_binding: float | None = None,
                 events_binding: int | None = None, server_cpu_binding: float | None = None,
                 requests: Counter | None = None):
        self.overall = count / (last - start)
        self.steady = (count - 1) / max(last - first, 1e-9)
        self.startup = first - start
        # CPU seconds the contender's process spent from its first binding to
        # its last, per 1,000 pods (batchsched only: the null binder shares
        # its process with the harness).
        self.cpu_per_1000 = None if cpu_binding is None else cpu_binding * 1000 / count
        self.cpu_share = None if cpu_binding is None else cpu_binding / max(last - first, 1e-9)
        # Events the contender created in the namespace from the second of its
        # first binding to that of its last (batchsched only): writes that
        # shared the API server with its bindings.
        self.events_binding = events_binding
        # CPU seconds the API server and etcd spent over the same window, per
        # 1,000 pods: what the contender's bindings, watches and other writes
        # cost the control plane.
        self.server_cpu_per_1000 = None if server_cpu_binding is None else server_cpu_binding * 1000 / count
        # The requests the API server served over the same window, by verb,
        # resource and subresource (every client's: kwok's and the harness's too).
        self.requests = requests


async def events_within(kube: Kube, ns: str, first: float, last: float) -> int:
    """Events in ``ns`` first recorded within the seconds of monotonic
    times ``first`` .. ``last`` (Events carry whole seconds)."""
    to_wall = time.time() - time.monotonic()
    since, until = int(first + to_wall), int(last + to_wall) + 1
    listing = await kube.request("GET", f"/api/v1/namespaces/{ns}/events")
    stamps = [item.get("firstTimestamp") or "" for item in listing.get("items") or ()]
    return sum(1 for stamp in stamps if stamp and since <= datetime.fromisoformat(
        stamp.replace("Z", "+00:00")).timestamp() < until)


async def request_counts(kube: Kube) -> Counter:
    """The API server's apiserver_request_total (its /metrics), summed by
    verb, resource and subresource ("pods/binding")."""
    text = await kube.request("GET", "/metrics", decode=bytes.decode)
    counts: Counter = Counter()
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels, _, value = line.rpartition(" ")
            fields = dict(part.split("=", 1) for part in labels[len("apiserver_request_total{"):-1].split(","))
            fields = {k: v.strip('"') for k, v in fields.items()}
            kind = fields.get("resource", "") + ("/" + fields["subresource"] if fields.get("subresource") else "")
            counts[f"{fields.get('verb', '')} {kind}"] += int(float(value))
    return counts


class RequestWindow:
    """The API server's request counts from the first binding (``opened``,
    called from a watch callback) to ``closed``."""

    def __init__(self, kube: Kube):
        self._kube = kube
        self._at_first: asyncio.Task | None = None

    def opened(self) -> None:
        self._at_first = asyncio.get_running_loop().create_task(request_counts(self._kube))

    async def closed(self) -> Counter:
        after = await request_counts(self._kube)
        return after - await self._at_first if self._at_first is not None else Counter()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_null_binder(kube: Kube, ns: str, nodes: list[str], count: int, parallel: int,
                          server_cpu: Callable[[], float]) -> Rate:
    await create_many(kube, f"/api/v1/namespaces/{ns}/pods",
                      [pod_body(f"p{i}", ns, "null-binder") for i in range(count)])
    listing = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods")
    pods = [(p["metadata"]["name"], p["metadata"]["uid"]) for p in listing["items"]]
    sem = asyncio.Semaphore(parallel)
    start = time.monotonic()

    async def bind(i, name, uid):
        async with sem:
            await kube.bind(ns, name, uid, nodes[i % len(nodes)])
    server_at_first: list[float] = []
    window = RequestWindow(kube)
    watcher = asyncio.create_task(wait_all_bound(kube, ns, count, on_first=lambda: (
        server_at_first.append(server_cpu()), window.opened())))
    await asyncio.gather(*(bind(i, n, u) for i, (n, u) in enumerate(pods)))
    first, last = await watcher
    return Rate(count, start, first, last, server_cpu_binding=server_cpu() - server_at_first[0],
                requests=await window.closed())


def as_installed(tree: Path) -> None:
    """Give ``tree``'s batchsched the bytecode an install gives it.

    ``pip install`` (the image's) writes every module's .pyc; a checkout has
    none, and with PYTHONDONTWRITEBYTECODE set (as on our machines) every
    start from it compiles ~75 modules from source again (~0.1 s of
    CPU: bench/history/RESULTS-until-2026-12-06.md, "Fewer, larger list
    pages; starts timed as installed").  Modules already compiled are skipped.
    """
    if not compileall.compile_dir(tree / "batchsched", quiet=1):
        raise RuntimeError(f"{tree}/batchsched does not compile")


def start_batchsched(kubeconfig: Path, workdir: Path, pool: str, log_level: str = "WARNING") -> subprocess.Popen:
    """batchsched restricted to the nodes of ``pool``; its log is workdir/batchsched-POOL.log."""
    config = workdir / f"batchsched-{pool}.yaml"
    config.write_text(yaml.safe_dump({"nodeSelector": {"bench-pool": pool}, "logLevel": log_level,
                                      "statusMinIntervalSeconds": 5, "metricsBindAddress": "",
                                      "leaderElection": {"enabled": False}}))
    profile = ["-m", "cProfile", "-o", str(PROFILE_DIR / f"batchsched-{pool}.prof")] if PROFILE_DIR else []
    return subprocess.Popen([sys.executable, *profile, "-m", "batchsched", "run", "--kubeconfig", str(kubeconfig),
                             "--config", str(config)], cwd=ROOT,
                            stdout=open(workdir / f"batchsched-{pool}.log", "wb"), stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, and SIGKILL if it has not exited within 30 s (a bench must end)."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        print(f"pid {proc.pid} ignored SIGTERM for 30 s; killed", file=sys.stderr)
        proc.kill()
        proc.wait()


async def run_batchsched(kube: Kube, kubeconfig: Path, workdir: Path, ns: str, pool: str,
                         count: int, gang: int, server_cpu: Callable[[], float]) -> Rate:
    groups = f"/apis/{constants.API_VERSION}/namespaces/{ns}/podgroups"
    await create_many(kube, groups, [{"apiVersion": constants.API_VERSION, "kind": "PodGroup",
                                      "metadata": {"name": f"g{g}", "namespace": ns},
                                      "spec": {"minMember": gang}} for g in range(count // gang)])
    await create_many(kube, f"/api/v1/namespaces/{ns}/pods",
                      [pod_body(f"g{i // gang}-{i % gang}", ns, "batchsched", f"g{i // gang}")
                       for i in range(count)])
    start = time.monotonic()
    proc = start_batchsched(kubeconfig, workdir, pool)
    cpu_at_first: list[float] = []
    window = RequestWindow(kube)
    try:
        first, last = await wait_all_bound(kube, ns, count, on_first=lambda: (cpu_at_first.extend(
            (process_cpu_seconds(proc.pid), server_cpu())), window.opened()))
        cpu, server = process_cpu_seconds(proc.pid) - cpu_at_first[0], server_cpu() - cpu_at_first[1]
        requests = await window.closed()
        return Rate(count, start, first, last, cpu, await events_within(kube, ns, first, last), server, requests)
    finally:
        stop(proc)


async def run_kube_scheduler(kube: Kube, kubeconfig: Path, workdir: Path, ns: str, pool: str,
                             count: int, qps: int | None) -> Rate:
    await create_many(kube, f"/api/v1/namespaces/{ns}/pods",
                      [pod_body(f"p{i}", ns, f"kube-{pool}", pool=pool) for i in range(count)])
    bins = localcluster.build_all()
    cfg = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
           "clientConnection": {"kubeconfig": str(kubeconfig), **({"qps": qps, "burst": qps} if qps else {})},
           "leaderElection": {"leaderElect": False}, "profiles": [{"schedulerName": f"kube-{pool}"}]}
    path = workdir / f"kube-scheduler-{pool}.yaml"
    path.write_text(json.dumps(cfg))
    start = time.monotonic()
    proc = subprocess.Popen([str(bins["kube-scheduler"]), f"--config={path}",
                             f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
                             "--bind-address=127.0.0.1", f"--secure-port={localcluster.free_port()}"],
                            stdout=open(workdir / f"kube-scheduler-{pool}.log", "wb"), stderr=subprocess.STDOUT)
    try:
        return Rate(count, start, *(await wait_all_bound(kube, ns, count)))
    finally:
        stop(proc)


async def gang_latency(kube: Kube, kubeconfig: Path, workdir: Path, ns: str, pool: str, size: int) -> float:
    proc = start_batchsched(kubeconfig, workdir, pool)
    try:
        # A one-pod probe bound proves it has listed the cluster and schedules.
        await kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=pod_body("probe", ns, "batchsched"))
        await wait_all_bound(kube, ns, 1)
        await kube.request("POST", f"/apis/{constants.API_VERSION}/namespaces/{ns}/podgroups",
                           body={"apiVersion": constants.API_VERSION, "kind": "PodGroup",
                                 "metadata": {"name": "big", "namespace": ns}, "spec": {"minMember": size}})
        await create_many(kube, f"/api/v1/namespaces/{ns}/pods",
                          [pod_body(f"big-{i}", ns, "batchsched", "big") for i in range(size)])
        eligible = time.monotonic()
        return (await wait_all_bound(kube, ns, size + 1))[1] - eligible
    finally:
        stop(proc)


@contextlib.asynccontextmanager
async def bench_cluster(prefix: str, **connect) -> AsyncIterator[tuple[localcluster.Cluster, Kube, Path]]:
    """A local control plane of the benchmark's own with the PodGroup CRD
    installed: (cluster, admin client, scratch dir), all gone afterwards.
    This tree's batchsched is compiled first, so every start is timed as
    installed."""
    as_installed(ROOT)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        workdir = Path(tmp)
        cluster = localcluster.up(workdir / "cluster", with_scheduler=False, die_with_parent=True)
        kube = await Kube.connect(str(cluster.kubeconfig), **connect)
        try:
            crd = yaml.safe_load((ROOT / "crds" / "podgroup.yaml").read_text())
            await kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
            yield cluster, kube, workdir
        finally:
            await kube.close()
            localcluster.down(workdir / "cluster")


async def main_async(args) -> None:
    async with bench_cluster("bench-cp-") as (cluster, kube, workdir):
        rounds = range(args.rounds)
        pools = ([f"null{r}" for r in rounds] + [f"batchsched{r}" for r in rounds]
                 + ["kube-fast", "kube-default", "gang"])
        for pool in pools:
            await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": f"bench-{pool}"}})
        node_names = {pool: [f"{pool}-{i:04d}" for i in range(args.nodes)] for pool in pools}
        null_rates, ours = [], []

        def server_cpu() -> float:
            return sum(process_cpu_seconds(cluster.pids[name]) for name in ("kube-apiserver", "etcd"))

        @contextlib.asynccontextmanager
        async def nodes_of(pool: str, pods: int = args.pods) -> AsyncIterator[None]:
            """The pool's nodes while its contender runs and kwok starts its
            ``pods``, then deleted: kwok renews a Lease for every node it
            keeps, at a cost to the API server and etcd
            (bench/history/RESULTS-until-2026-12-06.md, "One pool's nodes at a time")."""
            await create_many(kube, "/api/v1/nodes", [node_body(n, pool) for n in node_names[pool]])
            await asyncio.sleep(2)
            try:
                yield
                if pods:
                    await settle(kube, f"bench-{pool}", pods)
            finally:
                await kube.request("DELETE", "/api/v1/nodes", query={"labelSelector": f"bench-pool={pool}"})

        node_names["idle"] = [f"idle-{i:04d}" for i in range(args.nodes)]
        async with nodes_of("idle", pods=0):
            before, idle_from = server_cpu(), time.monotonic()
            await asyncio.sleep(5)  # what the control plane spends with one pool and no contender
            idle_share = (server_cpu() - before) / (time.monotonic() - idle_from)
        for r in rounds:  # alternating who goes first, each on its own pool
            for contender in (("null", "batchsched") if r % 2 == 0 else ("batchsched", "null")):
                pool = f"{contender}{r}"
                async with nodes_of(pool):
                    if contender == "null":
                        null_rates.append(await run_null_binder(kube, f"bench-{pool}", node_names[pool],
                                                                args.pods, args.parallel, server_cpu))
                    else:
                        ours.append(await run_batchsched(kube, cluster.kubeconfig, workdir, f"bench-{pool}",
                                                         pool, args.pods, args.gang, server_cpu))
        results = {"(a) null binder": median_rate(null_rates), "(b) batchsched": median_rate(ours)}
        latency = None
        if not args.only_ab:
            async with nodes_of("kube-fast"):
                results["(c) kube-scheduler, QPS 5000"] = await run_kube_scheduler(
                    kube, cluster.kubeconfig, workdir, "bench-kube-fast", "kube-fast", args.pods, 5000)
            async with nodes_of("kube-default"):
                results["(c) kube-scheduler, default QPS"] = await run_kube_scheduler(
                    kube, cluster.kubeconfig, workdir, "bench-kube-default", "kube-default", args.pods, None)
            async with nodes_of("gang", pods=0):
                latency = await gang_latency(kube, cluster.kubeconfig, workdir, "bench-gang", "gang", 256)
    ceiling = results["(a) null binder"]
    print(f"\n{args.nodes} nodes x 8 GPUs per contender, {args.pods} pending 1-GPU pods "
          f"(batchsched: gangs of {args.gang}), binding parallelism {args.parallel}, "
          f"(a) and (b) the median of {args.rounds} rounds\n")
    print("| contender | steady pods bound/s | ratio to (a) | start to first bind (s) | "
          "overall pods/s incl. start |\n|---|---|---|---|---|")
    for name, rate in results.items():
        print(f"| {name} | {rate.steady:.0f} | {rate.steady / ceiling.steady:.2f} | {rate.startup:.2f} | "
              f"{rate.overall:.0f} |")
    print("\nbatchsched's CPU from its first binding to its last, each round: seconds per 1,000 pods "
          + ", ".join(f"{b.cpu_per_1000:.2f}" for b in ours) + "; share of one core "
          + ", ".join(f"{b.cpu_share:.2f}" for b in ours))
    print("Events batchsched created during its binding window, each round: "
          + ", ".join(str(b.events_binding) for b in ours) + f" (of {args.pods} pods bound)")
    print("API server and etcd CPU from the first binding to the last, seconds per 1,000 pods, each round: "
          "null binder " + ", ".join(f"{a.server_cpu_per_1000:.2f}" for a in null_rates)
          + "; batchsched " + ", ".join(f"{b.server_cpu_per_1000:.2f}" for b in ours)
          + f" (with one pool's nodes and no contender they use {idle_share:.2f} of a core, "
            "which a longer window adds to)")
    for name, rates in (("null binder", null_rates), ("batchsched", ours)):
        total = sum((r.requests for r in rates if r.requests is not None), Counter())
        print(f"API requests over {name}'s binding windows, per 1,000 pods (all clients): " + ", ".join(
            f"{kind} {n * 1000 / (args.pods * len(rates)):.0f}" for kind, n in total.most_common(12)))
    print("\nper round, steady pods/s (a) / (b) = ratio: " + "; ".join(
        f"{a.steady:.0f} / {b.steady:.0f} = {b.steady / a.steady:.2f}" for a, b in zip(null_rates, ours)))
    if latency is not None:
        print(f"\n256-pod gang, eligible to all bound: {latency * 1000:.0f} ms")


def median_rate(rates: list[Rate]) -> Rate:
    """The round with the median steady rate."""
    return sorted(rates, key=lambda r: r.steady)[len(rates) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--gang", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (a) and (b), alternating which goes first")
    parser.add_argument("--profile", type=Path, help="write cProfile output of each batchsched run here")
    parser.add_argument("--only-ab", action="store_true",
                        help="only (a) and (b): no kube-scheduler, no 256-pod gang (quicker, for comparing changes)")
    args = parser.parse_args()
    global PROFILE_DIR
    PROFILE_DIR = args.profile
    asyncio.run(main_async(args))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
