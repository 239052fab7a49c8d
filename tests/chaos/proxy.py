"""A fault-injecting HTTP proxy between scheduler replicas and the real kube-apiserver.

Each client (a scheduler replica, a test's own client) gets its own port and
a kubeconfig naming it (plain http on 127.0.0.1); every request is forwarded
over https to the API server with the client's own headers, so each request
the proxy records says which client sent it.  Watch responses are streamed
line by line.  The proxy runs its own event loop in a background thread, so
a test drives it with plain calls.

Faults are rules, matched in order against each request (method, path regex,
client, watch or not) and fired with a probability (seeded, so a run is
repeatable) at most ``count`` times:

* ``status``: answer 500, 429 (with Retry-After), 409, ... without forwarding;
* ``reset``: close the client's connection without an answer, not forwarded;
* ``drop_reply``: forward (the API server commits the request), then close
  the client's connection instead of answering;
* ``delay``: hold the request this many seconds before forwarding it; for a
  watch, every line of the stream reaches the client this much later;
* ``hold``: keep the request (not forwarded) until :meth:`FaultProxy.release_held`;
* ``gone``: answer a watch with a ``410 Gone`` ERROR event (a relist).

:meth:`FaultProxy.expire_watches` ends live watch streams with that same
ERROR event, forcing the client to relist now.  Only the standard library,
aiohttp and nothing from ``batchsched``: the harness must not trust the code
under test.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import random
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

# Hop-by-hop headers are the proxy's own business on each side; the API
# server is asked for plain bodies (no Accept-Encoding), so watch streams can
# be read, delayed and cut line by line.
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host",
                         "accept-encoding", "content-encoding", "upgrade", "proxy-connection", "te",
                         "trailer"})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
BINDING_PATH = r"/api/v1/namespaces/[^/]+/pods/[^/]+/binding$"

FAULTS = ("status", "reset", "drop_reply", "delay", "hold", "gone")


def gone_event(message: str = "too old resource version (injected by the chaos proxy)") -> bytes:
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
              "message": message, "code": 410}
    return json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"


def status_body(code: int, reason: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": f"{reason} (injected by the chaos proxy)"}


STATUS_REASONS = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}


@dataclass
class Rule:
    """One fault: which requests it matches, what it does, how often."""

    fault: str
    method: str | None = None  # None: any
    path: str = ".*"  # regex searched in the path (without the query)
    client: str | None = None  # None: any client
    watch: bool | None = None  # True: only watch requests, False: none, None: both
    probability: float = 1.0
    count: int | None = None  # fire at most this many times (None: no limit)
    after: int = 0  # let this many matching requests through first
    status: int = 500  # for "status"
    retry_after: int = 1  # seconds, with status 429
    seconds: float = 0.0  # for "delay"
    fired: int = 0
    seen: int = 0

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; one of {FAULTS}")
        if self.fault == "gone":
            self.watch = True  # only a watch can end with an ERROR event
        self._path = re.compile(self.path)

    def matches(self, client: str, method: str, path: str, watch: bool) -> bool:
        return ((self.method is None or self.method == method) and (self.client in (None, client))
                and (self.watch is None or self.watch == watch) and bool(self._path.search(path)))

    @property
    def exhausted(self) -> bool:
        return self.count is not None and self.fired >= self.count


@dataclass
class Record:
    """One request as the proxy saw it. ``status`` 0: no answer reached the
    client. ``upstream_status``: what the API server answered (0: not sent)."""

    client: str
    method: str
    path: str
    query: str
    sent: float  # time.time() when it reached the proxy
    answered: float = 0.0  # when the API server's answer (headers) came back; 0: never
    status: int = 0
    upstream_status: int = 0
    fault: str = ""

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS

    @property
    def committed(self) -> bool:
        return self.is_write and 200 <= self.upstream_status < 300


@dataclass
class _Watch:
    client: str
    path: str
    expire: asyncio.Event = field(default_factory=asyncio.Event)


class FaultProxy:
    """Start with :meth:`start`, stop with :meth:`stop` (or use as a context manager)."""

    def __init__(self, server: str, token: str, seed: int = 11):
        self.upstream = server.rstrip("/")
        self.token = token
        self.random = random.Random(seed)
        self.rules: list[Rule] = []
        self.records: list[Record] = []
        self._lock = threading.Lock()
        self._clients: dict[int, str] = {}  # local port -> client name
        self.urls: dict[str, str] = {}  # client name -> its http://127.0.0.1:port
        self._watches: list[_Watch] = []
        self.expired_watches = 0  # live watches ended by expire_watches
        self._held: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # ---- lifecycle (called from the test's thread) -----------------------------

    def start(self) -> "FaultProxy":
        started = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._setup())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="chaos-proxy", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("the chaos proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        self._call(self._teardown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _setup(self) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the local control plane's self-signed certificate
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=0), skip_auto_headers=("Accept-Encoding",),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        self._held = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()

    async def _teardown(self) -> None:
        self._held.set()
        for w in self._watches:
            w.expire.set()
        await self._runner.cleanup()
        await self._session.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    # ---- clients ---------------------------------------------------------------

    def add_client(self, name: str, directory: Path, token: str | None = None) -> Path:
        """A port of its own for ``name``; returns a kubeconfig that points
        there, authenticating with ``token`` (default: the proxy's own, admin)."""
        port = self._call(self._listen(name))
        self.urls[name] = f"http://127.0.0.1:{port}"
        path = Path(directory) / f"kubeconfig-{name}"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "chaos", "cluster": {"server": self.urls[name]}}],
            "users": [{"name": "client", "user": {"token": token or self.token}}],
            "contexts": [{"name": "chaos", "context": {"cluster": "chaos", "user": "client"}}],
            "current-context": "chaos",
        }))
        return path

    async def _listen(self, name: str) -> int:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        self._clients[port] = name
        await web.SockSite(self._runner, sock).start()
        return port

    # ---- faults ----------------------------------------------------------------

    def add_rule(self, fault: str, **kwargs) -> Rule:
        rule = Rule(fault, **kwargs)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear_rules(self) -> None:
        with self._lock:
            self.rules.clear()

    def release_held(self) -> None:
        """Let held requests go on (forwarded, unless their client left) and drop the hold rules."""
        with self._lock:
            self.rules = [rule for rule in self.rules if rule.fault != "hold"]
        self._loop.call_soon_threadsafe(self._held.set)

    def expire_watches(self, path: str = ".*", client: str | None = None) -> int:
        """End every live watch on a matching path with 410 Gone; returns how many."""
        pattern = re.compile(path)
        hit = [w for w in list(self._watches) if pattern.search(w.path) and client in (None, w.client)]
        for w in hit:
            self._loop.call_soon_threadsafe(w.expire.set)
        with self._lock:
            self.expired_watches += len(hit)
        return len(hit)

    def live_watches(self, path: str = ".*") -> int:
        pattern = re.compile(path)
        return sum(1 for w in list(self._watches) if pattern.search(w.path))

    def faults_injected(self, fault: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.records if r.fault and fault in (None, r.fault)) + (
                self.expired_watches if fault in (None, "gone") else 0)

    def records_of(self, method: str | None = None, path: str = ".*") -> list[Record]:
        pattern = re.compile(path)
        with self._lock:
            return [r for r in self.records if method in (None, r.method) and pattern.search(r.path)]

    def _pick(self, client: str, method: str, path: str, watch: bool) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.exhausted or not rule.matches(client, method, path, watch):
                    continue
                rule.seen += 1
                if rule.seen <= rule.after or self.random.random() >= rule.probability:
                    continue
                rule.fired += 1
                return rule
        return None

    # ---- forwarding ------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        client = self._clients.get(request.transport.get_extra_info("sockname")[1], "?")
        watch = request.query.get("watch") in ("true", "1")
        body = await request.read()
        record = Record(client, request.method, request.path, request.query_string, time.time())
        with self._lock:
            self.records.append(record)
        rule = self._pick(client, request.method, request.path, watch)
        if rule is not None:
            record.fault = rule.fault
            if rule.fault == "status":
                record.status = rule.status
                headers = {"Retry-After": str(rule.retry_after)} if rule.status == 429 else {}
                return web.json_response(status_body(rule.status, STATUS_REASONS.get(rule.status, "Injected")),
                                         status=rule.status, headers=headers)
            if rule.fault == "reset":
                return self._abort(request)
            if rule.fault == "gone":
                return await self._answer_gone(request, record)
            if rule.fault == "hold":
                await self._held.wait()
                if request.transport is None or request.transport.is_closing():
                    return self._abort(request)  # its client is gone: never forwarded
            if rule.fault == "delay" and not watch:
                await asyncio.sleep(rule.seconds)
        delay = rule.seconds if rule is not None and rule.fault == "delay" else 0.0
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        try:
            upstream = await self._session.request(
                request.method, self.upstream + request.path_qs, headers=headers, data=body or None)
        except (aiohttp.ClientError, OSError):
            return self._abort(request)  # the API server is down: the client sees a broken connection
        record.answered, record.upstream_status = time.time(), upstream.status
        try:
            if rule is not None and rule.fault == "drop_reply":
                await upstream.read()  # the API server has answered: the request is committed
                return self._abort(request)
            if watch and upstream.status == 200:
                return await self._stream(request, upstream, record, delay)
            data = await upstream.read()
            record.status = upstream.status
            return web.Response(status=upstream.status, body=data, headers=self._reply_headers(upstream))
        finally:
            upstream.release()

    @staticmethod
    def _reply_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
        return {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}

    @staticmethod
    def _abort(request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=499)  # never written: the connection is gone

    async def _answer_gone(self, request: web.Request, record: Record) -> web.StreamResponse:
        record.status = 200
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(gone_event())
        await response.write_eof()
        return response

    async def _stream(self, request: web.Request, upstream: aiohttp.ClientResponse, record: Record,
                      delay: float) -> web.StreamResponse:
        record.status = 200
        response = web.StreamResponse(status=200, headers=self._reply_headers(upstream))
        await response.prepare(request)
        watch = _Watch(record.client, request.path)
        self._watches.append(watch)
        lines: asyncio.Queue = asyncio.Queue()

        async def read() -> None:
            try:
                async for line in upstream.content:
                    await lines.put((time.monotonic() + delay, line))
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
                pass  # the stream broke (the API server went away): end it for the client too
            await lines.put((time.monotonic() + delay, b""))

        reader = asyncio.create_task(read())
        expired = asyncio.create_task(watch.expire.wait())
        getting = None
        try:
            while True:
                getting = asyncio.create_task(lines.get())
                done, _ = await asyncio.wait({getting, expired}, return_when=asyncio.FIRST_COMPLETED)
                if expired in done:
                    getting.cancel()
                    await response.write(gone_event("watch ended by the chaos proxy"))
                    break
                due, line = getting.result()
                if due > time.monotonic():
                    await asyncio.sleep(due - time.monotonic())
                if not line:
                    break
                await response.write(line)
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientError, RuntimeError):
            pass  # the client went away
        finally:
            for task in (reader, expired, getting):
                if task is not None:
                    task.cancel()
            self._watches.remove(watch)
        return response



def call(proxy: FaultProxy, client: str, method: str, path: str, body: dict | None = None,
         timeout: float = 10) -> tuple[int, dict, dict] | None:
    """One request through the proxy as ``client`` with a raw http.client (no
    client library retrying behind the caller's back): (status, headers,
    JSON body), or None when the connection broke without an answer."""
    url = urlsplit(proxy.urls[client])
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Authorization": f"Bearer {proxy.token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, dict(resp.headers), json.loads(data) if data else {}
    except (ConnectionError, http.client.HTTPException):
        return None
    finally:
        conn.close()
