"""API faults on pods/binding and on the pod watch, during a burst of gangs.

The burst: 8 gangs of 4 pods x 2 GPUs on 6 nodes of 8 GPUs, all created
before the scheduler starts, so its first cycles bind as many as fit at
once: exactly 6 gangs (48 GPUs), the other 2 never (they must stay at 0).
"""
from __future__ import annotations

import pytest

from tests.chaos.proxy import BINDING_PATH

pytestmark = pytest.mark.e2e

NODES, GANGS, SIZE, GPUS = 6, 8, 4, 2
FITTING_PODS = NODES * 8 // GPUS  # 24: six whole gangs


def burst(chaos) -> None:
    chaos.add_gpu_nodes(NODES)
    chaos.make_gangs(GANGS, SIZE, GPUS)


def test_failed_bindings_are_retried_and_gangs_end_whole(chaos):
    """500, 429 (Retry-After) and reset connections on pods/binding: each fails 3 requests,
    interleaved with requests let through (``after``), so every kind surely fires."""
    burst(chaos)
    rules = [chaos.proxy.add_rule(method="POST", path=BINDING_PATH, after=2, count=3, **fault)
             for fault in (dict(fault="status", status=500), dict(fault="status", status=429), dict(fault="reset"))]
    chaos.start()
    chaos.wait_bound(FITTING_PODS)
    assert all(rule.fired >= 1 for rule in rules), [(r.fault, r.status, r.fired) for r in rules]
    chaos.finish()


def test_bindings_committed_but_unanswered_end_whole(chaos):
    """The API server binds, the reply is lost: the retry meets 409 (already bound)."""
    burst(chaos)
    rule = chaos.proxy.add_rule("drop_reply", method="POST", path=BINDING_PATH, probability=0.4, count=12)
    chaos.start()
    chaos.wait_bound(FITTING_PODS)
    assert rule.fired >= 1
    chaos.finish()


def test_unanswered_bindings_while_the_pod_watch_lags(chaos):
    """A lost reply's retry meets 409: the binder reads the pod back (bound) instead of
    forgetting a binding the lagging watch has not shown yet."""
    burst(chaos)
    lag = chaos.proxy.add_rule("delay", watch=True, path=r"^/api/v1/pods$", seconds=3)
    dropped = chaos.proxy.add_rule("drop_reply", method="POST", path=BINDING_PATH, probability=0.4, count=8)
    chaos.start()
    chaos.wait_bound(FITTING_PODS)
    assert lag.fired >= 1 and dropped.fired >= 1
    chaos.finish()


def watch_lag_scenario(chaos, lag_seconds: float, **config) -> None:
    """Bindings confirmed by the pod watch only ``lag_seconds`` late: the assumptions
    hold until it does (they have no deadline), so no room is handed out twice."""
    burst(chaos)
    lag = chaos.proxy.add_rule("delay", watch=True, path=r"^/api/v1/pods$", seconds=lag_seconds)
    chaos.start(**config)
    chaos.wait_bound(FITTING_PODS, timeout=lag_seconds + 60)
    assert lag.fired >= 1
    chaos.finish(still_for=lag_seconds + 3)  # the scheduler acts on what it sees that late


def test_a_watch_lagging_5_seconds(chaos):
    """Every binding is confirmed 5 s late: nothing is re-planned meanwhile."""
    watch_lag_scenario(chaos, 5.0)


@pytest.mark.chaos_long
def test_a_watch_lagging_45_seconds(chaos):
    """The issue's 45 s watch delay (past the 30 s assume timeout batchsched once had)."""
    watch_lag_scenario(chaos, 45.0)
