"""A stand-in for the binder's ``wait_idle``, for the writers that yield to
bindings (shell/status.py, shell/pod_status.py)."""
from __future__ import annotations

import asyncio
from typing import Callable


class BindingsInFlight:
    """Bindings are in flight until ``idle`` is set."""

    def __init__(self):
        self.idle = asyncio.Event()

    async def wait_for_bindings(self, at_most: float) -> None:
        try:
            async with asyncio.timeout(at_most):
                await self.idle.wait()
        except TimeoutError:
            pass

    async def writes_around_an_idle_moment(self, written: Callable[[], int], total: int) -> list[int]:
        """How many writes were made: while bindings are in flight; after
        one idle moment and the next burst of bindings; once idle for good
        (waiting up to 5 s for ``total``)."""
        await asyncio.sleep(0.05)
        seen = [written()]
        self.idle.set()
        await asyncio.sleep(0)  # one idle moment ...
        self.idle.clear()  # ... and the next burst of bindings
        await asyncio.sleep(0.05)
        seen.append(written())
        self.idle.set()
        async with asyncio.timeout(5):
            while written() < total:
                await asyncio.sleep(0.01)
        seen.append(written())
        return seen
