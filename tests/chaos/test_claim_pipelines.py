"""A gang whose claim writes hang holds up no other gang (issue 39, point 4),
and a refused binding whose claim undo hangs is not tried again before the
undo is done (point 3).

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

import time

import pytest

from tests.chaos.conftest import assert_alive_and_ready
from tests.chaos.invariants import claim_conflicts, overcommitted_nodes, partial_gangs, wait_quiescent
from tests.integration.test_dra_claims import claim_named, claiming_pod
from tests.integration.test_partial_gangs import refuse_binding_of
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
    # every write to slow's claims (the finalizer's patch first) waits at the proxy
    held = chaos.proxy.add_rule("hold", path=rf"/namespaces/{env.namespace}/resourceclaims/slow-")
    replica = chaos.start()

    wait_for("quick bound while slow's claim writes hang",
             lambda: held.fired >= 1 and {"quick-0", "quick-1"} <= env.bound().keys(), timeout=20)
    assert not {"slow-0", "slow-1"} & env.bound().keys()
    chaos.proxy.release_held()
    wait_for("slow bound once its claims are written", lambda: len(env.bound()) == 4, timeout=60)

    wait_quiescent(env.kube, env.namespace)
    assert not (overcommitted_nodes(env.kube, env.nodes) + claim_conflicts(env.kube, env.namespace)
                + partial_gangs(env.kube, env.namespace))
    assert_alive_and_ready([replica])


def test_a_refused_binding_is_tried_again_only_once_its_claim_is_undone(chaos, gpu_class):
    """The binding of ``p`` is refused after its own claim was allocated and
    reserved for it; the undo (a PUT of the claim's status) hangs at the
    proxy.  Until it is done the pod is not placed again (its devices and its
    room stay in flight): no second binding or claim write is sent, and the
    undo, when it lands, cannot take back what a next attempt wrote."""
    env = chaos.env
    dra_node(env, "dgx", DGX1.read_text())
    env.create(dra.claim("c", 2))
    refuse_binding_of(env, "p")
    claiming_pod(env, "p", claim="c")
    writes = chaos.proxy.add_rule("hold", method="PUT", path=rf"/namespaces/{env.namespace}/resourceclaims/c/status",
                                  after=1)  # the allocation goes through; the undo after the refusal waits
    replica = chaos.start()
    wait_for("the undo of the refused binding held", lambda: writes.fired == 1, timeout=30)
    time.sleep(5)  # several backoffs of a refused binding: a pod freed at once would be placed again by now
    bindings = [r for r in chaos.proxy.records if r.path.endswith(f"/namespaces/{env.namespace}/pods/p/binding")]
    assert len(bindings) == 1, f"p placed again {len(bindings) - 1} time(s) while its claim's undo hung"
    assert writes.seen == 2, f"{writes.seen - 2} more write(s) of c's status sent while its undo hung"
    for path in env.cluster_objects:  # the policy refusing p's binding goes
        if path.endswith(f"/refuse-{env.id}"):
            env.kube.delete(path)
    chaos.proxy.release_held()
    wait_for("p bound once its claim was undone", lambda: "p" in env.bound(), timeout=60)

    claim = claim_named(env, "c")
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [env.pods()["p"]["metadata"]["uid"]]
    assert claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == \
        [env.bound()["p"]]
    wait_quiescent(env.kube, env.namespace)
    assert not (overcommitted_nodes(env.kube, env.nodes) + claim_conflicts(env.kube, env.namespace))
    assert_alive_and_ready([replica])
