"""The reporter's loop: read the GPUs, decide, write the node (docs/node-agent.md)."""
from __future__ import annotations

import asyncio
import logging
from urllib.parse import quote

import grpc
from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest

from batchsched.api import constants
from batchsched.core.dra.inventory import gpu_selection, node_dra
from batchsched.core.dra.model import DraError, ResourceSlice, slice_from_json
from batchsched.core.topology.model import GpuTopology, TopologyError
from batchsched.kube.client import ApiError, Kube
from batchsched.kube.events import EventRecorder, node_ref, now_rfc3339, pod_ref
from batchsched.nodeagent.backends import Backend
from batchsched.nodeagent.podresources import api_pb2, api_pb2_grpc
from batchsched.nodeagent.report import GPU_READY_CONDITION, KubeletView, Report, current_condition, decide
from batchsched.nodeagent.verify import Finding, Held, verify

log = logging.getLogger("batchsched.nodeagent")
COMPONENT = "batchsched-node-agent"


async def node_slices(kube: Kube, node_name: str) -> list[ResourceSlice]:
    """The node's ResourceSlices, when the cluster serves DRA."""
    try:
        listed = await kube.request("GET", "/apis/resource.k8s.io/v1/resourceslices",
                                    query={"fieldSelector": f"spec.nodeName={node_name}"})
    except ApiError as exc:
        if exc.status in (403, 404):  # DRA not served, or not granted: the device plugin's count decides
            return []
        raise
    slices = []
    for item in listed.get("items") or ():
        try:
            slices.append(slice_from_json(item))
        except DraError as exc:
            log.warning("node %s: ResourceSlice skipped: %s", node_name, exc)
    return slices


class Reporter:
    def __init__(self, kube: Kube, node_name: str, backend: Backend, events: EventRecorder):
        self.kube = kube
        self.node_name = node_name
        self.backend = backend
        self.events = events
        self.topology: GpuTopology | None = None  # the last one read, for the verifier

    async def report_once(self, kubelet: KubeletView = KubeletView()) -> Report:
        try:
            # NVML and nvidia-smi block: off the event loop
            self.topology, problem = await asyncio.to_thread(self.backend.read), ""
        except TopologyError as exc:
            self.topology, problem = None, f"{self.backend.name}: {exc}"
        path = f"/api/v1/nodes/{quote(self.node_name)}"
        node = await self.kube.request("GET", path)
        report = decide(node, self.topology, problem, await node_slices(self.kube, self.node_name), kubelet)
        if report.annotation is not None:
            await self.kube.merge_patch(path, {"metadata": {"annotations": {
                constants.GPU_TOPOLOGY_ANNOTATION: report.annotation}}})
            log.info("node %s: wrote the topology annotation (%d GPUs)", self.node_name, len(self.topology or ()))
        await self._set_condition(path, node, report)
        if not report.ready:
            log.warning("node %s: %s", self.node_name, report.message)
            self.events.emit(node_ref(node), "Warning", report.reason, report.message)
        return report

    async def _set_condition(self, path: str, node: dict, report: Report) -> None:
        """Patch the condition when it says something new (a steady node is not rewritten)."""
        status = "True" if report.ready else "False"
        old = current_condition(node) or {}
        if (old.get("status"), old.get("reason"), old.get("message")) == (status, report.reason, report.message):
            return
        stamp = now_rfc3339()
        transition = stamp if old.get("status") != status else old.get("lastTransitionTime", stamp)
        condition = {"type": GPU_READY_CONDITION, "status": status, "reason": report.reason,
                     "message": report.message[:1024], "lastHeartbeatTime": stamp, "lastTransitionTime": transition}
        await self.kube.strategic_merge_patch(f"{path}/status", {"status": {"conditions": [condition]}})


class AgentMetrics:
    """The agent's /metrics (served by shell/server.py)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.mismatches = Counter(
            "batchsched_gpu_assignment_mismatches", "Pods found holding other GPUs than batchsched chose "
            "(per the kubelet's PodResources API), counted once per pod and actual set of GPUs.", ["node"],
            registry=self.registry)
        self.verifications = Counter(
            "batchsched_gpu_verifications", "Passes of the verifier, by result (ok, mismatch, error).",
            ["node", "result"], registry=self.registry)
        ProcessCollector(registry=self.registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def held_devices(response) -> dict[tuple[str, str], Held]:
    """A PodResources ``List`` answer as what each pod holds."""
    held = {}
    for pod in response.pod_resources:
        device_ids = [i for c in pod.containers for d in c.devices if d.resource_name == constants.GPU_RESOURCE
                      for i in d.device_ids]
        dra = [(r.driver_name, r.pool_name, r.device_name) for c in pod.containers for dr in c.dynamic_resources
               for r in dr.claim_resources if r.device_name]
        held[(pod.namespace, pod.name)] = Held(tuple(dict.fromkeys(device_ids)), tuple(dict.fromkeys(dra)))
    return held


class Verifier:
    """Compares what the kubelet gave each pod with its gpu-ids; on a
    mismatch: an Event on the pod, the metric, and gpu-ids-actual."""

    def __init__(self, kube: Kube, node_name: str, socket: str, events: EventRecorder, metrics: AgentMetrics,
                 timeout: float = 10.0):
        self.kube = kube
        self.node_name = node_name
        self.socket = socket
        self.events = events
        self.metrics = metrics
        self.timeout = timeout
        self.counted: dict[str, tuple[int, ...]] = {}  # pod uid -> the actual GPUs already counted
        self.view = KubeletView()  # what the last pass learnt, for the node condition

    async def verify_once(self, topology: GpuTopology) -> list[Finding]:
        async with grpc.aio.insecure_channel(f"unix://{self.socket}") as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)
            listed = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
            allocatable = await stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(),
                                                             timeout=self.timeout)
        allocatable_gpus = sum(len(d.device_ids) for d in allocatable.devices
                               if d.resource_name == constants.GPU_RESOURCE)
        pods = await self.kube.request("GET", "/api/v1/pods",
                                       query={"fieldSelector": f"spec.nodeName={self.node_name}"})
        slices = await node_slices(self.kube, self.node_name)
        dra = node_dra(slices, gpu_selection(()), topology) if slices else None
        findings = verify(pods.get("items") or (), held_devices(listed), topology, dra)
        for finding in findings:
            if finding.mismatch:
                await self._record(finding)
            else:
                self.counted.pop(finding.uid, None)
        live = {f.uid for f in findings}
        self.counted = {uid: ids for uid, ids in self.counted.items() if uid in live}
        mismatched = sum(f.mismatch for f in findings)
        self.metrics.verifications.labels(self.node_name, "mismatch" if mismatched else "ok").inc()
        self.view = KubeletView(allocatable_gpus, f"{len(findings)} pods with GPU ids, {mismatched} holding "
                                                  f"other GPUs (recorded in {constants.GPU_IDS_ACTUAL_ANNOTATION})")
        return findings

    async def _record(self, finding: Finding) -> None:
        message = finding.message()
        log.warning("node %s: pod %s/%s: %s", self.node_name, finding.namespace, finding.name, message)
        self.events.emit(pod_ref(finding.namespace, finding.name, finding.uid), "Warning", "GPUAssignmentMismatch",
                         message)
        if self.counted.get(finding.uid) != finding.actual:
            self.counted[finding.uid] = finding.actual
            self.metrics.mismatches.labels(self.node_name).inc()
        if finding.recorded != finding.actual_text:
            # uid precondition: a pod recreated under the same name is not this one
            await self.kube.merge_patch(
                f"/api/v1/namespaces/{quote(finding.namespace)}/pods/{quote(finding.name)}",
                {"metadata": {"uid": finding.uid,
                              "annotations": {constants.GPU_IDS_ACTUAL_ANNOTATION: finding.actual_text}}})
