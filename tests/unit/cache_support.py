"""A stand-in for the API server's paginated list, to drive the watch
cache's real list loop (``Reflector.list_once``) without a server."""
from __future__ import annotations

import asyncio
import gc
import json
import weakref
from typing import AsyncIterator, Callable

from batchsched.shell.cache import ClusterCache


class RawObject(dict):
    """A decoded API object that can be watched for being freed."""
    __slots__ = ("__weakref__",)


class PagedList:
    """Serves ``items`` ``limit`` at a time with continue tokens, each page
    freshly decoded (by the reflector's decoder) as ``Kube.request`` returns
    it.  Before serving a page it calls ``on_page(index)`` and records how
    many raw objects of the last page served (``alive_from_the_last_page``:
    it may still be being converted while the next is asked for) and of
    the pages before it (``alive_from_earlier_pages``) are still alive."""

    def __init__(self, items: list[dict], on_page: Callable[[int], None] = lambda index: None):
        self.items = items
        self.on_page = on_page
        self.alive_from_earlier_pages: list[int] = []
        self.alive_from_the_last_page: list[int] = []
        self._served: list[list[weakref.ref]] = []  # per page served
        self.watches = 0
        self.limits: list[int] = []  # the limit each page was asked with
        self.page_bytes: list[int] = []  # the JSON of each page served

    async def request(self, method: str, path: str, *, query: dict, timeout: float | None = None,
                      decode: Callable[[bytes], dict] = json.loads) -> dict:
        assert method == "GET" and "watch" not in query
        gc.collect()
        self.alive_from_earlier_pages.append(
            sum(1 for page in self._served[:-1] for ref in page if ref() is not None))
        self.alive_from_the_last_page.append(sum(1 for ref in (self._served or [[]])[-1] if ref() is not None))
        self.on_page(len(self.alive_from_earlier_pages) - 1)
        start = int(query.get("continue") or 0)
        end = start + query["limit"]
        more = {"continue": str(end)} if end < len(self.items) else {}
        raw = json.dumps({"metadata": {"resourceVersion": "7", **more}, "items": self.items[start:end]}).encode()
        self.limits.append(query["limit"])
        self.page_bytes.append(len(raw))
        page = decode(raw)
        page["items"] = [RawObject(obj) for obj in page["items"]]
        self._served.append([weakref.ref(obj) for obj in page["items"]])
        return page

    async def watch(self, path: str, resource_version: str, timeout_seconds: int,
                    decode: Callable[[bytes], dict] = json.loads) -> AsyncIterator[dict]:
        """A watch on which nothing ever happens."""
        self.watches += 1
        await asyncio.Event().wait()
        yield {}


def relist(cache: ClusterCache, kind: str, items: list[dict], page_size: int = 2,
           on_page: Callable[[int], None] = lambda index: None) -> PagedList:
    """List ``items`` into the cache as the ``kind`` reflector does, ``page_size`` a page."""
    source = PagedList(items, on_page)
    reflector = next(r for r in cache.reflectors(source) if r.kind == kind)  # type: ignore[arg-type]
    reflector.page_size = page_size
    asyncio.run(reflector.list_once())
    return source
