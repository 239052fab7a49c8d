"""The shell's waits: they end on time and never swallow a cancellation
(SIGTERM cancels them, and a lost cancellation kept the scheduler running)."""
from __future__ import annotations

import asyncio
import time
import types

import pytest

from batchsched.config import SchedulerConfig
from batchsched.core.config import CoreConfig
from batchsched.core.queueing.queue import GangQueue
from batchsched.shell.binder import Binder, BindRequest
from batchsched.shell.cache import ClusterCache
from batchsched.shell.scheduler import Scheduler


def test_waiting_for_work_is_cancelled_even_as_a_change_arrives():
    async def scenario():
        stand_in = types.SimpleNamespace(queue=GangQueue.from_config(CoreConfig()), cache=ClusterCache("batchsched"),
                                         config=SchedulerConfig())
        waiting = asyncio.create_task(Scheduler._wait_for_work(stand_in))
        await asyncio.sleep(0.01)
        stand_in.cache.changed.set()
        waiting.cancel()  # in the same step as the change: asyncio.wait_for on 3.11 loses this
        with pytest.raises(asyncio.CancelledError):
            await waiting
    asyncio.run(scenario())


class SlowKube:
    """Binds after ``release`` is set."""

    def __init__(self):
        self.release = asyncio.Event()

    async def bind(self, namespace, pod, uid, node, annotations=None):
        await self.release.wait()


def test_writes_that_can_wait_wait_for_bindings_in_flight_at_most_so_long():
    async def scenario():
        kube = SlowKube()
        binder = Binder(kube, quiet=0.05)  # type: ignore[arg-type]
        started = time.monotonic()
        await binder.wait_idle(5)  # nothing in flight: no wait
        assert time.monotonic() - started < 0.05
        binding = asyncio.create_task(binder.bind_all([BindRequest("u", "ns", "p", "n", "ns/p")]))
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await binder.wait_idle(0.2)  # in flight: waits, but not beyond at_most
        assert 0.18 < time.monotonic() - started < 1.0
        waiter = asyncio.create_task(binder.wait_idle(5))
        await asyncio.sleep(0.01)
        kube.release.set()
        results = await binding
        await asyncio.wait_for(waiter, 1)  # ends with the bindings, long before at_most
        assert [r.ok for r in results] == [True]
    asyncio.run(scenario())


class QuickKube:
    async def bind(self, namespace, pod, uid, node, annotations=None):
        await asyncio.sleep(0.005)


def test_writes_that_can_wait_hold_off_until_bindings_pause_not_between_a_burst_s_cycles():
    """A burst binds cycle after cycle, the binder idle only for moments
    between them: a waiting write goes once no binding was in flight for
    ``quiet`` seconds, and at ``at_most`` however the bindings go on."""
    async def scenario():
        binder = Binder(QuickKube(), quiet=0.3)  # type: ignore[arg-type]

        async def burst(cycles: int) -> None:
            for i in range(cycles):  # a cycle's bindings, then ~0.1 s of the next cycle's decisions
                await binder.bind_all([BindRequest(f"u{i}", "ns", f"p{i}", "n", "ns/p")])
                await asyncio.sleep(0.1)

        await binder.bind_all([BindRequest("u", "ns", "p", "n", "ns/p")])
        started = time.monotonic()
        await binder.wait_idle(5)  # bound a moment ago: waits out the quiet period
        assert 0.25 < time.monotonic() - started < 3.0

        bursting = asyncio.create_task(burst(8))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await binder.wait_idle(5)
        waited = time.monotonic() - started
        assert bursting.done() and waited > 0.7  # all eight cycles (~0.85 s), then the quiet period
        assert waited < 4.0  # not at_most

        bursting = asyncio.create_task(burst(30))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await binder.wait_idle(0.5)  # the bindings go on: at most so long
        assert 0.45 < time.monotonic() - started < 2.0 and not bursting.done()
        bursting.cancel()
    asyncio.run(scenario())
