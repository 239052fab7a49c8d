"""A kubelet PodResources endpoint for tests: the real gRPC v1 protocol,
served over a unix socket from the stubs generated from the kubelet's
api.proto, answering with the assignments a test sets."""
from __future__ import annotations

import tempfile
from concurrent import futures
from pathlib import Path

import grpc

from batchsched.api import constants
from batchsched.nodeagent.podresources import api_pb2, api_pb2_grpc


class PodResourcesServer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, allocatable_uuids: list[str]):
        self.allocatable_uuids = allocatable_uuids
        self.assignments: dict[tuple[str, str], list[str]] = {}  # (namespace, pod) -> GPU device ids
        self.calls: list[str] = []
        # a short path: a unix socket's path has a 108-byte limit
        self.folder = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
        self.socket = str(self.folder / "kubelet.sock")
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")

    def __enter__(self) -> "PodResourcesServer":
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop(grace=None)
        Path(self.socket).unlink(missing_ok=True)
        self.folder.rmdir()

    def List(self, request, context):  # noqa: N802 - the gRPC method's name
        self.calls.append("List")
        return api_pb2.ListPodResourcesResponse(pod_resources=[
            api_pb2.PodResources(namespace=namespace, name=name, containers=[api_pb2.ContainerResources(
                name="main", devices=[api_pb2.ContainerDevices(resource_name=constants.GPU_RESOURCE,
                                                               device_ids=ids)])])
            for (namespace, name), ids in self.assignments.items()])

    def GetAllocatableResources(self, request, context):  # noqa: N802
        self.calls.append("GetAllocatableResources")
        return api_pb2.AllocatableResourcesResponse(devices=[api_pb2.ContainerDevices(
            resource_name=constants.GPU_RESOURCE, device_ids=self.allocatable_uuids)])
