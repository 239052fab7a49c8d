"""Forced relists: every watch of the scheduler ends with 410 Gone in the middle of a burst."""
from __future__ import annotations

import pytest

from tests.chaos.faults import committed_bindings, hold_bindings_after
from tests.chaos.test_api_faults import FITTING_PODS, burst
from tests.support.kube import wait_for
from tests.support.metrics import sample

pytestmark = pytest.mark.e2e

WATCHED = r"^/api/v1/(pods|nodes)$|^/apis/scheduling.batchsched.io/v1alpha1/podgroups$|/priorityclasses$"


def relists(replica) -> float:
    text = replica.get("/metrics")[1]
    return sum(sample(text, "batchsched_watch_restarts_total", f'reason="gone",resource="{kind}"') or 0
               for kind in ("pods", "nodes", "podgroups", "priorityclasses"))


def test_relists_while_bindings_are_in_flight(chaos):
    """Half the burst's bindings wait at the proxy (assumed, not confirmed) while
    every watch is expired, and the re-watches are refused with 410 once more."""
    burst(chaos)
    held = hold_bindings_after(chaos.proxy, FITTING_PODS // 2)
    replica = chaos.start()
    wait_for("half the bindings committed and the rest held",
             lambda: committed_bindings(chaos.proxy) >= FITTING_PODS // 2 and held.fired >= 1)
    wait_for("the scheduler's four watches open", lambda: chaos.proxy.live_watches(WATCHED) == 4)
    chaos.proxy.add_rule("gone", watch=True, path=WATCHED, count=4)
    assert chaos.proxy.expire_watches(WATCHED) == 4
    wait_for("every collection relisted", lambda: relists(replica) >= 8, timeout=30)
    chaos.proxy.release_held()
    chaos.wait_bound(FITTING_PODS)
    assert chaos.proxy.faults_injected("gone") >= 8
    chaos.finish()
