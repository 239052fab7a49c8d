"""Pods in the watch cache: converted (a hostile pod alone is skipped),
overlaid with the GPU ids believed and the bindings assumed, and the gangs
they touch recorded for the next cycle."""
from __future__ import annotations

import logging
import time

from batchsched.api import constants
from batchsched.core.model import PodInfo, pod_with
from batchsched.core.readers import pod_from_json

log = logging.getLogger(__name__)
CHECKPOINT_CLOCK_SKEW_SECONDS = 60.0  # a checkpoint-time this far ahead of our clock is in the future


class PodHandlers:
    """The cache's pods (its ``state``, ``assumed``, ``witnessed``, ``touched_gangs``)."""

    def _parse_pod(self, obj: dict) -> PodInfo | None:
        try:
            pod = pod_from_json(obj, self.gang_sources, self.auto_always)
            if pod.scheduler_name in self.also_serves:
                pod = pod_with(pod, scheduler_name=self.scheduler_name)
            self._check_checkpoint(pod)
            return pod
        except Exception as exc:  # noqa: BLE001 - whatever a hostile pod holds, it alone is skipped
            meta = obj.get("metadata") or {}
            log.warning("ignoring pod %s/%s: %s", meta.get("namespace"), meta.get("name"), exc)
            self.on_bad_object("Pod", obj, str(exc))
            return None

    def _check_checkpoint(self, pod: PodInfo) -> None:
        """Log a checkpoint-time annotation that preemption ignores (not an
        RFC3339 time, or in the future), once per value."""
        problem = pod.checkpoint_problem
        if not problem and pod.checkpoint > time.time() + CHECKPOINT_CLOCK_SKEW_SECONDS:
            problem = "it is in the future"
        held = self.state.given_pod(pod.uid)
        if problem and (held is None or (held.checkpoint, held.checkpoint_problem)
                        != (pod.checkpoint, pod.checkpoint_problem)):
            log.warning("pod %s: ignoring annotation %s: %s (preemption counts its work lost from its start)",
                        pod.key, constants.CHECKPOINT_TIME_ANNOTATION, problem)

    def _pod_entry(self, obj: dict) -> tuple[str, PodInfo] | None:
        """A listed pod; one that differs from the pod held only in what
        the cache overlays (believed GPU ids) is the held object, so a
        relist holds no second copy of what did not change."""
        pod = self._parse_pod(obj)
        if pod is None:
            return None
        held = self.pods.get(pod.uid)
        if held is not None and pod_with(
                pod, gpu_ids=held.gpu_ids, bound_by_scheduler=held.bound_by_scheduler) == held:
            return pod.uid, held
        return pod.uid, pod

    def _replace_pods(self, listed: dict[str, PodInfo]) -> None:
        """A whole list at once: pods missing from it are gone; trust and
        assumptions are applied now, so one made while the list was read
        still holds."""
        for uid in [uid for uid in self.pods if uid not in listed]:
            self._drop_pod(uid)
        for pod in listed.values():
            self._put_pod(self._as_seen(pod))
        self.pods_listed = True
        self._notify()

    def _apply_pod(self, event_type: str, obj: dict) -> None:
        if event_type == "DELETED":
            self._drop_pod((obj.get("metadata") or {}).get("uid", ""))
        else:
            pod = self._parse_pod(obj)
            if pod is None:
                return
            self._put_pod(self._as_seen(pod))
        self._notify()

    def _put_pod(self, pod: PodInfo) -> None:
        if self.state.given_pod(pod.uid) == pod:
            return
        old = self.pods.get(pod.uid)
        self.state.put_pod(pod)
        if old and old.holds_resources and not pod.holds_resources:
            self.capacity_freed = True
        if old and (old.holds_resources and pod.terminating and not old.terminating):
            self.capacity_freed = True  # a victim going away: worth another look soon
        if not self._may_concern_a_gang(pod):
            return
        if (old is None or old.phase != pod.phase or old.node_name != pod.node_name
                or old.gated != pod.gated or old.terminating != pod.terminating):
            self.touched_gangs.add(pod.gang_key)

    def _drop_pod(self, uid: str) -> None:
        """The pod is gone: nothing about its binding is worth keeping."""
        old = self.state.remove_pod(uid)
        self.assumed.pop(uid, None)
        self.witnessed.pop(uid, None)
        if old:
            self.capacity_freed |= old.holds_resources
            if self._may_concern_a_gang(old):
                self.touched_gangs.add(old.gang_key)

    def _may_concern_a_gang(self, pod: PodInfo) -> bool:
        """Another scheduler's pod in no gang is a gang of one that is never
        ours (schedulerName cannot change): it touches capacity only, and at
        a start tens of thousands of them would each be looked at."""
        return pod.scheduler_name == self.scheduler_name or bool(pod.group)
