"""A gang whose claim writes hang holds up no other gang (issue 39, point 4).

Gang ``slow`` gets its GPUs through ResourceClaims of its own, and the fault
proxy holds every write to those claims; gang ``quick`` asks no GPU.  Both
exist before the scheduler starts, so its first cycle places both.
``quick`` must be bound while ``slow``'s claim writes still hang; once they
are let go, ``slow`` is bound too.

The pods of ``slow`` sit on a DRA-only node (no ``nvidia.com/gpu`` in its
allocatable), which the invariant checker's GPU-id count does not know: the
scenario checks the other invariants (no device in two claims among them).
"""
from __future__ import annotations

import pytest

from tests.chaos.conftest import assert_alive_and_ready
from tests.chaos.invariants import claim_conflicts, overcommitted_nodes, partial_gangs, wait_quiescent
from tests.integration.test_dra_claims import claiming_pod
from tests.integration.test_dra_inventory import DGX1, dra_node, gpu_class  # noqa: F401
from tests.support import dra
from tests.support.kube import wait_for
from tests.support.objects import pod, pod_group

pytestmark = pytest.mark.e2e


def test_a_gang_whose_claim_writes_hang_holds_up_no_other_gangs_bindings(chaos, gpu_class):
    env = chaos.env
    dra_node(env, "dgx", DGX1.read_text())
    env.create(pod_group("slow", env.namespace, 2))
    env.create(pod_group("quick", env.namespace, 2))
    for i in range(2):
        env.create(dra.claim(f"slow-{i}", 2))
        claiming_pod(env, f"slow-{i}", group="slow", claim=f"slow-{i}")
        env.create(pod(f"quick-{i}", env.namespace, group="quick", cpu="1"))
    # the first write to each of slow's claims (the finalizer's update) waits at the proxy
    held = chaos.proxy.add_rule("hold", method="PUT", path=rf"/namespaces/{env.namespace}/resourceclaims/slow-")
    replica = chaos.start()

    wait_for("quick bound while slow's claim writes hang", lambda: {"quick-0", "quick-1"} <= env.bound().keys(),
             timeout=20)
    assert held.fired >= 1 and not {"slow-0", "slow-1"} & env.bound().keys()
    chaos.proxy.release_held()
    wait_for("slow bound once its claims are written", lambda: len(env.bound()) == 4, timeout=60)

    wait_quiescent(env.kube, env.namespace)
    assert not (overcommitted_nodes(env.kube, env.nodes) + claim_conflicts(env.kube, env.namespace)
                + partial_gangs(env.kube, env.namespace))
    assert_alive_and_ready([replica])
