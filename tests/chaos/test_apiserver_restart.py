"""kube-apiserver SIGKILLed in the middle of a burst and started again (same port, same etcd).

This module runs on a control plane of its own (``own_cluster``), so no
other test sees its API server go away.
"""
from __future__ import annotations

import time

import pytest

import localcluster
from tests.chaos.faults import committed_bindings, hold_bindings_after
from tests.chaos.test_api_faults import FITTING_PODS, burst
from tests.conftest import install_podgroup_crd
from tests.support.kube import KubeError, TestKube, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def kubeconfig(own_cluster) -> str:
    return str(own_cluster.kubeconfig)


@pytest.fixture(scope="module")
def kube(kubeconfig) -> TestKube:
    return install_podgroup_crd(TestKube(kubeconfig))


def authorized(kube: TestKube, env) -> bool:
    try:
        kube.get(f"/api/v1/namespaces/{env.namespace}/pods", limit=1)
    except (KubeError, OSError):
        return False
    return True


def test_the_scheduler_rides_out_an_api_server_restart_mid_burst(chaos, own_cluster, scheduler_kubeconfig):
    burst(chaos)
    held = hold_bindings_after(chaos.proxy, FITTING_PODS // 2)
    # A lease that outlasts the outage: a restart under load can take longer
    # than the default 7 s renew deadline, and a replica that loses its lease
    # exits by design (tests/integration/test_high_availability.py covers that).
    chaos.start(leaderElection={"leaseNamespace": chaos.env.namespace, "leaseDurationSeconds": 120.0,
                                "renewDeadlineSeconds": 90.0, "retryPeriodSeconds": 1.0})
    wait_for("half the bindings committed and the rest held",
             lambda: committed_bindings(chaos.proxy) >= FITTING_PODS // 2 and held.fired >= 1)
    killed_at = time.time()
    localcluster.kill_component(own_cluster, "kube-apiserver")
    chaos.proxy.release_held()  # the held bindings now meet a dead API server

    def refused_while_down() -> int:  # requests the proxy could not forward: the outage itself
        return sum(1 for r in chaos.proxy.records if r.sent > killed_at and not r.upstream_status)

    wait_for("the scheduler's lists and bindings refused while the API server is down",
             lambda: refused_while_down() >= 4, timeout=30)
    localcluster.start_component(own_cluster, "kube-apiserver")
    # A restarted API server refuses what RBAC grants until its authorizer has
    # synced: the scheduler's requests refused till then are part of the fault.
    as_scheduler = TestKube(scheduler_kubeconfig)
    wait_for("the restarted API server authorizing the scheduler", lambda: authorized(as_scheduler, chaos.env),
             timeout=60)
    chaos.env.authorizer_outages.append((killed_at, time.time()))
    chaos.wait_bound(FITTING_PODS, timeout=90)
    chaos.finish()
