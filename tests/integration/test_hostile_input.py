"""Hostile objects against the real scheduler and API server: the scheduler
stays alive and ready, reports each bad object, and schedules the rest.

Every object the scheduler must refuse is one the API server accepts (the
CRD's tightened schema refuses the most extreme values itself, checked
here too)."""
from __future__ import annotations

import asyncio
import json

import pytest

from batchsched.api import constants
from batchsched.core.topology.annotation import to_annotation
from batchsched.kube.client import Kube
from batchsched.shell.reflector import Reflector
from tests.integration.test_gang_scheduling import wait_unschedulable
from tests.support.kube import KubeError, wait_for
from tests.support.objects import pod, pod_group
from tests.unit.topology_support import fixture

pytestmark = pytest.mark.e2e

def events(env, namespace: str, kind: str, name: str) -> list[dict]:
    return [e for e in env.kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
            if e["involvedObject"].get("kind") == kind and e["involvedObject"].get("name") == name]


def raw_group(name: str, min_resources: dict) -> dict:
    """Not built with the API types: they refuse these values already."""
    return {"apiVersion": constants.API_VERSION, "kind": constants.PODGROUP_KIND, "metadata": {"name": name},
            "spec": {"minMember": 1, "minResources": min_resources}}


def test_the_crd_refuses_the_most_extreme_quantities_itself(env):
    for quantity in ("1e5000", "1e999999999", "1" * 65):
        with pytest.raises(KubeError) as refused:
            env.create(raw_group("extreme", {"cpu": quantity}))
        assert refused.value.status == 422
    with pytest.raises(KubeError) as refused:
        env.create(raw_group("many", {f"example.com/r{i}": "1" for i in range(33)}))
    assert refused.value.status == 422
    env.create(raw_group("admitted", {"cpu": "1e20", "memory": "64Gi", "nvidia.com/gpu": 8}))


def test_the_crd_refuses_runtime_hints_out_of_range(env):
    for hint in (0, -1, 2**31, "1h"):
        with pytest.raises(KubeError) as refused:
            env.create({**raw_group("hint", {}), "spec": {"minMember": 1, "expectedRuntimeSeconds": hint}})
        assert refused.value.status == 422, hint
    env.create({**raw_group("hinted", {}), "spec": {"minMember": 1, "expectedRuntimeSeconds": 2**31 - 1}})


def test_hostile_podgroup_and_nodes_are_reported_and_a_good_gang_is_still_bound(env, start_scheduler):
    annotation = json.loads(to_annotation(fixture("pcie-switch-pairs-8gpu.txt")))
    annotation["gpus"][0]["cpus"] = "0-4294967295"
    cpu_bomb = env.add_node("cpubomb", gpus=8, annotations={
        constants.GPU_TOPOLOGY_ANNOTATION: json.dumps(annotation)})
    nested = env.add_node("nested", gpus=8, annotations={
        constants.GPU_TOPOLOGY_ANNOTATION: "[" * 5000 + "]" * 5000})  # the parser would recurse past its limit
    env.create(raw_group("huge", {"cpu": "1e20"}))  # the schema admits it; the scheduler must not
    env.create(pod("huge-0", env.namespace, group="huge", cpu="1"))
    env.create(pod_group("good", env.namespace, 2))
    for i in range(2):
        env.create(pod(f"good-{i}", env.namespace, group="good", cpu="1"))
    proc = start_scheduler()

    wait_for("the good gang bound", lambda: sorted(env.bound()) == ["good-0", "good-1"])
    condition = wait_unschedulable(env, "huge", "InvalidPodGroup")
    assert "spec.minResources" in condition["message"] and "exceeds" in condition["message"]
    wait_for("an InvalidPodGroup event", lambda: any(
        e["reason"] == "InvalidPodGroup" for e in events(env, env.namespace, "PodGroup", "huge")))
    for name, problem in ((cpu_bomb, "names a CPU beyond 8191"), (nested, "nested deeper than")):
        wait_for(f"an InvalidGpuTopology event on {name}", lambda name=name, problem=problem: any(
            e["reason"] == "InvalidGpuTopology" and problem in e["message"]
            for e in events(env, "default", "Node", name)))
    assert proc.proc.poll() is None, proc.log()[-3000:]
    assert proc.get("/readyz") == (200, "ok\n")
    assert "huge-0" not in env.bound()


def test_a_reflector_outlives_failing_updates_and_is_out_of_step_until_its_relist(env, scheduler_kubeconfig):
    """The updates fail in our own code (any exception, RecursionError
    included); the API server is real.  Each failure relists."""
    name = env.add_node("watched")
    failures = {"replace": [RecursionError("maximum recursion depth exceeded")], "apply": [KeyError("type")]}
    listed, applied, errors = [], [], []

    def convert(obj: dict) -> tuple[str, dict]:
        return obj["metadata"]["name"], obj

    def replace(entries: dict[str, dict]) -> None:
        if failures["replace"]:
            raise failures["replace"].pop()
        listed.append(set(entries))

    def apply(event_type: str, obj: dict) -> None:
        if obj["metadata"]["name"] == f"{env.id}-later" and failures["apply"]:
            raise failures["apply"].pop()
        applied.append((event_type, obj["metadata"]["name"]))

    async def scenario() -> None:
        kube = await Kube.connect(scheduler_kubeconfig)
        reflector = Reflector(kube, "/api/v1/nodes", "nodes", convert, replace, apply,
                              on_restart=lambda kind, why: errors.append((kind, why, reflector.error)))
        task = asyncio.create_task(reflector.run())
        try:
            await asyncio.wait_for(reflector.synced.wait(), 30)
            assert errors == [("nodes", "error", "cache update failed: RecursionError: maximum recursion "
                                                 "depth exceeded")]
            assert name in listed[-1] and reflector.error == ""
            await asyncio.to_thread(env.add_node, "later")
            async with asyncio.timeout(30):
                while len(listed) < 2 or reflector.error:  # the failed event, then the relist that shows it
                    await asyncio.sleep(0.05)
            assert errors[1] == ("nodes", "error", "cache update failed: KeyError: 'type'")
            assert f"{env.id}-later" in listed[1]
            assert not task.done()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await kube.close()

    asyncio.run(scenario())


def test_the_scheduling_loop_outlives_a_failing_cycle(env, monkeypatch, scheduler_kubeconfig):
    """A whole cycle raising (injected into the decision core's entry point;
    the API server is real) is logged, counted and followed by the next one."""
    from batchsched.config import SchedulerConfig
    from batchsched.shell import scheduler as scheduler_module

    env.add_node("n1")
    env.create(pod_group("g", env.namespace, 2))
    for i in range(2):
        env.create(pod(f"g-{i}", env.namespace, group="g", cpu="1"))
    real_cycle, calls = scheduler_module.schedule_cycle, []

    def first_cycle_fails(*args, **kwargs):
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("injected: the first cycle fails")
        return real_cycle(*args, **kwargs)

    monkeypatch.setattr(scheduler_module, "schedule_cycle", first_cycle_fails)

    async def scenario() -> float | None:
        kube = await Kube.connect(scheduler_kubeconfig)
        config = SchedulerConfig.model_validate({"nodeSelector": env.node_label, "metricsBindAddress": "0"})
        scheduler = scheduler_module.Scheduler(kube, config)
        task = asyncio.create_task(scheduler.run())
        try:
            async with asyncio.timeout(30):
                while len(await asyncio.to_thread(env.bound)) < 2:
                    assert not task.done(), task
                    await asyncio.sleep(0.1)
            assert not task.done()
            return scheduler.metrics.registry.get_sample_value("batchsched_scheduling_cycle_errors_total")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await kube.close()

    assert asyncio.run(scenario()) == 1
    assert len(calls) >= 2
