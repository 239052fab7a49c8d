"""Leader election on a ``coordination.k8s.io/v1`` Lease: only the holder acts.

Why not ``kubernetes.aio.leaderelection``: as shipped (kubernetes 37) it
lets a connection error escape its loop *without* cancelling the leader's
work, so a replica could go on acting with no lease; its requests have no
deadline, so a hung renewal outlasts the lease; it logs every lost race as
an exception; and it writes local time as UTC.  This one follows client-go's
algorithm with those holes closed:

* A candidate reads the Lease.  It may take it when nobody holds it, or when
  the record has not changed (``resourceVersion``) for the holder's
  ``leaseDurationSeconds`` *as measured on the candidate's own clock* since
  it first saw that record, so clock skew between replicas does not matter.
  Writes carry the ``resourceVersion`` read, so two candidates cannot both win.
* The holder renews every ``retry_period``.  It acts only while its last
  successful renewal *started* less than ``renew_deadline`` ago
  (:meth:`validity` checks the clock on every call): with
  ``renew_deadline < lease_duration`` it stops before anyone may take over,
  even when a renewal hangs.  The scheduler's writes are fenced by
  :meth:`validity` at the moment they are sent and cancelled when it runs
  out (``Kube.request``); the elector's own Lease writes go through its own,
  unfenced :class:`Kube`.  Losing is final: ``lost`` is set and the
  process exits (cli.py), as kube-scheduler does, to come back as a standby.
* A standby polls every ``retry_period``, and at the moment the observed
  record would expire, so a crashed holder is replaced about
  ``lease_duration`` after its last renewal.  On a clean stop the holder
  releases the Lease (empty holder), so a standby takes over within one
  ``retry_period``.

The elector has its own :class:`Kube` (connection pool), so renewals never
queue behind a burst of bindings.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import aiohttp

from batchsched.kube.client import ApiError, Kube

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_identity() -> str:
    """Unique per process: a restarted replica must not inherit its old lease."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def resolve_lease_namespace(configured: str) -> str:
    """The configured namespace, else the one batchsched runs in, else "default"."""
    if configured:
        return configured
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _micro_time() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, kube: Kube, namespace: str, name: str, identity: str, *,
                 lease_duration: float, renew_deadline: float, retry_period: float,
                 clock=time.monotonic):
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_duration")
        self.kube = kube
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._clock = clock
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases/{quote(name)}"
        self.leading = asyncio.Event()  # set once this replica holds the lease
        self.lost = asyncio.Event()  # set when it held the lease and lost it: stop acting, exit
        self.observed = asyncio.Event()  # the lease's state is known (for /readyz)
        self.holder = ""  # the holder last seen
        self._valid_until = 0.0  # clock(): act only before this
        self._seen_version = ""  # resourceVersion of the record last seen...
        self._seen_at = 0.0  # ...first seen at this clock() time
        self._seen_duration = lease_duration  # ...declaring this lease duration

    def is_leading(self) -> bool:
        return self.validity() > 0

    def validity(self) -> float:
        """Seconds this replica may still act: what is left of the renew
        deadline of its last renewal, 0 unless it holds the lease.  Every
        write the scheduler sends is fenced by it (``Kube.write_validity``)."""
        if not self.leading.is_set() or self.lost.is_set():
            return 0.0
        return max(0.0, self._valid_until - self._clock())

    async def run(self) -> None:
        """Stand by until the lease is ours, then renew it until it is lost."""
        log.info("leader election: %s stands by for Lease %s/%s", self.identity, self.namespace, self.name)
        while not await self._try_acquire_or_renew():
            await asyncio.sleep(self._standby_delay())
        log.info("leader election: %s holds Lease %s/%s; acting", self.identity, self.namespace, self.name)
        self.leading.set()
        while True:
            await asyncio.sleep(self.retry_period)
            remaining = self._valid_until - self._clock()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):  # not wait_for: it can lose a cancellation on 3.11
                    renewed = await self._try_acquire_or_renew()
            except TimeoutError:
                renewed = False
            # someone else holds it (no point retrying), or the deadline passed while trying
            if not renewed and (self.holder != self.identity or self._clock() >= self._valid_until):
                break
        self.leading.clear()
        self.lost.set()
        log.error("leader election: %s lost Lease %s/%s (holder now %r); stopping at once",
                  self.identity, self.namespace, self.name, self.holder)

    def _standby_delay(self) -> float:
        """Until the next poll, or until the observed record expires if sooner."""
        if not self.holder:
            return self.retry_period
        expires_in = self._seen_at + self._seen_duration - self._clock()
        return min(self.retry_period, expires_in) if expires_in > 0 else self.retry_period

    async def _try_acquire_or_renew(self) -> bool:
        started = self._clock()
        try:
            try:
                lease = await self.kube.request("GET", self.path, timeout=self.renew_deadline)
            except ApiError as exc:
                if not exc.not_found:
                    raise
                return await self._write("POST", None, 0, started)
            spec = lease.get("spec") or {}
            version = lease["metadata"]["resourceVersion"]
            self.holder = spec.get("holderIdentity") or ""
            if version != self._seen_version:
                self._seen_version, self._seen_at = version, self._clock()
                self._seen_duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            self.observed.set()
            held_by_other = self.holder and self.holder != self.identity
            if held_by_other and self._clock() < self._seen_at + self._seen_duration:
                return False
            transitions = int(spec.get("leaseTransitions") or 0) + (self.holder != self.identity)
            return await self._write("PUT", lease, transitions, started)
        except ApiError as exc:
            if not exc.conflict:  # a lost race is routine; anything else is worth a line
                log.warning("leader election: Lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            log.warning("leader election: Lease %s/%s: %r", self.namespace, self.name, exc)
            return False

    async def _write(self, method: str, current: dict | None, transitions: int, started: float) -> bool:
        now = _micro_time()
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": math.ceil(self.lease_duration),
                "renewTime": now, "leaseTransitions": transitions,
                "acquireTime": now if self.holder != self.identity or current is None
                else current["spec"].get("acquireTime", now)}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
        if current is not None:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        path = self.path if method == "PUT" else self.path.rsplit("/", 1)[0]
        written = await self.kube.request(method, path, body=body, timeout=self.renew_deadline)
        self.holder = self.identity
        self._seen_version, self._seen_at = written["metadata"]["resourceVersion"], self._clock()
        self._valid_until = started + self.renew_deadline
        self.observed.set()
        return True

    async def release(self) -> None:
        """On a clean stop: hand the lease back so a standby takes over at once."""
        if not self.is_leading():
            return
        self.leading.clear()
        try:
            lease = await self.kube.request("GET", self.path, timeout=self.retry_period)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"].update({"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": _micro_time()})
            await self.kube.request("PUT", self.path, body=lease, timeout=self.retry_period)
            log.info("leader election: %s released Lease %s/%s", self.identity, self.namespace, self.name)
        except (ApiError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.warning("leader election: releasing Lease %s/%s failed: %r", self.namespace, self.name, exc)
