"""Automatic gangs end to end (docs/integrations.md): an Indexed Job with no
PodGroup at all, its pods created by the real Job controller of the local
kube-controller-manager, is one gang of its parallelism: bound whole, or not
at all while the quorum cannot be placed, the pods saying why.  A
LeaderWorkerSet group, its pods stamped as the LWS controller stamps them
(no LWS controller runs here), binds whole once its last worker exists."""
from __future__ import annotations

import pytest

from tests.integration.test_gang_scheduling import members_bound
from tests.integration.test_pod_status import wait_all_unschedulable
from tests.support.frameworks import (
    JOB_INDEX, JOB_NAME_LABEL, JOB_UID_LABEL, indexed_job, leader_worker_set_group,
)
from tests.support.kube import wait_for

pytestmark = pytest.mark.e2e


def job_pods(env, job: dict, count: int) -> list[str]:
    """The Job controller's pods of ``job``, once it made ``count`` of them,
    checked to carry what the automatic gang reads."""
    created = wait_for(f"the Job controller's {count} pods", lambda: len(
        found := [p for p in env.pods().values() if p["metadata"]["labels"].get(JOB_NAME_LABEL) == "llama"])
        == count and found)
    uid = job["metadata"]["uid"]
    for pod in created:
        assert pod["metadata"]["labels"][JOB_UID_LABEL] == uid
        assert pod["metadata"]["annotations"][JOB_INDEX].isdigit()
    return sorted(p["metadata"]["name"] for p in created)


def test_an_indexed_job_with_no_podgroup_is_gang_bound_whole(env, start_scheduler):
    nodes = [env.add_node(f"gpu{i}", gpus=8) for i in range(4)]
    job = env.create(indexed_job("llama", env.namespace, parallelism=4, gpus=8))
    names = job_pods(env, job, 4)
    start_scheduler()
    wait_for("the whole Job bound", lambda: members_bound(env, "llama-") == names)
    assert sorted(env.bound().values()) == sorted(nodes)  # 8 GPUs each: one per node


def test_an_indexed_job_whose_quorum_cannot_be_placed_binds_nothing_and_says_why(env, start_scheduler):
    for i in range(3):
        env.add_node(f"gpu{i}", gpus=8)
    job = env.create(indexed_job("llama", env.namespace, parallelism=4, gpus=8))
    names = job_pods(env, job, 4)
    start_scheduler()
    wait_all_unschedulable(env, names, f"gang {env.namespace}/job:llama (ExceedsClusterCapacity): Exceeds cluster "
                                       f"capacity: gang {env.namespace}/job:llama needs 4 pods placed at once")
    assert members_bound(env, "llama-") == []
    env.add_node("gpu3", gpus=8)
    wait_for("the whole Job bound once a 4th node is there", lambda: members_bound(env, "llama-") == names)


def test_a_leader_worker_set_group_binds_whole_once_its_last_worker_exists(env, start_scheduler):
    nodes = [env.add_node(f"gpu{i}", gpus=8) for i in range(4)]
    pods = leader_worker_set_group("serve", env.namespace, 0, size=4, gpus=8)
    for pod in pods[:-1]:
        env.create(pod)
    start_scheduler()
    waiting = [p["metadata"]["name"] for p in pods[:-1]]
    wait_all_unschedulable(env, waiting, f"gang {env.namespace}/leaderworkerset:serve-0 (QuorumNotReached): 3/4 "
                                         "members exist")
    assert members_bound(env, "serve-") == []
    env.create(pods[-1])
    wait_for("the whole group bound", lambda: members_bound(env, "serve-") == sorted(p["metadata"]["name"] for p in pods))
    assert sorted(env.bound().values()) == sorted(nodes)
