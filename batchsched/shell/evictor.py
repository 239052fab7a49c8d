"""Carries out preemption plans: nominate, then evict through the Eviction API.

For one preemptor the victims are first evicted with ``dryRun=All``: if any
is refused (429 from a PodDisruptionBudget, say), nothing is evicted, the
refusal is remembered for ``refusalBackoffSeconds`` so the next cycle picks
another victim set or explains why it waits.  Otherwise the preemptor's pods
get ``status.nominatedNodeName`` (the room is theirs: the core holds it for
them) and the victims are evicted for real.  Nominations that have not led
to a binding within ``nominationTimeoutSeconds`` are cleared.
"""
from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import quote

from batchsched.config import PreemptionConfig
from batchsched.core.cycle import Eviction, GangReset, Nomination
from batchsched.core.model import PodInfo
from batchsched.core.preemption.policy import PreemptionState
from batchsched.shell.cache import ClusterCache
from batchsched.shell.kube import ApiError, Kube
from batchsched.shell.status import EventRecorder, group_ref, pod_ref

log = logging.getLogger(__name__)


class Evictor:
    def __init__(self, kube: Kube, cache: ClusterCache, events: EventRecorder, config: PreemptionConfig):
        self.kube, self.cache, self.events, self.config = kube, cache, events, config
        self.victims_by_gang: dict[str, set[str]] = {}
        self.node_evicted_at: dict[str, float] = {}
        self.refused: dict[str, tuple[str, float]] = {}  # uid -> (why, until)
        self.nominated_at: dict[str, float] = {}
        self.evicted_total = 0
        self.on_victim = lambda pod, preemptor: None  # metrics hook

    def state(self) -> PreemptionState:
        now = time.monotonic()
        self.refused = {uid: r for uid, r in self.refused.items() if r[1] > now}
        for gang, uids in list(self.victims_by_gang.items()):
            uids.intersection_update(self.cache.pods)  # a deleted victim is gone for good
            if not uids:
                del self.victims_by_gang[gang]
        cooling = frozenset(n for n, t in self.node_evicted_at.items()
                            if now - t < self.config.node_cooldown_seconds)
        return PreemptionState(cooling_nodes=cooling,
                               refused={uid: why for uid, (why, _) in self.refused.items()},
                               in_flight=frozenset(self.victims_by_gang))

    def carry_out(self, evictions: list[Eviction], nominations: list[Nomination]) -> list[asyncio.Task]:
        """Start one task per preemptor; nominations are assumed in the cache at once."""
        by_gang: dict[str, tuple[list[PodInfo], list[Nomination]]] = {}
        for ev in evictions:
            by_gang.setdefault(ev.preemptor, ([], []))[0].append(ev.pod)
        for nom in nominations:
            self._assume_nomination(nom.pod.uid, nom.node_name)
            by_gang.setdefault(nom.pod.gang_key, ([], []))[1].append(nom)
        # Gangs in this cycle's evictions are in flight from now on.
        for gang, (victims, _) in by_gang.items():
            self.victims_by_gang.setdefault(gang, set()).update(p.uid for p in victims)
        loop = asyncio.get_running_loop()
        return [loop.create_task(self._preempt(gang, victims, noms)) for gang, (victims, noms) in by_gang.items()]

    def _assume_nomination(self, uid: str, node: str) -> None:
        self.cache.set_nomination(uid, node)
        self.nominated_at[uid] = time.monotonic()

    async def _preempt(self, gang: str, victims: list[PodInfo], nominations: list[Nomination]) -> None:
        refusals = await asyncio.gather(*(self._evict(p, dry_run=True) for p in victims))
        refused = [(p, why) for p, why in zip(victims, refusals) if why]
        group = self.cache.groups_raw.get(gang)
        if refused:
            until = time.monotonic() + self.config.refusal_backoff_seconds
            for pod, why in refused:
                self.refused[pod.uid] = (why, until)
            self.victims_by_gang.pop(gang, None)
            for nom in nominations:
                await self._set_nomination(nom.pod, "")
            message = (f"Preemption for gang {gang} called off: eviction of "
                       + "; ".join(f"{p.key} refused ({why})" for p, why in refused[:5]))
            log.info(message)
            if group is not None:
                self.events.emit(group_ref(group), "Warning", "PreemptionBlocked", message)
            self.cache.changed.set()
            return
        for nom in nominations:
            await self._set_nomination(nom.pod, nom.node_name)
        now = time.monotonic()
        results = await asyncio.gather(*(self._evict(p, dry_run=False) for p in victims))
        for pod, why in zip(victims, results):
            if why:
                log.warning("eviction of %s for gang %s failed: %s", pod.key, gang, why)
                continue
            self.evicted_total += 1
            self.node_evicted_at[pod.node_name] = now
            self.on_victim(pod, gang)
            self.events.emit(pod_ref(pod.namespace, pod.name, pod.uid), "Normal", "Preempted",
                             f"Preempted by gang {gang} (priority above {pod.priority}) to make room on "
                             f"{pod.node_name}")
        if group is not None and victims:
            self.events.emit(group_ref(group), "Normal", "Preempting",
                             f"Evicted {len(victims)} pod(s) to make room: "
                             + ", ".join(sorted(p.key for p in victims)[:10]))

    async def start_over(self, reset: GangReset) -> None:
        """Evict the bound members of a gang left partly bound too long
        (always through the Eviction API: PodDisruptionBudgets hold).  A
        refused eviction is tried again when the timeout next expires."""
        group = self.cache.groups_raw.get(reset.gang_key)
        log.warning(reset.message)
        if group is not None:
            self.events.emit(group_ref(group), "Warning", "PartialGangTimeout", reset.message)
        results = await asyncio.gather(*(self._evict(p, dry_run=False, mode="Evict") for p in reset.pods))
        for pod, why in zip(reset.pods, results):
            if why:
                log.warning("evicting %s to start gang %s over failed: %s", pod.key, reset.gang_key, why)
            else:
                self.events.emit(pod_ref(pod.namespace, pod.name, pod.uid), "Normal", "PartialGangTimeout",
                                 f"Evicted: gang {reset.gang_key} stayed partly bound too long and starts over")

    async def _evict(self, pod: PodInfo, dry_run: bool, mode: str | None = None) -> str:
        """"" on success, else why it was refused.  ``mode``: Evict or Delete
        (default: the configured one)."""
        try:
            if (mode or self.config.mode) == "Delete":
                if not dry_run:
                    await self.kube.request(
                        "DELETE", f"/api/v1/namespaces/{quote(pod.namespace)}/pods/{quote(pod.name)}",
                        body={"preconditions": {"uid": pod.uid}})
                return ""
            await self.kube.evict(pod.namespace, pod.name, pod.uid, dry_run=dry_run)
            return ""
        except ApiError as exc:
            if exc.not_found:
                return ""  # already gone: as good as evicted
            return f"{exc.status} {exc.message}"
        except (OSError, asyncio.TimeoutError) as exc:
            return repr(exc)

    async def _set_nomination(self, pod: PodInfo, node: str) -> None:
        path = f"/api/v1/namespaces/{quote(pod.namespace)}/pods/{quote(pod.name)}/status"
        try:
            await self.kube.merge_patch(path, {"status": {"nominatedNodeName": node or None}})
        except (ApiError, OSError, asyncio.TimeoutError) as exc:
            log.warning("could not set nominatedNodeName of %s: %s", pod.key, exc)
        if not node:
            self.nominated_at.pop(pod.uid, None)
            current = self.cache.pods.get(pod.uid)
            if current is not None and not current.node_name:
                self.cache.set_nomination(pod.uid, "")

    def expire_nominations(self) -> list[asyncio.Task]:
        """Clear nominations that did not lead to a binding in time (also ones
        found after a restart, whose clock starts when first seen)."""
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        tasks = []
        nominated = self.cache.nominated_pods()
        current = {pod.uid for pod in nominated}
        for uid in [uid for uid in self.nominated_at if uid not in current]:
            del self.nominated_at[uid]  # bound, gone or cleared
        for pod in nominated:
            since = self.nominated_at.setdefault(pod.uid, now)
            if now - since > self.config.nomination_timeout_seconds:
                log.info("nomination of %s on %s expired", pod.key, pod.nominated_node)
                self.nominated_at.pop(pod.uid, None)
                tasks.append(loop.create_task(self._set_nomination(pod, "")))
        return tasks
