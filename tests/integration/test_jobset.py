"""JobSets end to end (docs/integrations.md), every controller real: the
JobSet controller (sigs.k8s.io/jobset, built from source; tests/support/
jobset.py) makes one Indexed Job per replicated Job, kube-controller-manager's
Job controller makes their pods, and batchsched, with no PodGroup anywhere,
binds the whole JobSet as one gang, or nothing of it while it cannot be
placed, saying why on each pod and on the JobSet.  A JobSet that starts its
replicated Jobs in order is a gang of the stages started, so it never waits
for pods its controller has not made yet."""
from __future__ import annotations

import pytest

from tests.integration.test_pod_status import events_on, wait_all_unschedulable
from tests.support.frameworks import JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL, jobset
from tests.support.jobset import running_jobset
from tests.support.kube import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def jobset_binary() -> str:
    import localcluster
    return str(localcluster.build_all()["jobset"])


@pytest.fixture
def jobset_controller(env, kube, kubeconfig, jobset_binary, tmp_path):
    with running_jobset(kube, kubeconfig, jobset_binary, tmp_path, env.namespace, env.id) as proc:
        yield proc


def jobset_pods(env, name: str, count: int) -> dict[str, dict]:
    """Pod name -> pod of JobSet ``name``, once the controllers made ``count``."""
    return wait_for(f"{count} pods of JobSet {name}", lambda: len(
        found := {n: p for n, p in env.pods().items() if p["metadata"]["labels"].get(JOBSET_NAME_LABEL) == name})
        == count and found, timeout=90)


def test_a_jobset_of_a_launcher_and_4_workers_is_gang_bound_as_one(env, jobset_controller, start_scheduler):
    nodes = [env.add_node(f"gpu{i}", gpus=8) for i in range(3)]
    created = env.create(jobset("llama", env.namespace, [("launcher", 1, 1, 0), ("workers", 1, 4, 8)]))
    pods = jobset_pods(env, "llama", 5)
    roles = sorted(p["metadata"]["labels"][REPLICATED_JOB_LABEL] for p in pods.values())
    assert roles == ["launcher"] + ["workers"] * 4
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-uid"] for p in pods.values()} \
        == {created["metadata"]["uid"]}
    start_scheduler()
    # 32 GPUs asked at once on 24: nothing binds, not even the launcher that would fit alone.
    key = f"{env.namespace}/jobset:llama"
    wait_all_unschedulable(env, sorted(pods), f"gang {key} (ExceedsClusterCapacity): Exceeds cluster capacity: "
                                              f"gang {key} needs 5 pods placed at once")
    wait_for("a FailedScheduling Event on the JobSet", lambda: any(
        e["reason"] == "FailedScheduling" and "needs 5 pods placed at once" in e["message"]
        for e in events_on(env, env.namespace, "JobSet", "llama")), timeout=30)
    assert env.bound() == {}
    nodes.append(env.add_node("gpu3", gpus=8))
    wait_for("the whole JobSet bound", lambda: sorted(env.bound()) == sorted(pods), timeout=60)
    bound = env.bound()
    assert sorted(bound[n] for n in pods if "workers" in n) == sorted(nodes)  # 8 GPUs each: one per node
    wait_for("a Scheduled Event on the JobSet", lambda: any(
        e["reason"] == "Scheduled" for e in events_on(env, env.namespace, "JobSet", "llama")), timeout=30)


def test_a_jobset_started_in_order_binds_each_stage_whole_as_its_controller_makes_it(
        env, jobset_controller, start_scheduler):
    for i in range(3):
        env.add_node(f"gpu{i}", gpus=8)
    env.create(jobset("llama", env.namespace, [("launcher", 1, 1, 0), ("workers", 1, 3, 8)], in_order=True))
    start_scheduler()
    # The controller makes the workers' Job only once the launcher's is Ready: a
    # gang of all five would wait for them forever.
    launcher = jobset_pods(env, "llama", 1)
    wait_for("the launcher bound alone", lambda: sorted(env.bound()) == sorted(launcher), timeout=60)
    pods = jobset_pods(env, "llama", 4)
    wait_for("the workers bound whole", lambda: sorted(env.bound()) == sorted(pods), timeout=90)
