"""Watch caches: list then watch pods, nodes, PodGroups, Queues, PriorityClasses and
the DRA objects (DeviceClasses, ResourceSlices, ResourceClaims).

The cache is the scheduler's only state.  It holds core model objects (not
client objects), applies the scheduler's *assumed* bindings on top of what the
API server has confirmed, and records what changed since the last cycle so
the queue can reset backoffs.

Each collection is kept by a :class:`Reflector`: list (paginated), then watch
from the list's resourceVersion with bookmarks; a watch that times out
resumes from the last resourceVersion seen; ``410 Gone`` relists at once;
any other error reconnects with capped exponential backoff; ``relist()``
(SIGUSR1) drops the watch and lists again.  A list is converted page by
page into model objects, never held raw as a whole, and swapped in at its
end: objects missing from it are removed, objects equal to those held keep
the held instance, and assumptions still overlay the listed pods, so
bindings in flight are not forgotten.

Nothing ends a reflector but cancellation: an object that cannot be
converted is reported (``on_bad_object``) and skipped, and any other
exception while listing, watching or applying is logged and followed by a
relist, the reflector counting as not synced (``error``) until that
relist succeeds.  An *optional* collection (the DRA ones, Queues) that the API
server does not serve (404: resource.k8s.io/v1 off, or a cluster before
1.34), or that the scheduler may not read (403: RBAC not updated), counts
as synced and empty, said once in the log, and is listed again every
``ABSENT_RECHECK_SECONDS``: the scheduler runs as it did without DRA rather
than stall every gang for an inventory it can do without (without the
Queue CRD every gang is in the default queue, and one naming another
queue waits with QueueNotFound).  Claims are the exception that fails
closed: without them no DRA GPU is known free, so the cache tells the state
(``ClusterState.set_claims_unreadable``) and every DRA GPU counts in use.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Any, Callable, Iterable, Mapping

import aiohttp

from batchsched.api import constants
from batchsched.core.cluster import ClusterState
from batchsched.core.tracked import TrackedDict
from batchsched.core import gangsources
from batchsched.core.dra import model as dra
from batchsched.core.gangsources import jobs, jobsets, native, schedulerplugins, volcano
from batchsched.core.model import GroupSpec, NodeInfo, PodInfo, annotated_topology, pod_with
from batchsched.core.readers import group_from_json, node_from_json, pod_from_json, recorded_bindings
from batchsched.core.queues.model import QueueInfo, queue_from_json
from batchsched.core.snapshot import Snapshot
from batchsched.core.text import clip
from batchsched.kube.client import ApiError, Kube
from batchsched.shell import wire

log = logging.getLogger(__name__)
CHECKPOINT_CLOCK_SKEW_SECONDS = 60.0  # a checkpoint-time this far ahead of our clock is in the future

PODGROUPS_PATH = gangsources.SOURCES[gangsources.OWN].path
QUEUES_PATH = f"/apis/{constants.GROUP}/{constants.VERSION}/{constants.QUEUE_PLURAL}"
# Objects per list page, at most: its raw JSON is all a relist holds beyond the
# model objects.  Each page costs the API server ~7 ms beyond its objects: 50,000
# pods in pages of 500 took it ~2.2 s of CPU, in pages of 2,000 ~1.5 s
# (bench/RESULTS.md, "Fewer, larger list pages").
LIST_PAGE_SIZE = 2000
# A page's size is aimed at PAGE_BYTES of raw JSON, from the bytes per object of
# the page before; the first asks for FIRST_PAGE_SIZE.  Tenants' objects can be
# large (the API server stores objects of ~1.5 MB, 256 KiB of annotations each),
# and 2,000 such pods would be gigabytes in one page.
FIRST_PAGE_SIZE = 50
PAGE_BYTES = 8 * 2**20
CONVERT_SLICE = 100  # objects converted between two yields to the event loop (~3 ms of pods)
MIN_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS = 0.2, 30.0
# A refused PodGroup's reason goes into its status condition and an Event:
# kept short whatever the object (hostile keys are echoed in the reason).
MAX_PROBLEM_LENGTH = 2000
# How often a collection the API server does not serve is looked for again.
ABSENT_RECHECK_SECONDS = 60.0
CLAIMS_ABSENT_EFFECT = "no DRA GPU counts as free until they can be read"


class Reflector:
    """Keeps one collection in step with the API server, forever.

    ``convert`` turns one listed object into its cache entry, ``(key,
    value)`` or None to leave it out; ``replace`` takes every entry of a
    whole list at once; ``apply`` takes one watch event.
    """

    def __init__(self, kube: Kube, path: str, kind: str,
                 convert: Callable[[dict], tuple[str, Any] | None], replace: Callable[[dict[str, Any]], None],
                 apply: Callable[[str, dict], None], on_restart: Callable[[str, str], None] | None = None,
                 optional: bool = False, decode_page: Callable[[bytes], dict] = json.loads,
                 decode_event: Callable[[bytes], dict] = json.loads,
                 on_absent: Callable[[str], None] | None = None, absent_effect: str = "running without them"):
        self.kube, self.path, self.kind = kube, path, kind
        self.decode_page, self.decode_event = decode_page, decode_event  # how list pages and watch lines are read
        self.optional = optional
        self.absent = False  # an optional collection the API server does not serve
        # told why it turned absent ("kind may not be read (RBAC)"), and "" once listed again;
        # absent_effect says in the log what its absence means
        self.on_absent = on_absent or (lambda why: None)
        self.absent_effect = absent_effect
        self.convert, self.replace, self.apply = convert, replace, apply
        self.on_restart = on_restart or (lambda kind, why: None)
        self.page_size = LIST_PAGE_SIZE
        self.synced = asyncio.Event()
        self.error = ""  # why the collection is not in step now ("" while it is)
        self._backoff = MIN_BACKOFF_SECONDS
        self._watching: asyncio.Timeout | None = None  # while watching: what relist() interrupts

    async def list_once(self) -> str:
        """List the collection into the cache; returns the list's resourceVersion.

        Each page is converted while the next one is asked for, so the API
        server serves one while this process converts the other, and the
        raw objects of at most two pages are alive (a decoded pod is many
        times its model object).  The cache is replaced only once the last
        page is in: until then cycles see the previous state whole, never a
        half-replaced one, and a list that fails midway changes nothing.
        """
        listed: dict[str, Any] = {}
        pages, started = 0, time.monotonic()
        asked = asyncio.ensure_future(self._page(None, min(self.page_size, FIRST_PAGE_SIZE)))
        try:
            while True:
                page, size = await asked
                pages += 1
                cont, resource_version = self._continued(page)
                if cont:
                    asked = asyncio.ensure_future(self._page(cont, self._next_limit(size, page)))
                await self._convert(page, listed)
                if not cont:
                    break
        finally:
            asked.cancel()  # a list that failed midway asks for nothing more
        self.replace(listed)
        log.info("%s listed: %d in %d page(s), %.1fs", self.kind, len(listed), pages, time.monotonic() - started)
        return resource_version

    async def _page(self, cont: str | None, limit: int) -> tuple[dict, int]:
        """The page and the bytes of its raw JSON."""
        size = 0

        def decode(data: bytes) -> dict:
            nonlocal size
            size = len(data)
            return self.decode_page(data)

        page = await self.kube.request("GET", self.path, query={"limit": limit, "continue": cont},
                                       timeout=120, decode=decode)
        return page, size

    def _next_limit(self, size: int, page: dict) -> int:
        """The next page's size: PAGE_BYTES at the bytes per object of
        ``page`` (``size`` bytes of JSON), within 1 and ``page_size``."""
        per_object = size / max(len(page.get("items") or ()), 1)
        return max(1, min(self.page_size, int(PAGE_BYTES / max(per_object, 1))))

    def _continued(self, page: dict) -> tuple[str | None, str]:
        """The page's continue token (None: the last page) and resourceVersion."""
        meta = page.get("metadata") or {}
        if not meta.get("resourceVersion"):
            raise ValueError(f"{self.kind}: a list page without a resourceVersion")  # a watch from it would see "any"
        return meta.get("continue") or None, meta["resourceVersion"]

    async def _convert(self, page: dict, listed: dict[str, Any]) -> None:
        """A page's objects into ``listed``, a slice at a time: between
        slices the next page's request goes out and other collections move."""
        items = page.get("items") or []
        for first in range(0, len(items), CONVERT_SLICE):
            await asyncio.sleep(0)
            for i in range(first, min(first + CONVERT_SLICE, len(items))):
                entry = self.convert(items[i])
                items[i] = None  # its raw object goes now, not with the page
                if entry is not None:
                    listed[entry[0]] = entry[1]

    def relist(self) -> None:
        """Drop the watch and list the collection again (a list under way is left to finish)."""
        if self._watching is not None:
            self._watching.reschedule(asyncio.get_running_loop().time())

    async def run(self) -> None:
        while True:
            try:
                resource_version = await self.list_once()
                if self.absent:
                    log.info("%s: now served; listed", self.kind)
                    self.absent = False
                    self.on_absent("")
                self.error = ""
                self.synced.set()
                await self._watch(resource_version)
                log.info("%s: relisting on request", self.kind)
                self.on_restart(self.kind, "requested")
                continue
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if exc.gone:
                    log.info("%s watch expired (410 Gone); relisting", self.kind)
                    self.on_restart(self.kind, "gone")
                    continue
                if self.optional and exc.status in (403, 404):
                    self._not_served(exc)
                    await asyncio.sleep(ABSENT_RECHECK_SECONDS)
                    continue
                log.warning("%s list/watch failed: %s; retrying in %.1fs", self.kind, exc, self._backoff)
                self._failed(f"list/watch failed: {exc}")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, json.JSONDecodeError) as exc:
                log.warning("%s list/watch connection failed: %r; retrying in %.1fs", self.kind, exc, self._backoff)
                self._failed(f"list/watch connection failed: {exc!r}")
            except Exception as exc:  # noqa: BLE001 - a bad answer or a bug: relist rather than die
                log.exception("%s cache update failed; relisting in %.1fs", self.kind, self._backoff)
                self._failed(f"cache update failed: {type(exc).__name__}: {exc}")
            await asyncio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_SECONDS)

    def _not_served(self, exc: ApiError) -> None:
        """Synced and empty: what the scheduler uses without this collection
        (emptied once: a look that finds it still absent changes nothing)."""
        if not self.absent:
            log.warning("%s (%s) %s: %s; looking again every %.0fs: %s", self.kind, self.path, absence(exc),
                        self.absent_effect, ABSENT_RECHECK_SECONDS, exc)
            self.absent = True
            self.hold_absent(exc)
        self.error = ""
        self.synced.set()

    def hold_absent(self, exc: ApiError) -> None:
        """Hold the collection empty, the API server refusing it (``exc``: 403 or 404)."""
        self.on_absent(f"{self.kind} {absence(exc)}")
        self.replace({})

    def _failed(self, why: str) -> None:
        self.error = clip(why, 300)
        self.on_restart(self.kind, "error")

    async def _watch(self, resource_version: str) -> None:
        """Apply watch events from ``resource_version`` on, resuming after every
        normal end, until ``relist`` asks for a fresh list (then it returns)."""
        watching = self._watching = asyncio.timeout(None)
        try:
            async with watching:
                while True:
                    async for event in self.kube.watch(self.path, resource_version, timeout_seconds=290,
                                                       decode=self.decode_event):
                        obj = event.get("object") or {}
                        resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
                        if event["type"] != "BOOKMARK":
                            self.apply(event["type"], obj)
                    self._backoff = MIN_BACKOFF_SECONDS  # a watch that ended normally is healthy
        except TimeoutError:
            if not watching.expired():
                raise  # the connection's own timeout, not relist()
        finally:
            self._watching = None


class ClusterCache:
    def __init__(self, scheduler_name: str, node_selector: Mapping[str, str] | None = None,
                 also_serves: Iterable[str] = (), gang_sources: Iterable[str] = (),
                 auto_always: Iterable[str] = ()):
        self.scheduler_name = scheduler_name
        # Other schedulerNames whose pods are ours too (config schedulerNames):
        # such a pod is held under scheduler_name, so the core sees one name.
        self.also_serves = frozenset(also_serves) - {scheduler_name}
        # The gang sources read (core/gangsources), ours always among them.
        self.gang_sources = frozenset({gangsources.OWN, *gang_sources})
        self.auto_always = frozenset(auto_always)  # automatic gangs that need no opt-in on the pods
        self.node_selector = dict(node_selector or {})
        self.state = ClusterState(scheduler_name)
        self.groups_raw: dict[str, dict] = {}  # every source's PodGroups, by gang key
        # The Jobs and JobSets sizing automatic gangs, as references for Events, by gang key.
        self.owner_refs: dict[str, dict] = {}
        self.groups: dict[str, GroupSpec] = TrackedDict()  # changes logged for the queues' counts (core/queues)
        self.invalid_groups: dict[str, str] = {}
        self.priority_classes: dict[str, int] = {}
        self.queues_raw: dict[str, dict] = {}  # kept raw: few, and their status is written back
        self.queues: dict[str, QueueInfo] = {}
        self.invalid_queues: dict[str, str] = {}  # name -> why
        # uid -> (node, gpu ids): bound by us (or being bound), not yet seen
        # bound by the watch.  Never expires: only the watch, the pod's end
        # or a binder that learnt the binding failed ends an assumption.
        self.assumed: dict[str, tuple[str, tuple[int, ...]]] = {}
        # uid -> (GPU ids, gang key) of the bound pods whose GPU ids this
        # scheduler believes (see _trusted); the gang is the one the pod was
        # in when this process made or saw its binding, "" when it did not.
        self.witnessed: dict[str, tuple[tuple[int, ...], str]] = {}
        self.pods_listed = False  # the first pod list is in: later arrivals are judged by what was seen
        self.touched_gangs: set[str] = set()
        self.capacity_freed = False
        self.changed = asyncio.Event()
        # node -> the topology problem last reported (reported once per new problem)
        self.topology_reported: dict[str, str] = {}
        # Nodes whose topology problem waits until the DRA collections are
        # listed: their GPUs served through DRA count in the check.
        self._unchecked_topology: dict[str, dict] = {}
        self._dra_listed: set[str] = set()
        self._listed_node_refs: dict[str, dict] = {}  # a node list's nodes, to name them in reports
        self.on_bad_object: Callable[[str, dict, str], None] = lambda kind, obj, why: None
        self.on_fixed_object: Callable[[str, dict, str, str], None] = lambda kind, obj, reason, message: None
        self.on_watch_restart: Callable[[str, str], None] = lambda kind, why: None

    # ---- wiring -------------------------------------------------------------

    def reflectors(self, kube: Kube) -> list[Reflector]:
        restart = lambda kind, why: self.on_watch_restart(kind, why)  # noqa: E731 - late bound
        return [
            Reflector(kube, "/apis/scheduling.k8s.io/v1/priorityclasses", "priorityclasses",
                      self._priority_class_entry, self._replace_priority_classes, self._apply_priority_class,
                      restart),
            Reflector(kube, "/api/v1/nodes", "nodes", self._node_entry, self._replace_nodes, self._apply_node,
                      restart),
            Reflector(kube, PODGROUPS_PATH, "podgroups", self._group_entry, self._replace_groups,
                      self._apply_group, restart),
            # A foreign CRD may not be installed: optional, like the DRA collections.
            *(Reflector(kube, gangsources.SOURCES[name].path, foreign_kind(name),
                        functools.partial(self._group_entry, source=name),
                        functools.partial(self._replace_groups, source=name),
                        functools.partial(self._apply_group, source=name), restart, optional=True)
              for name in gangsources.PRECEDENCE
              if name != gangsources.OWN and name in self.gang_sources and gangsources.SOURCES[name].podgroups),
            # Indexed Jobs and JobSets size their automatic gangs; without RBAC
            # for them (or their CRD) their pods wait as members of an owner not found.
            *(Reflector(kube, gangsources.SOURCES[name].path, gangsources.SOURCES[name].plural,
                        functools.partial(self._owner_entry, source=name),
                        functools.partial(self._replace_owners, source=name),
                        functools.partial(self._apply_owner, source=name), restart, optional=True)
              for name in gangsources.OWNER_SIZED if name in self.gang_sources),
            Reflector(kube, QUEUES_PATH, "queues", self._queue_entry, self._replace_queues, self._apply_queue,
                      restart, optional=True),
            Reflector(kube, "/api/v1/pods", "pods", self._pod_entry, self._replace_pods, self._apply_pod, restart,
                      decode_page=wire.pod_list, decode_event=wire.pod_event),
            *(Reflector(kube, f"{dra.API_PATH}/{kind}", kind, self._dra_entry(kind), self._dra_replace(kind),
                        self._dra_apply(kind), restart, optional=True,
                        **({"on_absent": self._claims_unreadable, "absent_effect": CLAIMS_ABSENT_EFFECT}
                           if kind == "resourceclaims" else {})) for kind in _DRA),
        ]

    def _notify(self) -> None:
        self.changed.set()

    # ---- pods ---------------------------------------------------------------

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

    def _as_seen(self, pod: PodInfo) -> PodInfo:
        """The pod as the cycle must see it: with the GPU ids believed, and
        bound where we bound it until the API says so."""
        pod = self._trusted(pod)
        assumed = self.assumed.get(pod.uid)
        if assumed:
            if pod.node_name or pod.terminal:
                del self.assumed[pod.uid]  # confirmed (or finished): stop assuming
            else:
                pod = pod_with(pod, node_name=assumed[0], gpu_ids=assumed[1], bound_by_scheduler=True)
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

        Bound by this scheduler (which may give its gang precedence) are only
        the pods whose binding this process made or saw, while they stay in
        the gang they were in then: a pod moved to another gang by its label
        proves nothing there.  Whether one found bound at a start was ours
        is the PodGroup's status to say (core/gangs.py ``bound_by_us``).

        On such a pod, the node agent's gpu-ids-actual (what the kubelet
        really gave it) wins over the plan when it names as many GPUs and an
        agent reports on the node (its BatchschedGPUReady condition: nodes
        are not tenant-writable, and the agent's component installs the
        policy that lets only agents write gpu-ids-actual): the agent
        corrects where, never how many (docs/node-agent.md, "Trust").
        """
        if not pod.node_name or pod.scheduler_name != self.scheduler_name:
            self.witnessed.pop(pod.uid, None)
            return pod_with(pod, gpu_ids=()) if pod.gpu_ids else pod
        witnessed = self.witnessed.get(pod.uid)
        if witnessed is None:
            assumed = self.assumed.get(pod.uid)
            before = self.pods.get(pod.uid)
            if assumed is not None and assumed[0] == pod.node_name:
                witnessed = (assumed[1], pod.gang_key)  # ours: the API copied the ids from our Binding
            elif before is not None and not before.node_name:
                witnessed = (pod.gpu_ids, pod.gang_key)
            elif not self.pods_listed:
                witnessed = (pod.gpu_ids, "")
            else:
                return pod_with(pod, gpu_ids=()) if pod.gpu_ids else pod
            self.witnessed[pod.uid] = witnessed
        ids, gang = witnessed
        if pod.gpu_ids_actual and len(pod.gpu_ids_actual) == len(ids) and self._agent_on(pod.node_name):
            ids = pod.gpu_ids_actual
        ours = gang == pod.gang_key
        if pod.gpu_ids == ids and pod.bound_by_scheduler == ours:
            return pod
        return pod_with(pod, gpu_ids=ids, bound_by_scheduler=ours)

    def _agent_on(self, node_name: str) -> bool:
        node = self.nodes.get(node_name)
        return node is not None and bool(node.gpu_agent)

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

    # ---- nodes --------------------------------------------------------------

    def _selected(self, obj: dict) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(labels.get(k) == v for k, v in self.node_selector.items())

    def _convert_node(self, obj: dict) -> NodeInfo | None:
        try:
            node = node_from_json(obj)
        except Exception as exc:  # noqa: BLE001 - whatever a node holds, it alone is skipped
            log.warning("ignoring node %s: %r", (obj.get("metadata") or {}).get("name"), exc)
            self.on_bad_object("Node", obj, f"node not used: {type(exc).__name__}: {exc}")
            return None
        return node

    def _check_topology(self, name: str, obj: dict) -> None:
        """Report the node's topology problem, counting its DRA GPUs; once
        per new problem, not on every status update of the node.  A count
        that does not match waits for the DRA collections to be listed."""
        given = self.state.given_node(name)
        if (len(self._dra_listed) < len(_DRA) and given is not None and given.topology_error
                and annotated_topology(given) is not None):
            self._unchecked_topology[name] = obj
            return
        node = self.nodes.get(name)
        error = node.topology_error if node is not None else ""
        if error and self.topology_reported.get(name) != error:
            log.warning("%s; treating its GPUs as flat", error)
            self.on_bad_object("Node", obj, error)
        if error:
            self.topology_reported[name] = error
        elif self.topology_reported.pop(name, None) and node is not None:
            # an Event of its own, so the latest one about the node is not the old problem
            if node.topology is not None:
                reason, message = "GpuTopologyAccepted", "its GPU topology is used"
            else:
                reason, message = "GpuTopologyRemoved", "GPUs are treated as flat"
            message = f"annotation {constants.GPU_TOPOLOGY_ANNOTATION} of node {node.name}: {message}"
            log.info("%s", message)
            self.on_fixed_object("Node", obj, reason, message)

    def _node_entry(self, obj: dict) -> tuple[str, NodeInfo] | None:
        """A listed node of ours; one equal to the node held is the held object."""
        if not self._selected(obj):
            return None
        held = self.state.given_node((obj.get("metadata") or {}).get("name", ""))
        node = self._convert_node(obj)
        if node is None:
            return None
        meta = obj.get("metadata") or {}
        self._listed_node_refs[node.name] = {"metadata": {"name": node.name, "uid": meta.get("uid", "")}}
        return node.name, held if held == node else node

    def _replace_nodes(self, listed: dict[str, NodeInfo]) -> None:
        for name in [name for name in self.nodes if name not in listed]:
            self.state.remove_node(name)
            self.topology_reported.pop(name, None)
        refs, self._listed_node_refs = self._listed_node_refs, {}
        for node in listed.values():
            self._put_node(node)
            self._check_topology(node.name, refs.get(node.name, {"metadata": {"name": node.name}}))
        self._notify()

    def _apply_node(self, event_type: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        if event_type == "DELETED" or not self._selected(obj):
            self.state.remove_node(name)
            self.topology_reported.pop(name, None)
        else:
            node = self._convert_node(obj)
            if node is None:
                self.state.remove_node(name)  # what it held before is no longer known to be true
            else:
                self._put_node(node)
                self._check_topology(name, obj)
        self._notify()

    def _put_node(self, node: NodeInfo) -> None:
        if self.state.given_node(node.name) != node:
            self.capacity_freed = True
        self.state.put_node(node)

    # ---- DRA: DeviceClasses, ResourceSlices, ResourceClaims ----------------------

    def _dra_entry(self, kind: str) -> Callable[[dict], tuple[str, Any] | None]:
        """A listed or changed DRA object.  One that does not convert is
        reported; what of it is read all the same (a claim's allocation) is
        kept, else, if an earlier version of it converted, that version: a
        claim's devices stay in use rather than be handed out again on a bad
        write.  Anything else is skipped."""
        convert, key_of, _, _ = _DRA[kind]

        def entry(obj: dict) -> tuple[str, Any] | None:
            try:
                converted = convert(obj)
            except Exception as exc:  # noqa: BLE001 - whatever it holds, this object alone is skipped
                partial = exc.partial if isinstance(exc, dra.DraError) else None
                held_anyway = "" if partial is None else " beyond its allocation (its devices stay in use)"
                why = clip(f"{_DRA_KIND_NAMES[kind]} not used{held_anyway}: {exc}", MAX_PROBLEM_LENGTH)
                log.warning("ignoring %s %s: %s", kind, _name_of(obj), why)
                self.on_bad_object(_DRA_KIND_NAMES[kind], obj, why)
                if partial is not None:
                    return key_of(partial), partial
                key = _dra_key(kind, obj)
                held = _dra_held(self.state, kind).get(key)
                return None if held is None else (key, held)
            return key_of(converted), converted
        return entry

    def _dra_replace(self, kind: str) -> Callable[[dict[str, Any]], None]:
        _, _, put, remove = _DRA[kind]

        def replace(listed: dict[str, Any]) -> None:
            held = _dra_held(self.state, kind)
            gone = [key for key in held if key not in listed]
            # as the watch would have: a new claim frees nothing; a changed or gone one may give devices back
            self.capacity_freed |= bool(gone) or any(
                held.get(key) != value and (key in held or kind != "resourceclaims") for key, value in listed.items())
            for key in gone:
                remove(self.state, key)
            for value in listed.values():
                put(self.state, value)
            self._dra_synced(kind)
            self._recheck_topologies(kind)
            self._notify()
        return replace

    def _dra_apply(self, kind: str) -> Callable[[str, dict], None]:
        _, _, put, remove = _DRA[kind]
        entry_of = self._dra_entry(kind)

        def apply(event_type: str, obj: dict) -> None:
            held = _dra_held(self.state, kind)
            if event_type == "DELETED":
                key, new = _dra_key(kind, obj), None
                old = held.get(key)
                remove(self.state, key)
            else:
                entry = entry_of(obj)
                if entry is None:
                    return
                new, old = entry[1], held.get(entry[0])
                put(self.state, new)
            self._recheck_topologies(kind)
            # a new claim frees nothing; a changed or gone one may give devices back
            self.capacity_freed |= kind != "resourceclaims" or (old is not None and old != new)
            self._notify()
        return apply

    def _claims_unreadable(self, why: str) -> None:
        """The claims cannot be listed (``why``), or can again (""): the
        state decides what that means (every DRA GPU taken meanwhile)."""
        if not why and self.state.dra.claims_unreadable:
            self.capacity_freed = True
        self.state.set_claims_unreadable(why)
        self._notify()

    def _dra_synced(self, kind: str) -> None:
        """A DRA collection is listed: nodes whose topology check waited for
        them are checked once all are."""
        self._dra_listed.add(kind)
        if len(self._dra_listed) == len(_DRA):
            waiting, self._unchecked_topology = self._unchecked_topology, {}
            for name, obj in waiting.items():
                self._check_topology(name, obj)

    def _recheck_topologies(self, kind: str) -> None:
        """Slices or classes changed which GPUs nodes serve through DRA:
        report a topology problem that appeared (a node's own events
        report the rest)."""
        if kind == "resourceclaims" or len(self._dra_listed) < len(_DRA):
            return
        for name, node in self.nodes.items():
            if node.topology_error and node.topology_error != self.topology_reported.get(name):
                self._check_topology(name, {"metadata": {"name": name}})

    # ---- PodGroups and PriorityClasses ---------------------------------------

    def _convert_group(self, key: str, obj: dict) -> None:
        """(Re)convert one PodGroup of any source; its gang is touched, and a
        problem reported, only when what the core sees of it changed (a
        relist or a PriorityClass event converts every group again)."""
        old_spec, old_why = self.groups.pop(key, None), self.invalid_groups.pop(key, None)
        source = gangsources.source_of_key(key)
        try:
            spec = _GROUP_READERS[source](obj, self._group_priority(source, obj))
        except Exception as exc:  # noqa: BLE001 - whatever it holds, only this PodGroup is refused
            why = str(exc) if isinstance(exc, (ValueError, TypeError)) else f"{type(exc).__name__}: {exc}"
            why = clip(why, MAX_PROBLEM_LENGTH)
            self.invalid_groups[key] = why
            if why != old_why:
                log.warning("PodGroup %s is invalid: %s", key, why)
                self.on_bad_object("PodGroup", obj, why)
                self.touched_gangs.add(key)
            return
        # an equal spec keeps the held object: the gangs built from it stay valid
        self.groups[key] = old_spec if spec == old_spec else spec
        if spec != old_spec:
            self.touched_gangs.add(key)

    def _group_priority(self, source: str, obj: dict) -> int | None:
        """The value of the PriorityClass the PodGroup names (None: it names
        none); ValueError when that class does not exist."""
        if source == gangsources.SCHEDULER_PLUGINS:
            return None  # its PodGroup has no priorityClassName: the members' priority holds
        spec = obj.get("spec")
        class_name = spec.get("priorityClassName") if isinstance(spec, dict) else None
        if not class_name or not isinstance(class_name, str):
            return None
        if class_name not in self.priority_classes:
            raise ValueError(f"PriorityClass {clip(class_name, 253)!r} not found")
        return self.priority_classes[class_name]

    @staticmethod
    def _group_key(obj: dict, source: str = gangsources.OWN) -> str:
        meta = obj.get("metadata") or {}
        return gangsources.gang_key(str(meta.get("namespace", "")), source, str(meta.get("name", "")))

    def _group_entry(self, obj: dict, source: str = gangsources.OWN) -> tuple[str, dict]:
        # Kept raw: few, and their status is written back.  A list's items
        # may lack their kind: Events on the object need it.
        api = gangsources.SOURCES[source]
        obj.setdefault("apiVersion", api.api_version)
        obj.setdefault("kind", constants.PODGROUP_KIND)
        return self._group_key(obj, source), obj

    def _replace_groups(self, listed: dict[str, dict], source: str = gangsources.OWN) -> None:
        """A whole list of one source's PodGroups at once (the other sources' stay)."""
        held = {key for key in self.groups_raw if gangsources.source_of_key(key) == source}
        for key in held - listed.keys():  # gone while not watched
            del self.groups_raw[key]
            self.groups.pop(key, None)
            self.invalid_groups.pop(key, None)
            self.touched_gangs.add(key)
        self.groups_raw.update(listed)
        for key, obj in listed.items():
            self._convert_group(key, obj)
        self._notify()

    def _apply_group(self, event_type: str, obj: dict, source: str = gangsources.OWN) -> None:
        key, obj = self._group_entry(obj, source)
        if event_type == "DELETED":
            self.groups_raw.pop(key, None)
            self.groups.pop(key, None)
            self.invalid_groups.pop(key, None)
            self.touched_gangs.add(key)
        else:
            old = self.groups_raw.get(key)
            self.groups_raw[key] = obj
            if old is None or old.get("spec") != obj.get("spec") or \
                    old["metadata"].get("generation") != obj["metadata"].get("generation") or \
                    recorded_bindings(old) != recorded_bindings(obj):
                self._convert_group(key, obj)
        self._notify()

    @staticmethod
    def _priority_class_entry(obj: dict) -> tuple[str, int]:
        return obj["metadata"]["name"], int(obj.get("value") or 0)

    def _replace_priority_classes(self, listed: dict[str, int]) -> None:
        self.priority_classes = listed
        self._regroup()

    def _apply_priority_class(self, event_type: str, obj: dict) -> None:
        name, value = self._priority_class_entry(obj)
        if event_type == "DELETED":
            self.priority_classes.pop(name, None)
        else:
            self.priority_classes[name] = value
        self._regroup()

    def _regroup(self) -> None:
        for key, obj in self.groups_raw.items():
            self._convert_group(key, obj)
        self._notify()

    # ---- owners sizing automatic gangs: Jobs, JobSets ---------------------------------

    def _owner_entry(self, obj: dict, source: str) -> tuple[str, tuple[GroupSpec | str, dict]] | None:
        """An owner as its gang's spec, or why it makes none, with a reference
        to it for Events (held like a PodGroup's spec, never raw: nothing is
        written to it); None for an owner that is no gang (a Job that is not
        Indexed)."""
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        try:
            spec = _OWNER_READERS[source](obj)
        except Exception as exc:  # noqa: BLE001 - whatever it holds, only this owner's gang is refused
            why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            spec = clip(why, MAX_PROBLEM_LENGTH)
        if spec is None:
            return None
        api = gangsources.SOURCES[source]
        ref = {"apiVersion": api.api_version, "kind": api.kind, "namespace": namespace, "name": name,
               "uid": str(meta.get("uid", ""))}
        return gangsources.gang_key(namespace, source, name), (spec, ref)

    def _replace_owners(self, listed: dict[str, tuple[GroupSpec | str, dict]], source: str) -> None:
        for key in [k for k in {*self.groups, *self.invalid_groups}
                    if gangsources.source_of_key(k) == source and k not in listed]:
            self._drop_owner(key)
        for key, (spec, ref) in listed.items():
            self._put_owner(key, spec, ref)
        self._notify()

    def _apply_owner(self, event_type: str, obj: dict, source: str) -> None:
        meta = obj.get("metadata") or {}
        key = gangsources.gang_key(str(meta.get("namespace", "")), source, str(meta.get("name", "")))
        entry = None if event_type == "DELETED" else self._owner_entry(obj, source)
        if entry is None:
            self._drop_owner(key)
        else:
            self._put_owner(key, *entry[1])
        self._notify()

    def _drop_owner(self, key: str) -> None:
        self.owner_refs.pop(key, None)
        if self.groups.pop(key, None) is not None or self.invalid_groups.pop(key, None) is not None:
            self.touched_gangs.add(key)

    def _put_owner(self, key: str, spec: GroupSpec | str, ref: dict) -> None:
        """Its gang is touched only when its size changed: a Job's status
        changes with every pod it starts, which mostly leaves the size be."""
        self.owner_refs[key] = ref
        if isinstance(spec, str):
            if self.invalid_groups.get(key) != spec:
                log.warning("%s is no gang: %s", key, spec)
                self.groups.pop(key, None)
                self.invalid_groups[key] = spec
                self.touched_gangs.add(key)
        elif self.groups.get(key) != spec or key in self.invalid_groups:
            self.invalid_groups.pop(key, None)
            self.groups[key] = spec
            self.touched_gangs.add(key)

    # ---- Queues -----------------------------------------------------------------

    @staticmethod
    def _queue_entry(obj: dict) -> tuple[str, dict]:
        return str((obj.get("metadata") or {}).get("name", "")), obj

    def _replace_queues(self, listed: dict[str, dict]) -> None:
        before = (dict(self.queues), dict(self.invalid_queues))
        self.queues_raw = listed
        self.queues.clear()
        self.invalid_queues.clear()
        for name, obj in listed.items():
            self._convert_queue(name, obj)
        self._queues_changed(before)

    def _apply_queue(self, event_type: str, obj: dict) -> None:
        name, _ = self._queue_entry(obj)
        before = (dict(self.queues), dict(self.invalid_queues))
        self.queues.pop(name, None)
        self.invalid_queues.pop(name, None)
        if event_type == "DELETED":
            self.queues_raw.pop(name, None)
        else:
            self.queues_raw[name] = obj
            self._convert_queue(name, obj)
        self._queues_changed(before)

    def _convert_queue(self, name: str, obj: dict) -> None:
        try:
            self.queues[name] = queue_from_json(obj)
        except Exception as exc:  # noqa: BLE001 - whatever it holds, only this Queue is refused
            why = str(exc) if isinstance(exc, (ValueError, TypeError)) else f"{type(exc).__name__}: {exc}"
            self.invalid_queues[name] = why = clip(why, MAX_PROBLEM_LENGTH)
            log.warning("Queue %s is invalid: %s", name, why)
            self.on_bad_object("Queue", obj, why)

    def _queues_changed(self, before: tuple[dict, dict]) -> None:
        """What any waiting gang may take changed: every one is tried again
        (Queues change seldom; which gangs a parent's change reaches is not
        worth working out)."""
        if before != (self.queues, self.invalid_queues):
            self.touched_gangs.update(self.state.pending_gang_keys())
            self._notify()

    # ---- assumptions ----------------------------------------------------------

    def assume(self, uid: str, node: str, gpu_ids: tuple[int, ...]) -> None:
        pod = self.pods.get(uid)
        if pod is None:
            return
        self.assumed[uid] = (node, gpu_ids)
        self.state.put_pod(pod_with(pod, node_name=node, gpu_ids=gpu_ids, bound_by_scheduler=True))

    def forget(self, uid: str) -> None:
        """The binding is known not to have happened: the pod is unbound again.

        Only the binder calls this, after a refusal or after reading the pod
        back (an ambiguous outcome is never guessed at).  Its room frees for
        others; its gang is touched (its status counted the pod bound), and
        keeps the refusal's backoff, which a touch does not clear.
        """
        if self.assumed.pop(uid, None) is None:
            return
        pod = self.pods.get(uid)
        if pod is not None and not pod.terminal:
            self.state.put_pod(pod_with(pod, node_name="", gpu_ids=(), bound_by_scheduler=False))
            self.touched_gangs.add(pod.gang_key)  # its status counted the pod bound
        self.capacity_freed = True
        self._notify()

    # ---- the cycle's view ------------------------------------------------------

    def snapshot(self, now: float) -> Snapshot:
        # The cycle is synchronous: nothing changes the state while it runs.
        return Snapshot.of(self.state, self.groups, now, self.invalid_groups, self.queues, self.invalid_queues)

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
            self.state.put_pod(pod_with(pod, nominated_node=node_name))

    def nominated_pods(self) -> list[PodInfo]:
        return list(self.state.nominated_pods())

    @property
    def pods(self) -> Mapping[str, PodInfo]:
        return self.state.pods

    @property
    def nodes(self) -> Mapping[str, NodeInfo]:
        return self.state.nodes


def absence(exc: ApiError) -> str:
    """Why an optional collection is absent, from the API's refusal (403 or 404)."""
    return "may not be read (RBAC)" if exc.status == 403 else "are not served by the API server"


def foreign_kind(source: str) -> str:
    """A foreign source's PodGroups as a collection is named (logs, metrics, /readyz)."""
    return f"podgroups.{gangsources.SOURCES[source].api_group}"


# source -> (PodGroup JSON, its PriorityClass's value or None) -> GroupSpec; raises ValueError
_GROUP_READERS: dict[str, Callable[[dict, int | None], GroupSpec]] = {
    gangsources.OWN: group_from_json,
    gangsources.SCHEDULER_PLUGINS: lambda obj, priority: schedulerplugins.group_from_json(obj),
    gangsources.VOLCANO: volcano.group_from_json,
    gangsources.NATIVE: native.group_from_json,
}


# source -> owner JSON -> its automatic gang's spec (None: no gang); raises ValueError
_OWNER_READERS: dict[str, Callable[[dict], GroupSpec | None]] = {
    gangsources.JOB: jobs.group_from_json,
    gangsources.JOBSET: jobsets.group_from_json,
}


def _name_of(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return clip(f"{meta.get('namespace') + '/' if meta.get('namespace') else ''}{meta.get('name')}", 300)


# kind -> (convert, key of a converted object, put into and remove from the state)
_DRA: dict[str, tuple[Callable, Callable, Callable, Callable]] = {
    "deviceclasses": (dra.class_from_json, lambda c: c.name,
                      ClusterState.put_device_class, ClusterState.remove_device_class),
    "resourceslices": (dra.slice_from_json, lambda s: s.name,
                       ClusterState.put_resource_slice, ClusterState.remove_resource_slice),
    "resourceclaims": (dra.claim_from_json, lambda c: c.uid, ClusterState.put_claim, ClusterState.remove_claim),
}
_DRA_KIND_NAMES = {"deviceclasses": "DeviceClass", "resourceslices": "ResourceSlice",
                   "resourceclaims": "ResourceClaim"}


def _dra_key(kind: str, obj: dict) -> str:
    """What a DRA object is held by, read from its JSON: claims by uid, the others by name."""
    return str((obj.get("metadata") or {}).get("uid" if kind == "resourceclaims" else "name", ""))


def _dra_held(state: ClusterState, kind: str) -> Mapping[str, Any]:
    return {"deviceclasses": state.dra.classes, "resourceslices": state.dra.slices,
            "resourceclaims": state.dra.claims}[kind]
