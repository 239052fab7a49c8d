"""``batchsched node-agent``: flags and the loop (docs/node-agent.md)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Callable

from batchsched.core.topology.annotation import to_annotation
from batchsched.core.topology.model import TopologyError
from batchsched.nodeagent.backends import BACKENDS, backend_named

log = logging.getLogger("batchsched.nodeagent")
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def add_node_agent_parser(sub, add_connection_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("node-agent", help="report this node's GPU topology (run on every GPU node, "
                                          "deploy/node-agent/)")
    p.add_argument("--node", default=os.environ.get("NODE_NAME", ""),
                   help="this node's name (default: $NODE_NAME, set from spec.nodeName in the DaemonSet)")
    p.add_argument("--backend", choices=tuple(BACKENDS), default="auto",
                   help="; ".join(f"{k}: {v}" for k, v in BACKENDS.items()) + " (default: %(default)s)")
    p.add_argument("--nvidia-smi", default="nvidia-smi", metavar="PATH", help="the nvidia-smi the text backend runs")
    p.add_argument("--sys-root", type=Path, default=Path("/sys"), metavar="DIR",
                   help="where the host's /sys is mounted, for NUMA memory (default: %(default)s)")
    p.add_argument("--interval", type=float, default=60.0, metavar="SECONDS",
                   help="seconds between two reports (default: %(default)s)")
    p.add_argument("--pod-resources-socket", default=DEFAULT_POD_RESOURCES_SOCKET, metavar="PATH",
                   help="the kubelet's PodResources gRPC socket, read to verify which GPUs each pod got; "
                        "\"\" turns the verifier off (default: %(default)s)")
    p.add_argument("--metrics-bind-address", default=":9402", metavar="HOST:PORT",
                   help="serve /healthz, /readyz and /metrics there; \"0\" turns it off (default: %(default)s)")
    p.add_argument("--once", action="store_true", help="report (and verify) once and exit")
    p.add_argument("--print", action="store_true",
                   help="print the topology annotation it would write, write nothing, contact no cluster")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default: %(default)s)")
    add_connection_flags(p)


def run_node_agent(args: argparse.Namespace) -> int:
    backend = backend_named(args.backend, args.nvidia_smi, args.sys_root)
    if args.print:
        try:
            print(to_annotation(backend.read()))
        except TopologyError as exc:
            print(f"batchsched: node-agent: {backend.name}: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.node:
        print("batchsched: node-agent: --node (or $NODE_NAME) is required to write the node", file=sys.stderr)
        return 2
    from batchsched.shell.logs import setup_logging

    setup_logging(args.log_level)
    return asyncio.run(_loop(args, backend))


async def _loop(args: argparse.Namespace, backend) -> int:
    import grpc

    from batchsched.kube.client import ApiError, Kube
    from batchsched.kube.events import EventRecorder
    from batchsched.nodeagent.agent import COMPONENT, AgentMetrics, Reporter, Verifier
    from batchsched.nodeagent.report import KubeletView
    from batchsched.shell.server import serve

    kube = await Kube.connect(args.kubeconfig, context=args.context)
    events = EventRecorder(kube, COMPONENT)
    metrics = AgentMetrics()
    reporter = Reporter(kube, args.node, backend, events)
    verifier = Verifier(kube, args.node, args.pod_resources_socket, events, metrics) \
        if args.pod_resources_socket else None
    runner = await serve(args.metrics_bind_address, metrics, lambda: "")
    try:
        while True:
            ok = True
            try:
                report = await reporter.report_once(verifier.view if verifier else KubeletView(verification="off"))
                log.info("node %s: %s: %s", args.node, report.reason, report.message)
                ok = report.ready
                if verifier is not None and reporter.topology is not None:
                    findings = await verifier.verify_once(reporter.topology)
                    log.info("node %s: verified %d pods, %d mismatched", args.node, len(findings),
                             sum(f.mismatch for f in findings))
            except (ApiError, OSError, asyncio.TimeoutError, grpc.aio.AioRpcError) as exc:
                # the API server or the kubelet is down or slow: the next round tries again
                log.warning("node %s: pass failed: %s", args.node, exc)
                if verifier is not None and isinstance(exc, grpc.aio.AioRpcError):
                    metrics.verifications.labels(args.node, "error").inc()
                    verifier.view = KubeletView(verifier.view.allocatable, f"failed: {exc.code().name}")
                ok = False
            if args.once:
                await asyncio.sleep(0.5)  # let the events go out
                return 0 if ok else 1
            await asyncio.sleep(args.interval)
    finally:
        if runner is not None:
            await runner.cleanup()
        await kube.close()
