"""The shell from decision to binding, with an API server stand-in that
can hold chosen requests: each gang runs its own pipeline (its claims,
then its bindings), an attempt's in-flight devices end with that attempt
alone, and the writer of a pod's own claims refuses devices another claim
took at the last moment (issue 39, points 3 and 4); gang mates sharing a
claim write it in turn: its allocation, then the joiners' reservations,
undone the other way round (point 5)."""
from __future__ import annotations

import asyncio
import json

from batchsched.config import SchedulerConfig
from batchsched.kube.client import ApiError
from batchsched.shell.scheduler import Scheduler
from tests.support import dra
from tests.support.metrics import sample
from tests.unit.test_dra import NODE, TOPOLOGY, claim_json, listed, node_json, pod_json
from tests.unit.test_dra_claims import claim_spec, claiming_pod, group_g, member

BINDING = "/binding"
CLAIMS = "/resourceclaims"
E2E_COUNT = "batchsched_gang_e2e_scheduling_duration_seconds_count"


class StandInKube:
    """Answers as the API server would (a created claim gets a name and a
    uid; claims are read back as written), records every request, refuses
    the bindings of ``refused`` pods and holds each request matching a
    ``hold`` (method, part of the path) until its gate is opened."""

    def __init__(self, claims: list[dict] = ()):
        self.requests: list[tuple[str, str]] = []
        self.bound: list[str] = []
        self.refused: set[str] = set()
        self.holds: list[tuple[str, str, asyncio.Event]] = []
        self.claims = {c["metadata"]["name"]: c for c in claims}

    def hold(self, method: str, path_part: str) -> asyncio.Event:
        gate = asyncio.Event()
        self.holds.append((method, path_part, gate))
        return gate

    def held(self, method: str, path_part: str) -> bool:
        return any((m, p) == (method, path_part) and not gate.is_set() for m, p, gate in self.holds) and any(
            m == method and path_part in p for m, p in self.requests)

    async def _arrive(self, method: str, path: str) -> None:
        self.requests.append((method, path))
        for held_method, part, gate in self.holds:
            if held_method == method and part in path:
                await gate.wait()

    async def request(self, method: str, path: str, *, body=None, query=None, **_) -> dict:
        await self._arrive(method, path)
        if path.endswith(CLAIMS) and method == "POST":
            name = f"{body['metadata']['generateName']}{len(self.claims)}"
            self.claims[name] = {**body, "metadata": {**body["metadata"], "name": name, "uid": f"uid-{name}"}}
            return self.claims[name]
        if path.endswith(CLAIMS) and method == "GET":
            name = query["fieldSelector"].removeprefix("metadata.name=")
            return {"items": [self.claims[name]] if name in self.claims else []}
        if CLAIMS in path and method == "PUT":
            self.claims[body["metadata"]["name"]] = json.loads(json.dumps(body))
        return body or {}

    async def merge_patch(self, path: str, patch: dict) -> dict:
        await self._arrive("PATCH", path)
        return {}

    async def strategic_merge_patch(self, path: str, patch: dict) -> dict:
        await self._arrive("PATCH", path)
        return {}

    async def bind(self, namespace: str, pod: str, uid: str, node: str, annotations=None) -> None:
        await self._arrive("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}{BINDING}")
        if pod in self.refused:
            raise ApiError(403, "Forbidden", "refused by a webhook", {})
        self.bound.append(pod)


def scheduler_over(kube: StandInKube, *, pods: list[dict], claims: list[dict] = ()) -> Scheduler:
    config = SchedulerConfig.model_validate({"queue": {"initialBackoffSeconds": 0.01}})
    scheduler = Scheduler(kube, config)  # type: ignore[arg-type]  # the stand-in answers what it sends
    listed(scheduler.cache, nodes=[node_json()], slices=[dra.resource_slice(NODE, TOPOLOGY)], claims=claims,
           pods=pods)
    return scheduler


async def settle() -> None:
    """Until every task the stand-in does not hold has run its course."""
    for _ in range(20):
        await asyncio.sleep(0.01)


def test_a_refused_binding_frees_its_pod_only_once_its_claim_is_undone_and_its_next_attempt_keeps_its_devices():
    kube = StandInKube()
    scheduler = scheduler_over(kube, pods=[pod_json("p", 1)])

    async def scenario():
        kube.refused.add("p")
        undo = kube.hold("PATCH", f"{CLAIMS}/p-extended-resources-")  # the finalizer's removal, first step of undo
        scheduler.cycle()
        await settle()
        assert kube.held("PATCH", f"{CLAIMS}/p-extended-resources-")
        kube.refused.clear()
        scheduler.cycle()  # its backoff is over; its claim is being undone: not placed again yet
        await settle()
        assert kube.bound == [] and scheduler.cache.state.dra_allocated(NODE) == 1
        undo.set()
        await settle()
        scheduler.cycle()  # now its next attempt
        await settle()
        assert kube.bound == ["p"]
        assert scheduler.cache.state.dra_allocated(NODE) == 1  # the next attempt's device, not 0
    asyncio.run(scenario())


def test_the_writer_of_a_pods_own_claim_refuses_a_device_another_claim_took_at_the_last_moment():
    mine = claim_spec("mine", 1)
    kube = StandInKube([mine])
    scheduler = scheduler_over(kube, pods=[claiming_pod("p", "mine")], claims=[mine, claim_json("theirs")])

    async def scenario():
        plan = scheduler.cycle()  # decides; its writer has not run yet
        [taken] = [d.device for b in plan.bindings for c in b.claims for d in c.devices]
        scheduler.cache._dra_apply("resourceclaims")("MODIFIED", claim_json("theirs", [taken]))  # seen meanwhile
        await settle()
        assert not [r for r in kube.requests if CLAIMS in r[1] and r[0] != "GET"], kube.requests  # nothing written
        assert kube.bound == [] and "mine" not in {c["metadata"]["name"] for c in kube.claims.values()
                                                   if (c.get("status") or {}).get("allocation")}
        assert scheduler.cache.state.dra_allocated(NODE) == 1  # theirs; the attempt is over
    asyncio.run(scenario())


def test_a_gang_whose_claims_hang_holds_up_no_other_gangs_bindings():
    kube = StandInKube()
    scheduler = scheduler_over(kube, pods=[pod_json("a", 1), pod_json("b", 0)])

    async def scenario():
        claims = kube.hold("POST", CLAIMS)
        scheduler.cycle()  # places both: a's claim to write, b nothing to write
        await settle()
        assert kube.held("POST", CLAIMS) and kube.bound == ["b"]
        claims.set()
        await settle()
        assert sorted(kube.bound) == ["a", "b"]
    asyncio.run(scenario())


def test_each_gang_s_time_to_bind_and_partial_clock_end_with_its_own_bindings():
    kube = StandInKube()
    scheduler = scheduler_over(kube, pods=[pod_json("a", 0), pod_json("b", 0)])

    async def scenario():
        recorded: list[str] = []
        record_bound = scheduler.queue.record_bound
        scheduler.queue.record_bound = lambda key: (recorded.append(key), record_bound(key))
        slow = kube.hold("POST", f"/pods/a{BINDING}")
        scheduler.cycle()
        await settle()
        assert kube.bound == ["b"] and kube.held("POST", f"/pods/a{BINDING}")
        assert recorded == ["ns/pod:b"]  # b's partial-gang clock stops with b's bindings
        assert sample(scheduler.metrics.exposition().decode(), E2E_COUNT) == 1  # b's, not waiting for a
        slow.set()
        await settle()
        assert sorted(recorded) == ["ns/pod:a", "ns/pod:b"]
        assert sample(scheduler.metrics.exposition().decode(), E2E_COUNT) == 2
    asyncio.run(scenario())


def sharing_gang(kube: StandInKube, *joiners: str, claims: list[dict] = ()) -> Scheduler:
    """A gang: a allocates the claim "shared", each of ``joiners`` joins it."""
    shared = claim_spec("shared", 2)
    kube.claims["shared"] = shared
    scheduler = scheduler_over(kube, pods=[member("a", "shared"), *joiners], claims=[shared, *claims])
    scheduler.cache._apply_group("ADDED", group_g(1 + len(joiners)))
    return scheduler


def test_a_gang_mate_joins_a_shared_claim_once_the_mate_allocating_it_has_written_the_allocation():
    kube = StandInKube()
    scheduler = sharing_gang(kube, member("b", "shared"))

    async def scenario():
        allocation = kube.hold("PUT", f"{CLAIMS}/shared/status")
        scheduler.cycle()
        await settle()
        assert kube.held("PUT", f"{CLAIMS}/shared/status")
        assert kube.requests.count(("GET", f"/apis/resource.k8s.io/v1/namespaces/ns{CLAIMS}")) == 2, \
            kube.requests  # a's reads (finalizer, status): b reads it only once the allocation is written
        allocation.set()
        await settle()
        assert sorted(kube.bound) == ["a", "b"]
        status = kube.claims["shared"]["status"]
        assert [r["uid"] for r in status["reservedFor"]] == ["a", "b"]
        assert len(status["allocation"]["devices"]["results"]) == 2
        assert kube.requests.count(("PUT", f"/apis/resource.k8s.io/v1/namespaces/ns{CLAIMS}/shared/status")) == 2
    asyncio.run(scenario())


def test_a_gang_sharing_a_claim_that_fails_takes_the_joiners_out_before_the_allocation():
    kube = StandInKube()
    # c joins "shared" too and allocates "gone", which the API no longer has: the gang fails after b joined
    scheduler = sharing_gang(kube, member("b", "shared"), member("c", "shared", "gone"),
                             claims=[claim_spec("gone", 1)])

    async def scenario():
        scheduler.cycle()
        await settle()
        assert kube.bound == []
        status = kube.claims["shared"]["status"]
        assert not status.get("reservedFor") and not status.get("allocation"), status  # nothing of ours left
    asyncio.run(scenario())
