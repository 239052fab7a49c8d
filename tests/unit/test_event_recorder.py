"""EventRecorder's rules: never stale, rate-limited per object and reason,
latest wins, memory bounded; it and the PodGroup status writer yield to
bindings.  Only the bookkeeping is under test here (a
recording stand-in for Kube); tests/integration/test_pod_status.py posts
the same Events to a real API server."""
from __future__ import annotations

import asyncio

from batchsched.kube.events import EventRecorder, node_ref, pod_ref
from batchsched.shell.status import YIELD_TO_BINDINGS_SECONDS, StatusWriter
from tests.unit.yield_support import BindingsInFlight

POD = pod_ref("team-a", "train-0", "uid-0")


class RecordingKube:
    def __init__(self):
        self.posted: list[tuple[str, str, str]] = []  # (object name, reason, message)

    async def request(self, method, path, body=None, **kwargs):
        self.posted.append((body["involvedObject"]["name"], body["reason"], body["message"]))
        return {}


def run(scenario, min_interval: float = 0.0, **kwargs) -> list[tuple[str, str, str]]:
    kube = RecordingKube()

    async def main():
        recorder = EventRecorder(kube, "batchsched", min_interval=min_interval, **kwargs)
        await scenario(recorder)
        await asyncio.sleep(0.05)  # let the posts run
    asyncio.run(main())
    return kube.posted


def test_an_event_equal_to_the_last_posted_is_dropped():
    async def scenario(recorder):
        for _ in range(3):
            recorder.emit(POD, "Warning", "FailedScheduling", "A")
    assert run(scenario) == [("train-0", "FailedScheduling", "A")]


def test_a_problem_that_comes_back_is_posted_again():
    """A -> B -> A: the old rule (dedup by message for 600 s) dropped the
    second A, leaving B, a stale reason, as the newest Event."""
    async def scenario(recorder):
        for message in ("A", "B", "A"):
            recorder.emit(POD, "Warning", "FailedScheduling", message)
            await asyncio.sleep(0)
    assert [m for _, _, m in run(scenario)] == ["A", "B", "A"]


def test_within_the_interval_the_newest_event_is_held_and_posted_when_due():
    async def scenario(recorder):
        recorder.emit(POD, "Warning", "FailedScheduling", "A")
        recorder.emit(POD, "Warning", "FailedScheduling", "B")
        recorder.emit(POD, "Warning", "FailedScheduling", "C")  # replaces B: latest wins
        await asyncio.sleep(0.1)
        assert recorder.posted == 1  # C waits for the interval
        await asyncio.sleep(0.25)
    assert [m for _, _, m in run(scenario, min_interval=0.2)] == ["A", "C"]


def test_a_held_event_is_dropped_when_the_object_is_back_to_what_was_posted():
    async def scenario(recorder):
        recorder.emit(POD, "Warning", "FailedScheduling", "A")
        recorder.emit(POD, "Warning", "FailedScheduling", "B")  # held
        recorder.emit(POD, "Warning", "FailedScheduling", "A")  # what the object shows already
        await asyncio.sleep(0.3)
    assert [m for _, _, m in run(scenario, min_interval=0.2)] == ["A"]


def test_another_reason_is_posted_at_once_and_supersedes_a_held_event():
    async def scenario(recorder):
        recorder.emit(POD, "Warning", "FailedScheduling", "A")
        recorder.emit(POD, "Warning", "FailedScheduling", "B")  # held
        recorder.emit(POD, "Normal", "Scheduled", "bound")  # not delayed by FailedScheduling's pace
        await asyncio.sleep(0.05)
        assert recorder.posted == 2
        await asyncio.sleep(0.3)  # and B, older than "bound", is never posted
    assert [(r, m) for _, r, m in run(scenario, min_interval=0.2)] == [
        ("FailedScheduling", "A"), ("Scheduled", "bound")]


def test_the_interval_is_per_object():
    async def scenario(recorder):
        for i in range(5):
            recorder.emit(pod_ref("ns", f"p{i}", f"u{i}"), "Warning", "FailedScheduling", "A")
    assert len(run(scenario, min_interval=60)) == 5


def test_a_node_whose_problem_changes_back_and_is_fixed_ends_on_the_fix():
    node = node_ref({"metadata": {"name": "gpu-1", "uid": "n1"}})

    async def scenario(recorder):
        for reason, message in (("InvalidGpuTopology", "bad A"), ("InvalidGpuTopology", "bad B"),
                                ("InvalidGpuTopology", "bad A"), ("GpuTopologyAccepted", "used")):
            recorder.emit(node, "Warning" if reason.startswith("Invalid") else "Normal", reason, message)
            await asyncio.sleep(0)
    assert [m for _, _, m in run(scenario)] == ["bad A", "bad B", "bad A", "used"]


def test_memory_stays_bounded():
    kept = []

    async def scenario(recorder):
        for i in range(1000):
            recorder.emit(pod_ref("ns", f"p{i}", f"u{i}"), "Warning", "FailedScheduling", "A")
            recorder.emit(pod_ref("ns", f"p{i}", f"u{i}"), "Warning", "FailedScheduling", "B")  # held
        kept.append(len(recorder._objects))
        kept.append(sum(1 for s in recorder._objects.values() if s.timer is not None))
    run(scenario, min_interval=60, max_objects=100)
    assert kept[0] <= 100
    assert kept[1] <= 100  # the timers of forgotten objects are cancelled with them


def test_events_yield_to_bindings_that_start_again_after_an_idle_moment():
    """An idle moment lets at most the events holding a slot through; the
    rest wait again once bindings are back in flight (they used to all
    pass the wait at the first idle moment and post amid the next burst)."""
    kube = RecordingKube()

    async def main():
        bindings = BindingsInFlight()
        recorder = EventRecorder(kube, "batchsched", max_in_flight=2, wait_for_bindings=bindings.wait_for_bindings)
        for i in range(10):
            recorder.emit(pod_ref("ns", f"p{i}", f"u{i}"), "Normal", "Scheduled", "bound")
        return await bindings.writes_around_an_idle_moment(lambda: len(kube.posted), total=10)
    assert asyncio.run(main()) == [0, 2, 10]


def test_podgroup_status_writes_yield_to_bindings_that_start_again_after_an_idle_moment():
    """The status writer writes one group at a time: an idle moment lets
    the first through, the rest wait for the next burst of bindings to end."""
    written: list[str] = []

    class PatchingKube:
        async def merge_patch(self, path, patch):
            written.append(path)
            await asyncio.sleep(0.001)
            return {}

    async def main():
        bindings = BindingsInFlight()
        writer = StatusWriter(PatchingKube(), min_interval=0, wait_for_bindings=bindings.wait_for_bindings)
        task = asyncio.get_running_loop().create_task(writer.run())
        for i in range(10):
            writer.update(f"team-a/g{i}", {"phase": "Running"})
        seen = await bindings.writes_around_an_idle_moment(lambda: len(written), total=10)
        task.cancel()
        return seen
    seen = asyncio.run(main())
    assert seen[0] == 0 and seen[1] <= 1 and seen[2] == 10


def test_events_wait_for_bindings_that_never_pause_their_own_longer_time():
    """Events may wait longer than status writes (EVENT_YIELD_SECONDS): a
    burst's Scheduled Events follow it, not share the API server with it;
    bindings that never pause still get them out at that limit."""
    kube = RecordingKube()
    asked: list[float] = []

    async def bindings_never_pause(at_most: float) -> None:
        asked.append(at_most)
        await asyncio.sleep(at_most)

    async def main():
        recorder = EventRecorder(kube, "batchsched", wait_for_bindings=bindings_never_pause, yield_seconds=1.0)
        recorder.emit(POD, "Normal", "Scheduled", "bound")
        await asyncio.sleep(0.1)
        waiting = list(kube.posted)
        async with asyncio.timeout(5):
            while not kube.posted:
                await asyncio.sleep(0.02)
        return waiting
    assert asyncio.run(main()) == []
    assert kube.posted == [("train-0", "Scheduled", "bound")]
    assert 0.9 < asked[0] <= 1.0  # its whole limit, not the status writes' 10 s nor none
    assert EventRecorder(RecordingKube(), "batchsched").yield_seconds > YIELD_TO_BINDINGS_SECONDS
