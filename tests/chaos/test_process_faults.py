"""Process faults: a replica SIGKILLed part-way through a gang, a leader SIGSTOPped with a standby."""
from __future__ import annotations

import pytest

from tests.chaos.conftest import fast_lease
from tests.chaos.faults import hold_bindings_after, kill_when_held, paused
from tests.support.kube import wait_for
from tests.support.metrics import sample
from tests.support.objects import pod

pytestmark = pytest.mark.e2e

GANG_SIZE, BOUND_BEFORE_KILL = 4, 2


def kill_mid_gang(chaos, **group_spec) -> None:
    """One gang of 4 whole-node pods on 4 nodes; the replica dies after 2 of its bindings."""
    chaos.add_gpu_nodes(GANG_SIZE)
    chaos.make_gangs(1, GANG_SIZE, gpus=8, **group_spec)
    held = hold_bindings_after(chaos.proxy, BOUND_BEFORE_KILL)
    first = chaos.start("replica-0", leaderElection=fast_lease(chaos.env))
    kill_when_held(chaos.proxy, first, held, BOUND_BEFORE_KILL)
    assert len(chaos.env.bound()) == BOUND_BEFORE_KILL


def free_nodes(chaos) -> list[str]:
    used = set(chaos.env.bound().values())
    return [n for n in chaos.env.nodes if n not in used]


def test_a_restarted_scheduler_binds_the_rest_of_a_gang_cut_by_a_crash(chaos):
    kill_mid_gang(chaos)
    chaos.start("replica-1", leaderElection=fast_lease(chaos.env))
    chaos.wait_bound(GANG_SIZE)
    chaos.finish(records=True, alive=["replica-1"])


def remove_a_free_node(chaos) -> None:
    node = free_nodes(chaos)[0]
    chaos.env.kube.delete(f"/api/v1/nodes/{node}")
    chaos.env.nodes.remove(node)


def fill_a_free_node(chaos) -> None:
    """Another scheduler's pod takes a whole node (bound by hand, as that scheduler would)."""
    node = free_nodes(chaos)[0]
    chaos.env.create(pod("intruder", chaos.env.namespace, gpus=8, scheduler="someone-else"))
    chaos.env.kube.create(f"/api/v1/namespaces/{chaos.env.namespace}/pods/intruder/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "intruder"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}})


@pytest.mark.parametrize("take_room", [
    pytest.param(remove_a_free_node, marks=pytest.mark.chaos_long),  # the same defect: kept out of make test
    fill_a_free_node,
], ids=["node-removed", "node-filled"])
def test_a_gang_cut_by_a_crash_whose_remainder_no_longer_fits(chaos, take_room):
    """The restarted scheduler finds the gang partly bound with no room for the rest:
    after binding.partialGangTimeoutSeconds its bound members are evicted, so the
    gang holds nothing it cannot use and starts over whole when its pods return."""
    kill_mid_gang(chaos)
    take_room(chaos)
    chaos.start("replica-1", leaderElection=fast_lease(chaos.env), binding={"partialGangTimeoutSeconds": 5})
    wait_for("the gang started over", lambda: any(
        c.get("reason") == "PartialGangTimeout"
        for c in (chaos.env.podgroup("g0").get("status") or {}).get("conditions") or ()), timeout=40)
    chaos.finish(records=True, alive=["replica-1"])


def leading(replica) -> bool:
    return sample(replica.get("/metrics")[1], "batchsched_leader") == 1


def test_a_leader_stopped_for_15_seconds_mid_burst_is_replaced_and_never_writes_again(chaos):
    """Default lease timing (10 s): the standby takes over during the pause; once
    resumed, the old leader must not write (it exits, and is started again as a standby)."""
    chaos.add_gpu_nodes(6)
    chaos.make_gangs(4, 4, gpus=2, prefix="early")  # 32 of 48 GPUs
    leader = chaos.start("replica-0")
    wait_for("replica-0 leads", lambda: leading(leader), timeout=30)
    standby = chaos.start("replica-1")
    wait_for("the standby ready", lambda: standby.get("/readyz")[0] == 200, timeout=30)
    chaos.wait_bound(16)
    with paused(leader, 15.0):
        chaos.make_gangs(4, 4, gpus=2, prefix="late")  # the rest of the burst: 2 of these 4 fit
        wait_for("the standby to take over and bind 2 late gangs", lambda: sum(
            1 for p in chaos.env.bound() if p.startswith("late")) == 8, timeout=30)
    wait_for("the old leader to exit on finding its lease lost", lambda: leader.proc.poll() is not None, timeout=15)
    assert leader.proc.returncode == 1 and "lost Lease" in leader.log()
    chaos.start("replica-2")  # back as a standby, as its Deployment would restart it
    assert leading(standby)
    chaos.finish(records=True, alive=["replica-1", "replica-2"])
