"""Command line: ``batchsched run | explain | demo``."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time

from batchsched.config import load_config


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def _run(args: argparse.Namespace) -> int:
    from batchsched.shell.kube import Kube
    from batchsched.shell.scheduler import Scheduler

    config = load_config(args.config)
    _setup_logging(config.log_level)
    kube = await Kube.connect(args.kubeconfig)
    scheduler = Scheduler(kube, config)
    task = asyncio.create_task(scheduler.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        logging.getLogger("batchsched").info("stopping")
    finally:
        await kube.close()
    return 0


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

    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return asyncio.run(_run(args))
        if args.command == "explain":
            return asyncio.run(_explain(args))
        from batchsched.demo import run_demo
        return run_demo()
    except (OSError, ValueError) as exc:
        print(f"batchsched: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
