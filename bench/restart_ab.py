"""Start to first bind of two source trees, alternated on one cluster.

    .venv/bin/python bench/restart_ab.py --baseline /tmp/before [--nodes 5000] [--pods 50000] [--rounds 6]

``bench/restart.py`` measures one start on a fresh cluster, and the API
server's pace differs from one cluster (and minute) to the next by more
than many changes gain.  This sets up one cluster as restart.py does
(``--nodes`` unmanaged 8-GPU nodes, ``--pods`` pods already bound to them),
then starts ``batchsched run`` from this tree and from ``--baseline`` (a
checkout of another commit, e.g. ``git worktree add /tmp/before HEAD~3``)
in turn, each round in the other order, each start with an 8-pod gang of
its own to bind.  Per start it prints the time from process start to the
gang's first pod bound (seen on a watch), the pods and nodes lists' times
from the scheduler's log, its peak RSS then, and the CPU seconds it and the
API server spent up to then; then each tree's medians.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import controlplane as cp  # noqa: E402  (shares the cluster helpers)
import restart as rs  # noqa: E402
import yaml  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


async def one_start(kube, cluster, workdir: Path, tree: Path, gang: str, bound_before: int) -> dict[str, float]:
    config = workdir / "batchsched.yaml"
    log = workdir / f"{gang}.log"
    await rs.submit_gang(kube, gang)
    apiserver = cluster.pids["kube-apiserver"]
    apiserver_before = cp.process_cpu_seconds(apiserver)
    start = time.monotonic()
    # cwd first on sys.path (-m): the tree's own batchsched, whatever the venv installed
    proc = subprocess.Popen([sys.executable, "-m", "batchsched", "run", "--kubeconfig", str(cluster.kubeconfig),
                             "--config", str(config)], cwd=tree, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        first, _ = await cp.wait_all_bound(kube, "bench-new", bound_before + 1, timeout=900)
        row = {"first bind s": first - start, "RSS MiB": rs.peak_rss_mib(proc.pid),
               "own CPU s": cp.process_cpu_seconds(proc.pid),
               "API server CPU s": cp.process_cpu_seconds(apiserver) - apiserver_before}
        await cp.wait_all_bound(kube, "bench-new", bound_before + 8, timeout=900)
    finally:
        cp.stop(proc)
    lists = rs.listed_in(log.read_text(errors="replace"))
    row["pods list s"], row["nodes list s"] = lists["pods"][2], lists["nodes"][2]
    return row


async def main_async(args) -> None:
    trees = {"this tree": HERE, "baseline": args.baseline.resolve()}
    for tree in trees.values():
        cp.as_installed(tree)
    async with cp.bench_cluster("bench-restart-ab-", qps_connections=128) as (cluster, kube, workdir):
        await rs.populate(kube, args.nodes, args.pods)
        (workdir / "batchsched.yaml").write_text(yaml.safe_dump(
            {"nodeSelector": {"bench-pool": rs.POOL}, "logLevel": "INFO", "statusMinIntervalSeconds": 5,
             "metricsBindAddress": "", "leaderElection": {"enabled": False}}))
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for r in range(args.rounds):
            for i, name in enumerate(sorted(trees, reverse=r % 2 == 1)):
                row = await one_start(kube, cluster, workdir, trees[name], f"g{r}-{i}", 8 * (2 * r + i))
                rows[name].append(row)
                print(f"round {r} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    print(f"\n{args.nodes} nodes, {args.pods} bound pods; medians of {args.rounds} starts each")
    columns = list(rows["this tree"][0])
    print("| tree | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, measured in rows.items():
        print(f"| {name} | " + " | ".join(f"{statistics.median(r[c] for r in measured):.2f}" for c in columns) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the tree to compare with")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=6)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
