"""Command line: ``batchsched run | explain | demo | topo parse``."""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from batchsched.config import load_config


async def _run(args: argparse.Namespace) -> int:
    from batchsched.shell.logs import setup_logging
    from batchsched.shell.replica import run_replica

    config = load_config(args.config)
    setup_logging(config.log_level, config.log_format)
    return await run_replica(args.kubeconfig, config)


async def _explain(args: argparse.Namespace) -> int:
    from batchsched.core.explain import explain_gang
    from batchsched.shell.cache import ClusterCache
    from batchsched.shell.kube import ApiError, Kube

    config = load_config(args.config)
    kube = await Kube.connect(args.kubeconfig)
    try:
        cache = ClusterCache(config.scheduler_name, config.node_selector)
        for reflector in cache.reflectors(kube):
            try:
                items, _ = await reflector.list_once()
            except ApiError as exc:
                if exc.not_found and reflector.kind == "podgroups":
                    items = []  # the CRD is not installed: no PodGroups
                else:
                    raise
            reflector.replace(items)
        key = args.gang if "/" in args.gang else f"default/{args.gang}"
        print(explain_gang(cache.snapshot(time.time()), key))
    finally:
        await kube.close()
    return 0


def _topo_parse(args: argparse.Namespace) -> int:
    from batchsched.core.topology.model import TopologyError
    from batchsched.core.topology.report import render

    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    try:
        print(render(text, args.format, args.numa_memory), end="")
    except TopologyError as exc:  # names the line and the problem
        print(f"batchsched: {args.file}: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="batchsched", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p_run = sub.add_parser("run", help="run the scheduler")
    p_run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    p_run.add_argument("--config", help="scheduler config YAML (configs/scheduler.yaml documents it)")

    p_explain = sub.add_parser("explain", help="why is a gang pending, node by node")
    p_explain.add_argument("gang", metavar="NAMESPACE/PODGROUP")
    p_explain.add_argument("--kubeconfig")
    p_explain.add_argument("--config")

    sub.add_parser("demo", help="the embedded default: a local control plane, GPU nodes and a sample gang")

    p_topo = sub.add_parser("topo", help="GPU topology tools").add_subparsers(dest="topo_command", required=True)
    p_parse = p_topo.add_parser("parse", help="read `nvidia-smi topo -m` output (FILE, or - for stdin)")
    p_parse.add_argument("file", metavar="FILE")
    p_parse.add_argument("--format", choices=("text", "json", "annotation"), default="text",
                         help="text: a summary; annotation: the value of the node annotation "
                              "scheduling.batchsched.io/gpu-topology; json: the same, indented")
    p_parse.add_argument("--numa-memory", default="", metavar="N=QTY,...",
                         help="memory of each NUMA node, e.g. 0=256Gi,1=256Gi (the matrix does not show it)")

    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return asyncio.run(_run(args))
        if args.command == "explain":
            return asyncio.run(_explain(args))
        if args.command == "topo":
            return _topo_parse(args)
        from batchsched.demo import run_demo
        return run_demo()
    except (OSError, ValueError) as exc:
        print(f"batchsched: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
