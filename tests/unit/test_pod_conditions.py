"""PodConditionWriter's coalescing: what it writes, when, and what it never
overwrites.  A recording stand-in for Kube; the real API server's side is in
tests/integration/test_pod_status.py."""
from __future__ import annotations

import asyncio
import dataclasses

from batchsched.core.model import PodInfo
from batchsched.core.readers import pod_from_json
from batchsched.kube.client import ApiError
from batchsched.shell.pod_status import PodConditionWriter
from tests.unit.yield_support import BindingsInFlight


class RecordingKube:
    def __init__(self, refuse: int = 0, status: int = 409):
        self.patches: list[tuple[str, dict]] = []
        self.refuse, self.status = refuse, status
        self.in_flight = self.most_in_flight = 0

    async def strategic_merge_patch(self, path, patch):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        if self.refuse:
            self.refuse -= 1
            raise ApiError(self.status, "Conflict", "the object has been modified", {})
        self.patches.append((path, patch))
        return {}


def pending(name: str = "train-0", **kwargs) -> PodInfo:
    return PodInfo(uid=f"uid-{name}", namespace="team-a", name=name, group="train", resource_version="7", **kwargs)


async def running_writer(kube, pods: dict[str, PodInfo], **kwargs) -> PodConditionWriter:
    writer = PodConditionWriter(kube, pods.get, **kwargs)
    asyncio.get_running_loop().create_task(writer.run())
    return writer


def messages(kube) -> list[str]:
    return [patch["status"]["conditions"][0]["message"] for _, patch in kube.patches]


def test_the_patch_touches_only_the_pod_scheduled_condition_and_is_guarded_by_the_resource_version():
    kube = RecordingKube()

    async def scenario():
        pod = pending()
        writer = await running_writer(kube, {pod.uid: pod}, min_interval=0)
        writer.update(pod, "gang team-a/train (QuorumNotReached): 2/4 members exist")
        await asyncio.sleep(0.05)
    asyncio.run(scenario())
    [(path, patch)] = kube.patches
    assert path == "/api/v1/namespaces/team-a/pods/train-0/status"
    assert patch["metadata"] == {"resourceVersion": "7"}
    [condition] = patch["status"]["conditions"]
    assert condition["type"] == "PodScheduled" and condition["status"] == "False"
    assert condition["reason"] == "Unschedulable" and "lastTransitionTime" in condition
    assert set(patch) == {"metadata", "status"} and set(patch["status"]) == {"conditions"}


def test_nothing_is_written_while_nothing_changed_and_a_change_keeps_the_transition_time():
    kube = RecordingKube()

    async def scenario():
        pod = pending()
        writer = await running_writer(kube, {pod.uid: pod}, min_interval=0)
        for message in ("A", "A", "A"):
            writer.update(pod, message)
            await asyncio.sleep(0.02)
        writer.update(pod, "B")
        for _ in range(200):  # B's write, however loaded the machine (and never a third)
            if writer.writes >= 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert writer.writes == 2
    asyncio.run(scenario())
    assert messages(kube) == ["A", "B"]
    assert "lastTransitionTime" not in kube.patches[1][1]["status"]["conditions"][0]  # still False: kept


def test_a_restart_rewrites_nothing_the_pod_already_says():
    kube = RecordingKube()

    async def scenario():
        pod = pending(scheduled_condition=("False", "Unschedulable", "A"))
        writer = await running_writer(kube, {pod.uid: pod}, min_interval=0)
        writer.update(pod, "A")
        await asyncio.sleep(0.05)
    asyncio.run(scenario())
    assert kube.patches == []


def test_within_the_interval_the_latest_message_wins():
    kube = RecordingKube()

    async def scenario():
        pod = pending()
        writer = await running_writer(kube, {pod.uid: pod}, min_interval=0.3)
        writer.update(pod, "A")
        await asyncio.sleep(0.05)
        for message in ("B", "C", "D"):
            writer.update(pod, message)
        await asyncio.sleep(0.1)
        assert messages(kube) == ["A"]
        await asyncio.sleep(0.5)
    asyncio.run(scenario())
    assert messages(kube) == ["A", "D"]


def test_a_pod_bound_or_gone_before_its_write_is_not_written_and_is_forgotten():
    kube = RecordingKube()

    async def scenario():
        bound, gated, gone = pending("bound"), pending("gated"), pending("gone")
        pods = {bound.uid: dataclasses.replace(bound, node_name="n1"),
                gated.uid: dataclasses.replace(gated, gated=True)}
        writer = await running_writer(kube, pods, min_interval=0)
        for pod in (bound, gated, gone):
            writer.update(pod, "A")  # the cycle saw them pending; by the write they are not
        await asyncio.sleep(0.05)
        assert not writer._pending and not writer._written
    asyncio.run(scenario())
    assert kube.patches == []


def test_a_refused_write_is_tried_again_with_the_pod_as_it_is_then():
    kube = RecordingKube(refuse=1)

    async def scenario():
        pod = pending()
        pods = {pod.uid: pod}
        writer = await running_writer(kube, pods, min_interval=0)
        writer.update(pod, "A")
        await asyncio.sleep(0.05)
        pods[pod.uid] = dataclasses.replace(pod, resource_version="8")  # the watch caught up
        await asyncio.sleep(1.5)
    asyncio.run(scenario())
    assert messages(kube) == ["A"]
    assert kube.patches[0][1]["metadata"]["resourceVersion"] == "8"


def test_a_256_pod_gang_is_written_once_per_pod_with_bounded_concurrency():
    kube = RecordingKube()

    async def scenario():
        pods = {p.uid: p for p in (pending(f"train-{i}") for i in range(256))}
        writer = await running_writer(kube, pods, min_interval=0, max_in_flight=16)
        for _ in range(3):  # three cycles with the same verdict
            for pod in pods.values():
                writer.update(pod, "gang team-a/train (Unschedulable): 0/4 nodes are available")
        await asyncio.sleep(0.5)
    asyncio.run(scenario())
    assert len(kube.patches) == 256
    assert kube.most_in_flight == 16


def test_bookkeeping_of_pods_no_longer_pending_is_pruned():
    kube = RecordingKube()

    async def scenario():
        pods = {p.uid: p for p in (pending(f"p-{i}") for i in range(3000))}
        writer = await running_writer(kube, pods, min_interval=0)
        for pod in list(pods.values())[:1000]:
            writer.update(pod, "A")
        await asyncio.sleep(0.5)
        for uid in list(pods)[:1000]:
            del pods[uid]  # deleted: the cache no longer has them
        for pod in list(pods.values())[1000:2000]:
            writer.update(pod, "A")
        await asyncio.sleep(0.5)
        assert len(writer._written) <= 1100
    asyncio.run(scenario())


def test_an_api_server_refusing_every_write_costs_one_log_line_a_round(caplog):
    kube = RecordingKube(refuse=64, status=500)

    async def scenario():
        pods = {p.uid: p for p in (pending(f"train-{i}") for i in range(64))}
        writer = await running_writer(kube, pods, min_interval=0)
        for pod in pods.values():
            writer.update(pod, "A")
        await asyncio.sleep(1.6)  # the first round fails, the retry a second later passes
    with caplog.at_level("WARNING", logger="batchsched.shell.pod_status"):
        asyncio.run(scenario())
    assert len(kube.patches) == 64
    assert [r.getMessage()[:45] for r in caplog.records] == ["64 PodScheduled condition write(s) failed, re"]


def test_the_seed_is_read_from_any_pod_status_without_raising():
    def condition_of(conditions) -> tuple:
        return pod_from_json({"metadata": {"name": "p", "uid": "u"}, "status": {"conditions": conditions}}
                             ).scheduled_condition
    ours = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "gang a/b"}
    assert condition_of([{"type": "Ready", "status": "False"}, ours]) == ("False", "Unschedulable", "gang a/b")
    for hostile in ("x", [1, None], [{"type": "PodScheduled", "status": ["False"]}], {"PodScheduled": 1}):
        assert condition_of(hostile) == ()


def test_writes_yield_to_bindings_that_start_again_after_an_idle_moment():
    """An idle moment lets through only the writes holding a slot; the rest
    wait again once bindings are back in flight."""
    kube = RecordingKube()

    async def scenario():
        bindings = BindingsInFlight()
        pods = {p.uid: p for p in (pending(f"train-{i}") for i in range(10))}
        writer = await running_writer(kube, pods, min_interval=0, max_in_flight=2,
                                      wait_for_bindings=bindings.wait_for_bindings)
        for pod in pods.values():
            writer.update(pod, "gang team-a/train (Unschedulable): 0/4 nodes are available")
        return await bindings.writes_around_an_idle_moment(lambda: len(kube.patches), total=10)
    seen = asyncio.run(scenario())
    assert seen[0] == 0 and seen[1] <= 2 and seen[2] == 10  # at most the slots' worth amid the burst
