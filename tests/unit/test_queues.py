"""Queues: fair-share arithmetic against hand-computed cases, admission in
the cycle (limits, borrowing, hierarchy, GPU types, order among queues),
and Queue objects that make no sense."""
from __future__ import annotations

import asyncio
import dataclasses
import random
from fractions import Fraction as F

import pytest

from batchsched.api.constants import GPU_PRODUCT_LABEL
from batchsched.api.queue import QueueStatus
from batchsched.core.config import CoreConfig
from batchsched.core.cycle import schedule_cycle
from batchsched.core.explain import explain_gang
from batchsched.core.queueing.queue import GangQueue
from batchsched.core.gangs import GangIndex
from batchsched.core.preemption.policy import PreemptionPolicy
from batchsched.core.queues.book import QueueBook
from batchsched.core.queues.model import QueueInfo, queue_from_json
from batchsched.core.queues.reclaim import awaited_reclaim, reclaim_for
from batchsched.core.queues.report import summarize
from batchsched.core.queues.share import Claimant, divide, dominant_share, fair_shares
from batchsched.core.resources import Resources
from batchsched.core.snapshot import Snapshot
from batchsched.core.tracked import TrackedDict
from batchsched.shell import reflector as reflector_module
from batchsched.shell.cache import ClusterCache
from batchsched.shell.metrics import Metrics
from batchsched.shell.scheduler import _with_removals
from tests.unit.cache_support import relist
from tests.unit.helpers import gang_pods, group, node, pod, snapshot
from tests.unit.test_dra import NotServed

CONFIG = CoreConfig(initial_backoff=1, max_backoff=4)
GPU = "nvidia.com/gpu"


def queue(name: str, parent: str | None = None, weight: float = 1, guaranteed=None, limit=None,
          gpu_types=None, **resources) -> QueueInfo:
    spec: dict = {"weight": weight, "resources": {}}
    if parent:
        spec["parent"] = parent
    if guaranteed is not None or limit is not None:
        spec["resources"][GPU] = {k: v for k, v in (("guaranteed", guaranteed), ("limit", limit)) if v is not None}
    spec["resources"].update(resources)
    if gpu_types:
        spec["gpuTypes"] = gpu_types
    return queue_from_json({"metadata": {"name": name}, "spec": spec})


def in_queue(name: str, queue_name: str, min_member: int = 1, created: float = 0.0):
    return dataclasses.replace(group(name, min_member=min_member, created=created), queue=queue_name)


def with_queues(snap: Snapshot, *queues: QueueInfo, invalid=None) -> Snapshot:
    return dataclasses.replace(snap, queues={q.name: q for q in queues}, invalid_queues=invalid or {})


def cycle(snap: Snapshot):
    return schedule_cycle(snap, GangQueue.from_config(CONFIG), CONFIG)


def bound_gangs(plan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for b in plan.bindings:
        counts[b.gang_key] = counts.get(b.gang_key, 0) + 1
    return counts


# ---- fair-share arithmetic ---------------------------------------------------

def shares(capacity, *claimants):
    return divide(F(capacity), claimants)


def test_equal_weights_split_evenly_and_what_one_cannot_use_goes_to_the_other():
    # 10 GPUs, A wants 10, B wants 2: B is filled (2), A gets the other 8.
    assert shares(10, Claimant("a", F(10)), Claimant("b", F(2))) == {"a": 8, "b": 2}
    # three equal claimants of 10: a third each, exactly
    assert shares(10, *(Claimant(n, F(10)) for n in "abc")) == {n: F(10, 3) for n in "abc"}


def test_weights_split_the_surplus():
    # 12 GPUs at weights 3:1, both wanting all: 9 and 3.
    assert shares(12, Claimant("a", F(12), weight=F(3)), Claimant("b", F(12))) == {"a": 9, "b": 3}


def test_guaranteed_first_then_the_rest_by_weight():
    # 10 GPUs; A guaranteed 6, B guaranteed 2, both want 10: 6+2 first, the
    # 2 left split 1:1 -> 7 and 3.
    assert shares(10, Claimant("a", F(10), F(6)), Claimant("b", F(10), F(2))) == {"a": 7, "b": 3}


def test_a_guarantee_beyond_the_demand_is_lent():
    # A guaranteed 8 but wants 2: B gets the 8 left of 10.
    assert shares(10, Claimant("a", F(2), F(8)), Claimant("b", F(10))) == {"a": 2, "b": 8}


def test_the_limit_caps_and_the_rest_goes_to_the_others():
    # 12 GPUs; A limited to 4, both want 10: A 4, B 8.
    assert shares(12, Claimant("a", F(10), limit=F(4)), Claimant("b", F(10))) == {"a": 4, "b": 8}
    # everyone capped below the capacity: the remainder stays idle
    assert shares(12, Claimant("a", F(10), limit=F(4)), Claimant("b", F(3))) == {"a": 4, "b": 3}


def test_oversubscribed_guarantees_are_scaled_down_alike():
    # guarantees 8 + 8 on 12 GPUs, both wanting 10: 6 each.
    assert shares(12, Claimant("a", F(10), F(8)), Claimant("b", F(10), F(8))) == {"a": 6, "b": 6}


def test_fair_shares_over_two_levels():
    # 16 GPUs.  Top level: org-x (teams a, weight 1, and b, weight 3, each
    # wanting 10: org-x wants 20) and org-y wanting 4.  16 split 8/8, org-y
    # filled at 4, org-x gets 12; org-x's 12 split 1:3 -> a 3, b 9.
    queues = {q.name: q for q in (queue("org-x"), queue("org-y"), queue("team-a", parent="org-x"),
                                  queue("team-b", parent="org-x", weight=3))}
    demand = {"team-a": {GPU: 10}, "team-b": {GPU: 10}, "org-y": {GPU: 4}}
    got = fair_shares(queues, demand, {GPU: 16})
    assert {n: s[GPU] for n, s in got.items()} == {"org-x": 12, "org-y": 4, "team-a": 3, "team-b": 9}


def test_a_parent_limit_binds_its_children_together():
    # As above, org-x limited to 8: org-x 8 (a 2, b 6), org-y 4, 4 idle.
    queues = {q.name: q for q in (queue("org-x", limit=8), queue("org-y"), queue("team-a", parent="org-x"),
                                  queue("team-b", parent="org-x", weight=3))}
    demand = {"team-a": {GPU: 10}, "team-b": {GPU: 10}, "org-y": {GPU: 4}}
    got = fair_shares(queues, demand, {GPU: 16})
    assert {n: s[GPU] for n, s in got.items()} == {"org-x": 8, "org-y": 4, "team-a": 2, "team-b": 6}


def test_fair_shares_are_per_resource_and_the_default_queue_needs_no_object():
    # cpu: 100 cores; A (guaranteed 60 cores) and the implicit default queue
    # both want 80: A gets its 60, the 40 left split 20/20, so A 80, default 20.
    # GPUs: only the default queue wants them (4 of 8).
    queues = {"a": queue("a", cpu={"guaranteed": "60"})}
    got = fair_shares(queues, {"a": {"cpu": 80_000, GPU: 0}, "default": {"cpu": 80_000, GPU: 4}},
                      {"cpu": 100_000, GPU: 8})
    assert got["a"] == {"cpu": 80_000, GPU: 0} and got["default"] == {"cpu": 20_000, GPU: 4}


def test_dominant_share_is_the_largest_weighted_fraction_held():
    # 4 of 16 GPUs (1/4) and 10 of 100 cpus (1/10): 1/4; at weight 2, 1/8.
    total = {GPU: 16, "cpu": 100_000}
    held = {GPU: 4, "cpu": 10_000}
    assert dominant_share(queue("a"), held, total) == F(1, 4)
    assert dominant_share(queue("a", weight=2), held, total) == F(1, 8)
    # a per-resource weight counts for that resource alone: cpu weight 1/2 -> 1/5 < 1/4
    assert dominant_share(queue("a", cpu={"weight": 0.5}), held, total) == F(1, 4)
    assert dominant_share(queue("a"), {}, total) == 0


# ---- admission in the cycle ---------------------------------------------------

def gpu_nodes(count=2, gpus=8, labels=None):
    return [node(f"n{i}", cpu="64", memory="256Gi", gpu=gpus, labels=labels) for i in range(count)]


def running(name: str, count: int, gpu: int, node_name: str, created: float = -100.0):
    return [pod(f"{name}-{i}", group=name, gpu=gpu, node_name=node_name, phase="Running", created=created)
            for i in range(count)]


def test_a_queue_at_its_limit_keeps_the_gang_pending_with_the_reason():
    snap = with_queues(snapshot(gpu_nodes(), running("held", 2, 4, "n0") + gang_pods("train", 1, gpu=4),
                                [in_queue("held", "team-a"), in_queue("train", "team-a")]),
                       queue("team-a", limit=8))
    plan = cycle(snap)
    assert plan.bindings == []
    verdict = plan.verdicts["default/train"]
    assert verdict.reason == "QueueAtLimit"
    assert "queue team-a is at its limit: 8/8 nvidia.com/gpu (gang default/train needs 4 at once)" in verdict.message


def test_a_gang_bigger_than_its_queue_is_told_so():
    snap = with_queues(snapshot(gpu_nodes(), gang_pods("big", 3, gpu=4), [in_queue("big", "team-a", 3)]),
                       queue("team-a", limit=8))
    verdict = cycle(snap).verdicts["default/big"]
    assert verdict.reason == "QueueAtLimit" and "queue team-a is too small: gang default/big needs 12" in \
        verdict.message


def test_a_queue_borrows_idle_room_beyond_its_guaranteed_up_to_its_limit():
    # team-a guaranteed 4, limit 12; team-b's guaranteed 8 lies idle: team-a takes 12.
    snap = with_queues(snapshot(gpu_nodes(), gang_pods("wide", 3, gpu=4), [in_queue("wide", "team-a", 3)]),
                       queue("team-a", guaranteed=4, limit=12), queue("team-b", guaranteed=8))
    assert bound_gangs(cycle(snap)) == {"default/wide": 3}


def test_quota_is_charged_by_placement_within_one_cycle():
    # limit 6: of two 4-GPU gangs the first placed takes the queue's room, the second waits.
    snap = with_queues(snapshot(gpu_nodes(), gang_pods("one", 1, gpu=4, created=1) + gang_pods("two", 1, gpu=4,
                                                                                                  created=2),
                                [in_queue("one", "team-a", created=1), in_queue("two", "team-a", created=2)]),
                       queue("team-a", limit=6))
    plan = cycle(snap)
    assert bound_gangs(plan) == {"default/one": 1}
    assert "4/6 nvidia.com/gpu" in plan.verdicts["default/two"].message


def test_a_gang_that_does_not_fit_charges_nothing_to_its_queue():
    # limit 20; the older gang (3 x 4 GPUs, 8 free GPUs) fits the quota but
    # not the nodes, so the younger 8-GPU gang still fits within the limit.
    snap = with_queues(snapshot(gpu_nodes(count=2), [pod("other", gpu=8, node_name="n0", phase="Running",
                                                         scheduler="default-scheduler")]
                                + gang_pods("huge", 3, gpu=4, created=1) + gang_pods("small", 1, gpu=8, created=2),
                                [in_queue("huge", "team-a", 3, created=1), in_queue("small", "team-a", created=2)]),
                       queue("team-a", limit=20))
    plan = cycle(snap)
    assert plan.verdicts["default/huge"].reason == "Unschedulable"  # 12 GPUs fit the quota, not the nodes
    assert bound_gangs(plan) == {"default/small": 1}


def test_a_parent_limit_binds_its_children_together_in_the_cycle():
    snap = with_queues(snapshot(gpu_nodes(), running("a-job", 3, 2, "n0") + gang_pods("b-job", 1, gpu=4),
                                [in_queue("a-job", "team-a"), in_queue("b-job", "team-b")]),
                       queue("org", limit=8), queue("team-a", parent="org"), queue("team-b", parent="org", limit=8))
    verdict = cycle(snap).verdicts["default/b-job"]
    assert verdict.reason == "QueueAtLimit"
    assert "queue team-b's parent org is at its limit: 6/8 nvidia.com/gpu" in verdict.message


def test_extra_members_beyond_the_quorum_wait_for_the_queue():
    # minMember 2 of 4 pods x 2 GPUs, limit 6: 3 bound, the 4th waits for room in the queue.
    snap = with_queues(snapshot(gpu_nodes(), gang_pods("elastic", 4, gpu=2), [in_queue("elastic", "team-a", 2)]),
                       queue("team-a", limit=6))
    plan = cycle(snap)
    assert bound_gangs(plan) == {"default/elastic": 3}
    assert "1 more wait for their queue: queue team-a is at its limit" in plan.verdicts["default/elastic"].message


def test_the_queue_with_the_lowest_share_goes_first():
    # 8 GPUs free on n1; team-a already holds n0's 8, so team-b's gang goes
    # first even though team-a's is older and of higher priority.
    snap = with_queues(snapshot(gpu_nodes(), running("a-old", 1, 8, "n0")
                                + gang_pods("a-next", 1, gpu=8, created=1, priority=100)
                                + gang_pods("b-next", 1, gpu=8, created=5),
                                [in_queue("a-old", "team-a"), in_queue("a-next", "team-a", created=1),
                                 in_queue("b-next", "team-b", created=5)]),
                       queue("team-a"), queue("team-b"))
    plan = cycle(snap)
    assert bound_gangs(plan) == {"default/b-next": 1}
    assert plan.verdicts["default/a-next"].reason == "Unschedulable"


def test_a_queue_below_its_guaranteed_goes_before_a_lower_share():
    # team-a (guaranteed 16) holds 8, above team-b's share of 0, yet is below its guaranteed.
    snap = with_queues(snapshot(gpu_nodes(count=3), running("a-old", 1, 8, "n0")
                                + gang_pods("a-next", 1, gpu=8, created=5) + gang_pods("b-next", 1, gpu=16,
                                                                                       created=1),
                                [in_queue("a-old", "team-a"), in_queue("a-next", "team-a", created=5),
                                 in_queue("b-next", "team-b", created=1)]),
                       queue("team-a", guaranteed=16), queue("team-b"))
    plan = cycle(snap)
    assert bound_gangs(plan) == {"default/a-next": 1}


def test_weights_divide_the_share():
    # each holds 8 GPUs of 24; team-b at weight 2 has half team-a's share and goes first.
    snap = with_queues(snapshot(gpu_nodes(count=3), running("a-old", 1, 8, "n0") + running("b-old", 1, 8, "n1")
                                + gang_pods("a-next", 1, gpu=8, created=1) + gang_pods("b-next", 1, gpu=8, created=2),
                                [in_queue("a-old", "team-a"), in_queue("b-old", "team-b"),
                                 in_queue("a-next", "team-a", created=1), in_queue("b-next", "team-b", created=2)]),
                       queue("team-a"), queue("team-b", weight=2))
    assert bound_gangs(cycle(snap)) == {"default/b-next": 1}


def typed_nodes():
    return [node("h0", cpu="64", memory="256Gi", gpu=8, labels={GPU_PRODUCT_LABEL: "H100"}),
            node("a0", cpu="64", memory="256Gi", gpu=8, labels={GPU_PRODUCT_LABEL: "A100"})]


def test_gpu_type_quotas_are_apart():
    # team-a may hold 4 H100: with 4 held, its next pod goes to the A100 node.
    pods = running("held", 1, 4, "h0") + gang_pods("next", 1, gpu=4)
    snap = with_queues(snapshot(typed_nodes(), pods, [in_queue("held", "team-a"), in_queue("next", "team-a")]),
                       queue("team-a", gpu_types={"H100": {"limit": 4}}))
    plan = cycle(snap)
    assert [(b.pod_name, b.node_name) for b in plan.bindings] == [("next-0", "a0")]


def test_a_gpu_type_at_its_limit_is_named_node_by_node():
    pods = running("held", 1, 4, "h0") + [pod("x", gpu=8, node_name="a0", phase="Running",
                                               scheduler="default-scheduler")] + gang_pods("next", 1, gpu=4)
    snap = with_queues(snapshot(typed_nodes(), pods, [in_queue("held", "team-a"), in_queue("next", "team-a")]),
                       queue("team-a", gpu_types={"H100": {"limit": 4}}))
    verdict = cycle(snap).verdicts["default/next"]
    assert verdict.reason == "Unschedulable"
    assert "1 node(s) had nvidia.com/gpu.product=H100, where queue team-a is at its limit (4/4 nvidia.com/gpu)" \
        in verdict.message
    assert "1 Insufficient nvidia.com/gpu" in verdict.message


def test_a_plan_beyond_a_gpu_type_headroom_waits():
    # 2 H100 left in the quota; a 2-pod gang of 2 GPUs each planned onto the
    # H100 node would take 4 of them: it waits, said in GPU-type terms.
    snap = with_queues(snapshot(typed_nodes()[:1], running("held", 1, 2, "h0") + gang_pods("pair", 2, gpu=2),
                                [in_queue("held", "team-a"), in_queue("pair", "team-a", 2)]),
                       queue("team-a", gpu_types={"H100": {"limit": 4}}))
    verdict = cycle(snap).verdicts["default/pair"]
    assert verdict.reason == "QueueAtLimit"
    assert "2/4 nvidia.com/gpu of nvidia.com/gpu.product=H100" in verdict.message


def test_a_missing_queue_is_a_clear_condition_and_the_default_queue_needs_no_object():
    snap = snapshot(gpu_nodes(), gang_pods("lost", 1, gpu=1) + gang_pods("plain", 1, gpu=1),
                    [in_queue("lost", "no-such-queue"), group("plain")])
    plan = cycle(snap)
    assert bound_gangs(plan) == {"default/plain": 1}
    verdict = plan.verdicts["default/lost"]
    assert verdict.reason == "QueueNotFound"
    assert verdict.message.startswith("Queue no-such-queue not found (spec.queue of PodGroup default/lost)")


@pytest.mark.parametrize("queues, invalid, reason, words", [
    ((), {"team-a": "spec.weight: Input should be greater than 0"}, "InvalidQueue",
     "Queue team-a is invalid: spec.weight"),
    ((queue("team-a", parent="org"),), {}, "QueueNotFound", "names parent queue org, which does not exist"),
    ((queue("team-a", parent="org"), queue("org", parent="top"), queue("top")), {}, "InvalidQueue",
     "two levels at most"),
    ((queue("team-a"), queue("child", parent="team-a")), {}, "InvalidQueue", "has child queues"),
])
def test_a_queue_that_cannot_admit_says_why(queues, invalid, reason, words):
    snap = with_queues(snapshot(gpu_nodes(), gang_pods("g", 1, gpu=1), [in_queue("g", "team-a")]), *queues,
                       invalid=invalid)
    verdict = cycle(snap).verdicts["default/g"]
    assert verdict.reason == reason and words in verdict.message


# ---- hostile Queue objects -------------------------------------------------------

@pytest.mark.parametrize("spec, problem", [
    ({"weight": -1}, "spec.weight: Input should be greater than 0"),
    ({"weight": True}, "spec.weight: Value error, should be a number above 0, not a boolean"),
    ({"weight": float("nan")}, "spec.weight"),
    ({"weight": 1e300}, "spec.weight: Input should be less than or equal to 1000000"),
    ({"reclaimable": "yes"}, "spec.reclaimable: Input should be a valid boolean"),
    ({"resources": ["nvidia.com/gpu"]}, "spec.resources: Input should be a valid dictionary"),
    ({"resources": {GPU: {"limit": "-4"}}}, "spec.resources.nvidia.com/gpu.limit: '-4' is negative"),
    ({"resources": {GPU: {"limit": -4}}}, "is negative"),
    ({"resources": {GPU: {"limit": "1e99"}}}, "exponent beyond"),
    ({"resources": {GPU: {"limit": 2**80}}}, "exceeds 9223372036854775807"),
    ({"resources": {GPU: {"limit": "8x"}}}, "invalid quantity '8x'"),
    ({"resources": {GPU: {"limit": {"a": 1}}}}, "spec.resources.nvidia.com/gpu.limit"),
    ({"resources": {GPU: {"guaranteed": 16, "limit": 8}}}, "guaranteed 16 is above limit 8"),
    ({"resources": {f"r{i}": {"limit": 1} for i in range(33)}}, "spec.resources: Dictionary should have at most 32"),
    ({"gpuTypes": {"x" * 64: {"limit": 1}}}, "spec.gpuTypes"),
    ({"parent": ["org"]}, "spec.parent: Input should be a valid string"),
    ({"parent": "q"}, "cannot be its own parent"),
    ("just a string", "spec: Input should be a valid dictionary"),
])
def test_bad_queues_name_the_field(spec, problem):
    with pytest.raises(ValueError, match=None) as err:
        queue_from_json({"metadata": {"name": "q"}, "spec": spec})
    assert problem in str(err.value)


def test_junk_never_raises_anything_but_value_error():
    rng = random.Random(15)
    junk = [None, True, -1, 0, 2**70, 1e308, float("inf"), "", "1e5000", "x" * 10_000, [], {}, [1], {"a": None}]

    def value(depth: int):
        if depth and rng.random() < 0.5:
            return {rng.choice(["guaranteed", "limit", "weight", GPU, "H100", "parent"]): value(depth - 1)
                    for _ in range(rng.randint(0, 3))}
        return rng.choice(junk)

    for _ in range(2000):
        spec = {rng.choice(["weight", "parent", "reclaimable", "resources", "gpuTypes", "other"]): value(3)
                for _ in range(rng.randint(0, 4))}
        try:
            info = queue_from_json({"metadata": {"name": "q", "generation": value(1)}, "spec": spec})
        except ValueError:
            continue
        assert all(q.limit is None or 0 <= q.limit < 2**63 for q in info.quotas.values())


# ---- the watch cache --------------------------------------------------------------


def queue_json(name: str, **spec) -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 1}, "spec": spec}


def test_the_cache_converts_queues_and_reports_a_bad_one_without_dropping_the_others():
    cache = ClusterCache("batchsched")
    reports = []
    cache.on_bad_object = lambda kind, obj, why: reports.append((kind, obj["metadata"]["name"], why))
    relist(cache, "queues", [queue_json("team-a", weight=2, resources={GPU: {"limit": 8}}),
                             queue_json("bad", weight="heavy")])
    assert cache.queues["team-a"].limits() == {GPU: 8} and cache.queues["team-a"].weight == 2
    assert list(cache.invalid_queues) == ["bad"] and "spec.weight" in cache.invalid_queues["bad"]
    assert [(kind, name) for kind, name, _ in reports] == [("Queue", "bad")]
    snap = cache.snapshot(0.0)
    assert set(snap.queues) == {"team-a"} and set(snap.invalid_queues) == {"bad"}


def test_a_queue_change_retries_every_waiting_gang_and_a_deletion_forgets_it():
    cache = ClusterCache("batchsched")
    cache.state.put_pod(pod("w-0", group="w"))
    relist(cache, "queues", [queue_json("team-a")])
    cache.drain_changes()
    cache._apply_queue("MODIFIED", queue_json("team-a", resources={GPU: {"limit": 4}}))
    assert cache.drain_changes()[0] == {"default/w"}
    cache._apply_queue("MODIFIED", queue_json("team-a", resources={GPU: {"limit": 4}}))
    assert cache.drain_changes()[0] == set()  # the same queue again: nothing to retry
    cache._apply_queue("DELETED", queue_json("team-a"))
    assert cache.queues == {} and cache.drain_changes()[0] == {"default/w"}


def test_without_the_queue_crd_the_reflector_runs_empty_and_looks_again(monkeypatch):
    monkeypatch.setattr(reflector_module, "ABSENT_RECHECK_SECONDS", 0.01)
    cache = ClusterCache("batchsched")
    relist(cache, "queues", [queue_json("team-a")])
    reflector = next(r for r in cache.reflectors(NotServed(404)) if r.kind == "queues")

    async def run_a_while() -> None:
        task = asyncio.create_task(reflector.run())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run_a_while())
    assert reflector.optional and reflector.absent and reflector.synced.is_set()
    assert cache.queues == {}  # what it held is no longer known to be there


# ---- status and metrics -----------------------------------------------------------


def test_a_summary_gives_allocated_guaranteed_fair_share_borrowed_and_gangs():
    # 16 GPUs.  team-a (guaranteed 4) holds 8 and waits for 4 more; team-b
    # waits for 8.  Fair share: team-a's 4 first, the 12 left split 6/6,
    # neither filled: team-a 10, team-b 6.
    snap = with_queues(snapshot(gpu_nodes(), running("a-old", 1, 8, "n0") + gang_pods("a-next", 1, gpu=4)
                                + gang_pods("b-next", 1, gpu=8),
                                [in_queue("a-old", "team-a"), in_queue("a-next", "team-a"),
                                 in_queue("b-next", "team-b")]),
                       queue("team-a", guaranteed=4), queue("team-b"))
    summaries = summarize(snap, CONFIG)
    a, b = summaries["team-a"], summaries["team-b"]
    assert (a.allocated[GPU], a.guaranteed, a.fair_share[GPU], a.borrowed[GPU], a.pending_gangs, a.running_gangs) \
        == (8, {GPU: 4}, 10, 4, 1, 1)
    assert (b.allocated, b.fair_share[GPU], b.pending_gangs, b.running_gangs) == ({}, 6, 1, 0)
    assert a.status()["fairShare"][GPU] == "10" and a.status()["borrowed"] == {GPU: "4"}
    assert QueueStatus.model_validate(a.status()).pending_gangs == 1  # the API's own type reads it
    metrics = Metrics()
    metrics.read_live(dict, dict, lambda: summaries)
    text = metrics.exposition().decode()
    assert 'batchsched_queue_allocated{queue="team-a",resource="nvidia.com/gpu"} 8.0' in text
    assert 'batchsched_queue_fair_share{queue="team-b",resource="nvidia.com/gpu"} 6.0' in text
    assert 'batchsched_queue_gangs{queue="team-b",state="pending"} 1.0' in text


def test_a_parent_summary_adds_up_its_children():
    snap = with_queues(snapshot(gpu_nodes(), running("a-job", 1, 4, "n0") + running("b-job", 1, 2, "n1"),
                                [in_queue("a-job", "team-a"), in_queue("b-job", "team-b")]),
                       queue("org", limit=8), queue("team-a", parent="org"), queue("team-b", parent="org"))
    org = summarize(snap, CONFIG)["org"]
    assert (org.allocated[GPU], org.running_gangs) == (6, 2)


def test_amounts_gone_from_a_queue_status_are_removed_by_the_patch():
    written = {"allocated": {GPU: "8", "cpu": "4"}, "pendingGangs": 1}
    assert _with_removals({"allocated": {"cpu": "2"}, "pendingGangs": 0}, written) == \
        {"allocated": {"cpu": "2", GPU: None}, "pendingGangs": 0}


# ---- explain ------------------------------------------------------------------------


def test_explain_names_the_queue_reason():
    snap = with_queues(snapshot(gpu_nodes(), running("held", 2, 4, "n0") + gang_pods("train", 1, gpu=4),
                                [in_queue("held", "team-a"), in_queue("train", "team-a")]),
                       queue("team-a", guaranteed=4, limit=8))
    report = explain_gang(snap, "default/train", CONFIG)
    assert report.verdict == ("QueueAtLimit: waits for its queue: queue team-a is at its limit: 8/8 nvidia.com/gpu "
                              "(gang default/train needs 4 at once)")
    assert "  queue: team-a, weight 1: nvidia.com/gpu 8 held, 4 guaranteed; limit 8 nvidia.com/gpu" in str(report)
    assert report.data["queue"]["allocated"][GPU] == "8" and report.data["reason"] == "QueueAtLimit"
    lost = explain_gang(with_queues(snapshot(gpu_nodes(), gang_pods("x", 1, gpu=1), [in_queue("x", "nope")])),
                        "default/x", CONFIG)
    assert lost.verdict.startswith("cannot be scheduled: QueueNotFound: Queue nope not found")


def test_the_default_queue_without_an_object_takes_its_turn_by_share_too():
    # 24 GPUs, team-a holds 4 (share 1/6).  The default queue (share 0) places
    # its first 8-GPU gang, which lifts it to 1/3: team-a's gang goes next,
    # before the default queue's older second gang, which then finds no room.
    snap = with_queues(snapshot(gpu_nodes(count=3), running("a-old", 1, 4, "n0")
                                + gang_pods("d1", 1, gpu=8, created=1) + gang_pods("d2", 1, gpu=8, created=2)
                                + gang_pods("a-next", 1, gpu=8, created=3),
                                [in_queue("a-old", "team-a"), group("d1", created=1), group("d2", created=2),
                                 in_queue("a-next", "team-a", created=3)]),
                       queue("team-a"))
    plan = cycle(snap)
    assert bound_gangs(plan) == {"default/d1": 1, "default/a-next": 1}


def test_what_queues_hold_is_kept_across_cycles_and_follows_every_change():
    groups = {g.key: g for g in (in_queue("a", "team-a"), in_queue("b", "team-b"), in_queue("c", "team-a"))}
    queues = {q.name: q for q in (queue("org"), queue("team-a", parent="org"), queue("team-b", parent="org"))}
    snap = snapshot(gpu_nodes(count=3), running("a", 2, 4, "n0") + running("b", 1, 8, "n1"), groups.values())
    cluster = snap.cluster

    def held(fresh: bool = False) -> dict[str, int]:
        state = Snapshot(dict(cluster.nodes), dict(cluster.pods), groups, 0.0).cluster if fresh else cluster
        book = QueueBook(Snapshot.of(state, groups, 0.0, queues=queues), CONFIG)
        return {name: book.allocated(name).get(GPU, 0) for name in queues}

    assert held() == {"org": 16, "team-a": 8, "team-b": 8}
    cluster.remove_pod("uid-default-a-0")  # one ends
    for p in running("c", 1, 8, "n2"):  # a gang starts
        cluster.put_pod(p)
    assert held() == held(fresh=True) == {"org": 20, "team-a": 12, "team-b": 8}
    groups["default/b"] = in_queue("b", "team-a")  # its PodGroup moves to another queue
    assert held() == held(fresh=True) == {"org": 20, "team-a": 20, "team-b": 0}
    queues["team-b"] = queue("team-b")  # the Queues change: team-b leaves org
    assert held() == held(fresh=True) == {"org": 20, "team-a": 20, "team-b": 0}


def test_what_queues_hold_read_from_the_change_logs_is_a_fresh_count():
    # Pods and PodGroups change at random, gangs come and go (enough of
    # them that both change logs drop what is gone): the counts kept from
    # the logs always equal a count from scratch.
    rng = random.Random(15)
    queues = {q.name: q for q in (queue("org"), queue("team-a", parent="org"), queue("team-b"))}
    groups = TrackedDict()
    cluster = snapshot(gpu_nodes(count=3), [], []).cluster

    def held(book: QueueBook) -> dict[str, Resources]:  # (a count that went back to 0 may stay as 0)
        return {name: {r: a for r, a in book.allocated(name).items() if a} for name in queues}

    for step in range(6000):
        gang = f"g{step // 2 + rng.randrange(12)}"  # a window of gangs sliding over 3,000 names
        roll = rng.random()
        if roll < 0.3:
            groups[f"default/{gang}"] = in_queue(gang, rng.choice(["team-a", "team-b", "nowhere"]))
        elif roll < 0.4:
            groups.pop(f"default/{gang}", None)
        elif roll < 0.65:
            bound = rng.random() < 0.7
            cluster.put_pod(pod(f"{gang}-{rng.randrange(2)}", group=gang, gpu=rng.choice([1, 2]),
                                node_name=rng.choice(["n0", "n1", "n2"]) if bound else None,
                                phase=rng.choice(["Running", "Succeeded"]) if bound else "Pending"))
        elif cluster.pods:  # the oldest pod ends: gangs left behind by the window go
            cluster.remove_pod(next(iter(cluster.pods)))
        groups.pop(f"default/g{step // 2 - 1}", None)  # and so do their PodGroups
        if step % 7 == 0:
            kept = QueueBook(Snapshot.of(cluster, groups, 0.0, queues=queues), CONFIG)
            fresh = QueueBook(Snapshot(dict(cluster.nodes), dict(cluster.pods), dict(groups), 0.0, queues=queues),
                              CONFIG)
            assert held(kept) == held(fresh), step
    assert cluster.gangs_changed_since(0) is None and groups.changed_since(0) is None  # both logs were trimmed


def test_a_tracked_dict_logs_every_change():
    groups = TrackedDict(a=1)
    start = groups.mark
    value = object()
    groups["b"] = value
    groups["b"] = value  # the same object: no change
    groups.update(c=3)
    groups.setdefault("d", 4)
    groups.setdefault("a", 9)  # present: no change
    del groups["a"]
    assert groups.changed_since(start) == ["a", "d", "c", "b"]
    middle = groups.mark
    groups.pop("x", None)  # absent: no change
    groups |= {"e": 5}
    groups.popitem()
    groups.clear()
    assert set(groups.changed_since(middle)) == {"b", "c", "d", "e"}


def test_a_gang_waiting_for_its_queue_holds_no_reservation():
    # The old gang waits for its queue past reservationAfterSeconds; the
    # younger gang of another queue may still use the free node.
    config = dataclasses.replace(CONFIG, reservation_after_seconds=10)
    snap = with_queues(snapshot(gpu_nodes(count=1), running("held", 1, 4, "n0")
                                + gang_pods("old", 1, gpu=4, created=1) + gang_pods("young", 1, gpu=4, created=50),
                                [in_queue("held", "team-a"), in_queue("old", "team-a", created=1),
                                 in_queue("young", "team-b", created=50)], now=0),
                       queue("team-a", limit=4), queue("team-b"))
    gang_queue = GangQueue.from_config(config)
    schedule_cycle(dataclasses.replace(snap, pods={k: v for k, v in snap.pods.items() if "young" not in k}),
                   gang_queue, config)
    plan = schedule_cycle(dataclasses.replace(snap, now=snap.now + 100), gang_queue, config)
    assert plan.reservation is None
    assert bound_gangs(plan) == {"default/young": 1}


# ---- reclaim ------------------------------------------------------------------------

PREEMPT = PreemptionPolicy(enabled=True)


def reclaim_cycle(snap: Snapshot):
    return schedule_cycle(snap, GangQueue.from_config(CONFIG), CONFIG, PREEMPT)


def borrowed_cluster(b_reclaimable=True, b_pods=None):
    # 16 GPUs.  team-a (guaranteed 8) holds none and waits for 2 x 4; team-b
    # borrowed all 16.  Fair shares: team-a 8 (its guaranteed), team-b 8.
    b_pods = b_pods if b_pods is not None else running("b1", 2, 4, "n0") + running("b2", 1, 8, "n1")
    groups = [in_queue("a", "team-a", 2, created=5)] + [in_queue(g, "team-b", 2 if g != "b2" else 1)
                                                        for g in sorted({p.group for p in b_pods})]
    b = queue_from_json({"metadata": {"name": "team-b"}, "spec": {"reclaimable": b_reclaimable}})
    return with_queues(snapshot(gpu_nodes(), b_pods + gang_pods("a", 2, gpu=4, created=5), groups),
                       queue("team-a", guaranteed=8), b)


def test_a_queue_below_its_fair_share_reclaims_what_it_lent():
    plan = reclaim_cycle(borrowed_cluster())
    assert [e.pod.name for e in plan.evictions] == ["b2-0"]  # the cheapest: one pod, no gang broken
    assert {n.node_name for n in plan.nominations} == {"n1"}
    message = plan.verdicts["default/a"].message
    assert "Queue team-a is below its fair share and reclaims: Gang default/a is preempting 1 pod(s) on n1" \
        in message


def test_reclaim_takes_whole_gangs_only():
    plan = reclaim_cycle(borrowed_cluster(b_pods=running("b1", 2, 4, "n0") + running("b3", 2, 4, "n1")))
    victims = sorted(e.pod.name for e in plan.evictions)
    assert victims in (["b1-0", "b1-1"], ["b3-0", "b3-1"])  # one gang, all of it


def test_a_queue_that_is_not_reclaimable_is_never_touched():
    plan = reclaim_cycle(borrowed_cluster(b_reclaimable=False))
    assert plan.evictions == [] and plan.verdicts["default/a"].reason == "Unschedulable"


def test_reclaim_stops_at_the_fair_share_so_queues_do_not_ping_pong():
    # After the reclaim: team-a holds its 8, team-b its other 8 and waits for b2
    # again.  team-b is at its fair share: it takes nothing back from team-a.
    pods = running("b1", 2, 4, "n0") + running("a", 2, 4, "n1", created=5) + gang_pods("b2", 1, gpu=8)
    groups = [in_queue("a", "team-a", 2, created=5), in_queue("b1", "team-b", 2), in_queue("b2", "team-b")]
    snap = with_queues(snapshot(gpu_nodes(), pods, groups), queue("team-a", guaranteed=8), queue("team-b"))
    plan = reclaim_cycle(snap)
    assert plan.evictions == [] and plan.verdicts["default/b2"].reason == "Unschedulable"
    # and a reclaim that would take a queue below its fair share is refused whole
    fair = QueueBook(borrowed_cluster(), CONFIG)
    reclaim = reclaim_for(fair, GangIndex(borrowed_cluster())["default/a"])
    assert reclaim is not None and reclaim.excess == {"team-b": {GPU: 8}}
    too_many = running("b1", 2, 4, "n0") + running("b2", 1, 8, "n1")
    assert "would take 16 nvidia.com/gpu from queue team-b, which holds only 8 beyond its fair share" in \
        reclaim.beyond(too_many)


# Two levels of queues under the cluster: A {A1, A2} and B {B1, B2}, all at
# weight 1, on four 8-GPU nodes (n0, n1 labelled pool=a; n2, n3 pool=b).
# A reclaim compares the two sides where they meet: the cluster for A1 and
# B1, A for A1 and A2.

def tree_queues():
    return [queue("A"), queue("A1", parent="A"), queue("A2", parent="A"),
            queue("B"), queue("B1", parent="B"), queue("B2", parent="B")]


def tree_cluster(held: dict[str, list[tuple[str, int, str]]], pending: dict[str, list[tuple[str, int, str]]],
                 foreign: list[tuple[int, str]] = ()) -> Snapshot:
    """``held``/``pending``: queue -> [(gang, GPUs of its one pod, node or
    pool it must go to)]; ``foreign``: (GPUs, node) held by another scheduler's pods."""
    nodes = [node(f"n{i}", cpu="64", memory="256Gi", gpu=8, labels={"pool": "a" if i < 2 else "b"})
             for i in range(4)]
    pods, groups = [], []
    for name, gangs in held.items():
        for gang, gpus, node_name in gangs:
            pods += running(gang, 1, gpus, node_name)
            groups.append(in_queue(gang, name))
    for name, gangs in pending.items():
        for gang, gpus, pool in gangs:
            pods += gang_pods(gang, 1, gpu=gpus, created=5, node_selector={"pool": pool} if pool else None)
            groups.append(in_queue(gang, name, created=5))
    pods += [pod(f"other-{i}", gpu=gpus, scheduler="other", node_name=node_name, phase="Running")
             for i, (gpus, node_name) in enumerate(foreign)]
    return with_queues(snapshot(nodes, pods, groups), *tree_queues())


def evicted(plan) -> list[str]:
    return sorted(e.pod.name for e in plan.evictions)


def test_a_child_over_its_share_is_not_reclaimed_from_while_its_parent_is_under_its_own():
    # Another scheduler's pods hold 8 GPUs.  A2 holds 12, B1 12; A1 waits for
    # 4 on pool b, B2 for 8.  Fair shares: A and B 16 each; A1 4, A2 12; B1
    # and B2 8.  B1 holds 4 beyond its own share, but B holds 4 less than
    # its: taking from B1 would take from B, which would take it back.
    snap = tree_cluster(held={"A2": [("a2x", 4, "n0"), ("a2y", 4, "n0"), ("a2z", 4, "n1")],
                              "B1": [("b1x", 4, "n2"), ("b1y", 4, "n2"), ("b1z", 4, "n3")]},
                        pending={"A1": [("a1", 4, "b")], "B2": [("b2", 8, "a")]},
                        foreign=[(4, "n1"), (4, "n3")])
    book = QueueBook(snap, CONFIG)
    assert book.within_fair_share(GangIndex(snap)["default/a1"])  # A1 and A stay within theirs
    assert reclaim_for(book, GangIndex(snap)["default/a1"]) is None
    plan = reclaim_cycle(snap)
    assert plan.evictions == [] and plan.verdicts["default/a1"].reason == "Unschedulable"


def test_a_reclaim_takes_no_more_than_the_victims_parent_holds_beyond_its_share():
    # B1 holds 8 beyond its share (16 of 8), B only 4 (20 of 16; another
    # scheduler holds 4 on n1): A1's 8 GPUs would take B below its share.
    snap = tree_cluster(held={"A2": [("a2", 8, "n0")], "B1": [("b1x", 8, "n2"), ("b1y", 8, "n3")],
                              "B2": [("b2", 4, "n1")]},
                        pending={"A1": [("a1", 8, "")], "B2": [("b2more", 8, "a")]}, foreign=[(4, "n1")])
    reclaim = reclaim_for(QueueBook(snap, CONFIG), GangIndex(snap)["default/a1"])
    assert reclaim is not None and reclaim.paths == {"B1": ("B1", "B")}
    assert reclaim.excess == {"B1": {GPU: 8}, "B": {GPU: 4}}
    plan = reclaim_cycle(snap)
    assert plan.evictions == []
    assert ("reclaiming for queue A1 would take 8 nvidia.com/gpu from queue B, which holds only 4 beyond its "
            "fair share; nothing was evicted") in plan.verdicts["default/a1"].message


def test_a_subtree_over_its_share_at_every_level_is_reclaimed_from_once_and_does_not_take_it_back():
    # A2 holds 8, B1 16 (its share 8), B2 8; A1 waits for 8.  Shares: A and B
    # 16 each, every child 8.  B1 and B each hold 8 beyond theirs: A1 takes
    # one of B1's gangs.
    held = {"A2": [("a2", 8, "n0")], "B1": [("b1x", 8, "n2"), ("b1y", 8, "n3")], "B2": [("b2", 8, "n1")]}
    snap = tree_cluster(held=held, pending={"A1": [("a1", 8, "")]})
    reclaim = reclaim_for(QueueBook(snap, CONFIG), GangIndex(snap)["default/a1"])
    assert reclaim is not None and reclaim.paths == {"B1": ("B1", "B")}
    assert reclaim.excess == {"B1": {GPU: 8}, "B": {GPU: 8}}
    plan = reclaim_cycle(snap)
    assert len(plan.evictions) == 1 and plan.evictions[0].pod.name in ("b1x-0", "b1y-0")
    # Once it went: A1's gang runs where it was, the victim's gang waits
    # again.  B1 and B are at their shares: the victim side takes nothing back.
    victim = plan.evictions[0].pod
    held["A1"] = [("a1", 8, victim.node_name)]
    held["B1"] = [g for g in held["B1"] if f"{g[0]}-0" != victim.name]
    after = tree_cluster(held=held, pending={"B1": [(victim.group, 8, "")]})
    assert reclaim_for(QueueBook(after, CONFIG), GangIndex(after)[victim.gang_key]) is None
    assert reclaim_cycle(after).evictions == []


def test_two_subtrees_do_not_reclaim_back_and_forth():
    # As A1 would leave it had it taken b1z from B1 above (A1's gang on n3,
    # b1z waiting again).  Shares: A 16, B 16; A1 and A2 8 each (A1 also
    # waits for 8 more); B1 12, B2 4.  A2 holds 4 beyond its share, but A
    # is at its own: B1's and B2's gangs, within theirs, take nothing from
    # A2, which would have A take it back.
    snap = tree_cluster(held={"A1": [("a1", 4, "n3")],
                              "A2": [("a2x", 4, "n0"), ("a2y", 4, "n0"), ("a2z", 4, "n1")],
                              "B1": [("b1x", 4, "n2"), ("b1y", 4, "n2")]},
                        pending={"A1": [("a1more", 8, "")], "B1": [("b1z", 4, "")], "B2": [("b2", 4, "a")]},
                        foreign=[(4, "n1"), (4, "n3")])
    book, gangs = QueueBook(snap, CONFIG), GangIndex(snap)
    for key in ("default/b1z", "default/b2"):
        assert book.within_fair_share(gangs[key]) and reclaim_for(book, gangs[key]) is None
    assert reclaim_cycle(snap).evictions == []


def test_within_a_parent_a_child_below_its_share_reclaims_from_a_sibling_beyond_its_own():
    # A2 holds 24 of the 32 GPUs (A's share is 16, B1's 16), A1 waits for 8:
    # A1 and A2 meet at A, whose total the reclaim does not change, so A
    # being beyond its share does not stop A1 (its share is 8).
    snap = tree_cluster(held={"A2": [("a2x", 8, "n0"), ("a2y", 8, "n1"), ("a2z", 8, "n2")],
                              "B1": [("b1", 8, "n3")]},
                        pending={"A1": [("a1", 8, "a")], "B1": [("b1more", 8, "b")]})
    reclaim = reclaim_for(QueueBook(snap, CONFIG), GangIndex(snap)["default/a1"])
    assert reclaim is not None and reclaim.paths == {"A2": ("A2",)} and reclaim.excess == {"A2": {GPU: 16}}
    plan = reclaim_cycle(snap)
    assert [e.pod.name for e in plan.evictions if e.preemptor == "default/a1"] in (["a2x-0"], ["a2y-0"])


def test_a_parent_that_is_not_reclaimable_keeps_what_its_children_borrowed():
    held = {"A2": [("a2", 8, "n0")], "B1": [("b1x", 8, "n2"), ("b1y", 8, "n3")], "B2": [("b2", 8, "n1")]}
    snap = tree_cluster(held=held, pending={"A1": [("a1", 8, "")]})
    b = queue_from_json({"metadata": {"name": "B"}, "spec": {"reclaimable": False}})
    snap = with_queues(snap, *[b if q.name == "B" else q for q in tree_queues()])
    assert reclaim_for(QueueBook(snap, CONFIG), GangIndex(snap)["default/a1"]) is None


def reclaim_in_flight(b2_queue="team-b"):
    # team-a's gang a reclaimed b2 (8 GPUs, terminating on n1 since unix
    # time 1000, a's pods nominated there); team-a's a2 waits too.
    b_pods = running("b1", 2, 4, "n0") + [dataclasses.replace(p, terminating=True, deleted=1000.0)
                                          for p in running("b2", 1, 8, "n1")]
    a_pods = [dataclasses.replace(p, nominated_node="n1") for p in gang_pods("a", 2, gpu=4, created=5)]
    groups = [in_queue("a", "team-a", 2, created=5), in_queue("a2", "team-a", 2, created=6),
              in_queue("b1", "team-b", 2), in_queue("b2", b2_queue)]
    return with_queues(snapshot(gpu_nodes(), b_pods + a_pods + gang_pods("a2", 2, gpu=4, created=6), groups),
                       queue("team-a", guaranteed=8), queue("team-b"))


def test_a_reclaim_in_flight_is_not_repeated_while_its_victims_terminate():
    # Gang a2 may not reclaim more: with a's nominated room team-a would go
    # beyond its fair share (12: its 8, then half of the 8 left), and
    # team-b's terminating b2 is no longer beyond its own.
    snap = reclaim_in_flight()
    book = QueueBook(snap, CONFIG)
    assert not book.within_fair_share(GangIndex(snap)["default/a2"])
    assert book.within_fair_share(GangIndex(snap)["default/a"])  # its own nomination is not counted twice
    plan = reclaim_cycle(snap)
    assert plan.evictions == []


def test_a_reclaim_in_flight_shows_in_the_status_of_both_queues():
    summaries = summarize(reclaim_in_flight(), CONFIG)
    taken = [{"queue": "team-b", "gangs": 1, "pods": 1, "resources": {GPU: "8", "pods": "1"}}]
    a, b = summaries["team-a"].status(), summaries["team-b"].status()
    assert a["reclaim"] == {"message": "from team-b (1 gang)", "waitingGangs": 1, "since": "1970-01-01T00:16:40Z",
                            "from": taken}
    assert b["reclaimedBy"] == {"message": "by team-a (1 gang)", "since": "1970-01-01T00:16:40Z",
                                "to": [dict(taken[0], queue="team-a")]}
    assert "reclaimedBy" not in a and "reclaim" not in b
    assert QueueStatus.model_validate(a).reclaim.from_[0].gangs == 1  # the API's own type reads it
    metrics = Metrics()
    metrics.read_live(dict, dict, lambda: summaries)
    assert ('batchsched_queue_reclaiming{from="team-b",queue="team-a",resource="nvidia.com/gpu"} 8.0'
            in metrics.exposition().decode())


def test_explain_and_the_verdict_say_which_reclaim_a_gang_waits_for():
    snap = reclaim_in_flight()
    report = explain_gang(snap, "default/a", CONFIG)
    assert report.verdict == "waiting for reclaim from team-b (1 gang)"
    assert report.data["queue"]["reclaim"] == [{"queue": "team-b", "gangs": 1, "pods": 1,
                                             "resources": {GPU: "8", "pods": "1"}}]
    assert "waiting for reclaim" not in explain_gang(snap, "default/a2", CONFIG).verdict  # nominated nowhere
    verdict = reclaim_cycle(snap).verdicts["default/a"]
    assert verdict.message.startswith("Gang default/a is waiting for reclaim from team-b (1 gang). ")


def test_pods_terminating_in_the_gangs_own_queue_are_no_reclaim():
    snap = reclaim_in_flight(b2_queue="team-a")  # b2 preempted by priority, within team-a
    summaries = summarize(snap, CONFIG)
    assert "reclaim" not in summaries["team-a"].status() and "reclaimedBy" not in summaries["team-b"].status()
    assert awaited_reclaim(QueueBook(snap, CONFIG), "default/a") == []
    assert "waiting for reclaim" not in reclaim_cycle(snap).verdicts["default/a"].message


def test_a_reclaim_over_is_removed_from_the_queue_status_by_the_patch():
    written = {"pendingGangs": 1, "reclaim": {"message": "from team-b (1 gang)", "waitingGangs": 1}}
    assert _with_removals({"pendingGangs": 0}, written) == {"pendingGangs": 0, "reclaim": None}


@pytest.mark.parametrize("hold", [False, True])
def test_with_hold_borrowing_no_queue_borrows_beyond_its_share_while_one_within_its_own_waits(hold):
    # 16 GPUs.  team-b holds n0 (b1, too young to be reclaimed); team-a
    # (guaranteed 16) waits for 2 x 8, so its fair share is all 16 and
    # team-b's none.  team-b's next gang would take n1, which reclaim would
    # take back once b1 may go: with holdBorrowing it waits instead.
    pods = running("b1", 1, 8, "n0", created=0) + gang_pods("a", 2, gpu=8, created=5) \
        + gang_pods("b2", 1, gpu=8, created=6)
    groups = [in_queue("b1", "team-b"), in_queue("a", "team-a", 2, created=5), in_queue("b2", "team-b", created=6)]
    snap = with_queues(snapshot(gpu_nodes(), pods, groups, now=10), queue("team-a", guaranteed=16), queue("team-b"))
    config = dataclasses.replace(CONFIG, hold_borrowing=hold)
    plan = schedule_cycle(snap, GangQueue.from_config(config), config,
                          dataclasses.replace(PREEMPT, min_runtime_seconds=3600))
    assert plan.evictions == [] and plan.verdicts["default/a"].reason == "Unschedulable"
    b2 = plan.verdicts["default/b2"]
    if not hold:
        assert bound_gangs(plan) == {"default/b2": 1}
        return
    assert bound_gangs(plan) == {} and b2.reason == "QueueBeyondFairShare"
    assert b2.message == ("Gang default/b2 waits for its queue: queue team-b would go beyond its fair share with "
                          "gang default/b2 while queue team-a, within its own, waits for room (what it borrowed "
                          "would be reclaimed).")


def test_no_reservation_for_a_gang_beyond_its_queues_fair_share():
    # team-a borrowed both nodes and its old gang has waited past
    # reservationAfterSeconds; team-b's young gang is within its fair share.
    # Reserving for team-a's gang would hold room reclaim takes back.
    config = dataclasses.replace(CONFIG, reservation_after_seconds=10)
    ending = [pod(f"{g}-0", group=g, gpu=8, node_name=n, phase="Running", created=-100, restart_policy="Never")
              for g, n in (("a1", "n0"), ("a2", "n1"))]  # pods a reservation may wait out
    pods = ending + gang_pods("old", 1, gpu=8, created=1) + gang_pods("young", 1, gpu=8, created=50)
    groups = [in_queue("a1", "team-a"), in_queue("a2", "team-a"), in_queue("old", "team-a", created=1),
              in_queue("young", "team-b", created=50)]
    snap = with_queues(snapshot(gpu_nodes(), pods, groups, now=0), queue("team-a"), queue("team-b"))
    gang_queue = GangQueue.from_config(config)
    schedule_cycle(snap, gang_queue, config)
    plan = schedule_cycle(dataclasses.replace(snap, now=snap.now + 100), gang_queue, config)
    assert plan.reservation is not None and plan.reservation.gang_key == "default/young"
