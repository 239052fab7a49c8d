#!/usr/bin/env python3
"""Give real (kind) nodes simulated GPUs, the way a device plugin and GPU
feature discovery would have marked them:

* ``nvidia.com/gpu: N`` in the node's capacity and allocatable, written
  through the ``nodes/status`` subresource (the kubelet keeps extended
  resources it does not manage, and admits pods asking for them);
* the topology annotation ``scheduling.batchsched.io/gpu-topology``, made
  from an ``nvidia-smi topo -m`` capture by ``batchsched topo parse``;
* the pool label the GPU metrics group by (``node.kubernetes.io/instance-type``).

    e2e/kind/simulate_gpus.py --selector batchsched.io/gpu-node=true \\
        --gpus 8 --topology e2e/kind/hgx-8gpu-topo.txt --pool kind-hgx

Runs kubectl (``--kubectl``, default from PATH) against $KUBECONFIG, with
the project's Python (it runs ``python -m batchsched``).  Idempotent.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

GPU_RESOURCE = "nvidia.com/gpu"
TOPOLOGY_ANNOTATION = "scheduling.batchsched.io/gpu-topology"
POOL_LABEL = "node.kubernetes.io/instance-type"


def topology_annotation(capture: str) -> str:
    return subprocess.run([sys.executable, "-m", "batchsched", "topo", "parse", "--format", "annotation", capture],
                          check=True, capture_output=True, text=True).stdout.strip()


def simulate(kubectl: str, selector: str, gpus: int, annotation: str, pool: str) -> list[str]:
    def run(*args: str) -> str:
        return subprocess.run([kubectl, *args], check=True, capture_output=True, text=True).stdout

    nodes = run("get", "nodes", "--selector", selector, "--output", "name").split()
    if not nodes:
        raise SystemExit(f"no node matches {selector!r}")
    gpu_status = {"status": {"capacity": {GPU_RESOURCE: str(gpus)}, "allocatable": {GPU_RESOURCE: str(gpus)}}}
    for node in nodes:
        run("patch", node, "--subresource=status", "--type=merge", "--patch", json.dumps(gpu_status))
        run("label", node, "--overwrite", f"{POOL_LABEL}={pool}")
        run("annotate", node, "--overwrite", f"{TOPOLOGY_ANNOTATION}={annotation}")
    return nodes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--selector", required=True, help="label selector of the nodes to give GPUs")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--topology", required=True, help="an `nvidia-smi topo -m` capture with that many GPUs")
    parser.add_argument("--pool", default="simulated-gpu", help=f"value of the {POOL_LABEL} label")
    parser.add_argument("--kubectl", default="kubectl")
    args = parser.parse_args()
    annotation = topology_annotation(args.topology)
    if len(json.loads(annotation)["gpus"]) != args.gpus:
        raise SystemExit(f"{args.topology} describes {len(json.loads(annotation)['gpus'])} GPUs, not {args.gpus}")
    nodes = simulate(args.kubectl, args.selector, args.gpus, annotation, args.pool)
    print(f"{len(nodes)} node(s) now have {args.gpus} simulated GPUs: {' '.join(nodes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
