"""The reporter's loop: read the GPUs, decide, write the node (docs/node-agent.md)."""
from __future__ import annotations

import asyncio
import logging
from urllib.parse import quote

from batchsched.api import constants
from batchsched.core.dra.model import DraError, slice_from_json
from batchsched.core.topology.model import GpuTopology, TopologyError
from batchsched.nodeagent.backends import Backend
from batchsched.nodeagent.report import GPU_READY_CONDITION, Report, current_condition, decide
from batchsched.shell.kube import ApiError, Kube
from batchsched.shell.status import EventRecorder, node_ref, now_rfc3339

log = logging.getLogger("batchsched.nodeagent")
COMPONENT = "batchsched-node-agent"


class Reporter:
    def __init__(self, kube: Kube, node_name: str, backend: Backend, events: EventRecorder):
        self.kube = kube
        self.node_name = node_name
        self.backend = backend
        self.events = events
        self.topology: GpuTopology | None = None  # the last one read, for the verifier

    async def report_once(self) -> Report:
        try:
            # NVML and nvidia-smi block: off the event loop
            self.topology, problem = await asyncio.to_thread(self.backend.read), ""
        except TopologyError as exc:
            self.topology, problem = None, f"{self.backend.name}: {exc}"
        path = f"/api/v1/nodes/{quote(self.node_name)}"
        node = await self.kube.request("GET", path)
        report = decide(node, self.topology, problem, await self._slices())
        if report.annotation is not None:
            await self.kube.merge_patch(path, {"metadata": {"annotations": {
                constants.GPU_TOPOLOGY_ANNOTATION: report.annotation}}})
            log.info("node %s: wrote the topology annotation (%d GPUs)", self.node_name, len(self.topology or ()))
        await self._set_condition(path, node, report)
        if not report.ready:
            log.warning("node %s: %s", self.node_name, report.message)
            self.events.emit(node_ref(node), "Warning", report.reason, report.message)
        return report

    async def _slices(self) -> list:
        """This node's ResourceSlices, when the cluster serves DRA."""
        try:
            listed = await self.kube.request("GET", "/apis/resource.k8s.io/v1/resourceslices",
                                             query={"fieldSelector": f"spec.nodeName={self.node_name}"})
        except ApiError as exc:
            if exc.status in (403, 404):  # DRA not served, or not granted: the device plugin's count decides
                return []
            raise
        slices = []
        for item in listed.get("items") or ():
            try:
                slices.append(slice_from_json(item))
            except DraError as exc:
                log.warning("node %s: ResourceSlice skipped: %s", self.node_name, exc)
        return slices

    async def _set_condition(self, path: str, node: dict, report: Report) -> None:
        """Patch the condition when it says something new (a steady node is not rewritten)."""
        status = "True" if report.ready else "False"
        old = current_condition(node) or {}
        if (old.get("status"), old.get("reason"), old.get("message")) == (status, report.reason, report.message):
            return
        stamp = now_rfc3339()
        condition = {"type": GPU_READY_CONDITION, "status": status, "reason": report.reason,
                     "message": report.message[:1024], "lastHeartbeatTime": stamp,
                     "lastTransitionTime": stamp if old.get("status") != status else old.get("lastTransitionTime", stamp)}
        await self.kube.strategic_merge_patch(f"{path}/status", {"status": {"conditions": [condition]}})
