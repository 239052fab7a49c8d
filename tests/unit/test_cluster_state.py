"""ClusterState's indexes, and the indexes kept across cycles on top of it
(the capacity index, built gangs), against the same things computed from
scratch after random changes."""
from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from batchsched.api.constants import TOPOLOGY_MANAGER_POLICY_LABEL
from batchsched.core import resources as res
from batchsched.core.cluster import ClusterState
from batchsched.core.cycle.reserve import _drained_entry, drained_index
from batchsched.core.gangs import GangIndex, build_gangs
from batchsched.core.model import TopologyPolicy
from batchsched.core.placement import capacity
from batchsched.core.placement.capacity import CapacityIndex, KeptIndex, cluster_capacity, kept_index
from batchsched.core.placement.fit import NodeFilter
from batchsched.core.placement.fragmentation import NodeChoice, quantized_mix
from batchsched.core.snapshot import Snapshot
from batchsched.core.topology.accounting import room_of
from batchsched.core.tracked import TrackedDict
from tests.unit.helpers import group, node, pod
from tests.unit.topology_support import fixture, topology_node

DGX1 = fixture("dgx1-hybrid-cube-mesh-8gpu.txt")
POLICIES = (TopologyPolicy(), TopologyPolicy(gpu_link="require-nvlink"), TopologyPolicy(numa="single"))


def random_node(rng: random.Random, name: str):
    zone = rng.choice("ab")
    labels = {"zone": zone, **({"nvidia.com/gpu.clique": "c1"} if zone == "a" else {})}
    if rng.random() < 0.5:
        return topology_node(name, DGX1, labels=labels)
    return node(name, cpu="64", memory="256Gi", gpu=rng.choice((4, 8)), labels=labels,
                unschedulable=rng.random() < 0.1)


def random_pod(rng: random.Random, k: int, nodes: list[str]):
    bound = rng.random() < 0.6 and nodes
    gpu = rng.choice((1, 2, 4))
    return dataclasses.replace(
        pod(f"p{k}", cpu=rng.choice((1, 4)), memory="8Gi", gpu=gpu, group=rng.choice(("g1", "g2", None)),
            scheduler=rng.choice(("batchsched", "batchsched", "default-scheduler")),
            node_name=rng.choice(nodes) if bound else None,
            phase=rng.choice(("Running", "Running", "Pending", "Succeeded")) if bound else "Pending",
            gated=rng.random() < 0.1, deleting=rng.random() < 0.1,
            gpu_ids=",".join(map(str, rng.sample(range(8), gpu))) if bound and rng.random() < 0.8 else None),
        nominated_node=rng.choice(nodes) if nodes and not bound and rng.random() < 0.2 else "")


def mutate(rng: random.Random, state: ClusterState, step: int) -> None:
    names = sorted(state.nodes)
    roll = rng.random()
    if roll < 0.05 or len(names) < 8:
        state.put_node(random_node(rng, f"n{rng.randrange(12)}"))
    elif roll < 0.07:
        state.remove_node(rng.choice(names))
    elif roll < 0.25 and state.pods:
        state.remove_pod(rng.choice(sorted(state.pods)))
    else:
        replaced = rng.choice(sorted(state.pods)) if state.pods and rng.random() < 0.5 else None
        fresh = random_pod(rng, step, names)
        if replaced:
            fresh = dataclasses.replace(fresh, uid=replaced, name=state.pods[replaced].name)
        state.put_pod(fresh)


@pytest.mark.parametrize("every", [1, 10], ids=["each-change", "every-ten-changes"])
def test_indexes_match_a_scan_of_every_pod_after_random_changes(every):
    """Looked at after each change too: each node's free resources and room
    are then derived from those before where they can be (a pod bound onto
    it), and must equal a scan of its pods (GPU ids two pods name, ids out
    of range and NUMA charges included)."""
    rng = random.Random(7)
    state = ClusterState("batchsched")
    for step in range(600):
        mutate(rng, state, step)
        mark = state.mark
        if step % every:
            continue
        for name, n in state.nodes.items():
            holding = [p for p in state.pods.values() if p.node_name == name and p.holds_resources]
            used: dict = {}
            for p in holding:
                used = res.add(used, p.requests)
            assert {k: v for k, v in state.free(name).items() if v != n.allocatable.get(k, 0) or k in used} == \
                {k: v for k, v in res.subtract(n.allocatable, used).items()
                 if v != n.allocatable.get(k, 0) or k in used}
            assert state.room(name) == room_of(n, holding)
        ours = [p for p in state.pods.values() if p.scheduler_name == "batchsched"]
        assert set(state.pending_gang_keys()) == {
            p.gang_key for p in ours if not p.node_name and not p.terminal and not p.terminating and not p.gated}
        assert list(state.nominated_pods()) == [
            p for p in ours if p.nominated_node and not p.node_name and not p.terminal]
        assert set(state.group_names("default")) == {p.group for p in state.pods.values() if p.group}
        assert not state.group_names("elsewhere")
        assert list(state.terminating_pods()) == [
            p for p in state.pods.values() if p.node_name and p.holds_resources and p.terminating]
        assert state.total_allocatable == {
            k: sum(n.allocatable.get(k, 0) for n in state.nodes.values())
            for k in {k for n in state.nodes.values() for k in n.allocatable}} | {
            k: v for k, v in state.total_allocatable.items() if v == 0}
        assert state.changed_since(mark) == []
        asks = Counter(p.requests["nvidia.com/gpu"] for p in state.pods.values() if p.requests.get("nvidia.com/gpu")
                       and ((p.scheduler_name == "batchsched" and p.awaits_placement) or p.holds_resources))
        assert state.gpu_asks == asks
        assert state.pending_gpu_asks == Counter(p.requests.get("nvidia.com/gpu", 0) for p in ours
                                                 if p.awaits_placement and p.requests.get("nvidia.com/gpu"))
        assert sum(state.clique_node_gpus.values()) == sum(
            "nvidia.com/gpu.clique" in n.labels for n in state.nodes.values())


def heap_order(view) -> list[tuple]:
    """The valid entries of a view, best first, without their versions."""
    versions = view._index.versions
    return sorted(e[:2] for e in view._heap if e[2] == versions.get(e[1], 0))


def fresh_index(state: ClusterState, withheld, choice: NodeChoice | None = None) -> CapacityIndex:
    free = {n: res.subtract(state.free(n), withheld[n]) if n in withheld else state.free(n) for n in state.nodes}
    rooms = {n: r for n in state.nodes if (r := state.room(n)) is not None}
    return CapacityIndex(state.nodes, free, NodeFilter(state.nodes), rooms=rooms, choice=choice)


@pytest.mark.parametrize("with_choice", [False, True], ids=["best-fit", "fragmentation-and-cliques"])
def test_the_kept_capacity_index_equals_a_fresh_one_after_random_changes_and_commits(with_choice):
    rng = random.Random(11)
    state = ClusterState("batchsched")
    shapes = [pod(f"shape{g}", cpu=2, memory="8Gi", gpu=g) for g in (1, 2, 4)] + [
        pod("zoned", cpu=1, gpu=2, node_selector={"zone": "a"})]
    for step in range(400):
        mutate(rng, state, step)
        if step % 7:
            continue
        names = sorted(state.nodes)
        withheld = {n: {"cpu": 1000} for n in rng.sample(names, min(2, len(names)))}
        # the choice as node_choice makes it: from the cluster's asks, so it changes as they do
        choice = NodeChoice(quantized_mix(state.gpu_asks), max(state.pending_gpu_asks, default=0)) \
            if with_choice else None
        kept = cluster_capacity(state, withheld, choice)
        fresh = fresh_index(state, withheld, choice)
        for shape in shapes:
            for policy in POLICIES:
                a, b = kept.view(shape, policy), fresh.view(shape, policy)
                assert heap_order(a) == heap_order(b), (step, shape.name, policy)
                assert a.reason_counts((), {}, {}) == b.reason_counts((), {}, {})
                assert a.feasible == b.feasible
                assert (a.holds_when_empty, a.never_counts()) == (b.holds_when_empty, b.never_counts())
        # a plan committed in this cycle must not leak into the next one
        if names and rng.random() < 0.5:
            target = rng.choice(names)
            kept.commit({target: {"cpu": 0}})


def test_a_view_built_from_its_preference_sibling_equals_one_built_alone():
    """A gang's RDMA preference makes a second view of a shape: it copies
    where the shape may go from the sibling kept current by the same index,
    and must equal a view built from nothing."""
    rng = random.Random(5)
    state = ClusterState("batchsched")
    shapes = [pod(f"shape{g}", cpu=2, memory="8Gi", gpu=g) for g in (1, 2, 8)]
    for step in range(200):
        mutate(rng, state, step)
        if step % 9:
            continue
        kept = cluster_capacity(state, {})
        for shape in shapes:
            kept.view(shape)  # the sibling, kept across cycles
        for shape in shapes:
            a = kept.view(shape, TopologyPolicy(rdma=True))
            b = fresh_index(state, {}).view(shape, TopologyPolicy(rdma=True))
            assert heap_order(a) == heap_order(b), (step, shape.name)
            assert a.reason_counts((), {}, {}) == b.reason_counts((), {}, {})
            assert (a.feasible, a.holds_when_empty, a.never_counts()) == (b.feasible, b.holds_when_empty,
                                                                          b.never_counts())
        if state.nodes and rng.random() < 0.5:
            kept.commit({rng.choice(sorted(state.nodes)): {"cpu": 0}})


def index_of_entries(state: ClusterState, entry) -> CapacityIndex:
    """An index built from scratch over every node's ``entry``."""
    free, rooms, tiebreak = {}, {}, {}
    for name in state.nodes:
        free[name], room, tiebreak[name] = entry(name)
        if room is not None:
            rooms[name] = room
    return CapacityIndex(state.nodes, free, NodeFilter(state.nodes), tiebreak=tiebreak, rooms=rooms)


def assert_views_equal(kept: CapacityIndex, fresh: CapacityIndex, shape, where) -> None:
    for policy in POLICIES:
        a, b = kept.view(shape, policy), fresh.view(shape, policy)
        assert heap_order(a) == heap_order(b), (where, policy)
        assert a.reason_counts((), {}, {}) == b.reason_counts((), {}, {})


def test_a_kept_index_with_tiebreaks_and_a_key_equals_a_fresh_one():
    """As the reservation's "as if drained" index: entries with a tiebreak,
    rebuilt when the key changes, reset from changed nodes otherwise."""
    rng = random.Random(5)
    state = ClusterState("batchsched")
    shape = pod("shape", cpu=2, memory="8Gi", gpu=2)

    def entry_for(drained_gang: str):
        def entry(name):
            now = state.free(name)
            gone = [p for p in state.bound_pods(name) if p.holds_resources and p.gang_key == drained_gang]
            free = now
            for p in gone:
                free = res.add(free, p.requests)
            return free, state.room(name), (-now.get("nvidia.com/gpu", 0),)
        return entry

    for step in range(400):
        mutate(rng, state, step)
        if step % 5:
            continue
        drained_gang = rng.choice(("default/g1", "default/g2"))
        entry = entry_for(drained_gang)
        kept = kept_index(state, state.kept(KeptIndex), drained_gang, entry)
        assert_views_equal(kept, index_of_entries(state, entry), shape, step)
        if state.nodes and rng.random() < 0.5:
            kept.commit({rng.choice(sorted(state.nodes)): {"cpu": 0}})


def test_built_gangs_are_reused_until_a_member_or_the_group_changes():
    members = [pod(f"g-{i}", cpu=1, group="g") for i in range(3)]
    state = ClusterState("batchsched", [node("n")], members)
    groups = {"default/g": group("g", min_member=3)}
    first = GangIndex(Snapshot.of(state, groups, 0.0))["default/g"]
    assert GangIndex(Snapshot.of(state, groups, 1.0))["default/g"] is first
    state.put_pod(dataclasses.replace(members[0], node_name="n"))
    bound = GangIndex(Snapshot.of(state, groups, 2.0))["default/g"]
    assert bound is not first and len(bound.bound_active) == 1
    regrouped = {"default/g": group("g", min_member=2, generation=2)}
    assert GangIndex(Snapshot.of(state, regrouped, 3.0))["default/g"].min_member == 2
    assert [g.key for g in GangIndex(Snapshot.of(state, groups, 4.0)).pending()] == ["default/g"]
    for p in members:
        state.remove_pod(p.uid)
    assert build_gangs(Snapshot.of(state, groups, 5.0)) == {}
    assert GangIndex(Snapshot.of(state, groups, 5.0)).get("default/g") is None


def test_an_equal_node_keeps_the_held_object_and_changes_nothing():
    state = ClusterState("batchsched", [node("n", gpu=8)])
    held, mark = state.nodes["n"], state.mark
    state.put_node(node("n", gpu=8))  # a relist or a heartbeat: equal, another object
    assert state.nodes["n"] is held and state.changed_since(mark) == []
    state.put_node(node("n", gpu=4))
    assert state.nodes["n"].allocatable["nvidia.com/gpu"] == 4 and state.changed_since(mark) == ["n"]


@pytest.mark.parametrize("tracked", [False, True], ids=["groups-rebuilt", "groups-changed-in-place"])
def test_the_drained_index_shared_by_every_head_equals_a_fresh_one(tracked):
    """The reservation's "as if drained" index is kept across cycles and
    heads: after random changes, another head (of another priority), and
    runtime hints and PodGroup priorities that change, it equals one built
    from scratch, and it waits out exactly the bound pods of ours that end
    by themselves, of gangs not above the head's priority.  With the
    PodGroups changed in place (a TrackedDict, as the shell keeps them),
    what it kept of each gang is looked up again only for gangs whose pods
    or PodGroup changed."""
    rng = random.Random(3)
    state = ClusterState("batchsched")
    tracked_groups = TrackedDict()
    shape = pod("shape", cpu=2, memory="8Gi", gpu=2)
    gang_names = ("g1", "g2", "g3", "g4")
    priorities = {"g1": 0, "g2": 0, "g3": 100, "g4": 1000}
    heads_seen: set[str] = set()
    for step in range(500):
        names = sorted(state.nodes)
        if len(names) < 8 or rng.random() < 0.05:
            state.put_node(random_node(rng, f"n{rng.randrange(12)}"))
            continue
        if rng.random() < 0.2 and state.pods:
            state.remove_pod(rng.choice(sorted(state.pods)))
        else:
            name = rng.choice(gang_names)
            gpu = rng.choice((1, 2, 4))
            bound = rng.random() < 0.7
            state.put_pod(pod(f"p{step}", cpu=1, memory="8Gi", gpu=gpu, group=name, priority=priorities[name],
                              node_name=rng.choice(names) if bound else None,
                              phase="Running" if bound else "Pending", started=float(step) if bound else None,
                              restart_policy=rng.choice(("Never", "OnFailure", None)),
                              gpu_ids=",".join(map(str, rng.sample(range(8), gpu))) if bound else None))
        if step % 5:
            continue
        groups = {f"default/{g}": group(g, expected_runtime=rng.choice((None, 100, 300)),
                                        priority=rng.choice((None, None, 50))) for g in gang_names}
        if tracked:  # only some PodGroups change
            tracked_groups.update({k: v for k, v in groups.items() if k not in tracked_groups or rng.random() < 0.3})
            groups = tracked_groups
        snapshot = Snapshot.of(state, groups, float(step))
        gangs = GangIndex(snapshot)
        heads = [k for k in gangs if gangs[k].pending]
        if not heads:
            continue
        head = gangs[rng.choice(heads)]
        heads_seen.add(head.key)
        # Pods lent the head's reserved room (queueing.lending): some, with
        # times from which it may evict them, changing from call to call.
        bound_uids = sorted(u for u, p in state.pods.items() if p.node_name)
        lent = {u: float(rng.choice((step, step + 50))) for u in rng.sample(bound_uids, min(len(bound_uids), 3))
                if rng.random() < 0.5}
        kept, draining = drained_index(snapshot, gangs, head, lent)
        waited_out = {k for k in state.holding_gang_keys() if k != head.key and gangs[k].priority <= head.priority}
        for p in state.pods.values():
            assert draining(p) == (p.uid in lent or (p.scheduler_name == "batchsched" and p.gang_key in waited_out
                                                     and p.runs_to_completion)), (step, p.name)
        assert_views_equal(kept, index_of_entries(state, _drained_entry(snapshot, draining)), shape,
                           (step, head.key))
    assert len(heads_seen) == len(gang_names)  # the index did serve every head


def test_nodes_of_one_board_with_other_free_cpu_share_one_gpu_choice(monkeypatch):
    """In a real cluster free cpu and memory differ from node to node; the
    GPU choice does not depend on them (but for single-numa-node
    alignment), so six such nodes cost one choice, and a node where the
    pod does not fit says so without one."""
    import batchsched.core.placement.capacity as capacity_module

    chosen = []
    real = capacity_module.pick_gpus
    monkeypatch.setattr(capacity_module, "pick_gpus", lambda *args: chosen.append(args[0].name) or real(*args))
    nodes = [topology_node(f"n{i}", DGX1) for i in range(6)]
    state = ClusterState("batchsched", nodes)
    view = CapacityIndex(state.nodes, {}, NodeFilter(state.nodes)).view(pod("shape", cpu=4, gpu=2))
    picks = []
    for i, n in enumerate(nodes):
        used = [pod(f"u{i}", cpu=1 + 3 * i, gpu=1, node_name=n.name, phase="Running", gpu_ids="7")]
        free = res.subtract(n.allocatable, {"cpu": 1000 + 3000 * i, "nvidia.com/gpu": 1})
        picks.append(view.pick(n.name, free, room_of(n, used)))
    assert chosen == ["n0"] and len(set(picks)) == 1 and 7 not in picks[0].gpus
    starved = res.subtract(nodes[0].allocatable, {"cpu": nodes[0].allocatable["cpu"] - 1000})
    assert view.pick("n1", starved, room_of(nodes[1], [])) == ["Insufficient cpu"] and chosen == ["n0"]


def test_a_shape_view_answers_alike_nodes_from_one_pick_as_a_fresh_view_would():
    """ShapeView.pick keeps its answers per kind of node, free amounts and
    GPU room: every answer equals a fresh view's, on nodes of two boards and
    flat ones, empty and used, under each policy."""
    rng = random.Random(13)
    plain = topology_node("plain", DGX1)
    # the same board object, under a Topology Manager policy of one NUMA node
    single = dataclasses.replace(plain, name="single", labels={TOPOLOGY_MANAGER_POLICY_LABEL: "single-numa-node"})
    nodes = [random_node(rng, f"n{i}") for i in range(12)] + [plain, single]
    state = ClusterState("batchsched", nodes)
    shape = pod("shape", cpu=20, memory="8Gi", gpu=2)  # a NUMA node's cpu may run short
    # The same GPUs and cpu used, NUMA by NUMA otherwise: different answers.
    uses = [[pod(f"u{gpu}", cpu=cpu, memory="8Gi", gpu=1, node_name="single", phase="Running", gpu_ids=str(gpu))
             for gpu, cpu in zip((0, 7), cpus)] for cpus in ((20, 1), (1, 20))]
    view = CapacityIndex(state.nodes, {}, NodeFilter(state.nodes)).view(shape)
    free = res.subtract(single.allocatable, {"cpu": 21000, "nvidia.com/gpu": 2})
    answers = [view.pick(name, free, room_of(single, used)) for used in uses for name in ("single", "plain")]
    assert answers[0].gpus != answers[2].gpus and answers[0] != answers[1], answers
    for policy in POLICIES + (TopologyPolicy(rdma=True),):
        kept = CapacityIndex(state.nodes, {n: state.free(n) for n in state.nodes}, NodeFilter(state.nodes),
                             rooms={n: r for n in state.nodes if (r := state.room(n)) is not None})
        view, asked = kept.view(shape, policy), 0
        for _ in range(300):
            name = rng.choice(sorted(state.nodes))
            holding = [pod(f"h{k}", cpu=rng.choice((1, 8)), memory="8Gi", gpu=1, node_name=name, phase="Running",
                           gpu_ids=str(k)) for k in rng.sample(range(8), rng.randrange(8))]
            free = res.subtract(state.nodes[name].allocatable,
                                {"cpu": sum(p.requests["cpu"] for p in holding), "nvidia.com/gpu": len(holding)})
            room = room_of(state.nodes[name], holding) if name in kept.rooms else None
            fresh = CapacityIndex(state.nodes, dict(kept.free), NodeFilter(state.nodes), rooms=dict(kept.rooms))
            assert view.pick(name, free, room) == fresh.view(shape, policy).pick(name, free, room), (name, policy)
            asked += 1
        assert len(view._picks) < asked  # alike nodes did share answers


@pytest.mark.parametrize("kinds_kept", [capacity.KIND_TOKENS_KEPT, 1], ids=["kinds-kept", "kind-tokens-start-over"])
def test_a_view_files_each_node_as_a_view_of_that_node_alone_would(monkeypatch, kinds_kept):
    """A view being built files alike nodes once (``node_kind``, the free
    amounts the shape asks and the GPU room): each node's entry, what it lacks, and how
    many pods it holds empty still equal a view's over that node alone,
    across boards and flat nodes, Topology Manager policies, clique labels,
    cpu sizes, GPUs in use and tiebreaks; also where the kinds' tokens start
    over at every new kind."""
    monkeypatch.setattr(capacity, "KIND_TOKENS_KEPT", kinds_kept)
    monkeypatch.setattr(capacity, "_KIND_TOKENS", {})  # the kinds of earlier tests are not known here
    rng = random.Random(17)
    shapes = [pod(f"shape{g}", cpu=c, memory="8Gi", gpu=g) for g, c in ((1, 2), (2, 20), (4, 2), (8, 2))]
    picks = []
    real_pick = capacity.ShapeView.pick
    monkeypatch.setattr(capacity.ShapeView, "pick", lambda view, *args: picks.append(1) or real_pick(view, *args))
    shared_filings = 0
    for case in range(12):
        nodes = []
        for i in range(16):
            labels = {}
            if rng.random() < 0.3:
                labels[TOPOLOGY_MANAGER_POLICY_LABEL] = "single-numa-node"
            if rng.random() < 0.3:
                labels["nvidia.com/gpu.clique"] = "c1"
            cpu = rng.choice(("64", "96"))
            # flat nodes with the boards' memory: alike but for the board
            nodes.append(topology_node(f"n{i}", DGX1, cpu=cpu, labels=labels) if rng.random() < 0.7
                         else node(f"n{i}", cpu=cpu, memory="512Gi", gpu=8, labels=labels))
        state = ClusterState("batchsched", nodes)
        # Kinds given in the list's order: a build visits its nodes in a
        # set's order, which the hash seed sets, and tokens that start over
        # are shared only by alike nodes given one after the other.
        for n in state.nodes.values():
            capacity.node_kind(n)
        for i, n in enumerate(nodes):
            if rng.random() < 0.5:
                gpus = rng.sample(range(8), rng.randrange(1, 4))
                state.put_pod(pod(f"u{i}", cpu=rng.choice((1, 8)), memory="8Gi", gpu=len(gpus), node_name=n.name,
                                  phase="Running", gpu_ids=",".join(map(str, gpus))))
        free = {name: state.free(name) for name in state.nodes}
        rooms = {name: r for name in state.nodes if (r := state.room(name)) is not None}
        tiebreak = {name: (rng.randrange(3),) for name in state.nodes}
        choice = rng.choice((None, NodeChoice(quantized_mix({1: 3, 8: 2}), 8)))
        index = CapacityIndex(state.nodes, dict(free), NodeFilter(state.nodes), tiebreak=tiebreak,
                              rooms=dict(rooms), choice=choice)
        for shape in shapes:
            for policy in POLICIES + (TopologyPolicy(rdma=True),):
                picks.clear()
                view = index.view(shape, policy)
                shared_filings += len(view.feasible) - len(picks)
                for name, n in state.nodes.items():
                    one = {name: n}
                    alone = CapacityIndex(one, {name: free[name]}, NodeFilter(one), tiebreak={name: tiebreak[name]},
                                          rooms={name: rooms[name]} if name in rooms else {},
                                          choice=choice).view(shape, policy)
                    where = (case, name, shape.name, policy)
                    filed = [e for e in heap_order(view) if e[1] == name]
                    assert filed == heap_order(alone), where
                    if filed:  # its score, tiebreak and all, as ``score`` gives it
                        room = rooms.get(name)
                        assert filed[0][0] == alone.score(name, free[name], alone.pick(name, free[name], room), room)
                    assert view._short.get(name) == alone._short.get(name), where
                    assert (view._holds.get(name), view._too_small.get(name)) == (
                        alone._holds.get(name), alone._too_small.get(name)), where
    assert shared_filings > 0  # alike nodes did share filings


def test_whether_a_shape_fits_outside_a_reserved_set_follows_every_commit_and_node_change():
    """``fits_outside`` keeps its answer for one reserved set until a node
    is filed anew: after random commits, node changes and reserved sets,
    each answer equals a look at a fresh index's view."""
    rng = random.Random(23)
    state = ClusterState("batchsched")
    shapes = [pod(f"shape{g}", cpu=2, memory="8Gi", gpu=g) for g in (1, 4, 8)]
    kept, answers = None, Counter()
    for step in range(300):
        mutate(rng, state, step)
        if step % 3:
            continue
        kept = cluster_capacity(state, {})
        names = sorted(state.nodes)
        reservations = [frozenset(rng.sample(names, min(len(names), k))) for k in (0, 2, 6)]
        for _ in range(6):
            if names and rng.random() < 0.4:  # a plan taking a node's room in this cycle
                name = rng.choice(names)
                kept.commit({name: {"cpu": 0}}, {name: dataclasses.replace(kept.rooms[name], free=0)}
                            if name in kept.rooms else None)
            fresh = CapacityIndex(state.nodes, dict(kept.free), NodeFilter(state.nodes), rooms=dict(kept.rooms))
            for shape in shapes:
                reserved = rng.choice(reservations)
                look = fresh.view(shape)
                expected = look.peek(reserved) is not None
                look.restore()
                assert kept.view(shape).fits_outside(reserved) == expected, (step, shape.name, sorted(reserved))
                answers[expected] += 1
    assert answers[True] and answers[False]


def test_idle_views_are_kept_while_their_upkeep_is_below_a_few_rebuilds():
    """In an index kept with ``kept_rebuilds`` (the reservation's), a view
    unused for VIEW_IDLE_SYNCS syncs is kept while keeping it current cost
    less than that many rebuilds, dropped after; any view is dropped after
    VIEW_KEPT_SYNCS unused; at most IDLE_VIEWS_KEPT unused ones are kept,
    the most lately used.  The cluster's own index drops a view unused for
    VIEW_IDLE_SYNCS syncs."""
    nodes = [node(f"n{i}", cpu="16", gpu=8) for i in range(10)]
    state = ClusterState("batchsched", nodes)

    def sync() -> CapacityIndex:
        cluster_capacity(state, {})
        return kept_index(state, state.kept(KeptIndex), None, lambda name: (state.free(name), state.room(name), ()),
                          kept_rebuilds=4)

    index, cluster_view = sync(), cluster_capacity(state, {}).view(pod("used", cpu=1, gpu=1))
    used, unused = index.view(pod("used", cpu=1, gpu=1)), index.view(pod("unused", cpu=1, gpu=2))
    for step in range(capacity.VIEW_IDLE_SYNCS + 1):  # a node changes each sync: a filing in every view
        state.put_pod(pod(f"p{step}", cpu=1, node_name=f"n{step % 10}", phase="Running"))
        index = sync()
    assert index.view(pod("used", cpu=1, gpu=1)) is used  # 33 syncs unused, upkeep 33 < 4 x 10 nodes
    assert cluster_capacity(state, {}).view(pod("used", cpu=1, gpu=1)) is not cluster_view
    for step in range(capacity.VIEW_IDLE_SYNCS + 1):
        state.put_pod(pod(f"q{step}", cpu=1, node_name=f"n{step % 10}", phase="Running"))
        index = sync()
    # the other went unused for 66 syncs with 66 filings: past 4 rebuilds of 10 nodes, dropped
    assert index.view(pod("unused", cpu=1, gpu=2)) is not unused
    for _ in range(capacity.VIEW_KEPT_SYNCS + 1):
        index = sync()
    assert index.view(pod("used", cpu=1, gpu=1)) is not used  # nothing changed, but unused too long
    older = [index.view(pod(f"s{k}", cpu=1 + k)) for k in range(5)]
    index = sync()
    newer = [index.view(pod(f"t{k}", cpu=1 + k, memory="1Gi")) for k in range(capacity.IDLE_VIEWS_KEPT)]
    for _ in range(capacity.VIEW_IDLE_SYNCS + 1):
        index = sync()
    assert len(index._views) == capacity.IDLE_VIEWS_KEPT  # all unused, with no upkeep: the newer ones kept
    assert index.view(pod("t0", cpu=1, memory="1Gi")) is newer[0] and index.view(pod("s0", cpu=1)) is not older[0]


def test_a_view_whose_nodes_are_filed_anew_over_and_over_keeps_its_heap_compact(monkeypatch):
    """Each node filed anew leaves a superseded heap entry behind: past half
    as many again as the feasible nodes (plus HEAP_SLACK) they are dropped,
    and the view still gives what a fresh one would, best first."""
    monkeypatch.setattr(capacity, "HEAP_SLACK", 0)
    rng = random.Random(5)
    nodes = [node(f"n{i}", cpu="64", gpu=8) for i in range(10)]
    state = ClusterState("batchsched", nodes)
    shape = pod("shape", cpu=1, gpu=1)
    index = cluster_capacity(state, {})
    view, largest = index.view(shape), 0
    for step in range(500):
        name = rng.choice(sorted(state.nodes))
        index.commit({name: {**index.free[name], "cpu": rng.randrange(0, 64_000)}})
        assert index.view(shape) is view  # read: the node is filed anew
        largest = max(largest, len(view._heap))
    assert largest <= 15 + 1  # 10 feasible nodes: compacted when past 15
    fresh = CapacityIndex(state.nodes, dict(index.free), NodeFilter(state.nodes), rooms=dict(index.rooms)).view(shape)
    assert heap_order(view) == heap_order(fresh)

    def best_first(look) -> list[tuple]:
        order = []
        while look.peek() is not None:
            order.append(look.pop()[:2])
        look.restore()
        return order

    assert best_first(view) == best_first(fresh) == heap_order(fresh)
    assert heap_order(view) == heap_order(fresh)  # all put back


def test_a_view_held_across_commits_reads_what_they_changed():
    """Commits file a node anew only when the view is next read: a view
    held across them (not handed out again) answers peeks, reserved-set
    looks and reason counts as a fresh index's view would."""
    rng = random.Random(29)
    nodes = [node(f"n{i}", cpu="16", gpu=8) for i in range(12)]
    state = ClusterState("batchsched", nodes)
    shape = pod("shape", cpu=2, gpu=4)
    index = cluster_capacity(state, {})
    view = index.view(shape)
    reservations = [frozenset(rng.sample(sorted(state.nodes), k)) for k in (3, 9)]
    for step in range(200):
        name = rng.choice(sorted(state.nodes))
        index.commit({name: {**index.free[name], "nvidia.com/gpu": rng.randrange(0, 9),
                             "cpu": rng.randrange(0, 16_001)}})
        fresh = CapacityIndex(state.nodes, dict(index.free), NodeFilter(state.nodes),
                              rooms=dict(index.rooms)).view(shape)
        look = rng.randrange(3)
        if look == 0:
            best, expected = view.peek(), fresh.peek()
            assert (best and best[:2]) == (expected and expected[:2]), step
        elif look == 1:
            reserved = rng.choice(reservations)  # few sets: kept answers are asked again
            expected = fresh.peek(reserved) is not None
            fresh.restore()
            assert view.fits_outside(reserved) == expected, step
        else:
            assert view.reason_counts((), {}, {}) == fresh.reason_counts((), {}, {}), step
        view.restore()
