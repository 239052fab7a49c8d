"""Carries out preemption plans: nominate, then evict through the Eviction API.

For one preemptor the victims are first evicted with ``dryRun=All``: if any
is refused (429 from a PodDisruptionBudget, say), nothing is evicted, the
refusal is remembered for ``refusalBackoffSeconds`` so the next cycle picks
another victim set or explains why it waits.  Otherwise the preemptor's pods
get ``status.nominatedNodeName`` (the room is theirs: the core holds it for
them) and the victims are evicted for real.  A dry run judges each victim
alone, so a real eviction can still be refused (a budget of one, two
victims): refused ones are tried again with backoff for up to
``evictionRetrySeconds`` (a victim gang partly evicted is below minMember
until the rest go); what is still refused then is called off like a refused
dry run, and the preemptor is planned again.  Nominations that have not led
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
from batchsched.core.preemption.policy import EvictionLog, PreemptionState
from batchsched.kube.client import ApiError, Kube
from batchsched.kube.events import EventRecorder, pod_ref
from batchsched.shell.cache import ClusterCache
from batchsched.shell.status import group_ref

log = logging.getLogger(__name__)

# Backoff between tries of a refused real eviction (evictionRetrySeconds bounds them all).
RETRY_FIRST_DELAY_SECONDS = 0.5
RETRY_MAX_DELAY_SECONDS = 5.0


class Evictor:
    def __init__(self, kube: Kube, cache: ClusterCache, events: EventRecorder, config: PreemptionConfig):
        self.kube, self.cache, self.events, self.config = kube, cache, events, config
        self.victims_by_gang: dict[str, set[str]] = {}
        self.node_evicted_at: dict[str, float] = {}
        self.refused: dict[str, tuple[str, float]] = {}  # uid -> (why, until)
        self.nominated_at: dict[str, float] = {}
        self.evicted_by_priority = EvictionLog()
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
                               in_flight=frozenset(self.victims_by_gang),
                               evicted_last_hour=self.evicted_by_priority.last_hour(now))

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
        # victims of priority preemption count against their namespace's eviction budget, a reclaim's do not
        budgeted = frozenset(ev.pod.uid for ev in evictions if not ev.reclaim)
        return [loop.create_task(self._preempt(gang, victims, noms, budgeted))
                for gang, (victims, noms) in by_gang.items()]

    def _assume_nomination(self, uid: str, node: str) -> None:
        self.cache.set_nomination(uid, node)
        self.nominated_at[uid] = time.monotonic()

    async def _preempt(self, gang: str, victims: list[PodInfo], nominations: list[Nomination],
                       budgeted: frozenset[str]) -> None:
        refusals = await asyncio.gather(*(self._evict(p, dry_run=True) for p in victims))
        refused = [(p, why) for p, why in zip(victims, refusals) if why]
        if refused:
            await self._call_off(gang, refused, nominations, "PreemptionBlocked",
                                 f"Preemption for gang {gang} called off: eviction of ")
            return
        for nom in nominations:
            await self._set_nomination(nom.pod, nom.node_name)
        refused = await self._evict_for_real(gang, victims, budgeted)
        still_there = {p.uid for p, _ in refused}
        evicted = [p for p in victims if p.uid not in still_there]
        group = self.cache.groups_raw.get(gang)
        if group is not None and evicted:
            self.events.emit(group_ref(group), "Normal", "Preempting",
                             f"Evicted {len(evicted)} pod(s) to make room: "
                             + ", ".join(sorted(p.key for p in evicted)[:10]))
        if refused:
            self._report_broken_victim_gangs(gang, evicted, refused)
            await self._call_off(gang, refused, nominations, "PreemptionIncomplete", (
                f"Preemption for gang {gang} stopped after {len(evicted)} of {len(victims)} eviction(s) "
                f"(tried for {self.config.eviction_retry_seconds:g}s); its nominations are released and "
                "it is planned again without the refused pods: eviction of "))

    async def _evict_for_real(self, gang: str, victims: list[PodInfo],
                              budgeted: frozenset[str]) -> list[tuple[PodInfo, str]]:
        """Evict ``victims``; a refused one is tried again with backoff until
        ``evictionRetrySeconds`` have passed; those in ``budgeted`` are logged
        for the eviction budget once evicted.  Returns those still refused."""
        deadline = time.monotonic() + self.config.eviction_retry_seconds
        delay = RETRY_FIRST_DELAY_SECONDS
        trying = victims
        while True:
            results = await asyncio.gather(*(self._evict(p, dry_run=False) for p in trying))
            now = time.monotonic()
            refused = []
            for pod, why in zip(trying, results):
                if why:
                    refused.append((pod, why))
                    continue
                self.evicted_total += 1
                self.node_evicted_at[pod.node_name] = now
                if pod.uid in budgeted:
                    self.evicted_by_priority.add(now, pod.namespace)
                self.on_victim(pod, gang)
                self.events.emit(pod_ref(pod.namespace, pod.name, pod.uid), "Normal", "Preempted",
                                 f"Preempted by gang {gang} (priority above {pod.priority}) to make room on "
                                 f"{pod.node_name}")
            refused = [(p, why) for p, why in refused if p.uid in self.cache.pods]  # deleted meanwhile: gone
            if not refused or now >= deadline:
                return refused
            wait = min(delay, deadline - now)
            log.warning("eviction of %s for gang %s refused (%s); trying again in %.1fs",
                        ", ".join(p.key for p, _ in refused[:5]), gang, refused[0][1], wait)
            await asyncio.sleep(wait)
            delay = min(delay * 2, RETRY_MAX_DELAY_SECONDS)
            trying = [p for p, _ in refused]

    async def _call_off(self, gang: str, refused: list[tuple[PodInfo, str]], nominations: list[Nomination],
                        reason: str, message: str) -> None:
        """Remember the refusals (the core avoids those victims for
        ``refusalBackoffSeconds`` or names them), release the preemptor's
        claims and let it be planned again."""
        until = time.monotonic() + self.config.refusal_backoff_seconds
        for pod, why in refused:
            self.refused[pod.uid] = (why, until)
        self.victims_by_gang.pop(gang, None)
        for nom in nominations:
            await self._set_nomination(nom.pod, "")
        message += "; ".join(f"{p.key} refused ({why})" for p, why in refused[:5])
        log.warning(message)
        group = self.cache.groups_raw.get(gang)
        if group is not None:
            self.events.emit(group_ref(group), "Warning", reason, message)
        else:  # a pod without a PodGroup: the event goes on the pod itself
            for nom in nominations:
                self.events.emit(pod_ref(nom.pod.namespace, nom.pod.name, nom.pod.uid), "Warning", reason, message)
        self.cache.changed.set()

    def _report_broken_victim_gangs(self, gang: str, evicted: list[PodInfo],
                                    refused: list[tuple[PodInfo, str]]) -> None:
        """A victim gang whose eviction was refused part way stays bound below
        its minMember: say so on it (its pods are not evicted against the budget)."""
        gone = {p.uid for p in evicted}
        for key in sorted({p.gang_key for p in evicted} & {p.gang_key for p, _ in refused}):
            spec, obj = self.cache.groups.get(key), self.cache.groups_raw.get(key)
            if spec is None or obj is None:
                continue
            left = [p for p in self.cache.members(key)
                    if p.holds_resources and not p.terminating and p.uid not in gone]
            if len(left) >= spec.min_member:
                continue
            why = next(why for p, why in refused if p.gang_key == key)
            message = (f"Preemption by gang {gang} evicted {sum(p.gang_key == key for p in evicted)} member(s) "
                       f"but the eviction of the rest was refused ({why}): {len(left)} member(s) stay bound "
                       f"below minMember={spec.min_member} until they end or are preempted again")
            log.warning("gang %s: %s", key, message)
            self.events.emit(group_ref(obj), "Warning", "PreemptionIncomplete", message)

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
