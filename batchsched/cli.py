"""Command line: ``batchsched run | explain | simulate | demo-cluster | topo parse | node-agent``."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path


async def _run(args: argparse.Namespace) -> int:
    from batchsched.shell.heap import collect_rarely
    # Before the imports below: at Python's thresholds, collections walked
    # what they build ~130 times, ~60 ms of a start (bench/RESULTS.md).
    collect_rarely()
    # Pydantic looks for plugins in every installed distribution's entry
    # points when it builds its first model, tens of ms of a start; the
    # scheduler uses none.  An operator's own setting is kept.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from batchsched.config import load_config
    from batchsched.shell.logs import setup_logging
    from batchsched.shell.replica import run_replica

    config = load_config(args.config)
    setup_logging(config.log_level, config.log_format)
    return await run_replica(args.kubeconfig, config, args.context)


async def _explain(args: argparse.Namespace) -> int:
    import aiohttp

    from batchsched.config import load_config
    from batchsched.core.explain import explain_gang, explain_waiting, gang_key_for
    from batchsched.shell.cache import ClusterCache
    from batchsched.kube.client import ApiError, Kube, resolve_target

    # the cache warns once about each bad object it lists; say the line is ours
    logging.basicConfig(level=logging.WARNING, format="batchsched: %(levelname)s: %(message)s", force=True)
    config = load_config(args.config)
    target = await resolve_target(args.kubeconfig, args.context)
    namespace = args.namespace or target.namespace
    kube = Kube.over(target.configuration)
    try:
        cache = ClusterCache(config.scheduler_name, config.node_selector, config.also_serves,
                             config.gang_sources.enabled(),
                             config.gang_sources.auto_always())
        for reflector in cache.reflectors(kube):
            try:
                await reflector.list_once()
            except ApiError as exc:
                # DRA, Queues or a foreign CRD not served, or not ours to read
                if reflector.optional and exc.status in (403, 404):
                    reflector.hold_absent(exc)
                elif not (exc.not_found and reflector.kind == "podgroups"):
                    raise  # (not found: the CRD is not installed, so no PodGroups)
    except (ApiError, OSError, aiohttp.ClientError) as exc:
        print(f"batchsched: {target.source}: {exc}", file=sys.stderr)
        return 1
    finally:
        await kube.close()
    snapshot = cache.snapshot(time.time())
    if args.gang:
        report = explain_gang(snapshot, gang_key_for(snapshot, namespace, args.gang), config.core())
        print(json.dumps(report.data, indent=2) if args.output == "json" else report)
        return 0 if report.data["found"] else 1
    reports = explain_waiting(snapshot, None if args.all_namespaces else namespace, config.core())
    if args.output == "json":
        print(json.dumps([r.data for r in reports], indent=2))
    elif not reports:
        print("No gang is waiting" + ("." if args.all_namespaces else f" in namespace {namespace}."))
    else:
        for report in reports:
            print(f"{report.data['gang']}: {report.verdict}")
    return 0


def _topo_parse(args: argparse.Namespace) -> int:
    from batchsched.core.topology.model import TopologyError
    from batchsched.core.topology.report import render

    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except (OSError, UnicodeDecodeError) as exc:  # unusable input, like malformed input: status 2
        print(f"batchsched: {args.file}: cannot read it: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 2
    try:
        print(render(text, args.format, args.numa_memory), end="")
    except TopologyError as exc:  # names the line and the problem
        print(f"batchsched: {args.file}: {exc}", file=sys.stderr)
        return 2
    return 0


def _node_agent(args: argparse.Namespace) -> int:
    from batchsched.nodeagent.main import run_node_agent

    return run_node_agent(args)


def _simulate(args: argparse.Namespace) -> int:
    from batchsched.sim.ceiling import allocation_ceiling
    from batchsched.sim.progress import TerminalProgress
    from batchsched.sim.report import PlotUnavailable, require_matplotlib, summary, write_plots
    from batchsched.sim.scenario import build_scenario, run_scenario

    try:
        if args.plot:
            require_matplotlib()  # before the run, not after it
    except PlotUnavailable as exc:
        print(f"batchsched: {exc}", file=sys.stderr)
        return 2
    scenario = build_scenario(args.cluster, args.workload, args.trace, args.trace_dir, args.config, args.seed,
                              args.max_pods)
    print(f"batchsched simulate (seed {args.seed})\n{scenario.describe()}\n", flush=True)
    results = run_scenario(scenario, [p.strip() for p in args.policies.split(",") if p.strip()], args.seed,
                           plot=bool(args.plot), progress=TerminalProgress.if_terminal(sys.stderr))
    print(summary(results))
    if results:
        ceiling = allocation_ceiling(scenario.jobs, results[0].gpus)
        print(f"No policy could hold more than {100 * ceiling:.1f}% of the GPUs over the arrival window "
              "on this workload (the allocation ceiling).")
    print("batchsched runs the real decision core; the baselines are batchsched/sim/baselines/. "
          "Every figure is defined in docs/simulator.md.")
    if args.plot:
        print("charts: " + ", ".join(str(p) for p in write_plots(results, args.plot)))
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("batchsched")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _add_connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="kubeconfig file (default, as kubectl: $KUBECONFIG, a path list, "
                             "else ~/.kube/config, else the in-cluster service account)")
    parser.add_argument("--context", help="kubeconfig context to use (default: its current-context)")


def build_parser(prog: str = "batchsched") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p_run = sub.add_parser("run", help="run the scheduler")
    _add_connection_flags(p_run)
    p_run.add_argument("--config", metavar="FILE",
                       help="scheduler config YAML (default: built-in; configs/scheduler.yaml documents it)")

    p_explain = sub.add_parser(
        "explain", help="why is a gang pending, node by node; without a target, every waiting gang, one line each",
        description="Reads the cluster (no scheduler needs to run) and says why a gang waits. "
                    "Exit status 1 when the target is unknown or the cluster cannot be read.")
    p_explain.add_argument("gang", nargs="?", metavar="TARGET",
                           help="NAME or podgroup/NAME: a PodGroup (or the gang its pods' label names); "
                                "pod/NAME: that pod's gang, a pod without a PodGroup being a gang of one; "
                                "NAMESPACE/NAME: a PodGroup there. Omitted: list the waiting gangs")
    p_explain.add_argument("-n", "--namespace", help="namespace of TARGET (default: the context's, else default)")
    p_explain.add_argument("-A", "--all-namespaces", action="store_true",
                           help="without TARGET: list waiting gangs in every namespace")
    p_explain.add_argument("-o", "--output", choices=("text", "json"), default="text",
                           help="text for people, json for scripts (default: %(default)s)")
    _add_connection_flags(p_explain)
    p_explain.add_argument("--config", metavar="FILE",
                           help="scheduler config YAML, for schedulerName and nodeSelector (default: built-in)")

    p_sim = sub.add_parser("simulate", help="batchsched and baseline schedulers on a simulated cluster "
                                            "(no arguments: the embedded default cluster and workload)")
    p_sim.add_argument("--cluster", type=Path, metavar="FILE", help="cluster file, YAML or CSV (docs/simulator.md)")
    p_sim.add_argument("--workload", type=Path, metavar="FILE", help="workload file, YAML or CSV")
    p_sim.add_argument("--trace", choices=("alibaba", "philly"), help="replay a public trace instead of a workload")
    p_sim.add_argument("--trace-dir", type=Path, metavar="DIR",
                       help="the folder holding alibaba-v2023/ and pollux-workload-via-blox/ "
                            "(default: $BATCHSCHED_TRACE_DIR, else ./traces; docs/simulator.md, \"Traces\")")
    p_sim.add_argument("--config", type=Path, metavar="FILE",
                       help="batchsched's scheduler config (default: the simulator's, preemption on)")
    p_sim.add_argument("--policies", default="batchsched,spread,binpack,random,volcano-like,kai-like",
                       help="comma separated, run side by side (default: %(default)s; also: proportion, "
                            "quota admission for workloads with queues)")
    p_sim.add_argument("--plot", type=Path, metavar="DIR", help="write PNG charts there (needs matplotlib)")
    p_sim.add_argument("--seed", type=int, default=1, help="for drawn workloads, sampling and random GPU ids")
    p_sim.add_argument("--max-pods", type=int, metavar="N",
                       help="a smaller trace: a sample of N Alibaba pods (and their share of nodes), "
                            "or the first Philly jobs up to N pods")

    sub.add_parser("demo-cluster", help="a local control plane, GPU nodes and a sample gang, scheduled for real "
                                        "(needs the e2e/ control-plane binaries)")

    p_topo = sub.add_parser("topo", help="GPU topology tools").add_subparsers(dest="topo_command", required=True)
    p_parse = p_topo.add_parser("parse", help="read `nvidia-smi topo -m` output (FILE, or - for stdin)")
    p_parse.add_argument("file", metavar="FILE", help="the saved output, or - to read stdin")
    p_parse.add_argument("--format", choices=("text", "json", "annotation"), default="text",
                         help="text: a summary; annotation: the value of the node annotation "
                              "scheduling.batchsched.io/gpu-topology; json: the same, indented")
    p_parse.add_argument("--numa-memory", default="", metavar="N=QTY,...",
                         help="memory of each NUMA node, e.g. 0=256Gi,1=256Gi (the matrix does not show it)")

    from batchsched.nodeagent.main import add_node_agent_parser
    add_node_agent_parser(sub, _add_connection_flags)

    return parser


def kubectl_plugin() -> int:
    """``kubectl batchsched ...``: kubectl runs ``kubectl-batchsched`` from PATH
    with the words after ``batchsched`` (and $KUBECONFIG as it has it)."""
    return main(prog="kubectl batchsched")


def main(argv: list[str] | None = None, prog: str = "batchsched") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.command == "explain" and args.gang and args.all_namespaces:
        parser.error("explain: -A lists the waiting gangs of every namespace; it takes no TARGET")
    try:
        if args.command == "run":
            return asyncio.run(_run(args))
        if args.command == "explain":
            return asyncio.run(_explain(args))
        if args.command == "topo":
            return _topo_parse(args)
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "node-agent":
            return _node_agent(args)
        from batchsched.demo import run_demo
        return run_demo()
    except (OSError, ValueError) as exc:
        print(f"batchsched: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
