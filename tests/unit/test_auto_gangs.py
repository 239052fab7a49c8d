"""Automatic gangs (docs/integrations.md): an Indexed Job's pods, stamped as
the Job controller stamps them, are one gang with no PodGroup, its size the
Job's parallelism; each LeaderWorkerSet group, stamped as the LWS controller
stamps it, is one gang of its size annotation; opt-in per owner or by
config; every explicit grouping on the same pods wins."""
from __future__ import annotations

import asyncio

import pytest

from batchsched.config import SchedulerConfig
from batchsched.core import gangsources
from batchsched.core.cycle import schedule_cycle
from batchsched.core.gangs import GangIndex
from batchsched.core.gangsources import jobs, jobsets
from batchsched.core.readers import pod_from_json
from batchsched.core.queueing.queue import GangQueue
from batchsched.shell.cache import ClusterCache
from tests.support.frameworks import (
    indexed_job, job_controller_pods, jobset, jobset_controller_pods, leader_worker_set_group,
)
from tests.unit.cache_support import relist

ALL = frozenset(gangsources.PRECEDENCE)
KEY = "train/job:llama"


def nodes(count: int) -> list[dict]:
    return [{"metadata": {"name": f"n{i}"},
             "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                        "conditions": [{"type": "Ready", "status": "True"}]}} for i in range(count)]


def listed_job(parallelism: int = 4, completions: int | None = None, succeeded: int = 0, **kwargs) -> dict:
    job = indexed_job("llama", "train", parallelism, gpus=8, completions=completions, **kwargs)
    job["metadata"].update(uid="job-uid", creationTimestamp="2024-01-01T00:00:00Z")
    job["status"] = {"succeeded": succeeded} if succeeded else {}
    return job


def cache_with(owners: list[dict], pods: list[dict], node_count: int, owner: str = gangsources.JOB,
               **config) -> ClusterCache:
    """A cache that listed ``owners`` (Jobs, or the owner kind of source ``owner``) and ``pods``."""
    sources = SchedulerConfig.model_validate({"gangSources": config}).gang_sources
    cache = asyncio.run(_new(sources.enabled(), sources.auto_always()))
    relist(cache, "nodes", nodes(node_count))
    if owner in cache.gang_sources:
        relist(cache, gangsources.SOURCES[owner].plural, owners)
    relist(cache, "pods", pods)
    return cache


async def _new(sources, always) -> ClusterCache:
    return ClusterCache("batchsched", gang_sources=sources, auto_always=always)


def cycle(cache: ClusterCache, now: float = 0.0):
    return schedule_cycle(cache.snapshot(now), GangQueue())


def test_an_indexed_job_is_one_gang_of_its_parallelism_bound_whole():
    job = listed_job(4)
    cache = cache_with([job], job_controller_pods(job), 4)
    gang = GangIndex(cache.snapshot(0.0))[KEY]
    assert (gang.min_member, len(gang.pending), gang.implicit, gang.problem) == (4, 4, False, None)
    assert len({b.node_name for b in cycle(cache).bindings}) == 4  # 8 GPUs each: one node each


def test_nothing_binds_while_the_quorum_cannot_be_placed():
    job = listed_job(4)
    plan = cycle(cache_with([job], job_controller_pods(job), 3))
    assert plan.bindings == []
    assert (plan.verdicts[KEY].reason, plan.verdicts[KEY].message) == (
        "ExceedsClusterCapacity", "Exceeds cluster capacity: gang train/job:llama needs 4 pods placed at once; "
                                  "they ask 32 nvidia.com/gpu, the cluster has 24 allocatable.")


def test_nothing_binds_while_a_member_is_missing():
    job = listed_job(4)
    plan = cycle(cache_with([job], job_controller_pods(job)[:3], 4))
    assert plan.bindings == []
    assert plan.verdicts[KEY].message.startswith(
        "3/4 members exist (pods with label batch.kubernetes.io/job-name=llama and schedulerName batchsched")


@pytest.mark.parametrize("parallelism, completions, succeeded, expected", [
    (4, 4, 0, 4),
    (4, 16, 0, 4),   # runs 4 at a time
    (4, 4, 1, 3),    # an index done: 3 more pods at most
    (4, 16, 15, 1),
    (0, 4, 0, 1),    # suspended by hand: any pod may go alone
])
def test_the_gang_is_as_big_as_the_pods_the_job_runs_at_once(parallelism, completions, succeeded, expected):
    spec = jobs.group_from_json(listed_job(parallelism, completions, succeeded))
    assert spec is not None and (spec.key, spec.min_member) == (KEY, expected)


def test_a_jobs_active_deadline_is_kept_with_its_gang_and_a_bad_one_refused():
    job = listed_job(4)
    assert jobs.group_from_json(job).job_deadline_seconds is None
    job["spec"]["activeDeadlineSeconds"] = 3600
    assert jobs.group_from_json(job).job_deadline_seconds == 3600
    for bad in (0, -5, True, "3600", 1.5, 2**63):
        job["spec"]["activeDeadlineSeconds"] = bad
        with pytest.raises(ValueError, match="spec.activeDeadlineSeconds"):
            jobs.group_from_json(job)


def test_a_job_that_is_not_indexed_forms_no_gang():
    job = listed_job(4)
    job["spec"]["completionMode"] = "NonIndexed"
    assert jobs.group_from_json(job) is None
    pods = job_controller_pods(job)
    for pod in pods:  # the Job controller writes no completion index on such pods
        del pod["metadata"]["annotations"][gangsources.JOB_INDEX_ANNOTATION]
    assert {pod_from_json(p, ALL).gang_key for p in pods} == {f"train/pod:{p['metadata']['name']}" for p in pods}


def test_a_job_not_seen_yet_keeps_its_pods_waiting_and_says_for_what():
    job = listed_job(2)
    plan = cycle(cache_with([], job_controller_pods(job), 2))
    assert plan.bindings == []
    assert (plan.verdicts[KEY].reason, plan.verdicts[KEY].message) == (
        "PodGroupNotFound", "Job train/llama (batch/v1, named by the pod's label "
                            "batch.kubernetes.io/job-name=llama) not found")


def test_a_job_event_changes_the_gang_only_when_its_size_does():
    job = listed_job(4, completions=8)
    cache = cache_with([job], [], 0)
    reflector = next(r for r in cache.reflectors(None) if r.kind == "jobs")  # type: ignore[arg-type]
    cache.drain_changes()
    job["status"] = {"active": 4, "ready": 2}
    reflector.apply("MODIFIED", job)
    assert cache.drain_changes()[0] == set()
    job["status"] = {"succeeded": 6}
    reflector.apply("MODIFIED", job)
    assert cache.drain_changes()[0] == {KEY} and cache.groups[KEY].min_member == 2
    reflector.apply("DELETED", job)
    assert KEY not in cache.groups


@pytest.mark.parametrize("mode, label, expected", [
    ("optIn", "true", KEY),
    ("optIn", None, "alone"),
    ("always", None, KEY),
    ("always", "false", "alone"),
    ("never", "true", "alone"),
])
def test_automatic_gangs_are_opt_in_per_job_or_for_every_job_by_config(mode, label, expected):
    job = listed_job(2, auto_gang=label)
    cache = cache_with([job], job_controller_pods(job), 2, autoGangs={"jobs": mode})
    keys = {p.gang_key for p in cache.pods.values()}
    assert keys == ({KEY} if expected == KEY else {f"train/pod:{p.name}" for p in cache.pods.values()})
    assert any(r.kind == "jobs" for r in cache.reflectors(None)) == (mode != "never")  # type: ignore[arg-type]


@pytest.mark.parametrize("label, annotation, expected", [
    ({"scheduling.batchsched.io/pod-group": "mine"}, {}, "train/mine"),
    ({"scheduling.x-k8s.io/pod-group": "pg"}, {}, "train/scheduler-plugins:pg"),
    ({}, {"scheduling.k8s.io/group-name": "pg"}, "train/volcano:pg"),
    ({"kueue.x-k8s.io/pod-group-name": "g"}, {"kueue.x-k8s.io/pod-group-total-count": "2"}, "train/kueue:g"),
])
def test_every_explicit_grouping_wins_over_the_automatic_gang(label, annotation, expected):
    pod = job_controller_pods(listed_job(2))[0]
    pod["metadata"]["labels"].update(label)
    pod["metadata"]["annotations"].update(annotation)
    assert pod_from_json(pod, ALL).gang_key == expected
    assert pod_from_json(pod, ALL - {gangsources.source_of_key(expected)} | {gangsources.OWN}).gang_key \
        == (KEY if expected != "train/mine" else expected)  # our own label is always read


def lws_cache(pods: list[dict], node_count: int, **config) -> ClusterCache:
    for pod in pods:
        pod["metadata"].update(uid=f"uid-{pod['metadata']['name']}", creationTimestamp="2024-01-01T00:00:00Z")
    return cache_with([], pods, node_count, **config)


def test_each_leader_worker_set_group_is_one_gang_of_its_stated_size():
    pods = leader_worker_set_group("serve", "train", 0, 4, 8) + leader_worker_set_group("serve", "train", 1, 4, 8)
    cache = lws_cache(pods, 4)
    index = GangIndex(cache.snapshot(0.0))
    assert sorted(index) == ["train/leaderworkerset:serve-0", "train/leaderworkerset:serve-1"]
    assert [index[k].min_member for k in sorted(index)] == [4, 4]
    placed = cycle(cache).bindings
    assert len(placed) == 4 and len({b.gang_key for b in placed}) == 1  # room for one group: it binds whole


def test_a_leader_worker_set_group_missing_a_worker_binds_nothing():
    plan = cycle(lws_cache(leader_worker_set_group("serve", "train", 0, 4, 8)[:3], 4))
    assert plan.bindings == []
    assert plan.verdicts["train/leaderworkerset:serve-0"].message.startswith(
        "3/4 members exist (pods with labels leaderworkerset.sigs.k8s.io/name and "
        "leaderworkerset.sigs.k8s.io/group-index of group serve-0 and schedulerName batchsched")


def test_a_leader_worker_set_group_whose_pods_disagree_on_its_size_is_refused():
    pods = leader_worker_set_group("serve", "train", 0, 2, 8)
    pods[1]["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/size"] = "3"
    verdict = cycle(lws_cache(pods, 2)).verdicts["train/leaderworkerset:serve-0"]
    assert (verdict.reason, verdict.message) == (
        "InvalidPodGroup", "the pods of LeaderWorkerSet group serve-0 disagree on leaderworkerset.sigs.k8s.io/size: 2, 3")


def test_kueues_group_on_leader_worker_set_pods_wins_and_lws_groups_are_opt_in():
    pod = leader_worker_set_group("serve", "train", 0, 2, 8)[0]
    assert pod_from_json(pod, ALL).gang_key == "train/leaderworkerset:serve-0"
    pod["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] = "leaderworkerset-serve-0-ab12c"
    pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] = "2"
    assert pod_from_json(pod, ALL).gang_key == "train/kueue:leaderworkerset-serve-0-ab12c"
    plain = leader_worker_set_group("serve", "train", 0, 2, 8, auto_gang=None)
    assert {p.gang_key for p in lws_cache(plain, 2).pods.values()} == {"train/pod:serve-0", "train/pod:serve-0-1"}
    everyone = leader_worker_set_group("serve", "train", 0, 2, 8, auto_gang=None)
    assert {p.gang_key for p in lws_cache(everyone, 2, autoGangs={"leaderWorkerSets": "always"}).pods.values()} \
        == {"train/leaderworkerset:serve-0"}


JOBSET_KEY = "train/jobset:llama"


def listed_jobset(in_order: bool = False, **kwargs) -> dict:
    """1 launcher (no GPU) + 4 workers x 8 GPUs, as JobSet users write MPI-style training."""
    js = jobset("llama", "train", [("launcher", 1, 1, 0), ("workers", 1, 4, 8)], in_order=in_order, **kwargs)
    js["metadata"].update(uid="jobset-uid", creationTimestamp="2024-01-01T00:00:00Z")
    return js


def jobset_cache(js_list: list[dict], pods: list[dict], node_count: int, **config) -> ClusterCache:
    return cache_with(js_list, pods, node_count, owner=gangsources.JOBSET, **config)


def test_a_jobset_is_one_gang_of_all_its_replicated_jobs_bound_whole():
    js = listed_jobset()
    cache = jobset_cache([js], jobset_controller_pods(js), 4)
    gang = GangIndex(cache.snapshot(0.0))[JOBSET_KEY]
    assert (gang.min_member, len(gang.pending), gang.problem) == (5, 5, None)
    placed = cycle(cache).bindings
    assert len(placed) == 5 and {b.gang_key for b in placed} == {JOBSET_KEY}
    assert cache.owner_refs[JOBSET_KEY] == {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                            "namespace": "train", "name": "llama", "uid": "jobset-uid"}


def test_nothing_of_a_jobset_binds_while_a_pod_is_missing_or_cannot_be_placed():
    js = listed_jobset()
    assert cycle(jobset_cache([js], jobset_controller_pods(js)[:4], 4)).bindings == []
    plan = cycle(jobset_cache([js], jobset_controller_pods(js), 3))
    assert plan.bindings == [] and plan.verdicts[JOBSET_KEY].reason == "ExceedsClusterCapacity"


@pytest.mark.parametrize("replicated, expected", [
    ([("a", 1, 1, 0), ("b", 2, 4, 8)], 9),
    ([("a", 3, 2, 8)], 6),
    ([("a", 0, 4, 8), ("b", 1, 1, 8)], 1),   # replicas 0: that replicated Job makes no pod
])
def test_a_jobsets_size_is_replicas_times_pods_at_once_summed(replicated, expected):
    spec = jobsets.group_from_json(jobset("x", "train", replicated))
    assert (spec.key, spec.min_member, spec.stages_in_turn) == ("train/jobset:x", expected, False)


def test_a_jobsets_job_deadline_is_its_longest_only_if_every_replicated_job_has_one():
    js = jobset("x", "train", [("a", 1, 1, 0), ("b", 2, 4, 8)])
    templates = [job["template"]["spec"] for job in js["spec"]["replicatedJobs"]]
    templates[0]["activeDeadlineSeconds"] = 600
    assert jobsets.group_from_json(js).job_deadline_seconds is None  # b's pods have no bound
    templates[1]["activeDeadlineSeconds"] = 7200
    assert jobsets.group_from_json(js).job_deadline_seconds == 7200
    templates[1]["activeDeadlineSeconds"] = "soon"
    with pytest.raises(ValueError, match=r"replicatedJobs\[1\].template.spec.activeDeadlineSeconds"):
        jobsets.group_from_json(js)


def test_completions_below_parallelism_bound_what_a_replicated_job_runs_at_once():
    js = jobset("x", "train", [("a", 2, 4, 8)])
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] = 3
    assert jobsets.group_from_json(js).min_member == 6


def test_a_jobset_started_in_order_is_a_gang_of_its_started_stages():
    js = listed_jobset(in_order=True)
    assert jobsets.group_from_json(js).stages == (("launcher", 1, 1), ("workers", 4, 4))
    # The controller made the launcher's Job only: the gang is the launcher, and it binds.
    launcher = jobset_controller_pods(js, only=("launcher",))
    cache = jobset_cache([js], launcher, 4)
    assert [b.pod_name for b in cycle(cache).bindings] == [launcher[0]["metadata"]["name"]]
    # Once it runs the workers' Job is made: the 4 workers bind at once beside the bound launcher.
    launcher[0]["spec"]["nodeName"], launcher[0]["status"]["phase"] = "n0", "Running"
    cache = jobset_cache([js], launcher + jobset_controller_pods(js, only=("workers",)), 5)
    gang = GangIndex(cache.snapshot(0.0))[JOBSET_KEY]
    assert (gang.min_member, gang.need) == (5, 4)
    assert len(cycle(cache).bindings) == 4
    # A worker still missing: none binds.
    cache = jobset_cache([js], launcher + jobset_controller_pods(js, only=("workers",))[:3], 5)
    assert cycle(cache).bindings == []


def test_a_stage_whose_pods_all_ended_no_longer_counts():
    js = listed_jobset()
    js["spec"]["replicatedJobs"][1]["dependsOn"] = [{"name": "launcher", "status": "Complete"}]
    launcher = jobset_controller_pods(js, only=("launcher",))
    launcher[0]["spec"]["nodeName"], launcher[0]["status"]["phase"] = "n0", "Succeeded"
    cache = jobset_cache([js], launcher + jobset_controller_pods(js, only=("workers",)), 4)
    gang = GangIndex(cache.snapshot(0.0))[JOBSET_KEY]
    assert (gang.min_member, gang.need) == (4, 4)
    assert len(cycle(cache).bindings) == 4


def test_members_that_succeeded_are_done_so_a_replacement_binds_alone():
    """Launcher Succeeded, 3 workers running, the 4th failed and replaced:
    the replacement waits for no one (the gang would never reach 5 again)."""
    js = listed_jobset()
    pods = jobset_controller_pods(js)
    pods[0]["spec"]["nodeName"], pods[0]["status"] = "n0", {"phase": "Succeeded"}
    for i, pod in enumerate(pods[1:4], 1):
        pod["spec"]["nodeName"], pod["status"] = f"n{i}", {"phase": "Running"}
    pods[4]["status"] = {"phase": "Pending"}
    cache = jobset_cache([js], pods, 5)
    gang = GangIndex(cache.snapshot(0.0))[JOBSET_KEY]
    assert (gang.min_member, gang.need) == (4, 1)
    assert [b.pod_name for b in cycle(cache).bindings] == [pods[4]["metadata"]["name"]]


def test_the_jobset_gang_wins_over_its_jobs_gangs_and_without_it_each_job_is_one():
    js = listed_jobset()
    pods = jobset_controller_pods(js)
    assert {pod_from_json(p, ALL).gang_key for p in pods} == {JOBSET_KEY}
    without = {pod_from_json(p, ALL - {gangsources.JOBSET}).gang_key for p in pods}
    assert without == {"train/job:llama-launcher-0", "train/job:llama-workers-0"}


@pytest.mark.parametrize("mode, label, grouped", [
    ("optIn", "true", True), ("optIn", None, False), ("always", None, True), ("always", "false", False),
    ("never", "true", False),
])
def test_jobset_gangs_are_opt_in_per_template_or_by_config(mode, label, grouped):
    js = listed_jobset(auto_gang=label)
    cache = jobset_cache([js], jobset_controller_pods(js), 4, autoGangs={"jobSets": mode, "jobs": "never"})
    assert ({p.gang_key for p in cache.pods.values()} == {JOBSET_KEY}) == grouped
    assert any(r.kind == "jobsets" for r in cache.reflectors(None)) == (mode != "never")  # type: ignore[arg-type]


@pytest.mark.parametrize("spec, why", [
    ({}, "spec.replicatedJobs: 1 to 64 entries expected"),
    ({"replicatedJobs": [{"name": "a", "replicas": -1}]}, "spec.replicatedJobs[0].replicas: a count from 0 to 100000"),
    ({"replicatedJobs": [{"name": "a", "replicas": "2"}]}, "spec.replicatedJobs[0].replicas: a count"),
    ({"replicatedJobs": [{"name": "a", "template": {"spec": {"parallelism": 1e9}}}]},
     "spec.replicatedJobs[0].template.spec.parallelism: a count"),
    ({"replicatedJobs": [{"replicas": 1}]}, "spec.replicatedJobs[0]: a name expected"),
    ({"replicatedJobs": ["x"]}, "spec.replicatedJobs[0]: a name expected"),
    ({"replicatedJobs": [{"name": "a", "template": {"spec": 5}}]},
     "spec.replicatedJobs[0].template.spec: a mapping expected"),
    (True, "spec: a mapping expected"),
])
def test_a_jobset_that_makes_no_sense_keeps_its_pods_waiting_and_says_why(spec, why):
    js = listed_jobset()
    pods = jobset_controller_pods(js)
    js["spec"] = spec
    cache = jobset_cache([js], pods, 4)
    plan = cycle(cache)
    assert plan.bindings == []
    assert plan.verdicts[JOBSET_KEY].reason == "InvalidPodGroup" and plan.verdicts[JOBSET_KEY].message.startswith(why)


def test_a_jobset_event_changes_the_gang_only_when_its_size_does():
    js = listed_jobset()
    cache = jobset_cache([js], [], 0)
    reflector = next(r for r in cache.reflectors(None) if r.kind == "jobsets")  # type: ignore[arg-type]
    cache.drain_changes()
    js["status"] = {"replicatedJobsStatus": [{"name": "workers", "active": 1}]}
    reflector.apply("MODIFIED", js)
    assert cache.drain_changes()[0] == set()
    js["spec"]["replicatedJobs"][1]["replicas"] = 2
    reflector.apply("MODIFIED", js)
    assert cache.drain_changes()[0] == {JOBSET_KEY} and cache.groups[JOBSET_KEY].min_member == 9
    reflector.apply("DELETED", js)
    assert JOBSET_KEY not in cache.groups and JOBSET_KEY not in cache.owner_refs
