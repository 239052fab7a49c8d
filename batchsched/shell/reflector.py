"""A reflector keeps one collection of the cache in step with the API server.

List (paginated), then watch from the list's resourceVersion with bookmarks;
a watch that times out resumes from the last resourceVersion seen; ``410
Gone`` relists at once; any other error reconnects with capped exponential
backoff; ``relist()`` (SIGUSR1) drops the watch and lists again.  A list is
converted page by page into model objects, never held raw as a whole, and
swapped in at its end (the cache's ``replace``).

Nothing ends a reflector but cancellation: any exception while listing,
watching or applying is logged and followed by a relist, the reflector
counting as not synced (``error``) until that relist succeeds.  An
*optional* collection that the API server does not serve (404) or that the
scheduler may not read (403) counts as synced and empty, said once in the
log, and is listed again every ``ABSENT_RECHECK_SECONDS``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable

import aiohttp

from batchsched.core.text import clip
from batchsched.kube.client import ApiError, Kube

log = logging.getLogger(__name__)

# Objects per list page, at most: its raw JSON is all a relist holds beyond the
# model objects.  Each page costs the API server ~7 ms beyond its objects: 50,000
# pods in pages of 500 took it ~2.2 s of CPU, in pages of 2,000 ~1.5 s
# (bench/history/RESULTS-until-2026-12-06.md, "Fewer, larger list pages").
LIST_PAGE_SIZE = 2000
# A page's size is aimed at PAGE_BYTES of raw JSON, from the bytes per object of
# the page before; the first asks for FIRST_PAGE_SIZE.  Tenants' objects can be
# large (the API server stores objects of ~1.5 MB, 256 KiB of annotations each),
# and 2,000 such pods would be gigabytes in one page.
FIRST_PAGE_SIZE = 50
PAGE_BYTES = 8 * 2**20
CONVERT_SLICE = 100  # objects converted between two yields to the event loop (~3 ms of pods)
MIN_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS = 0.2, 30.0
# How often a collection the API server does not serve is looked for again.
ABSENT_RECHECK_SECONDS = 60.0


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


def absence(exc: ApiError) -> str:
    """Why an optional collection is absent, from the API's refusal (403 or 404)."""
    return "may not be read (RBAC)" if exc.status == 403 else "are not served by the API server"
