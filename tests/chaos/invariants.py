"""What must hold whatever was injected, read from the cluster through the API.

Nothing here imports ``batchsched`` (tests/chaos/test_invariants.py checks
that): the checker must not share a bug with the code it judges.  It reads
nodes, pods and PodGroups with tests/support/kube.py's TestKube and returns
violations as sentences, so a failing scenario says what broke:

* no node over-committed: the requests of the live pods bound to a node
  (a container's limits where it states no request, ``nvidia.com/gpu``
  included) fit the node's allocatable, for every resource and the pod
  count.  kwok runs no kubelet admission, so an over-committed node shows
  no failed pod: only this sum finds it;
* no GPU id held twice on a node by live pods the scheduler bound
  (annotation ``scheduling.batchsched.io/gpu-ids``), and none outside the
  node's GPUs; pods of other schedulers count by number, in the sum above;
* no DRA device in two claims' ``status.allocation`` (results with admin
  access or a share id excepted: the API lets those share), and no claim
  allocated on one node and reserved for a pod bound to another;
* at quiescence, every gang has 0 or at least ``minMember`` members bound;
* from the fault proxy's record, no write committed by a deposed leader
  after the next leader's first write.
"""
from __future__ import annotations

import re
import time
from collections import defaultdict
from fractions import Fraction
from typing import Iterable

from tests.support.kube import KubeError, TestKube, wait_for

GROUP = "scheduling.batchsched.io"
POD_GROUP_LABEL = f"{GROUP}/pod-group"
GPU_IDS_ANNOTATION = f"{GROUP}/gpu-ids"
GPU_RESOURCE = "nvidia.com/gpu"
SCHEDULER_NAME = "batchsched"
LEASE_PATH = re.compile(r"/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases")

_SUFFIXES = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
             "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
             "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
             "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60)}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


def parse_quantity(text: str | int | float) -> Fraction:
    """A Kubernetes quantity ("500m", "64Gi", "1e3", 8) as an exact number."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent:
        return value * Fraction(10) ** int(exponent[1:])
    return value * _SUFFIXES[suffix or ""]


def is_live(pod: dict) -> bool:
    """Holds its node's resources: not finished (a terminating pod still holds them)."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def pod_requests(pod: dict) -> dict[str, Fraction]:
    """What a pod takes from its node, as the kubelet would admit it."""
    def of(container: dict) -> dict[str, Fraction]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: parse_quantity(q) for name, q in merged.items()}

    spec = pod.get("spec") or {}
    total: dict[str, Fraction] = defaultdict(Fraction)
    for container in spec.get("containers") or ():
        for name, q in of(container).items():
            total[name] += q
    for container in spec.get("initContainers") or ():  # run one at a time, before the others
        for name, q in of(container).items():
            total[name] = max(total[name], q)
    for name, q in (spec.get("overhead") or {}).items():
        total[name] += parse_quantity(q)
    total["pods"] += 1
    return dict(total)


def pods_on(kube: TestKube, node: str) -> list[dict]:
    return kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")["items"]


def overcommitted_nodes(kube: TestKube, nodes: Iterable[str]) -> list[str]:
    violations = []
    for node in nodes:
        allocatable = {k: parse_quantity(v)
                       for k, v in (kube.get(f"/api/v1/nodes/{node}").get("status") or {})
                       .get("allocatable", {}).items()}
        used: dict[str, Fraction] = defaultdict(Fraction)
        for pod in filter(is_live, pods_on(kube, node)):
            for name, q in pod_requests(pod).items():
                used[name] += q
        over = {name: f"{float(q):g} > {float(allocatable.get(name, 0)):g}"
                for name, q in sorted(used.items()) if q > allocatable.get(name, 0)}
        if over:
            violations.append(f"node {node} over-committed: {over}")
    return violations


def gpu_ids_held(pod: dict) -> list[int] | None:
    """The GPU ids the scheduler's annotation gives a pod; None if it is unreadable."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_IDS_ANNOTATION, "")
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        return None


def gpu_id_conflicts(kube: TestKube, nodes: Iterable[str], scheduler: str = SCHEDULER_NAME) -> list[str]:
    violations = []
    for node in nodes:
        gpus = parse_quantity((kube.get(f"/api/v1/nodes/{node}").get("status") or {})
                              .get("allocatable", {}).get(GPU_RESOURCE, 0))
        holders: dict[int, list[str]] = defaultdict(list)
        for pod in filter(is_live, pods_on(kube, node)):
            if (pod.get("spec") or {}).get("schedulerName") != scheduler:
                continue  # other schedulers' pods count by number (overcommitted_nodes)
            name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            ids = gpu_ids_held(pod)
            if ids is None:
                violations.append(f"pod {name} on {node}: unreadable {GPU_IDS_ANNOTATION} annotation")
                continue
            for gpu in ids:
                holders[gpu].append(name)
        for gpu, pods in sorted(holders.items()):
            if len(pods) > 1:
                violations.append(f"GPU {gpu} of node {node} held by {len(pods)} pods: {sorted(pods)}")
            if not 0 <= gpu < gpus:
                violations.append(f"GPU {gpu} of node {node} does not exist (it has {gpus}): {pods}")
    return violations


def claim_conflicts(kube: TestKube, namespace: str) -> list[str]:
    """Devices in two claims (all namespaces: a device is the cluster's), and
    claims of ``namespace`` reserved for a pod bound off their node."""
    try:
        claims = kube.get("/apis/resource.k8s.io/v1/resourceclaims")["items"]
    except KubeError as exc:
        if exc.status == 404:  # no DRA served: nothing to hold
            return []
        raise
    violations = []
    holders: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    pods = {p["metadata"]["uid"]: p for p in kube.pods(namespace)}
    for claim in claims:
        meta, allocation = claim["metadata"], (claim.get("status") or {}).get("allocation") or {}
        name = f"{meta['namespace']}/{meta['name']}"
        for result in (allocation.get("devices") or {}).get("results") or []:
            if not result.get("adminAccess") and not result.get("shareID"):
                holders[(result["driver"], result["pool"], result["device"])].append(name)
        node = allocated_node(allocation)
        if meta["namespace"] != namespace or not node:
            continue
        for reserved in (claim.get("status") or {}).get("reservedFor") or []:
            bound_to = ((pods.get(reserved.get("uid")) or {}).get("spec") or {}).get("nodeName")
            if bound_to and bound_to != node:
                violations.append(f"claim {name} allocated on {node} is reserved for pod {reserved.get('name')}, "
                                  f"bound to {bound_to}")
    violations += [f"device {'/'.join(device)} allocated in {len(names)} claims: {sorted(names)}"
                   for device, names in sorted(holders.items()) if len(names) > 1]
    return violations


def allocated_node(allocation: dict) -> str:
    """The one node an allocation's nodeSelector names by ``metadata.name``, else ""."""
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    fields = [f for t in terms for f in t.get("matchFields") or []]
    if len(terms) == 1 and len(fields) == 1 and fields[0].get("key") == "metadata.name" \
            and fields[0].get("operator") == "In" and len(fields[0].get("values") or []) == 1:
        return fields[0]["values"][0]
    return ""


def partial_gangs(kube: TestKube, namespace: str) -> list[str]:
    """Gangs with some but fewer than minMember members bound (judge at quiescence)."""
    groups = kube.get(f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/podgroups")["items"]
    min_member = {g["metadata"]["name"]: int((g.get("spec") or {}).get("minMember") or 1) for g in groups}
    bound: dict[str, list[str]] = defaultdict(list)
    for pod in kube.pods(namespace, labelSelector=POD_GROUP_LABEL):
        group = pod["metadata"]["labels"][POD_GROUP_LABEL]
        if pod["spec"].get("nodeName") and (pod.get("status") or {}).get("phase") != "Failed":
            bound[group].append(pod["metadata"]["name"])
    return [f"gang {namespace}/{group}: {len(pods)} of minMember {min_member[group]} bound: {sorted(pods)}"
            for group, pods in sorted(bound.items()) if group in min_member and len(pods) < min_member[group]]


def deposed_leader_writes(records) -> list[str]:
    """Writes a deposed leader got committed after the next leader's first write.

    ``records`` are the fault proxy's (tests/chaos/proxy.py Record), one
    client per replica.  Leaders succeed each other in the order of their
    first committed write (a standby writes nothing before it holds the
    Lease); a client is deposed once the next one has written, and any write
    it *sent* after that moment and the API server accepted is a violation.
    A replica restarted later must be a new client (it is a new identity).
    """
    writes = sorted((r for r in records if r.committed), key=lambda r: r.answered)
    order: list[str] = []
    first_write: dict[str, float] = {}
    for r in writes:
        if r.client not in first_write:
            first_write[r.client] = r.answered
            order.append(r.client)
    deposed_at = {old: first_write[new] for old, new in zip(order, order[1:])}
    return [f"{r.method} {r.path} by deposed leader {r.client!r}, sent {r.sent - deposed_at[r.client]:.3f}s "
            f"after the next leader's first write (answered {r.upstream_status})"
            for r in writes if r.client in deposed_at and r.sent > deposed_at[r.client]]


def violations(kube: TestKube, namespace: str, nodes: Iterable[str], records=None,
               scheduler: str = SCHEDULER_NAME) -> list[str]:
    nodes = list(nodes)
    found = (overcommitted_nodes(kube, nodes) + gpu_id_conflicts(kube, nodes, scheduler)
             + claim_conflicts(kube, namespace) + partial_gangs(kube, namespace))
    if records is not None:
        found += deposed_leader_writes(records)
    return found


def placements(kube: TestKube, namespace: str) -> dict[str, str]:
    """Pod name -> node ("" while unbound), plus each PodGroup's status phase."""
    pods = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in kube.pods(namespace)}
    groups = {f"podgroup/{g['metadata']['name']}": (g.get("status") or {}).get("phase", "")
              for g in kube.get(f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/podgroups")["items"]}
    return {**pods, **groups}


def wait_quiescent(kube: TestKube, namespace: str, still_for: float = 3.0, timeout: float = 60.0) -> None:
    """Until no pod of the namespace changes node and no PodGroup phase changes for
    ``still_for`` seconds (within ``timeout`` seconds more)."""
    state = {"last": None, "since": 0.0}

    def settled() -> bool:
        now, current = time.monotonic(), placements(kube, namespace)
        if current != state["last"]:
            state["last"], state["since"] = current, now
        return now - state["since"] >= still_for

    wait_for(f"namespace {namespace} quiescent for {still_for}s", settled, timeout=still_for + timeout,
             interval=0.5)


def assert_invariants(kube: TestKube, namespace: str, nodes: Iterable[str], records=None,
                      scheduler: str = SCHEDULER_NAME) -> None:
    found = violations(kube, namespace, nodes, records, scheduler)
    assert not found, "invariant violations:\n  " + "\n  ".join(found)
