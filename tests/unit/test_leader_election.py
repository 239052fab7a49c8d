"""The leader elector against an in-memory Lease API (the real one is in
tests/integration/test_high_availability.py).  Durations are short so each
case takes about a second; the ratios are the defaults' (10 / 7 / 2)."""
from __future__ import annotations

import asyncio
import copy

import pytest

from batchsched.kube.client import ApiError
from batchsched.shell.leader import LeaderElector

LEASE, RENEW, RETRY = 1.0, 0.7, 0.2


class FakeLeaseApi:
    """GET/POST/PUT of one Lease with resourceVersion preconditions."""

    def __init__(self):
        self.lease: dict | None = None
        self.version = 0
        self.hang = False  # requests never answer (a partitioned replica)

    async def request(self, method: str, path: str, *, body=None, timeout=None, **_):
        if self.hang:
            await asyncio.sleep(3600)
        if method == "GET":
            if self.lease is None:
                raise ApiError(404, "NotFound", "", {})
            return copy.deepcopy(self.lease)
        if method == "POST" and self.lease is not None:
            raise ApiError(409, "AlreadyExists", "", {})
        if method == "PUT" and body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "", {})
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


def elector(api: FakeLeaseApi, identity: str) -> LeaderElector:
    return LeaderElector(api, "ns", "lease", identity, lease_duration=LEASE, renew_deadline=RENEW,
                         retry_period=RETRY)


async def wait(event: asyncio.Event, timeout: float) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(event.wait(), timeout)
    return loop.time() - started


async def holding(api: FakeLeaseApi, identity: str) -> tuple[LeaderElector, asyncio.Task]:
    """An elector running against ``api`` that has become the leader."""
    holder = elector(api, identity)
    task = asyncio.create_task(holder.run())
    await wait(holder.leading, 1)
    return holder, task


def test_one_leader_and_the_standby_takes_over_a_lease_duration_after_the_last_renewal():
    async def scenario():
        api = FakeLeaseApi()
        (a, task_a), b = await holding(api, "a"), elector(api, "b")
        task_b = asyncio.create_task(b.run())
        await wait(b.observed, 1)
        await asyncio.sleep(3 * RETRY)
        assert a.is_leading() and not b.is_leading() and b.holder == "a"
        assert api.lease["spec"]["holderIdentity"] == "a"
        task_a.cancel()  # a crash: no release
        failover = await wait(b.leading, 3 * LEASE)
        assert LEASE - RETRY - 0.1 <= failover <= LEASE + RETRY + 0.1
        assert api.lease["spec"]["holderIdentity"] == "b" and api.lease["spec"]["leaseTransitions"] == 1
        task_b.cancel()

    asyncio.run(scenario())


def test_a_holder_whose_renewals_hang_stops_acting_before_anyone_may_take_over():
    async def scenario():
        api = FakeLeaseApi()
        a, task = await holding(api, "a")
        renewed_at = asyncio.get_running_loop().time()
        api.hang = True
        await wait(a.lost, 2 * LEASE)
        gave_up_after = asyncio.get_running_loop().time() - renewed_at
        assert not a.is_leading()
        # it gave up within the renew deadline, before the lease could expire for others
        assert gave_up_after < LEASE
        await task

    asyncio.run(scenario())


def test_a_holder_that_sees_another_holder_stops_at_its_next_renewal():
    async def scenario():
        api = FakeLeaseApi()
        a, task = await holding(api, "a")
        api.lease["spec"]["holderIdentity"] = "usurper"
        api.lease["metadata"]["resourceVersion"] = "stolen"
        assert await wait(a.lost, 2 * RETRY + 0.2) <= 2 * RETRY + 0.2
        assert not a.is_leading() and a.holder == "usurper"
        await task

    asyncio.run(scenario())


def test_release_hands_over_within_one_retry_period():
    async def scenario():
        api = FakeLeaseApi()
        (a, task_a), b = await holding(api, "a"), elector(api, "b")
        task_b = asyncio.create_task(b.run())
        await wait(b.observed, 1)
        task_a.cancel()
        await a.release()
        assert not a.is_leading()
        assert await wait(b.leading, 2 * RETRY) <= RETRY + 0.1
        task_b.cancel()

    asyncio.run(scenario())


def test_durations_must_leave_the_holder_time_to_give_up():
    with pytest.raises(ValueError):
        LeaderElector(FakeLeaseApi(), "ns", "l", "a", lease_duration=5, renew_deadline=5, retry_period=1)
