"""schedulerNames against the real API server: pods naming any served name are
one batchsched's, gang-bound as one; a name not served is left alone."""
from __future__ import annotations

import pytest

from tests.integration.test_gang_scheduling import members_bound, wait_unschedulable
from tests.support.kube import wait_for
from tests.support.objects import pod, pod_group

pytestmark = pytest.mark.e2e


def test_a_gang_whose_pods_name_a_served_alias_binds_whole_and_only_with_its_quorum(env, start_scheduler):
    env.add_node("n1", gpus=8)
    env.create(pod_group("mpi", env.namespace, 3))
    for i, scheduler in enumerate(("mpi-gang", "batchsched")):  # two of three members, under two names
        env.create(pod(f"mpi-{i}", env.namespace, group="mpi", gpus=2, scheduler=scheduler))
    env.create(pod("stranger", env.namespace, gpus=1, scheduler="someone-else"))
    start_scheduler(schedulerNames=["batchsched", "mpi-gang"])
    condition = wait_unschedulable(env, "mpi", "QuorumNotReached")
    assert condition["message"].startswith("2/3 members exist")
    assert members_bound(env, "mpi-") == []
    env.create(pod("mpi-2", env.namespace, group="mpi", gpus=2, scheduler="mpi-gang"))
    wait_for("the whole gang bound", lambda: members_bound(env, "mpi-") == ["mpi-0", "mpi-1", "mpi-2"])
    assert "stranger" not in env.bound()
