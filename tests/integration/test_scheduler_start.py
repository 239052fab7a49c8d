"""What a scheduler does between its start and its first bindings, against
the real API server: the heap is settled (a pause over the whole cache)
only once the first bindings are answered, and the collector is set to run
rarely before the first list."""
from __future__ import annotations

import asyncio
import gc

import pytest

from batchsched.config import SchedulerConfig
from batchsched.kube.client import Kube
from batchsched.shell import heap, replica
from batchsched.shell.scheduler import Scheduler
from tests.support.objects import pod, pod_group

pytestmark = pytest.mark.e2e


def started_when(env, kubeconfig: str, leading: asyncio.Event | None = None) -> list[dict[str, str]]:
    """Runs a scheduler until its on_started hook has been called; returns,
    per call, the pods the API server showed bound at that moment."""
    async def scenario() -> list[dict[str, str]]:
        kube = await Kube.connect(kubeconfig)
        config = SchedulerConfig.model_validate({"nodeSelector": env.node_label, "metricsBindAddress": "0"})
        scheduler = Scheduler(kube, config, leading=leading)
        calls: list[dict[str, str]] = []
        scheduler.on_started = lambda: calls.append(env.bound())
        task = asyncio.create_task(scheduler.run())
        try:
            async with asyncio.timeout(30):
                while not calls:
                    assert not task.done(), task
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)  # called once only
            return calls
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await kube.close()

    return asyncio.run(scenario())


def test_the_heap_settles_once_the_first_bindings_are_answered(env, scheduler_kubeconfig):
    env.add_node("n1")
    env.create(pod_group("g", env.namespace, 4))
    for i in range(4):
        env.create(pod(f"g-{i}", env.namespace, group="g", cpu="1"))
    calls = started_when(env, scheduler_kubeconfig)
    assert len(calls) == 1 and sorted(calls[0]) == [f"g-{i}" for i in range(4)]


def test_a_standby_settles_its_heap_once_synced(env, scheduler_kubeconfig):
    env.add_node("n1")
    env.create(pod_group("g", env.namespace, 1))
    env.create(pod("g-0", env.namespace, group="g", cpu="1"))
    assert started_when(env, scheduler_kubeconfig, leading=asyncio.Event()) == [{}]  # never leads: binds nothing, settles anyway


def test_collections_are_made_rare_before_the_first_list(monkeypatch):
    seen = []

    async def no_cluster(*args, **kwargs):
        seen.append(gc.get_threshold())
        raise ConnectionRefusedError("stop here")

    monkeypatch.setattr(replica.Kube, "connect", no_cluster)
    before = gc.get_threshold()
    try:
        with pytest.raises(ConnectionRefusedError):
            asyncio.run(replica.run_replica(None, SchedulerConfig()))
    finally:
        gc.set_threshold(*before)
    assert seen == [heap.THRESHOLDS] and before != heap.THRESHOLDS
