"""A small synchronous raw-JSON client for test setup and assertions.

Tests arrange and observe the cluster through this; the scheduler under test
uses its own async client (batchsched.kube.client).  Built on the sync
``kubernetes`` client so any kubeconfig (token, client cert, exec) works.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Mapping

from kubernetes import client, config


class KubeError(Exception):
    def __init__(self, status: int, body: Mapping[str, Any]):
        super().__init__(f"{status}: {body.get('message', body)}")
        self.status = status
        self.body = body


class TestKube:
    __test__ = False  # not a pytest test class

    def __init__(self, kubeconfig: str):
        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        self.api = client.ApiClient(configuration)

    def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                content_type: str | None = None, ok_missing: bool = False,
                accept: str = "application/json") -> dict:
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        params = self.api.param_serialize(method=method, resource_path=path,
                                          query_params=list((query or {}).items()),
                                          header_params=headers, body=body,
                                          auth_settings=["BearerToken"])
        resp = self.api.call_api(*params, _request_timeout=30)
        data = resp.read()
        decoded = json.loads(data) if data else {}
        if resp.status == 404 and ok_missing:
            return {}
        if resp.status >= 400:
            raise KubeError(resp.status, decoded)
        return decoded

    def get(self, path: str, **query) -> dict:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: Mapping[str, Any]) -> dict:
        return self.request("POST", path, body=body)

    def delete(self, path: str, **query) -> dict:
        return self.request("DELETE", path, query=query, ok_missing=True)

    def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict:
        return self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def apply_yaml_objects(self, objects: list[dict]) -> None:
        """Create each object, replacing an existing one of the same name."""
        for obj in objects:
            path = object_collection_path(obj)
            try:
                self.create(path, obj)
            except KubeError as exc:
                if exc.status != 409:
                    raise
                current = self.get(f"{path}/{obj['metadata']['name']}")
                obj = {**obj, "metadata": {**obj["metadata"],
                                           "resourceVersion": current["metadata"]["resourceVersion"]}}
                self.request("PUT", f"{path}/{obj['metadata']['name']}", body=obj)

    def pods(self, namespace: str, **query) -> list[dict]:
        return self.get(f"/api/v1/namespaces/{namespace}/pods", **query)["items"]


CLUSTER_SCOPED = frozenset({"Node", "Namespace", "PriorityClass", "CustomResourceDefinition", "ClusterRole",
                            "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                            "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "DeviceClass",
                            "ResourceSlice"})


def plural_of(kind: str) -> str:
    """The resource name the API serves a kind under (the regular English plurals it uses)."""
    lower = kind.lower()
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    if lower.endswith("ss"):
        return lower + "es"
    return lower + "s"


def object_collection_path(obj: Mapping[str, Any]) -> str:
    api_version, kind = obj["apiVersion"], obj["kind"]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    namespace = obj.get("metadata", {}).get("namespace")
    if namespace and kind not in CLUSTER_SCOPED:
        return f"{base}/namespaces/{namespace}/{plural_of(kind)}"
    return f"{base}/{plural_of(kind)}"


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1) -> Any:
    """Poll until predicate() is truthy; return its value or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
