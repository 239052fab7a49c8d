"""The one adapter over ``kubernetes.aio``: raw JSON requests and watch streams.

Everything the shell sends to the API server goes through :class:`Kube`.  It
uses the client only for what it does well (kubeconfig and in-cluster auth,
URL and header building, the aiohttp session) and reads responses as raw
JSON, which is faster than the pydantic models on hot paths and sidesteps
one client defect:

* ``CoreV1Api.create_namespaced_pod_binding`` declares a ``V1Binding``
  response, but the API server answers a binding with a ``Status`` object.
  The typed call can raise while deserializing even though the pod *was*
  bound (``tests/integration/test_client_quirks.py`` proves it against a real
  API server), so binding is done here on the raw path and judged by the
  HTTP status code alone.
* Its aiohttp session is made with ``trust_env=True``, so every request
  reads ``~/.netrc`` and the proxy variables in a worker thread: two thread
  hops per request, most of the client's CPU per binding (measured in
  bench/RESULTS.md).  Unless a proxy variable is set, the session is made
  without it; a kubeconfig ``proxy-url`` still applies.

Writes are fenced by the leader lease (``Kube.write_validity``, the seconds
the lease is still certain): a write is refused when the lease has lapsed by
the moment its bytes would go out (checked by aiohttp trace hooks, after
the request got a connection, however long it queued for one, and again just
before its body is written), and one still
in flight when the lease lapses is cancelled.  docs/operations.md says what
this does and does not guarantee.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import math
import os
import sys
import types
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator, Mapping
from urllib.parse import quote

import yaml


@contextlib.contextmanager
def _no_default_certificates() -> Iterator[None]:
    """While importing aiohttp, point OpenSSL's default certificate paths at
    nothing.

    ``aiohttp.connector`` builds two default TLS contexts at import time,
    each loading the system's CA bundle (~300 certificates, 30-100 ms each on
    our machines: bench/RESULTS.md).  Nothing here uses them: every session
    to the API server gets the context the kubeconfig or service account
    describes.  The variables are restored at once, so contexts made later
    (the kube client's, when a kubeconfig names no CA) read the real bundle.
    Were aiohttp's defaults ever used, they would trust nothing and fail
    closed.
    """
    saved = {name: os.environ.get(name) for name in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    os.environ.update(dict.fromkeys(saved, os.devnull))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


with _no_default_certificates():
    import aiohttp


def _bare_package(name: str) -> None:
    """Enter package ``name`` as a bare namespace over its directory,
    without running its ``__init__``, unless something imported it already.

    ``kubernetes``' ``__init__`` imports the whole synchronous client, config,
    watch, dynamic and stream modules (~225 modules, 0.1-0.2 s of every
    start: bench/RESULTS.md), none of which ``kubernetes.aio`` uses; and
    ``kubernetes.aio``'s imports its own dynamic, watch (which loads pydoc),
    stream, leaderelection and utils modules, of which only ``client`` and
    ``config`` are used here.  ``from kubernetes import client`` still works
    (it imports the submodule); only attributes an ``__init__`` would have
    set are absent.
    """
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return  # not installed as a package: the import below says so
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)


_bare_package("kubernetes")
_bare_package("kubernetes.aio")
from kubernetes.aio import client, config  # noqa: E402
from kubernetes.aio.config.config_exception import ConfigException  # noqa: E402

log = logging.getLogger(__name__)

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


@dataclass
class ApiError(Exception):
    status: int
    reason: str
    message: str
    body: Mapping[str, Any]

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404


def not_leader(method: str, path: str, when: str) -> ApiError:
    return ApiError(503, "NotLeader", f"the leader lease lapsed {when}: {method} {path} not completed", {})


class TransportError(OSError):
    """A connection that failed midway (the server disconnected, a body cut
    short): aiohttp raises these as ClientErrors that are not OSErrors, so
    the adapter raises them as one, and every caller's OSError handler,
    which is there for exactly such faults, takes them."""


class _LeaseLapsed(Exception):
    """Raised by the trace hook to abort a write before any of its bytes are sent."""


# The lease validity of the write the current task is sending (None for a
# read): the trace hook has no other way to know which request it sees.
_sending_write: ContextVar[Callable[[], float] | None] = ContextVar("_sending_write", default=None)


async def _refuse_if_lease_lapsed(session, context, params) -> None:
    """Runs on_request_headers_sent (once the request holds a connection,
    before its headers are buffered) and again on_request_chunk_sent (before
    the body, and the headers buffered with it, are written to the socket).

    The second check is the one that counts for a write with a body: on
    Python 3.11 aiohttp writes the body from a task of its own, a loop turn
    or more after the headers hook, and a process paused in between (SIGSTOP,
    a frozen VM) would send it after resuming, long after the lease lapsed.
    No await lies between this hook and the socket write, so the check and
    the send happen in one step.  Raising closes the connection; nothing
    reaches the server."""
    validity = _sending_write.get()
    if validity is not None and validity() <= 0:
        raise _LeaseLapsed()


def lease_fence() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(_refuse_if_lease_lapsed)
    trace.on_request_chunk_sent.append(_refuse_if_lease_lapsed)
    return trace


class KubeconfigError(ValueError):
    """No usable client configuration; the message is one line for the operator."""


@dataclass(frozen=True)
class Target:
    """Where the client talks to, as kubectl would resolve it."""
    configuration: client.Configuration
    namespace: str  # the context's namespace, "default" when it sets none
    source: str  # for messages: the kubeconfig files and context, or "in-cluster"


ANONYMOUS_USER = "batchsched:anonymous"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Keys holding a file path, resolved against the directory of the file naming them (as kubectl does).
_PATH_KEYS = {"clusters": ("cluster", ("certificate-authority",)),
              "users": ("user", ("client-certificate", "client-key", "tokenFile"))}


def kubeconfig_paths(explicit: str | None, environ: Mapping[str, str], home: Path) -> list[Path]:
    """The kubeconfig files kubectl reads, first one first: --kubeconfig alone,
    else each entry of $KUBECONFIG (a path list; empty entries and repeats
    dropped), else ~/.kube/config."""
    if explicit:
        return [Path(explicit).expanduser()]
    if environ.get("KUBECONFIG"):
        paths = [Path(p).expanduser() for p in environ["KUBECONFIG"].split(os.pathsep) if p]
        return list(dict.fromkeys(paths))
    return [home / ".kube" / "config"]


def merge_kubeconfigs(files: list[tuple[Path, Mapping[str, Any]]]) -> dict[str, Any]:
    """kubectl's merge of a $KUBECONFIG list: the first file to name a
    cluster, context or user wins it, and the first non-empty current-context
    wins.  (The client's own merger lets the last current-context win.)"""
    merged: dict[str, Any] = {"clusters": [], "contexts": [], "users": [], "current-context": ""}
    for path, document in files:
        if not merged["current-context"] and isinstance(document.get("current-context"), str):
            merged["current-context"] = document["current-context"]
        for section in ("clusters", "contexts", "users"):
            named = {entry["name"] for entry in merged[section]}
            for entry in document.get(section) or []:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise KubeconfigError(f"kubeconfig {path}: every entry of {section} needs a name")
                if entry["name"] not in named:
                    named.add(entry["name"])
                    merged[section].append(_absolute_paths(section, entry, path.parent))
    return merged


def _absolute_paths(section: str, entry: dict, base: Path) -> dict:
    inner_key, keys = _PATH_KEYS.get(section, ("", ()))
    inner = entry.get(inner_key)
    if not isinstance(inner, dict):
        return entry
    fixed = {k: str(base / v) if k in keys and isinstance(v, str) and v and not os.path.isabs(v) else v
             for k, v in inner.items()}
    return {**entry, inner_key: fixed}


def _read_kubeconfig(path: Path) -> Mapping[str, Any]:
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeconfigError(f"kubeconfig {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise KubeconfigError(f"kubeconfig {path}: expected a mapping, got {type(document).__name__}")
    return document


async def resolve_target(kubeconfig: str | None = None, context: str | None = None,
                         environ: Mapping[str, str] = os.environ, home: Path | None = None) -> Target:
    """Resolve the client configuration as kubectl does: --kubeconfig (which
    must exist), else $KUBECONFIG (missing entries skipped), else
    ~/.kube/config, else the in-cluster service account.  --context picks
    the context, else current-context.  Raises KubeconfigError."""
    paths = kubeconfig_paths(kubeconfig, environ, home or Path.home())
    files = [(p, _read_kubeconfig(p)) for p in paths if kubeconfig or p.exists()]
    merged = merge_kubeconfigs(files)
    if not merged["contexts"] and not context:
        return _in_cluster(paths)
    where = ", ".join(str(p) for p, _ in files) or os.pathsep.join(map(str, paths))
    name = context or merged["current-context"]
    names = ", ".join(c["name"] for c in merged["contexts"]) or "none"
    if not name:
        raise KubeconfigError(f"kubeconfig {where} sets no current-context: pass --context (contexts: {names})")
    chosen = next((c for c in merged["contexts"] if c["name"] == name), None)
    if chosen is None:
        raise KubeconfigError(f"context {name!r} not found in kubeconfig {where} (contexts: {names})")
    settings = chosen.get("context") if isinstance(chosen.get("context"), dict) else {}
    if not any(u["name"] == settings.get("user") for u in merged["users"]):
        # kubectl then sends no credentials; the client's loader crashes without a user entry
        merged["users"].append({"name": ANONYMOUS_USER, "user": {}})
        merged["contexts"] = [{**c, "context": {**settings, "user": ANONYMOUS_USER}} if c is chosen else c
                              for c in merged["contexts"]]
    configuration = client.Configuration()
    try:
        await config.load_kube_config_from_dict(merged, context=name, client_configuration=configuration)
    except (ConfigException, TypeError, KeyError, AttributeError) as exc:  # the loader's ways of saying "malformed"
        raise KubeconfigError(f"kubeconfig {where}, context {name!r}: {type(exc).__name__}: {exc}") from None
    namespace = settings.get("namespace") or "default"
    return Target(configuration, namespace, f"kubeconfig {where}, context {name!r}")


def _in_cluster(paths: list[Path]) -> Target:
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        raise KubeconfigError(
            f"no configuration: no kubeconfig at {os.pathsep.join(map(str, paths))} and not running in a pod; "
            "pass --kubeconfig or set $KUBECONFIG") from None
    try:
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        namespace = "default"
    return Target(configuration, namespace, "in-cluster")


class Kube:
    def __init__(self, api_client: client.ApiClient):
        self.api = api_client
        # Seconds the leader lease is still certain (batchsched.shell.leader);
        # writes are sent and completed only within it.  Without leader
        # election the only replica may always write.
        self.write_validity: Callable[[], float] = lambda: math.inf

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, qps_connections: int = 64,
                      context: str | None = None) -> "Kube":
        """A Kube on the configuration kubectl would use (see :func:`resolve_target`)."""
        return cls.over((await resolve_target(kubeconfig, context)).configuration, qps_connections)

    @classmethod
    def over(cls, configuration: client.Configuration, qps_connections: int = 64) -> "Kube":
        """A Kube on a loaded configuration (server, credentials)."""
        # Binding a 256-pod gang wants many requests in flight at once.
        configuration.connection_pool_maxsize = qps_connections
        if not any(os.environ.get(v) for v in PROXY_VARIABLES):
            configuration.client_session_kwargs = {"trust_env": False}
        configuration.trace_configs = [lease_fence()]
        return cls(client.ApiClient(configuration))

    async def close(self) -> None:
        await self.api.close()

    async def _call(self, method: str, path: str, query: Mapping[str, Any] | None, body: Any,
                    content_type: str | None, timeout: float | None):
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        params = await self.api.param_serialize(
            method=method, resource_path=path,
            query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
            header_params=headers, body=body, auth_settings=["BearerToken"],
        )
        return await self.api.call_api(*params, _request_timeout=timeout)

    async def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                      body: Any = None, content_type: str | None = None,
                      timeout: float | None = 30.0, decode: Callable[[bytes], dict] = json.loads) -> dict:
        """One API call; returns the decoded JSON body or raises ApiError.

        ``decode`` reads a successful answer's body (an error's is always
        read whole, as JSON).

        A write is sent only while the leader lease is certain and cancelled
        when it lapses before the answer (ApiError 503 NotLeader).
        """
        if method == "GET":
            return await self._exchange(method, path, query, body, content_type, timeout, decode)
        if self.write_validity() <= 0:
            raise not_leader(method, path, "before sending")
        sending = _sending_write.set(self.write_validity)
        try:
            async with self._within_lease() as lease:
                try:
                    return await self._exchange(method, path, query, body, content_type, timeout, decode)
                except _LeaseLapsed:
                    raise not_leader(method, path, "before its bytes went out") from None
        except TimeoutError:
            if lease.expired():
                raise not_leader(method, path, "while it was in flight") from None
            raise
        finally:
            _sending_write.reset(sending)

    @contextlib.asynccontextmanager
    async def _within_lease(self) -> AsyncIterator[asyncio.Timeout]:
        """A deadline that follows the lease: it moves on with each renewal
        and fires (cancelling the request) once the validity is spent."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(None) as deadline:
            def check() -> None:
                nonlocal pending
                left = self.write_validity()
                if left <= 0:
                    deadline.reschedule(loop.time())
                elif math.isfinite(left):
                    pending = loop.call_later(left, check)

            pending: asyncio.TimerHandle | None = None
            check()
            try:
                yield deadline
            finally:
                if pending is not None:
                    pending.cancel()

    async def _exchange(self, method: str, path: str, query: Mapping[str, Any] | None, body: Any,
                        content_type: str | None, timeout: float | None,
                        decode: Callable[[bytes], dict] = json.loads) -> dict:
        try:
            resp = await self._call(method, path, query, body, content_type, timeout)
            data = await resp.read()
        except aiohttp.ClientError as exc:
            if isinstance(exc.__cause__, _LeaseLapsed):  # refused by the body hook, in aiohttp's writer task
                raise exc.__cause__ from None
            if isinstance(exc, OSError):
                raise
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        try:
            decoded = (decode if resp.status < 400 else json.loads)(data) if data else {}
        except ValueError:
            decoded = {"message": data[:500].decode(errors="replace")}
        if resp.status >= 400:
            raise ApiError(resp.status, decoded.get("reason", resp.reason or ""),
                           decoded.get("message", ""), decoded)
        return decoded

    async def watch(self, path: str, resource_version: str, timeout_seconds: int = 300,
                    extra: Mapping[str, Any] | None = None,
                    decode: Callable[[bytes], dict] = json.loads) -> AsyncIterator[dict]:
        """Yield watch events (``{"type":..., "object":...}``) as they arrive,
        each line read by ``decode``.

        An ``ERROR`` event (for example 410 Gone) is raised as ApiError.
        """
        query = {"watch": "true", "allowWatchBookmarks": "true",
                 "resourceVersion": resource_version, "timeoutSeconds": timeout_seconds,
                 **(extra or {})}
        resp = await self._call("GET", path, query, None, None, timeout_seconds + 30)
        try:
            if resp.status >= 400:
                data = await resp.read()
                body = json.loads(data) if data else {}
                raise ApiError(resp.status, body.get("reason", ""), body.get("message", ""), body)
            content = resp.response.content
            while True:
                line = await content.readline()
                if not line:
                    return
                event = decode(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiError(int(status.get("code") or 500), status.get("reason", ""),
                                   status.get("message", ""), status)
                yield event
        finally:
            resp.response.release()

    # ---- typed conveniences on the raw path --------------------------------

    async def bind(self, namespace: str, pod: str, uid: str, node: str,
                   annotations: Mapping[str, str] | None = None) -> None:
        """Bind through the pods/binding subresource, guarded by the pod's UID.

        Success is the HTTP status (201); the Status body is not parsed into a
        V1Binding (see module docstring).
        """
        body = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod, "namespace": namespace, "uid": uid,
                         **({"annotations": dict(annotations)} if annotations else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/binding",
                           body=body)

    async def evict(self, namespace: str, pod: str, uid: str | None = None, dry_run: bool = False) -> None:
        """Evict through policy/v1 Eviction, so PodDisruptionBudgets hold (429 when they refuse)."""
        delete_options: dict[str, Any] = {}
        if uid:
            delete_options["preconditions"] = {"uid": uid}
        if dry_run:
            delete_options["dryRun"] = ["All"]
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod, "namespace": namespace},
                **({"deleteOptions": delete_options} if delete_options else {})}
        await self.request("POST", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/eviction",
                           body=body, query={"dryRun": "All"} if dry_run else None)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict:
        return await self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    async def strategic_merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict:
        """A strategic merge patch: lists with a merge key (a pod's
        status.conditions, by type) are merged entry by entry, not replaced."""
        return await self.request("PATCH", path, body=patch,
                                  content_type="application/strategic-merge-patch+json")
