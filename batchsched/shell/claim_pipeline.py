"""A gang's claim transaction, the first step of its binding pipeline.

The claims of a gang's pods placed where DRA serves nvidia.com/gpu are
written, and their own claims allocated or reserved, before any member
binds (docs/dra.md): in waves, a pod joining a claim a gang mate allocates
after that mate.  One claim not written undoes all written for the gang.
A binding refused later has its pod's claims undone before the pod is
unassumed, so nothing the claims still hold is given out again meanwhile.
Claims of ours left by a crash or a failed delete are swept.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Coroutine

from batchsched.kube.client import Kube
from batchsched.shell.binder import BindRequest
from batchsched.shell.cache import ClusterCache
from batchsched.shell.claims import ClaimError, ClaimWriter, ExplicitClaims, PodClaims, WrittenClaim
from batchsched.shell.logs import decision

log = logging.getLogger(__name__)

# How often claims left over by a crash or a failed delete are looked for.
SWEEP_SECONDS = 1.0


@dataclass(frozen=True)
class ClaimsRefused:
    """A gang's claims not all written (and those written undone): ``first``,
    the first member in gang order whose own did not, and ``why``."""
    first: BindRequest
    why: BaseException
    failed: frozenset[str]  # uids of the members whose own claims failed


def has_claims(r: BindRequest) -> bool:
    return r.claim is not None or bool(r.claims)


def claim_waves(asking: list[BindRequest]) -> list[list[BindRequest]]:
    """A gang's pods in the waves their claims are written in: a pod joining
    a claim that a gang mate allocates (core/dra/claims.py) comes after that
    mate, as its reservation must see the allocation."""
    allocating = {c.uid: r.uid for r in asking for c in r.claims if c.allocate}
    waves: list[list[BindRequest]] = []
    written: set[str] = set()
    left = asking
    while left:
        wave = [r for r in left if all(allocating[c.uid] in written for c in r.claims
                                       if not c.allocate and c.uid in allocating)]
        wave = wave or left  # (a cycle, which no plan makes: a joiner then fails, finding no allocation)
        waves.append(wave)
        written.update(r.uid for r in wave)
        left = [r for r in left if r.uid not in written]
    return waves


class ClaimPipeline:
    """Writes and undoes the claims of the pods a cycle binds (at most
    ``parallelism`` pods' at once); ``spawn`` runs a task the scheduler tracks."""

    def __init__(self, kube: Kube, cache: ClusterCache, scheduler_name: str, parallelism: int,
                 spawn: Callable[[Coroutine], None]):
        self.cache = cache
        self.scheduler_name = scheduler_name
        self.claims = ClaimWriter(kube, lambda: cache.state)
        self.explicit = ExplicitClaims(kube, lambda: cache.state)
        self._slots = asyncio.Semaphore(parallelism)
        self._spawn = spawn
        self._swept = 0.0
        self._deleting: set[str] = set()  # claim uids

    async def write_gang(self, key: str, members: list[BindRequest]) -> dict[str, PodClaims] | ClaimsRefused:
        """The claims of the members that have any, by pod uid, all written;
        or why not, with every claim written for the gang undone (its pods
        are still assumed: the caller unassumes them)."""
        asking = [r for r in members if has_claims(r)]
        started = time.monotonic()
        waves = claim_waves(asking)
        errors: dict[str, BaseException] = {}
        done: dict[str, PodClaims] = {}
        for wave in waves:
            outcomes = await asyncio.gather(*(self._write_pod(r) for r in wave), return_exceptions=True)
            errors.update((r.uid, o) for r, o in zip(wave, outcomes) if isinstance(o, BaseException))
            done.update((r.uid, o) for r, o in zip(wave, outcomes) if isinstance(o, PodClaims))
            if errors:
                break
        log.info("ResourceClaims of %d pod(s) written in %.2f s%s", len(done), time.monotonic() - started,
                 " (gang refused)" if errors else "", extra=decision(key, [r.name for r in asking]))
        if not errors:
            return done
        for wave in reversed(waves):  # joiners leave a shared claim first: its allocation goes with the last
            await asyncio.gather(*(self.undo(r.uid, done[r.uid]) for r in wave if r.uid in done))
        first = next(r for r in asking if r.uid in errors)
        return ClaimsRefused(first, errors[first.uid], frozenset(errors))

    async def _write_pod(self, r: BindRequest) -> PodClaims:
        """The pod's extended-resource claim, then its own claims; a failure
        undoes what was written for it and raises ClaimError."""
        async with self._slots:
            written = PodClaims()
            try:
                if r.claim is not None:
                    written.extended = await self.claims.write(r.namespace, r.name, r.uid, r.claim)
                if r.claims:
                    written.reserved = await self.explicit.write(r.name, r.uid, r.claims)
                return written
            except Exception as exc:  # noqa: BLE001 - a bug here fails this gang, not the loop
                if written.extended is not None:
                    await self.claims.delete(written.extended)
                if isinstance(exc, ClaimError):
                    raise
                log.exception("writing the ResourceClaims of %s/%s failed", r.namespace, r.name)
                raise ClaimError(f"writing its ResourceClaims failed: {type(exc).__name__}: {exc}") from exc

    async def undo(self, pod_uid: str, written: PodClaims) -> None:
        if written.extended is not None:
            await self.claims.delete(written.extended)
        for reserved in reversed(written.reserved):
            await self.explicit.undo(pod_uid, reserved)

    async def undo_then_unassume(self, r: BindRequest, written: PodClaims) -> None:
        """A binding refused after its claims were written: they are undone,
        and only then is the pod unassumed.  Till then its devices stay in
        flight and the pod is not placed again, so neither another pod nor
        the pod's next attempt is given what the claims still hold."""
        try:
            await self.undo(r.uid, written)
        finally:
            self.unassume(r)

    def unassume(self, r: BindRequest) -> None:
        """The attempt did not bind: its in-flight devices and the pod's
        room are released together (the devices of another attempt of the
        pod are left alone)."""
        self.cache.state.forget_allocation(r.uid, r.attempt)
        self.cache.forget(r.uid)

    def sweep_leftovers(self) -> None:
        """Extended-resource claims of our pods that are neither bound nor
        being bound (left by a crash, or by a delete that failed) are
        deleted, so that the pod's next attempt makes the only one.  At most
        every ``SWEEP_SECONDS``."""
        if time.monotonic() - self._swept <= SWEEP_SECONDS:
            return
        self._swept = time.monotonic()
        for claim in list(self.cache.state.dra.claims.values()):
            pod = self.cache.pods.get(claim.owner_pod) if claim.extended else None
            if (pod is None or pod.namespace != claim.namespace or pod.scheduler_name != self.scheduler_name
                    or not pod.awaits_placement
                    or pod.uid in self.cache.assumed or claim.uid in self._deleting):
                continue
            log.info("deleting ResourceClaim %s/%s: its pod %s is not bound nor being bound",
                     claim.namespace, claim.name, pod.name)
            self._deleting.add(claim.uid)
            self._spawn(self._delete_leftover(WrittenClaim(claim.namespace, claim.name, claim.uid)))

    async def _delete_leftover(self, claim: WrittenClaim) -> None:
        try:
            await self.claims.delete(claim)
        finally:
            self._deleting.discard(claim.uid)
