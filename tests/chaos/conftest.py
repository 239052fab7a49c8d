"""Fixtures of the chaos suite: the fault proxy, replicas behind it, and an own control plane.

Every scenario ends with tests/chaos/invariants.py at quiescence and checks
that each scheduler it left running is alive and ready, and that at least
one fault was really injected (so no scenario passes vacuously).
"""
from __future__ import annotations

import os

import pytest
import yaml

import localcluster
from tests.chaos.invariants import assert_invariants, wait_quiescent
from tests.chaos.proxy import FaultProxy
from tests.conftest import Env, SchedulerProcess
from tests.support.deployed import token_of
from tests.support.kube import wait_for
from tests.support.objects import pod, pod_group


def pytest_collection_modifyitems(config, items):
    """chaos_long variants run only when -m names them (make chaos), never in a plain run."""
    if "chaos_long" in (config.getoption("markexpr") or ""):
        return
    long = [item for item in items if item.get_closest_marker("chaos_long")]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if not item.get_closest_marker("chaos_long")]


def admin_server_and_token(kubeconfig: str) -> tuple[str, str]:
    config = yaml.safe_load(open(kubeconfig))
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    if "token" not in user:
        pytest.skip("the fault proxy forwards bearer tokens; this $KUBECONFIG authenticates otherwise")
    return cluster["server"], user["token"]


@pytest.fixture
def proxy(kubeconfig):
    with FaultProxy(*admin_server_and_token(kubeconfig)) as p:
        yield p


class Chaos:
    """One scenario's cluster slice, proxy and scheduler replicas."""

    def __init__(self, env: Env, proxy: FaultProxy, tmp_path, start_scheduler, scheduler_token: str):
        self.env, self.proxy, self.tmp_path = env, proxy, tmp_path
        self._start_scheduler = start_scheduler
        self.scheduler_token = scheduler_token
        self.replicas: dict[str, SchedulerProcess] = {}

    def start(self, name: str = "replica-0", **config) -> SchedulerProcess:
        """A scheduler replica whose every request goes through the proxy as
        client ``name``, as deploy/'s ServiceAccount."""
        kubeconfig = self.proxy.add_client(name, self.tmp_path, self.scheduler_token)
        replica = self._start_scheduler(kubeconfig=str(kubeconfig), **config)
        self.replicas[name] = replica
        return replica

    def add_gpu_nodes(self, count: int, gpus: int = 8) -> list[str]:
        return [self.env.add_node(f"gpu{i}", gpus=gpus) for i in range(count)]

    def make_gangs(self, count: int, size: int, gpus: int, prefix: str = "g", **group_spec) -> list[str]:
        names = [f"{prefix}{i}" for i in range(count)]
        for name in names:
            self.env.create(pod_group(name, self.env.namespace, size, **group_spec))
            for j in range(size):
                self.env.create(pod(f"{name}-{j}", self.env.namespace, group=name, gpus=gpus, cpu="1"))
        return names

    def bound_count(self) -> int:
        return len(self.env.bound())

    def wait_bound(self, count: int, timeout: float = 60) -> None:
        wait_for(f"{count} pods bound", lambda: self.bound_count() >= count, timeout=timeout)

    def finish(self, records: bool = False, alive: list[str] | None = None, still_for: float = 3.0) -> None:
        """The end of every scenario: quiescent, no invariant broken, replicas alive and ready
        (``alive``: the names of those expected to run still; default all)."""
        wait_quiescent(self.env.kube, self.env.namespace, still_for)
        assert_invariants(self.env.kube, self.env.namespace, self.env.nodes,
                          self.proxy.records if records else None)
        assert_alive_and_ready([self.replicas[n] for n in (alive if alive is not None else self.replicas)])


def fast_lease(env: Env) -> dict:
    """Leader election timing for scenarios that kill the leader: a standby or a
    restarted replica takes over within ~6 s, not the default ~10 s.  The renew
    deadline stays 4 s: shorter, a renewal slowed by a loaded CI machine lost
    the lease (and the replica exited) mid-test."""
    return {"leaseNamespace": env.namespace, "leaseDurationSeconds": 6.0, "renewDeadlineSeconds": 4.0,
            "retryPeriodSeconds": 0.5}


def assert_alive_and_ready(replicas: list[SchedulerProcess]) -> None:
    for replica in replicas:
        assert replica.proc.poll() is None, f"scheduler exited with {replica.proc.returncode}"
        wait_for("the scheduler's /readyz answering 200", lambda: replica.get("/readyz")[0] == 200, timeout=30)


@pytest.fixture
def chaos(env, proxy, tmp_path, start_scheduler, scheduler_kubeconfig) -> Chaos:
    return Chaos(env, proxy, tmp_path, start_scheduler, token_of(scheduler_kubeconfig))


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory) -> localcluster.Cluster:
    """A control plane of the module's own, for scenarios that kill parts of it
    (so no other test sees its API server go away). A module using it
    overrides ``kubeconfig`` and ``kube`` with own_kubeconfig / own_kube.
    Needs the local control plane: a $KUBECONFIG cluster is not restarted from here."""
    if os.environ.get("KUBECONFIG"):
        pytest.skip("restarting kube-apiserver needs the local control plane, not $KUBECONFIG")
    workdir = tmp_path_factory.mktemp("chaos-cluster")
    cluster = localcluster.up(workdir, with_scheduler=False, die_with_parent=True)
    try:
        yield cluster
    finally:
        localcluster.down(workdir)
