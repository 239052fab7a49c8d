"""Watch caches: list then watch pods, nodes, PodGroups and PriorityClasses.

The cache is the scheduler's only state.  It holds core model objects (not
client objects), applies the scheduler's *assumed* bindings on top of what the
API server has confirmed, and records what changed since the last cycle so
the queue can reset backoffs.

Each collection is kept by a :class:`Reflector`: list (paginated), then watch
from the list's resourceVersion with bookmarks; a watch that times out
resumes from the last resourceVersion seen; ``410 Gone`` relists at once;
any other error reconnects with capped exponential backoff.  A relist
replaces the confirmed state but keeps assumptions, so bindings in flight
are not forgotten.

Nothing ends a reflector but cancellation: an object that cannot be
converted is reported (``on_bad_object``) and skipped, and any other
exception while listing, watching or applying is logged and followed by a
relist, the reflector counting as not synced (``error``) until that
relist succeeds.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Callable, Iterable, Mapping

import aiohttp

from batchsched.api import constants
from batchsched.core.cluster import ClusterState
from batchsched.core.model import GroupSpec, NodeInfo, PodInfo, group_from_json, node_from_json, pod_from_json
from batchsched.core.snapshot import Snapshot
from batchsched.core.text import clip
from batchsched.shell.kube import ApiError, Kube

log = logging.getLogger(__name__)

PODGROUPS_PATH = f"/apis/{constants.GROUP}/{constants.VERSION}/podgroups"
# A refused PodGroup's reason goes into its status condition and an Event:
# kept short whatever the object (hostile keys are echoed in the reason).
MAX_PROBLEM_LENGTH = 2000


class Reflector:
    """Keeps one collection in step with the API server, forever."""

    def __init__(self, kube: Kube, path: str, kind: str,
                 replace: Callable[[list[dict]], None], apply: Callable[[str, dict], None],
                 on_restart: Callable[[str, str], None] | None = None):
        self.kube, self.path, self.kind = kube, path, kind
        self.replace, self.apply = replace, apply
        self.on_restart = on_restart or (lambda kind, why: None)
        self.synced = asyncio.Event()
        self.error = ""  # why the collection is not in step now ("" while it is)

    async def list_once(self) -> tuple[list[dict], str]:
        """Every object of the collection (paginated) and the list's resourceVersion."""
        items: list[dict] = []
        cont = None
        while True:
            page = await self.kube.request("GET", self.path, query={"limit": 1000, "continue": cont},
                                           timeout=120)
            items.extend(page.get("items") or ())
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items, page["metadata"]["resourceVersion"]

    async def run(self) -> None:
        backoff = 0.2
        while True:
            try:
                items, rv = await self.list_once()
                self.replace(items)
                self.error = ""
                self.synced.set()
                while True:
                    async for event in self.kube.watch(self.path, rv, timeout_seconds=290):
                        obj = event.get("object") or {}
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if event["type"] != "BOOKMARK":
                            self.apply(event["type"], obj)
                    backoff = 0.2  # a watch that ended normally is healthy
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if exc.gone:
                    log.info("%s watch expired (410 Gone); relisting", self.kind)
                    self.on_restart(self.kind, "gone")
                    continue
                log.warning("%s list/watch failed: %s; retrying in %.1fs", self.kind, exc, backoff)
                self._failed(f"list/watch failed: {exc}")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, json.JSONDecodeError) as exc:
                log.warning("%s list/watch connection failed: %r; retrying in %.1fs", self.kind, exc, backoff)
                self._failed(f"list/watch connection failed: {exc!r}")
            except Exception as exc:  # noqa: BLE001 - a bad answer or a bug: relist rather than die
                log.exception("%s cache update failed; relisting in %.1fs", self.kind, backoff)
                self._failed(f"cache update failed: {type(exc).__name__}: {exc}")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 30.0)

    def _failed(self, why: str) -> None:
        self.error = clip(why, 300)
        self.on_restart(self.kind, "error")


class ClusterCache:
    def __init__(self, scheduler_name: str, node_selector: Mapping[str, str] | None = None):
        self.scheduler_name = scheduler_name
        self.node_selector = dict(node_selector or {})
        self.state = ClusterState(scheduler_name)
        self.groups_raw: dict[str, dict] = {}
        self.groups: dict[str, GroupSpec] = {}
        self.invalid_groups: dict[str, str] = {}
        self.priority_classes: dict[str, int] = {}
        # uid -> (node, gpu ids): bound by us (or being bound), not yet seen
        # bound by the watch.  Never expires: only the watch, the pod's end
        # or a binder that learnt the binding failed ends an assumption.
        self.assumed: dict[str, tuple[str, tuple[int, ...]]] = {}
        # uid -> GPU ids of the bound pods whose binding this scheduler made
        # or witnessed (see _trusted): the only GPU ids it believes.
        self.witnessed: dict[str, tuple[int, ...]] = {}
        self.pods_listed = False  # the first pod list is in: later arrivals are judged by what was seen
        self.touched_gangs: set[str] = set()
        self.capacity_freed = False
        self.changed = asyncio.Event()
        self.on_bad_object: Callable[[str, dict, str], None] = lambda kind, obj, why: None
        self.on_watch_restart: Callable[[str, str], None] = lambda kind, why: None

    # ---- wiring -------------------------------------------------------------

    def reflectors(self, kube: Kube) -> list[Reflector]:
        restart = lambda kind, why: self.on_watch_restart(kind, why)  # noqa: E731 - late bound
        return [
            Reflector(kube, "/apis/scheduling.k8s.io/v1/priorityclasses", "priorityclasses",
                      self._replace_priority_classes, self._apply_priority_class, restart),
            Reflector(kube, "/api/v1/nodes", "nodes", self._replace_nodes, self._apply_node, restart),
            Reflector(kube, PODGROUPS_PATH, "podgroups", self._replace_groups, self._apply_group, restart),
            Reflector(kube, "/api/v1/pods", "pods", self._replace_pods, self._apply_pod, restart),
        ]

    def _notify(self) -> None:
        self.changed.set()

    # ---- pods ---------------------------------------------------------------

    def _convert_pod(self, obj: dict) -> PodInfo | None:
        try:
            pod = pod_from_json(obj)
        except Exception as exc:  # noqa: BLE001 - whatever a hostile pod holds, it alone is skipped
            meta = obj.get("metadata") or {}
            log.warning("ignoring pod %s/%s: %s", meta.get("namespace"), meta.get("name"), exc)
            self.on_bad_object("Pod", obj, str(exc))
            return None
        pod = self._trusted(pod)
        assumed = self.assumed.get(pod.uid)
        if assumed:
            if pod.node_name or pod.terminal:
                del self.assumed[pod.uid]  # confirmed (or finished): stop assuming
            else:
                pod = dataclasses.replace(pod, node_name=assumed[0], gpu_ids=assumed[1], bound_by_scheduler=True)
        return pod

    def _trusted(self, pod: PodInfo) -> PodInfo:
        """The pod with the GPU ids this scheduler believes, and whether it bound it.

        The gpu-ids annotation is tenant-writable, and a tenant can create a
        pod already bound (spec.nodeName).  So ids are believed only for a
        binding this scheduler made (an assumption the watch now confirms),
        saw happen (the pod was unbound, now it is bound: only pods/binding
        does that), or found at its first list after a start (nothing else
        to go by then; docs/binding.md).  Once believed, they stay what they
        were: editing or removing the annotation later changes nothing.
        Every other pod's GPUs count by number only.
        """
        if not pod.node_name or pod.scheduler_name != self.scheduler_name:
            self.witnessed.pop(pod.uid, None)
            return dataclasses.replace(pod, gpu_ids=()) if pod.gpu_ids else pod
        ids = self.witnessed.get(pod.uid)
        if ids is None:
            assumed = self.assumed.get(pod.uid)
            before = self.pods.get(pod.uid)
            if assumed is not None and assumed[0] == pod.node_name:
                ids = assumed[1]  # ours: the API copied them from our Binding
            elif (before is not None and not before.node_name) or not self.pods_listed:
                ids = pod.gpu_ids
            else:
                return dataclasses.replace(pod, gpu_ids=()) if pod.gpu_ids else pod
            self.witnessed[pod.uid] = ids
        return dataclasses.replace(pod, gpu_ids=ids, bound_by_scheduler=True)

    def _replace_pods(self, items: list[dict]) -> None:
        listed = {}
        for obj in items:
            pod = self._convert_pod(obj)
            if pod:
                listed[pod.uid] = pod
        for uid in [uid for uid in self.pods if uid not in listed]:
            self._drop_pod_records(uid)
            if self.state.remove_pod(uid).holds_resources:
                self.capacity_freed = True
        for pod in listed.values():
            self.state.put_pod(pod)
        for pod in self.pods.values():
            self.touched_gangs.add(pod.gang_key)
        self.pods_listed = True
        self._notify()

    def _drop_pod_records(self, uid: str) -> None:
        """The pod is gone: nothing about its binding is worth keeping."""
        self.assumed.pop(uid, None)
        self.witnessed.pop(uid, None)

    def _apply_pod(self, event_type: str, obj: dict) -> None:
        uid = (obj.get("metadata") or {}).get("uid", "")
        old = self.pods.get(uid)
        if event_type == "DELETED":
            self.state.remove_pod(uid)
            self._drop_pod_records(uid)
            if old:
                self.capacity_freed |= old.holds_resources
                self.touched_gangs.add(old.gang_key)
            self._notify()
            return
        pod = self._convert_pod(obj)
        if pod is None:
            return
        self.state.put_pod(pod)
        if old and old.holds_resources and not pod.holds_resources:
            self.capacity_freed = True
        if old and (old.holds_resources and pod.terminating and not old.terminating):
            self.capacity_freed = True  # a victim going away: worth another look soon
        if (old is None or old.phase != pod.phase or old.node_name != pod.node_name
                or old.gated != pod.gated or old.terminating != pod.terminating):
            self.touched_gangs.add(pod.gang_key)
        self._notify()

    # ---- nodes --------------------------------------------------------------

    def _selected(self, obj: dict) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(labels.get(k) == v for k, v in self.node_selector.items())

    def _convert_node(self, obj: dict, old: NodeInfo | None) -> NodeInfo | None:
        try:
            node = node_from_json(obj)
        except Exception as exc:  # noqa: BLE001 - whatever a node holds, it alone is skipped
            log.warning("ignoring node %s: %r", (obj.get("metadata") or {}).get("name"), exc)
            self.on_bad_object("Node", obj, f"node not used: {type(exc).__name__}: {exc}")
            return None
        if node.topology_error and (old is None or old.topology_error != node.topology_error):
            # reported once per new problem, not on every status update of the node
            log.warning("%s; treating its GPUs as flat", node.topology_error)
            self.on_bad_object("Node", obj, node.topology_error)
        return node

    def _replace_nodes(self, items: list[dict]) -> None:
        listed = {}
        for obj in items:
            if self._selected(obj):
                node = self._convert_node(obj, self.nodes.get((obj.get("metadata") or {}).get("name", "")))
                if node is not None:
                    listed[node.name] = node
        for name in [name for name in self.nodes if name not in listed]:
            self.state.remove_node(name)
        for node in listed.values():
            self.state.put_node(node)
        self.capacity_freed = True
        self._notify()

    def _apply_node(self, event_type: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if event_type == "DELETED" or not self._selected(obj):
            self.state.remove_node(name)
        else:
            old = self.nodes.get(name)
            node = self._convert_node(obj, old)
            if node is None:
                self.state.remove_node(name)  # what it held before is no longer known to be true
            else:
                if old != node:
                    self.capacity_freed = True
                self.state.put_node(node)
        self._notify()

    # ---- PodGroups and PriorityClasses ---------------------------------------

    def _convert_group(self, key: str, obj: dict) -> None:
        self.groups.pop(key, None)
        self.invalid_groups.pop(key, None)
        class_name = (obj.get("spec") or {}).get("priorityClassName")
        try:
            if class_name and class_name not in self.priority_classes:
                raise ValueError(f"PriorityClass {class_name!r} not found")
            self.groups[key] = group_from_json(obj, self.priority_classes.get(class_name, 0) if class_name
                                               else None)
        except Exception as exc:  # noqa: BLE001 - whatever it holds, only this PodGroup is refused
            why = str(exc) if isinstance(exc, (ValueError, TypeError)) else f"{type(exc).__name__}: {exc}"
            why = clip(why, MAX_PROBLEM_LENGTH)
            log.warning("PodGroup %s is invalid: %s", key, why)
            self.invalid_groups[key] = why
            self.on_bad_object("PodGroup", obj, why)
        self.touched_gangs.add(key)

    @staticmethod
    def _group_key(obj: dict) -> str:
        meta = obj.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    def _replace_groups(self, items: list[dict]) -> None:
        self.groups_raw = {self._group_key(o): o for o in items}
        self.groups, self.invalid_groups = {}, {}
        for key, obj in self.groups_raw.items():
            self._convert_group(key, obj)
        self._notify()

    def _apply_group(self, event_type: str, obj: dict) -> None:
        key = self._group_key(obj)
        if event_type == "DELETED":
            self.groups_raw.pop(key, None)
            self.groups.pop(key, None)
            self.invalid_groups.pop(key, None)
            self.touched_gangs.add(key)
        else:
            old = self.groups_raw.get(key)
            self.groups_raw[key] = obj
            if old is None or old.get("spec") != obj.get("spec") or \
                    old["metadata"].get("generation") != obj["metadata"].get("generation"):
                self._convert_group(key, obj)
        self._notify()

    def _replace_priority_classes(self, items: list[dict]) -> None:
        self.priority_classes = {o["metadata"]["name"]: int(o.get("value") or 0) for o in items}
        self._regroup()

    def _apply_priority_class(self, event_type: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        if event_type == "DELETED":
            self.priority_classes.pop(name, None)
        else:
            self.priority_classes[name] = int(obj.get("value") or 0)
        self._regroup()

    def _regroup(self) -> None:
        for key, obj in self.groups_raw.items():
            self._convert_group(key, obj)
        self._notify()

    # ---- assumptions ----------------------------------------------------------

    def assume(self, uid: str, node: str, gpu_ids: tuple[int, ...]) -> None:
        pod = self.pods.get(uid)
        if pod is None:
            return
        self.assumed[uid] = (node, gpu_ids)
        self.state.put_pod(dataclasses.replace(pod, node_name=node, gpu_ids=gpu_ids, bound_by_scheduler=True))

    def forget(self, uid: str) -> None:
        """The binding is known not to have happened: the pod is unbound again.

        Only the binder calls this, after a refusal or after reading the pod
        back (an ambiguous outcome is never guessed at).  Its room frees for
        others; the gang itself is not touched, so it keeps the backoff the
        shell gives it for the refusal.
        """
        if self.assumed.pop(uid, None) is None:
            return
        pod = self.pods.get(uid)
        if pod is not None and not pod.terminal:
            self.state.put_pod(dataclasses.replace(pod, node_name="", gpu_ids=(), bound_by_scheduler=False))
        self.capacity_freed = True
        self._notify()

    # ---- the cycle's view ------------------------------------------------------

    def snapshot(self, now: float) -> Snapshot:
        # The cycle is synchronous: nothing changes the state while it runs.
        return Snapshot.of(self.state, self.groups, now, self.invalid_groups)

    def drain_changes(self) -> tuple[set[str], bool]:
        touched, freed = self.touched_gangs, self.capacity_freed
        self.touched_gangs, self.capacity_freed = set(), False
        return touched, freed

    def members(self, gang_key: str) -> list[PodInfo]:
        """The gang's pods of our scheduler, from the index (no scan)."""
        pods = (self.pods[uid] for uid in self.state.gang_uids(gang_key))
        return [p for p in pods if p.scheduler_name == self.scheduler_name]

    def set_nomination(self, uid: str, node_name: str) -> None:
        """Record (or clear, with "") the node a pending pod is nominated to."""
        pod = self.pods.get(uid)
        if pod is not None and pod.nominated_node != node_name:
            self.state.put_pod(dataclasses.replace(pod, nominated_node=node_name))

    def nominated_pods(self) -> list[PodInfo]:
        return list(self.state.nominated_pods())

    @property
    def pods(self) -> Mapping[str, PodInfo]:
        return self.state.pods

    @property
    def nodes(self) -> Mapping[str, NodeInfo]:
        return self.state.nodes
