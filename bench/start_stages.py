"""The start's work on a big cluster, stage by stage, in process.

    .venv/bin/python bench/start_stages.py [--nodes 5000] [--pods 50000] [--rounds 3]

``bench/restart.py`` times a whole start against a real API server; this
splits what batchsched's own process does with the lists, without a server
or a profiler: ``--nodes`` 8-GPU nodes and ``--pods`` pods bound to them, as
the API server serves them (defaulted fields and managedFields included),
in pages of 2,000.  Per round it times converting and putting the nodes
(``nodes``), the typed decode of every pods page (``decode``,
``shell/wire.py``), converting each pod (``convert``: ``pod_from_json`` and
the cache's checks, ``ClusterCache._pod_entry``), and putting the whole
list into the cache and its indexes (``replace``).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import controlplane as cp  # noqa: E402  (shares the node body)

from batchsched.shell import wire  # noqa: E402
from batchsched.shell.cache import ClusterCache  # noqa: E402
from batchsched.shell.heap import collect_rarely  # noqa: E402

PAGE = 2000
POOL = "restart"


def served_pod(i: int, node: str) -> dict:
    """A bound cpu-only pod as the API server answers it (restart.py's ``bound_pod`` once stored)."""
    fields = {"f:spec": {"f:containers": {'k:{"name":"c"}': {
        ".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
        "f:resources": {"f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}},
        "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}},
        "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:nodeName": {}, "f:restartPolicy": {},
        "f:schedulerName": {}, "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}}}
    not_ready = {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": f"old-{i}", "namespace": "bench-old", "uid": str(uuid.uuid4()),
                     "resourceVersion": str(1000 + i), "creationTimestamp": f"2026-12-03T14:16:{i % 60:02d}Z",
                     "managedFields": [{"manager": "python", "operation": "Update", "apiVersion": "v1",
                                        "time": "2026-12-03T14:16:00Z", "fieldsType": "FieldsV1",
                                        "fieldsV1": fields}]},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                                 "terminationMessagePath": "/dev/termination-log",
                                 "terminationMessagePolicy": "File", "imagePullPolicy": "Always"}],
                 "restartPolicy": "Always", "terminationGracePeriodSeconds": 0, "dnsPolicy": "ClusterFirst",
                 "nodeName": node, "securityContext": {}, "schedulerName": "default-scheduler",
                 "tolerations": [{"key": "node.kubernetes.io/not-ready", **not_ready},
                                 {"key": "node.kubernetes.io/unreachable", **not_ready}],
                 "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"},
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def pages_of(items: list[dict]) -> list[bytes]:
    return [json.dumps({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "99"},
                        "items": items[first:first + PAGE]}).encode() for first in range(0, len(items), PAGE)]


def one_round(node_pages: list[bytes], pod_pages: list[bytes]) -> dict[str, float]:
    cache = ClusterCache("batchsched", {"bench-pool": POOL})
    times: dict[str, float] = {}
    started = time.perf_counter()
    listed_nodes = {}
    for raw in node_pages:
        for obj in json.loads(raw)["items"]:
            entry = cache._node_entry(obj)
            if entry:
                listed_nodes[entry[0]] = entry[1]
    cache._replace_nodes(listed_nodes)
    times["nodes"] = time.perf_counter() - started
    decode = convert = 0.0
    listed = {}
    for raw in pod_pages:
        before = time.perf_counter()
        items = wire.pod_list(raw)["items"]
        decoded = time.perf_counter()
        for i, obj in enumerate(items):
            entry = cache._pod_entry(obj)
            items[i] = None  # as the cache's list does: the raw object goes once converted
            if entry:
                listed[entry[0]] = entry[1]
        convert += time.perf_counter() - decoded
        decode += decoded - before
    times["decode"], times["convert"] = decode, convert
    before = time.perf_counter()
    cache._replace_pods(listed)
    times["replace"] = time.perf_counter() - before
    times["total"] = time.perf_counter() - started
    times["pods held"] = len(cache.pods)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    collect_rarely()  # as batchsched run does from before its first lists
    nodes = [cp.node_body(f"{POOL}-{i:05d}", POOL) for i in range(args.nodes)]
    for i, node in enumerate(nodes):
        node["metadata"].update(uid=str(uuid.uuid4()), resourceVersion=str(i + 1),
                                creationTimestamp="2026-12-03T14:00:00Z")
    pod_pages = pages_of([served_pod(i, f"{POOL}-{i % args.nodes:05d}") for i in range(args.pods)])
    node_pages = pages_of(nodes)
    print(f"{args.nodes} nodes, {args.pods} pods ({sum(map(len, pod_pages)) / max(args.pods, 1):.0f} bytes of JSON "
          f"a pod), pages of {PAGE}; seconds per stage")
    print("| round | nodes | decode | convert | replace | total |\n|---|---|---|---|---|---|")
    for r in range(args.rounds):
        t = one_round(node_pages, pod_pages)
        print(f"| {r} | {t['nodes']:.3f} | {t['decode']:.3f} | {t['convert']:.3f} | {t['replace']:.3f} "
              f"| {t['total']:.3f} |")
        gc.collect()


if __name__ == "__main__":
    main()
